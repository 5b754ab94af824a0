"""Controller CPU per request over the whole session lifecycle, per endpoint, for one or more versions.

``bench/controller_load.py`` measures interacts on sessions that are already open. A rollout also
starts every session and ends it, and those calls cost the controller more (routing, session
records, metrics). Here each endpoint is measured in its own window, all on 127.0.0.1
(controller, one echo worker, and this load generator). Requests are offered at a fixed
``--rate`` (400/s to each version by default): below saturation, and the same load for every
version compared, since CPU per request falls as load rises (the event loop does more per
wake-up); ``--rate 0`` runs ``--concurrency`` closed-loop clients as fast as they go instead:

- ``start_sample``: ``--sessions`` sessions started;
- ``interact``: ``--turns`` echo steps on each of them;
- ``interact (ends session)``: the ``finish`` step on half of them;
- ``cancel``: the other half cancelled;
- ``lifecycle``: ``--sessions`` more sessions, each start + ``--turns`` steps + finish, back to back;
- ``lifecycle, new connection per request``: the same with a new TCP connection for every request
  (what a load generator without keep-alive costs the controller).

Controller CPU comes from /proc/<pid>/stat (user + system) around each window; latencies are the
load generator's. ``--ref REV`` (repeatable) also runs the controller of git revision REV (exported
with ``git archive``; the workers stay this checkout's), so versions are compared in one run:
all versions run at once, each window offering every controller the same load at the same time
(so other load on the machine weighs on all of them alike); ``--repeat`` runs, medians shown.

Usage::

    .venv/bin/python bench/controller_lifecycle.py                     # this checkout only
    .venv/bin/python bench/controller_lifecycle.py --ref fd03a07       # side by side with fd03a07
    .venv/bin/python bench/controller_lifecycle.py --rate 0            # closed loop, 20 clients

It prints a table and writes ``bench/results/controller_lifecycle.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import aiohttp
from controller_load import cpu_seconds

from agentrl_ext.testing.env_servers import ECHO_TASK, REPO, EnvServers

CURRENT = "this checkout"


def _step(name: str, arguments: str) -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return json.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]}).encode()


ECHO = _step("echo", '{"text": "ping"}')
FINISH = _step("finish", '{"answer": "done-0"}')
START = json.dumps({"name": "echo", "index": 0}).encode()
JSON = {"content-type": "application/json"}


@dataclass
class Window:
    """One measured window: ``requests`` calls of one kind."""

    phase: str
    requests: int
    seconds: float
    cpu_ms_per_request: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float


class Api:
    """The controller API over raw aiohttp (the load generator should cost little)."""

    def __init__(self, base: str, new_connection_per_request: bool = False) -> None:
        self.base = base
        connector = aiohttp.TCPConnector(limit=0, force_close=new_connection_per_request)
        self.http = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

    async def _post(self, path: str, body: bytes | None, session_id: int | None = None) -> tuple[bytes, Any]:
        headers = dict(JSON)
        if session_id is not None:
            headers["session_id"] = str(session_id)
        async with self.http.post(self.base + path, data=body, headers=headers) as response:
            payload = await response.read()
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status}: {payload[:300]!r}")
            return payload, response.headers

    async def start(self) -> int:
        _, headers = await self._post("/start_sample", START)
        return int(headers["session_id"])

    async def step(self, session_id: int, body: bytes = ECHO) -> None:
        await self._post("/interact", body, session_id)

    async def cancel(self, session_id: int) -> None:
        await self._post("/cancel", None, session_id)

    async def close(self) -> None:
        await self.http.close()


async def measure_window(
    phase: str,
    pid: int,
    jobs: list[Any],
    job: Callable[[Any, list[float]], Awaitable[None]],
    concurrency: int,
    jobs_per_s: float | None,
) -> Window:
    """Run ``job(item, latencies)`` for every item; CPU of ``pid`` around it.

    ``jobs_per_s``: jobs start at this fixed rate (open loop, at most 1,000 at once); None: on
    ``concurrency`` closed-loop clients, as fast as the machine allows.
    """
    latencies: list[float] = []

    async def closed_loop() -> None:
        queue = iter(jobs)

        async def client() -> None:
            for item in queue:
                await job(item, latencies)

        await asyncio.gather(*(client() for _ in range(concurrency)))

    async def fixed_rate(rate: float) -> None:
        slots = asyncio.Semaphore(1000)
        start = time.perf_counter()

        async def run(item: Any) -> None:
            async with slots:
                await job(item, latencies)

        tasks = []
        for position, item in enumerate(jobs):
            delay = start + position / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(run(item)))
        await asyncio.gather(*tasks)

    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    await (closed_loop() if jobs_per_s is None else fixed_rate(jobs_per_s))
    seconds, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    latencies.sort()
    n = len(latencies)
    return Window(
        phase=phase,
        requests=n,
        seconds=round(seconds, 3),
        cpu_ms_per_request=round(cpu / n * 1e3, 4),
        requests_per_s=round(n / seconds, 1),
        p50_ms=round(latencies[n // 2] * 1e3, 3),
        p99_ms=round(latencies[min(n - 1, int(n * 0.99))] * 1e3, 3),
    )


def timed(call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
    """A job that makes one call and records its latency."""

    async def job(item: Any, latencies: list[float]) -> None:
        t0 = time.perf_counter()
        await call(item)
        latencies.append(time.perf_counter() - t0)

    return job


def lifecycle(api: Api, turns: int) -> Callable[[Any, list[float]], Awaitable[None]]:
    """A job that plays one whole session: start, ``turns`` echo steps, finish."""

    async def job(_: Any, latencies: list[float]) -> None:
        t0 = time.perf_counter()
        session_id = await api.start()
        latencies.append(time.perf_counter() - t0)
        for body in [ECHO] * turns + [FINISH]:
            t0 = time.perf_counter()
            await api.step(session_id, body)
            latencies.append(time.perf_counter() - t0)

    return job


async def run_once(
    controller_api: str, pid: int, args: argparse.Namespace, barrier: asyncio.Barrier
) -> list[Window]:
    """Every phase once against a running controller; each window starts when every version's
    run reaches it (``barrier``), so the versions share the machine's state window by window."""

    async def measure(*window: Any) -> Window:
        await barrier.wait()
        return await measure_window(*window)

    api = Api(controller_api)
    fresh = Api(controller_api, new_connection_per_request=True)
    c, n, turns = args.concurrency, args.sessions, args.turns
    rate = args.rate or None  # requests/s; a whole session is turns + 2 requests
    session_rate = rate / (turns + 2) if rate else None
    try:
        warm = [await api.start() for _ in range(c)]
        await asyncio.gather(*(api.cancel(s) for s in warm))
        started: list[int] = []

        async def start(_: Any) -> None:
            started.append(await api.start())

        windows = [await measure("start_sample", pid, list(range(n)), timed(start), c, rate)]
        steps = [s for _ in range(turns) for s in started]
        windows.append(await measure("interact", pid, steps, timed(api.step), c, rate))
        half = len(started) // 2
        finish = timed(lambda s: api.step(s, FINISH))
        windows.append(await measure("interact (ends session)", pid, started[:half], finish, c, rate))
        windows.append(await measure("cancel", pid, started[half:], timed(api.cancel), c, rate))
        whole = await measure("lifecycle", pid, list(range(n)), lifecycle(api, turns), c, session_rate)
        windows.append(whole)
        per_session = whole.cpu_ms_per_request * whole.requests / n
        windows.append(
            Window(
                "lifecycle, per session",
                n,
                whole.seconds,
                round(per_session, 4),
                round(n / whole.seconds, 1),
                0,
                0,
            )
        )
        few = max(c, n // 4)
        fresh_sessions = lifecycle(fresh, turns)
        windows.append(
            await measure(
                "lifecycle, new connection per request",
                pid,
                list(range(few)),
                fresh_sessions,
                c,
                session_rate,
            )
        )
        return windows
    finally:
        await api.close()
        await fresh.close()


def export_revision(rev: str, into: Path) -> Path:
    """``agentrl_ext`` of git revision ``rev`` under ``into/<rev>``; returns that folder."""
    target = into / rev.replace("/", "_")
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "agentrl_ext"],
        capture_output=True,
        check=True,
    ).stdout
    target.mkdir(parents=True)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def run_versions(
    versions: dict[str, Path | None], args: argparse.Namespace, log_dir: Path
) -> dict[str, list[Window]]:
    """Start one controller (of ``code_dir``, else this checkout) and one echo worker per version,
    all at once, and measure them side by side: each window offers every controller the same load
    at the same time. Stops them all."""
    with ExitStack() as stack:
        controllers = {}
        for label, code_dir in versions.items():
            servers = stack.enter_context(EnvServers(log_dir / label.replace(" ", "_").replace("/", "_")))
            controller = servers.controller(idle_timeout=3600, log_level="warning", code_dir=code_dir)
            servers.worker(
                controller,
                ECHO_TASK,
                task_kwargs={"max_turns": 10**9},
                concurrency=10 * args.sessions,
                heartbeat_interval=1.0,
                log_level="warning",
            )
            servers.wait_routable(controller, "echo")
            controllers[label] = controller

        async def measure_all() -> list[list[Window]]:
            barrier = asyncio.Barrier(len(controllers))
            return await asyncio.gather(
                *(run_once(c.api, c.pid, args, barrier) for c in controllers.values())
            )

        return dict(zip(controllers, asyncio.run(measure_all()), strict=True))


