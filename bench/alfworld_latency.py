"""alfworld benchmark: start_sample and per-step latency, memory per session, through controller -> worker.

Everything runs on 127.0.0.1: one controller and one alfworld worker (``new_std``). The client
(this process) speaks the raw AgentRL protocol. Measured:

- ``start_sample`` latency over ``--games`` games (the first of ``new_std``'s task types in turn):
  the game's process is forked and the game translated from PDDL there;
- ``take_action`` latency over ``--steps`` steps per game (the ``go to ...`` commands of the
  opening list, so every step moves and changes the admissible commands);
- memory per open session: with ``--open`` sessions held, the proportional set size (PSS: shared
  pages split between the processes sharing them) of the worker, its zygote and the game
  processes, minus the same with no session, divided by ``--open``; plus one game process's RSS.

Usage (bounded: a few minutes on 2 busy cores)::

    .venv/bin/python bench/alfworld_latency.py   # prints a table, writes bench/results/alfworld_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from agentrl_ext.envs.alfworld.data import LISTS_DIR, load_split
from agentrl_ext.envs.alfworld.engine import engine_missing
from latency_stats import percentiles

from agentrl_ext.data.store import install_from
from agentrl_ext.env.data_files import DataError, data_dir, require
from agentrl_ext.testing.env_servers import REPO, EnvServers

TASK = "agentrl_ext.envs.alfworld.task:ALFWorldTask"
SHARED_DATA = REPO.parent / "shared" / "data"


def memory_kb(pid: int, field: str) -> int:
    """``Pss`` (smaps_rollup) or ``VmRSS`` (status) of ``pid`` in kB; 0 if it is gone."""
    source = "smaps_rollup" if field == "Pss" else "status"
    try:
        for line in Path(f"/proc/{pid}/{source}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def action(text: str, number: int) -> dict[str, Any]:
    arguments = json.dumps({"action": text})
    tool_call = {
        "id": f"c{number}",
        "type": "function",
        "function": {"name": "take_action", "arguments": arguments},
    }
    return {"messages": [{"role": "assistant", "content": None, "tool_calls": [tool_call]}]}


def timed_post(http: httpx.Client, url: str, **kwargs: Any) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = http.post(url, **kwargs)
    elapsed = (time.perf_counter() - start) * 1000
    response.raise_for_status()
    return response, elapsed


def go_to_commands(opening: dict[str, Any]) -> list[str]:
    listed = opening["messages"][1]["content"].split(" AVAILABLE ACTIONS: ")[1].splitlines()
    return [command for command in listed if command.startswith("go to ")]


def run(root: Path, data: Path, games: int, steps: int, open_sessions: int) -> dict[str, Any]:
    split = load_split("new_std", data)
    by_type: dict[str, list[int]] = {}
    for index in split.indices:
        by_type.setdefault(split.game(index).task_type, []).append(index)
    order = [index for group in zip(*by_type.values(), strict=False) for index in group][:games]
    with EnvServers(root) as servers:
        controller = servers.controller(log_level="warning")
        started = time.perf_counter()
        worker = servers.worker(controller, TASK, task_kwargs={"data_dir": str(data)}, log_level="warning")
        servers.wait_routable(controller, "alfworld", timeout_s=120)
        worker_start_s = time.perf_counter() - started
        api = controller.api
        http = httpx.Client(timeout=300)
        start_ms, step_ms = [], []
        for index in order:
            response, elapsed = timed_post(
                http, f"{api}/start_sample", json={"name": "alfworld", "index": index}
            )
            start_ms.append(elapsed)
            session = response.headers["session_id"]
            for number, command in enumerate(go_to_commands(response.json())[:steps]):
                answer, elapsed = timed_post(
                    http, f"{api}/interact", headers={"session_id": session}, json=action(command, number)
                )
                step_ms.append(elapsed)
                if answer.json()["finish"]:
                    break
            http.post(f"{api}/cancel", headers={"session_id": session})
        time.sleep(3.0)  # cancelled games' processes exit
        idle_pss = sum(memory_kb(pid, "Pss") for pid in tree(worker.pid))
        sessions = []
        for number in range(open_sessions):
            response, _ = timed_post(
                http, f"{api}/start_sample", json={"name": "alfworld", "index": order[number % len(order)]}
            )
            sessions.append(response.headers["session_id"])
        processes = tree(worker.pid)
        loaded_pss = sum(memory_kb(pid, "Pss") for pid in processes)
        game_rss = max(memory_kb(pid, "VmRSS") for pid in processes[2:]) if len(processes) > 2 else 0
        for session in sessions:
            http.post(f"{api}/cancel", headers={"session_id": session})
        return {
            "split": "new_std",
            "games": order,
            "worker_start_s": round(worker_start_s, 2),
            "start_sample": percentiles(start_ms, 1),
            "take_action": percentiles(step_ms, 1),
            "open_sessions": open_sessions,
            "pss_idle_mb": round(idle_pss / 1024, 1),
            "pss_with_open_sessions_mb": round(loaded_pss / 1024, 1),
            "mb_per_session": round((loaded_pss - idle_pss) / 1024 / open_sessions, 1),
            "game_process_rss_mb": round(game_rss / 1024, 1),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="data directory (default: agentrl-data's)")
    parser.add_argument("--games", type=int, default=12, help="games played (task types in turn)")
    parser.add_argument("--steps", type=int, default=5, help="take_action steps per game")
    parser.add_argument("--open", type=int, default=8, help="sessions held open for the memory figure")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "alfworld_latency.json"))
    args = parser.parse_args(argv)
    missing = engine_missing()
    if missing is not None:
        print(missing)
        return 1
    with tempfile.TemporaryDirectory(prefix="alfworld-bench-") as tmp:
        data = data_dir(args.data_dir)
        try:
            require(f"{LISTS_DIR}/new_std.json", data)
            require("alfworld/json_2.1.1.tar.xz", data)
        except DataError:
            if not (SHARED_DATA / "SHA256SUMS").is_file():
                raise
            data = Path(tmp) / "data"
            install_from(SHARED_DATA, data)
        result = run(Path(tmp) / "run", data, args.games, args.steps, args.open)
    s, a = result["start_sample"], result["take_action"]
    print(f"{'start_sample p50/p95':>22}{'take_action p50/p95':>22}{'MB/session (PSS)':>18}{'game RSS':>10}")
    print(
        f"{s['p50_ms']:>12.0f} / {s['p95_ms']:<6.0f} ms{a['p50_ms']:>10.0f} / {a['p95_ms']:<6.0f} ms"
        f"{result['mb_per_session']:>14.1f}{result['game_process_rss_mb']:>12.0f}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }
    out.write_text(json.dumps({"machine": machine, "results": result}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
