"""Time from a worker's hang (SIGSTOP) to the ``task error`` answer of an interact in flight to it.

Default settings everywhere (controller: ``heartbeat_timeout_s`` 25 s, checks every 1 s; echo
worker: a heartbeat every 8 s), all on 127.0.0.1. Each run starts a session, stops the worker
with SIGSTOP, sends one interact at once (so it is forwarded to the hung worker) and measures:

- SIGSTOP -> answer: what the agent loop waits (the loss detection: 17 to 26 s, by where in its
  8 s heartbeat cycle the worker hung; run i hangs it i/runs of a cycle after a heartbeat);
- loss -> answer: from the controller's log line declaring the worker lost to the answer; the
  calls in flight should end with the loss, not at a timeout.

``--ref REV`` also runs the controller of git revision REV (its answer is awaited up to
``--client-timeout`` seconds). Prints a table; writes ``bench/results/hung_worker.json``.

Usage::

    .venv/bin/python bench/hung_worker.py --runs 3 [--ref fd03a07]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from controller_lifecycle import export_revision

from agentrl_ext.env.client import ControllerClient, ControllerUnavailable
from agentrl_ext.env.protocol import HEARTBEAT_INTERVAL_S
from agentrl_ext.testing.env_servers import ECHO_TASK, REPO, EnvServers

STEP = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": '{"text": "x"}'}}
        ],
    }
]


def lost_at(log: Path) -> float | None:
    """Wall-clock time of the controller's log line that declares the worker lost."""
    for line in log.read_text(errors="replace").splitlines():
        if "is unhealthy" in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


async def one_run(
    servers: EnvServers, code_dir: Path | None, client_timeout_s: float, phase: float
) -> dict[str, Any]:
    controller = servers.controller(code_dir=code_dir, log_level="warning")
    worker = servers.worker(
        controller, ECHO_TASK, heartbeat_interval=HEARTBEAT_INTERVAL_S, log_level="warning"
    )
    servers.wait_routable(controller, "echo")
    joined = time.monotonic()  # the worker's heartbeats went out from about now, every 8 s
    try:
        async with ControllerClient(controller.api, timeout_s=client_timeout_s) as client:
            started = await client.start_sample("echo", 0)
            await asyncio.sleep(max(0.0, joined + phase * HEARTBEAT_INTERVAL_S - time.monotonic()))
            worker.pause()
            paused_at = time.monotonic()
            try:
                answer = await client.interact(started.session_id, STEP)
                outcome = f"{answer.status.value}: {answer.error}"
            except ControllerUnavailable as exc:
                outcome = f"no answer: {exc}"
            answered_at, answered_wall = time.monotonic(), time.time()
        loss = lost_at(controller.log_path)
        return {
            "sigstop_to_answer_s": round(answered_at - paused_at, 2),
            "loss_to_answer_s": round(answered_wall - loss, 3) if loss is not None else None,
            "answer": outcome,
        }
    finally:
        worker.kill()
        controller.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of this checkout")
    parser.add_argument("--ref", default=None, help="also run (once) the controller of this git revision")
    parser.add_argument("--client-timeout", type=float, default=90.0, help="longest wait for an answer, s")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "hung_worker.json")
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="hung-worker-") as tmp:
        versions: list[tuple[str, Path | None, int]] = [("this checkout", None, args.runs)]
        if args.ref:
            versions.append((args.ref, export_revision(args.ref, Path(tmp)), 1))
        for label, code_dir, runs in versions:
            for run in range(runs):
                with EnvServers(Path(tmp) / f"logs-{label}-{run}") as servers:
                    phase = (run + 0.5) / runs
                    result = asyncio.run(one_run(servers, code_dir, args.client_timeout, phase))
                results.setdefault(label, []).append(result)
                print(f"{label} run {run + 1}: {result}", file=sys.stderr)
    print(f"\n{'controller':16s} {'SIGSTOP -> answer':>18s} {'loss -> answer':>15s}  answer")
    for label, rows in results.items():
        for row in rows:
            loss = f"{row['loss_to_answer_s']:.3f} s" if row["loss_to_answer_s"] is not None else "-"
            print(f"{label:16s} {row['sigstop_to_answer_s']:>16.2f} s {loss:>15s}  {row['answer'][:90]}")
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": "controller and worker defaults (heartbeat_timeout_s 25, check_interval_s 1, heartbeat every 8 s)",
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