def summarize(runs: dict[str, list[list[Window]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Median of each figure over the repeats, per version and phase."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for label, repeats in runs.items():
        for position, first in enumerate(repeats[0]):
            cells = [windows[position] for windows in repeats]
            table.setdefault(first.phase, {})[label] = {
                key: statistics.median(getattr(w, key) for w in cells)
                for key in ("cpu_ms_per_request", "requests_per_s", "p50_ms", "p99_ms")
            }
    return table


def print_table(
    table: dict[str, dict[str, dict[str, float]]], labels: list[str], args: argparse.Namespace
) -> None:
    print(
        f"\nController CPU per request, ms (median of {args.repeat}); "
        + (f"{args.rate:g} requests/s offered" if args.rate else f"{args.concurrency} closed-loop clients")
        + f", {args.sessions} sessions, {args.turns} echo steps per session; {os.cpu_count()} CPUs, all on 127.0.0.1\n"
    )
    header = f"{'endpoint':40s}" + "".join(f"{label[:22]:>24s}" for label in labels)
    if len(labels) > 1:
        header += f"{'change':>12s}"
    print(header)
    for phase, cells in table.items():
        row = f"{phase:40s}"
        values = [cells[label]["cpu_ms_per_request"] for label in labels]
        for label, value in zip(labels, values, strict=True):
            extra = "" if phase.endswith("per session") else f" ({cells[label]['requests_per_s']:.0f}/s)"
            row += f"{value:>12.3f}{extra:>12s}"
        if len(labels) > 1:
            row += f"{(values[0] - values[1]) * 1e3:>+10.0f}µs"
        print(row)
    if len(labels) > 1:
        print(
            f"\nchange: {labels[0]} minus {labels[1]}, controller CPU per request (per session in that row)"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ref", action="append", default=[], help="also run the controller of this git revision"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=400.0,
        help="offered requests/s in every window (fixed rate, so versions are compared at the same load); "
        "0: closed loop, as fast as --concurrency clients go",
    )
    parser.add_argument("--concurrency", type=int, default=20, help="closed-loop clients (with --rate 0)")
    parser.add_argument("--sessions", type=int, default=1500, help="sessions per phase")
    parser.add_argument("--turns", type=int, default=3, help="echo steps per session")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per version (alternating); medians reported"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench" / "results" / "controller_lifecycle.json",
        help="JSON output",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="controller-lifecycle-") as tmp:
        versions: dict[str, Path | None] = {CURRENT: None}
        for rev in args.ref:
            versions[rev] = export_revision(rev, Path(tmp))
        runs: dict[str, list[list[Window]]] = {label: [] for label in versions}
        for repeat in range(args.repeat):
            for label, windows in run_versions(versions, args, Path(tmp) / f"logs-{repeat}").items():
                runs[label].append(windows)
                print(
                    f"[{repeat + 1}/{args.repeat}] {label}: "
                    + ", ".join(f"{w.phase} {w.cpu_ms_per_request:.3f}" for w in windows),
                    file=sys.stderr,
                )
    table = summarize(runs)
    labels = list(versions)
    print_table(table, labels, args)
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "agentrl_ext"], capture_output=True, text=True
    )
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "this_checkout": {"head": head.stdout.strip(), "agentrl_ext_modified": bool(dirty.stdout.strip())},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "median": table,
        "runs": {
            label: [[asdict(w) for w in windows] for windows in repeats] for label, repeats in runs.items()
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
