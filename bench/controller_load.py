"""Controller load benchmark: echo sessions through controller -> workers vs directly to a worker.

Everything runs on loopback (127.0.0.1): one controller process, ``--workers`` echo-task worker
processes, and the load generator (this process, closed-loop aiohttp clients). Measured:

- interact round trips/s and p50/p99 latency at each ``--concurrency`` level, through the
  controller and directly to a worker (same client code, same offered load), with ``--held``
  extra idle sessions open; the difference is the controller's added latency;
- controller CPU per forwarded request (from /proc/<pid>/stat);
- session starts/s through the controller;
- the most concurrent open sessions held (up to ``--max-sessions``) and controller memory.

Usage (bounded: about a minute with the defaults)::

    .venv/bin/python bench/controller_load.py     # prints a table, writes bench/results/controller_load.json
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from latency_stats import ECHO_STEP, cpu_seconds, percentile

from agentrl_ext.testing.env_servers import ECHO_TASK, REPO, EnvServers


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Phase:
    """One closed-loop measurement."""

    target: str
    concurrency: int
    held: int
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    controller_cpu_ms_per_request: float | None = None
    errors: int = 0


@dataclass
class Report:
    machine: dict[str, Any]
    settings: dict[str, Any]
    phases: list[Phase] = field(default_factory=list)
    starts_per_s: float = 0.0
    max_sessions_held: int = 0
    held_probe_p50_ms: float = float("nan")
    controller_rss_mb_idle: float = 0.0
    controller_rss_mb_at_max: float = 0.0
    notes: list[str] = field(default_factory=list)


class Stack:
    """Controller and echo worker processes on free loopback ports (the shared launcher)."""

    def __init__(self, workers: int, worker_concurrency: int, log_dir: Path) -> None:
        self.servers = EnvServers(log_dir)
        self.workers = workers
        self.worker_concurrency = worker_concurrency
        self.worker_apis: list[str] = []
        self.controller = ""
        self.controller_pid = 0

    def worker(self, i: int) -> str:
        return self.worker_apis[i]

    def start(self) -> None:
        controller = self.servers.controller(idle_timeout=3600, log_level="warning")
        self.controller, self.controller_pid = controller.api, controller.pid
        for _ in range(self.workers):
            worker = self.servers.worker(
                controller,
                ECHO_TASK,
                task_kwargs={"max_turns": 10**9},
                concurrency=self.worker_concurrency,
                heartbeat_interval=1.0,
                log_level="warning",
            )
            self.worker_apis.append(worker.api)

    def stop(self) -> None:
        self.servers.stop_all()


class Load:
    """Closed-loop clients; the same code talks to the controller or directly to a worker."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30), cookie_jar=aiohttp.DummyCookieJar()
        )
        self._direct_ids = 10**12

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                async with self.http.get(self.stack.controller + "/list_workers") as r:
                    workers = (await r.json()).get("echo", [])
                    if len(workers) == self.stack.workers and all(w["routable"] for w in workers):
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError("controller/workers did not come up in time")

    async def start(self, direct: int | None) -> tuple[str, int]:
        """Start an echo session; returns (target, id). ``direct``: worker number, or None for the controller."""
        if direct is None:
            async with self.http.post(
                self.stack.controller + "/start_sample", json={"name": "echo", "index": 0}
            ) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"start_sample: HTTP {r.status}: {body[:200]!r}")
                return "controller", int(r.headers["session_id"])
        self._direct_ids += 1
        sid = self._direct_ids
        async with self.http.post(
            self.stack.worker(direct) + "/start_sample", json={"index": 0, "session_id": sid}
        ) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"worker start_sample: HTTP {r.status}")
        return f"worker{direct}", sid

    async def step(self, target: str, sid: int) -> None:
        if target == "controller":
            url, body, headers = (
                self.stack.controller + "/interact",
                {"messages": ECHO_STEP},
                {"session_id": str(sid)},
            )
        else:
            url, body, headers = (
                self.stack.worker(int(target[6:])) + "/interact",
                {"session_id": sid, "messages": ECHO_STEP},
                None,
            )
        async with self.http.post(url, json=body, headers=headers) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"interact: HTTP {r.status}")

    async def cancel(self, target: str, sid: int) -> None:
        if target == "controller":
            async with self.http.post(
                self.stack.controller + "/cancel", headers={"session_id": str(sid)}
            ) as r:
                await r.read()
        else:
            async with self.http.post(
                self.stack.worker(int(target[6:])) + "/cancel", json={"session_id": sid}
            ) as r:
                await r.read()

    async def open_many(self, count: int, direct: int | None, parallel: int = 100) -> list[tuple[str, int]]:
        sessions: list[tuple[str, int]] = []
        queue = iter(range(count))

        async def opener() -> None:
            for _ in queue:
                sessions.append(await self.start(direct))

        await asyncio.gather(*(opener() for _ in range(min(parallel, count))))
        return sessions

    async def closed_loop(self, direct: bool, concurrency: int, seconds: float, held: int) -> Phase:
        workers = self.stack.workers
        held_sessions = await self.open_many(held, 0 if direct else None)
        sessions = [await self.start((i % workers) if direct else None) for i in range(concurrency)]
        latencies: list[float] = []
        errors = 0
        stop_at = 0.0

        async def client(target: str, sid: int) -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    await self.step(target, sid)
                except (RuntimeError, aiohttp.ClientError):
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)

        # warm-up, then the measured window
        stop_at = time.perf_counter() + min(1.0, seconds / 4)
        await asyncio.gather(*(client(t, s) for t, s in sessions))
        latencies.clear()
        cpu0 = cpu_seconds(self.stack.controller_pid)
        t0 = time.perf_counter()
        stop_at = t0 + seconds
        await asyncio.gather(*(client(t, s) for t, s in sessions))
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds(self.stack.controller_pid) - cpu0
        await asyncio.gather(*(self.cancel(t, s) for t, s in sessions + held_sessions))
        latencies.sort()
        n = len(latencies)
        return Phase(
            target="worker (direct)" if direct else "controller",
            concurrency=concurrency,
            held=held,
            requests=n,
            seconds=round(elapsed, 2),
            rps=round(n / elapsed, 1),
            p50_ms=round(percentile(latencies, 0.5) * 1e3, 2),
            p99_ms=round(percentile(latencies, 0.99) * 1e3, 2),
            controller_cpu_ms_per_request=None if direct else round(cpu / max(n, 1) * 1e3, 3),
            errors=errors,
        )

    async def open_loop(self, direct: bool, sessions: int, rate: float, seconds: float) -> Phase:
        """Fixed offered load: ``sessions`` open sessions, each stepping every ``sessions/rate`` s."""
        workers = self.stack.workers
        opened: list[tuple[str, int]] = []
        for w in range(workers if direct else 1):
            share = sessions // workers if direct else sessions
            opened += await self.open_many(share, w if direct else None)
        period = len(opened) / rate
        latencies: list[float] = []
        errors = 0
        t_start = time.perf_counter() + 0.2
        warm_until = t_start + min(1.0, seconds / 4)
        stop_at = warm_until + seconds

        async def session_loop(position: int, target: str, sid: int) -> None:
            nonlocal errors
            due = t_start + period * position / len(opened)
            while due < stop_at:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                t0 = time.perf_counter()
                try:
                    await self.step(target, sid)
                except (RuntimeError, aiohttp.ClientError):
                    errors += 1
                else:
                    if t0 >= warm_until:
                        latencies.append(time.perf_counter() - t0)
                due += period

        cpu0 = cpu_seconds(self.stack.controller_pid)
        await asyncio.gather(*(session_loop(i, t, s) for i, (t, s) in enumerate(opened)))
        cpu = cpu_seconds(self.stack.controller_pid) - cpu0
        await asyncio.gather(*(self.cancel(t, s) for t, s in opened))
        latencies.sort()
        n = len(latencies)
        return Phase(
            target=("worker (direct)" if direct else "controller") + f" @{rate:g}/s",
            concurrency=len(opened),
            held=0,
            requests=n,
            seconds=round(seconds, 2),
            rps=round(n / seconds, 1),
            p50_ms=round(percentile(latencies, 0.5) * 1e3, 2),
            p99_ms=round(percentile(latencies, 0.99) * 1e3, 2),
            controller_cpu_ms_per_request=None if direct else round(cpu / max(n, 1) * 1e3, 3),
            errors=errors,
        )

    async def starts_per_second(self, count: int, parallel: int) -> float:
        t0 = time.perf_counter()
        sessions = await self.open_many(count, None, parallel)
        rate = len(sessions) / (time.perf_counter() - t0)
        await asyncio.gather(*(self.cancel(t, s) for t, s in sessions))
        return rate

    async def hold(self, target_sessions: int, seconds: float) -> tuple[int, float, float]:
        """Open sessions up to ``target_sessions`` (or until failures/time runs out); returns
        (sessions held, controller RSS MB at that point, p50 ms of interacts probed while held)."""
        sessions: list[tuple[str, int]] = []
        deadline = time.monotonic() + seconds
        batch = 500
        while len(sessions) < target_sessions and time.monotonic() < deadline:
            try:
                sessions += await self.open_many(min(batch, target_sessions - len(sessions)), None, 200)
            except RuntimeError as exc:
                print(f"stopped opening sessions at {len(sessions)}: {exc}", file=sys.stderr)
                break
        async with self.http.get(self.stack.controller + "/health") as r:
            held = int((await r.json())["open_sessions"])
        rss = rss_mb(self.stack.controller_pid)
        probes = []
        for target, sid in sessions[:: max(1, len(sessions) // 200)]:
            t0 = time.perf_counter()
            await self.step(target, sid)
            probes.append(time.perf_counter() - t0)
        probes.sort()
        cancel_queue = iter(sessions)

        async def canceller() -> None:
            for target, sid in cancel_queue:
                await self.cancel(target, sid)

        await asyncio.gather(*(canceller() for _ in range(100)))
        return held, rss, percentile(probes, 0.5) * 1e3


async def run(args: argparse.Namespace, log_dir: Path) -> Report:
    stack = Stack(args.workers, args.worker_concurrency, log_dir)
    report = Report(
        machine={
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        settings=vars(args).copy(),
    )
    load = Load(stack)
    try:
        stack.start()
        await load.wait_ready()
        report.controller_rss_mb_idle = round(rss_mb(stack.controller_pid), 1)
        for concurrency in args.concurrency:
            for direct in (True, False):
                phase = await load.closed_loop(direct, concurrency, args.seconds, args.held)
                report.phases.append(phase)
                print(
                    f"  {phase.target:16s} c={concurrency:4d}: {phase.rps:8.1f} rps  p50 {phase.p50_ms:6.2f} ms  "
                    f"p99 {phase.p99_ms:6.2f} ms",
                    file=sys.stderr,
                )
        for rate in args.rates:
            for direct in (True, False):
                phase = await load.open_loop(direct, args.open_sessions, rate, args.seconds)
                report.phases.append(phase)
                print(
                    f"  {phase.target:22s} sessions={args.open_sessions}: {phase.rps:8.1f} rps  "
                    f"p50 {phase.p50_ms:6.2f} ms  p99 {phase.p99_ms:6.2f} ms",
                    file=sys.stderr,
                )
        report.starts_per_s = round(await load.starts_per_second(args.starts, 100), 1)
        held, rss, probe = await load.hold(args.max_sessions, args.hold_seconds)
        report.max_sessions_held = held
        report.controller_rss_mb_at_max = round(rss, 1)
        report.held_probe_p50_ms = round(probe, 2)
    finally:
        await load.http.close()
        stack.stop()
    return report


def print_table(report: Report) -> None:
    print(
        f"\nController load benchmark ({report.machine['cpus']} CPUs, Python {report.machine['python']}, "
        f"{report.settings['workers']} echo workers, all on 127.0.0.1)\n"
    )
    print("closed loop: 'conc' clients step back to back; fixed rate (@N/s): 'conc' sessions share N steps/s")
    print(
        f"{'target':22s} {'conc':>5s} {'held':>6s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} "
        f"{'+p50 ms':>8s} {'+p99 ms':>8s} {'ctl CPU ms/req':>15s}"
    )

    def key(p: Phase) -> tuple[int, int, str]:
        return p.concurrency, p.held, p.target.partition("@")[2]

    direct = {key(p): p for p in report.phases if p.target.startswith("worker")}
    for p in report.phases:
        through = p.target.startswith("controller")
        base = direct.get(key(p))
        added50 = f"{p.p50_ms - base.p50_ms:8.2f}" if through and base else f"{'':8s}"
        added99 = f"{p.p99_ms - base.p99_ms:8.2f}" if through and base else f"{'':8s}"
        cpu = (
            f"{p.controller_cpu_ms_per_request:15.3f}"
            if p.controller_cpu_ms_per_request is not None
            else f"{'':15s}"
        )
        print(
            f"{p.target:22s} {p.concurrency:5d} {p.held:6d} {p.rps:9.1f} {p.p50_ms:8.2f} {p.p99_ms:8.2f} "
            f"{added50} {added99} {cpu}"
        )
    print(f"\nsession starts/s through the controller: {report.starts_per_s:.1f}")
    print(
        f"concurrent open sessions held: {report.max_sessions_held} (interact p50 while held: "
        f"{report.held_probe_p50_ms:.2f} ms)"
    )
    print(
        f"controller RSS: {report.controller_rss_mb_idle:.1f} MB idle, {report.controller_rss_mb_at_max:.1f} MB "
        f"with {report.max_sessions_held} sessions"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2, help="echo worker processes")
    parser.add_argument("--worker-concurrency", type=int, default=6000, help="session limit per worker")
    parser.add_argument(
        "--concurrency", type=int, nargs="*", default=[10, 50, 100], help="closed-loop client counts"
    )
    parser.add_argument(
        "--held", type=int, default=1000, help="idle sessions held open during the closed-loop phases"
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per closed-loop phase")
    parser.add_argument(
        "--open-sessions", type=int, default=1000, help="sessions stepping in the fixed-rate phases"
    )
    parser.add_argument(
        "--rates",
        type=float,
        nargs="*",
        default=[500.0, 1000.0],
        help="offered interacts/s (fixed-rate phases)",
    )
    parser.add_argument("--starts", type=int, default=2000, help="sessions started for the starts/s figure")
    parser.add_argument(
        "--max-sessions", type=int, default=10000, help="open sessions to reach for the held figure"
    )
    parser.add_argument("--hold-seconds", type=float, default=60.0, help="time limit for opening them")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "controller_load.json", help="JSON output"
    )
    args = parser.parse_args(argv)
    if args.max_sessions > args.workers * args.worker_concurrency:
        parser.error("--max-sessions exceeds --workers x --worker-concurrency")
    with tempfile.TemporaryDirectory(prefix="controller-load-") as log_dir:
        report = asyncio.run(run(args, Path(log_dir)))
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = asdict(report)
    payload["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in payload["settings"].items()}
    args.out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
