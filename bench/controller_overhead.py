"""The controller's own CPU per request, in process: its HTTP layer and logic without sockets.

A cross-check of ``bench/controller_lifecycle.py`` that other load on the machine hardly moves:
the controller's ASGI app is called directly (no server, no network), with the worker calls
answered by a stub, for every step of a session's lifecycle (start_sample, interact, the
interact that ends the session, cancel). What is left out (uvicorn's HTTP parsing, the sockets,
the aiohttp call to the worker) is the same code whatever the controller's HTTP layer.

``--ref REV`` (repeatable) also measures the controller of git revision REV; all versions run at
the same time, each in its own process; the best of ``--repeat`` rounds is reported, in µs of
process CPU per request.

Usage::

    .venv/bin/python bench/controller_overhead.py --ref fd03a07

Writes ``bench/results/controller_overhead.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CURRENT = "this checkout"


def _step(name: str, arguments: str) -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return json.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]}).encode()


ECHO, FINISH = _step("echo", '{"text": "ping"}'), _step("finish", '{"answer": "done-0"}')
START = b'{"name": "echo", "index": 0}'
OPENING = json.dumps(
    {
        "messages": [{"role": "system", "content": "Use the echo tool."}, {"role": "user", "content": "Go."}],
        "tools": [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}],
        "status": "running",
        "finish": False,
        "reward": 0.0,
        "metric": {},
    }
).encode()


def _turn(session_id: int, finish: bool) -> bytes:
    env_out = {
        "messages": [{"role": "tool", "tool_call_id": "c1", "content": "ping"}],
        "status": "completed" if finish else "running",
        "finish": finish,
        "reward": float(finish),
        "metric": {},
    }
    return json.dumps({"session_id": session_id, "env_out": env_out}).encode()


async def stub_worker(
    method: str, address: str, path: str, body: bytes | None, timeout_s: float
) -> tuple[int, bytes]:
    """What an echo worker answers, without the worker."""
    if path == "/start_sample":
        return 200, OPENING
    if path == "/interact":
        assert body is not None
        return 200, _turn(json.loads(body)["session_id"], b'"finish"' in body)
    if path == "/worker_status":  # asked before a joining worker is trusted
        return 200, b'{"concurrency": 1000000, "current": 0}'
    return 200, b"{}"


def _load_asgi_caller() -> Any:
    """``agentrl_ext/testing/asgi.py`` of this checkout, loaded from its file: the revisions of
    ``--ref`` (which may predate it) are called by the same code as this one."""
    path = REPO / "agentrl_ext" / "testing" / "asgi.py"
    spec = importlib.util.spec_from_file_location("controller_overhead_asgi", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


asgi = _load_asgi_caller()


async def call(app: Any, path: str, body: bytes, session_id: int | None = None) -> Any:
    """One POST straight into the ASGI app; its answer (status, headers)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if session_id is not None:
        headers.append((b"session_id", str(session_id).encode()))
    answer = await asgi.call_asgi(app, path, body, headers)
    assert answer.status == 200, (path, answer)
    return answer


async def measure(sessions: int, rounds: int) -> dict[str, float]:
    """Best of ``rounds``: µs of process CPU per request, per endpoint (run inside the version's process)."""
    from agentrl_ext.env.controller import ControllerConfig, ControllerService, create_app
    from agentrl_ext.env.protocol import HeartbeatRequest

    service = ControllerService(ControllerConfig())
    service.upstream.request = stub_worker  # type: ignore[method-assign]
    app = create_app(service=service)
    await service.start()
    beat = HeartbeatRequest(
        name="echo", address="http://stub/api", concurrency=10**6, indices=list(range(100))
    )
    await service.receive_heartbeat(beat)
    best: dict[str, float] = {}

    async def timed(name: str, calls: list[tuple[str, bytes, int | None]]) -> list[Any]:
        t0 = time.process_time()
        answers = [await call(app, *c) for c in calls]
        best[name] = min(best.get(name, float("inf")), (time.process_time() - t0) / len(calls) * 1e6)
        return answers

    for _ in range(rounds):
        started = await timed("start_sample", [("/api/start_sample", START, None)] * sessions)
        ids = [int(a.headers[b"session_id"]) for a in started]
        await timed("interact", [("/api/interact", ECHO, s) for _ in range(3) for s in ids])
        half = len(ids) // 2
        await timed("interact (ends session)", [("/api/interact", FINISH, s) for s in ids[:half]])
        await timed("cancel", [("/api/cancel", b"", s) for s in ids[half:]])
    await service.stop()
    return {name: round(value, 1) for name, value in best.items()}


def start_version(code_dir: Path | None, args: argparse.Namespace) -> subprocess.Popen[str]:
    """Start measuring in a fresh process that imports ``agentrl_ext`` from ``code_dir`` (else this checkout)."""
    root = str(code_dir or REPO)
    program = (
        f"import sys; sys.path.insert(0, {root!r}); sys.path.insert(1, {str(Path(__file__).parent)!r})\n"
        "import agentrl_ext, asyncio, json, controller_overhead as bench\n"
        f"assert agentrl_ext.__file__.startswith({root!r}), agentrl_ext.__file__\n"
        f"print(json.dumps(asyncio.run(bench.measure({args.sessions}, {args.repeat}))))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root
    )


def result_of(label: str, process: subprocess.Popen[str]) -> dict[str, float]:
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"measuring {label} failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    from controller_lifecycle import export_revision

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ref", action="append", default=[], help="also measure the controller of this git revision"
    )
    parser.add_argument("--sessions", type=int, default=3000, help="sessions per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; the best is reported")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "controller_overhead.json")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="controller-overhead-") as tmp:
        versions: dict[str, Path | None] = {CURRENT: None}
        for rev in args.ref:
            versions[rev] = export_revision(rev, Path(tmp))
        # All versions at once (one process each), so other load on the machine weighs on all alike.
        running = {label: start_version(code_dir, args) for label, code_dir in versions.items()}
        results = {label: result_of(label, process) for label, process in running.items()}
    labels = list(results)
    print("\nController CPU per request in process (no sockets; worker stubbed), µs, best of", args.repeat)
    print(
        f"{'endpoint':28s}"
        + "".join(f"{label[:16]:>18s}" for label in labels)
        + ("  change" if len(labels) > 1 else "")
    )
    for endpoint in results[CURRENT]:
        values = [results[label][endpoint] for label in labels]
        change = f"  {values[0] - values[1]:+.1f}" if len(values) > 1 else ""
        print(f"{endpoint:28s}" + "".join(f"{v:>18.1f}" for v in values) + change)
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "us_per_request": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
