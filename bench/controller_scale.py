"""Several controller processes vs one vs direct-to-worker: interacts/s, p50/p99, CPU per request.

Everything on loopback (127.0.0.1): ``--workers`` echo-task worker processes; for each count in
``--controllers`` (e.g. 1,2), that many controller shards (``agentrl-controller --shard k
--shards n``); every worker heartbeats to every controller. The load generator (this process,
closed-loop aiohttp clients, each stepping its own session) routes as ``ControllerClient`` does:
starts spread over the shards, each session's calls to ``shards[session_id % n]``. The same
clients then step sessions opened directly on the workers.

Reported per phase: interacts/s, p50/p99 latency, controller CPU per request (sum over the
phase's controller processes, from /proc/<pid>/stat), errors. On a 2-core machine the load
generator, the controllers and the workers share the cores, so the figures show that sharding
works and how CPU per request changes, not the many-core speedup.

Usage (bounded: under a minute with the defaults)::

    .venv/bin/python bench/controller_scale.py   # prints a table, writes bench/results/controller_scale.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from latency_stats import ECHO_STEP, cpu_seconds, percentile

from agentrl_ext.testing.env_servers import ECHO_TASK, REPO, EnvServers, ServerProcess, wait_routable


@dataclass
class Phase:
    target: str
    controllers: int
    concurrency: int
    requests: int
    seconds: float
    interacts_per_s: float
    p50_ms: float
    p99_ms: float
    controller_cpu_ms_per_request: float | None
    controller_cpu_share: float | None
    """Controller CPU seconds per wall second (summed over its processes)."""
    errors: int


class Load:
    """Closed-loop clients stepping echo sessions through controller shards or straight to workers."""

    def __init__(self, workers: list[str]) -> None:
        self.workers = workers
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30), cookie_jar=aiohttp.DummyCookieJar()
        )
        self._direct_ids = 10**12

    async def open(self, shards: list[str] | None, i: int) -> tuple[str, dict[str, str] | None, int]:
        """A session; returns (interact URL, headers, session id)."""
        if shards is None:  # directly on a worker, with an id of our own
            self._direct_ids += 1
            worker = self.workers[i % len(self.workers)]
            async with self.http.post(
                worker + "/start_sample", json={"index": 0, "session_id": self._direct_ids}
            ) as r:
                await r.read()
                r.raise_for_status()
            return worker + "/interact", None, self._direct_ids
        async with self.http.post(
            shards[i % len(shards)] + "/start_sample", json={"name": "echo", "index": 0}
        ) as r:
            await r.read()
            r.raise_for_status()
            sid = int(r.headers["session_id"])
        return shards[sid % len(shards)] + "/interact", {"session_id": str(sid)}, sid

    async def phase(
        self, shards: list[str] | None, pids: list[int], concurrency: int, seconds: float
    ) -> Phase:
        sessions = [await self.open(shards, i) for i in range(concurrency)]
        latencies: list[float] = []
        errors = 0
        stop_at = 0.0

        async def client(url: str, headers: dict[str, str] | None, sid: int) -> None:
            nonlocal errors
            body = {"messages": ECHO_STEP} if headers else {"session_id": sid, "messages": ECHO_STEP}
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    async with self.http.post(url, json=body, headers=headers) as r:
                        await r.read()
                        if r.status != 200:
                            errors += 1
                            continue
                except aiohttp.ClientError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)

        stop_at = time.perf_counter() + min(1.0, seconds / 4)  # warm-up
        await asyncio.gather(*(client(*s) for s in sessions))
        latencies.clear()
        cpu0 = sum(cpu_seconds(p) for p in pids)
        t0 = time.perf_counter()
        stop_at = t0 + seconds
        await asyncio.gather(*(client(*s) for s in sessions))
        elapsed = time.perf_counter() - t0
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        for url, headers, sid in sessions:
            cancel = url.rsplit("/", 1)[0] + "/cancel"
            async with self.http.post(
                cancel, headers=headers, json=None if headers else {"session_id": sid}
            ) as r:
                await r.read()
        latencies.sort()
        n = len(latencies)
        return Phase(
            target="worker (direct)" if shards is None else f"{len(shards)} controller(s)",
            controllers=0 if shards is None else len(shards),
            concurrency=concurrency,
            requests=n,
            seconds=round(elapsed, 2),
            interacts_per_s=round(n / elapsed, 1),
            p50_ms=round(percentile(latencies, 0.5) * 1e3, 2),
            p99_ms=round(percentile(latencies, 0.99) * 1e3, 2),
            controller_cpu_ms_per_request=None if shards is None else round(cpu / max(n, 1) * 1e3, 3),
            controller_cpu_share=None if shards is None else round(cpu / elapsed, 2),
            errors=errors,
        )


async def run(args: argparse.Namespace, log_dir: Path) -> dict[str, object]:
    counts = [int(c) for c in args.controllers.split(",")]
    load_before = os.getloadavg()
    with EnvServers(log_dir) as servers:
        fleets: dict[int, list[ServerProcess]] = {
            n: [
                servers.controller(
                    shard=k, shards=n, idle_timeout=3600, log_level="warning", name=f"c{n}-{k}"
                )
                for k in range(n)
            ]
            for n in counts
        }
        every = [c for fleet in fleets.values() for c in fleet]
        workers = [
            servers.worker(
                every,
                ECHO_TASK,
                task_kwargs={"max_turns": 10**9},
                concurrency=max(args.concurrency, 64),
                heartbeat_interval=1.0,
                log_level="warning",
            )
            for _ in range(args.workers)
        ]
        for controller in every:
            wait_routable(controller, "echo", count=args.workers)
        load = Load([w.api for w in workers])
        try:
            phases = [await load.phase(None, [], args.concurrency, args.seconds)]
            for n in counts:
                fleet = fleets[n]
                phases.append(
                    await load.phase(
                        [c.api for c in fleet], [c.pid for c in fleet], args.concurrency, args.seconds
                    )
                )
        finally:
            await load.http.close()
    return {
        "bench": "controller_scale",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "settings": vars(args),
        "phases": [asdict(p) for p in phases],
    }


def print_table(report: dict[str, object]) -> None:
    print(
        f"{'target':<18} {'interacts/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'ctl CPU ms/req':>15} {'ctl CPU share':>13} {'errors':>6}"
    )
    for p in report["phases"]:  # type: ignore[attr-defined]
        cpu = (
            "-" if p["controller_cpu_ms_per_request"] is None else f"{p['controller_cpu_ms_per_request']:.3f}"
        )
        share = "-" if p["controller_cpu_share"] is None else f"{p['controller_cpu_share']:.2f}"
        print(
            f"{p['target']:<18} {p['interacts_per_s']:>11.0f} {p['p50_ms']:>8.2f} {p['p99_ms']:>8.2f} "
            f"{cpu:>15} {share:>13} {p['errors']:>6}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--controllers", default="1,2", help="controller process counts to measure, e.g. 1,2,4"
    )
    parser.add_argument("--workers", type=int, default=2, help="echo worker processes")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients (one session each)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window per phase")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "controller_scale.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="controller_scale_") as log_dir:
        report = asyncio.run(run(args, Path(log_dir)))
    print_table(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
