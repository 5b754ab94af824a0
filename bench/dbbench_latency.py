"""dbbench benchmark: latency and memory per session, SQLite vs MariaDB, through controller -> worker.

Everything runs on 127.0.0.1: one controller, one dbbench worker per backend (and, for MariaDB,
a private server started with ``scripts/mariadb.sh`` in a temporary folder). The client (this
process) speaks the raw AgentRL protocol and plays every ``standard`` sample with its gold
answer: ``execute_sql`` of a ``SELECT COUNT(*)``, then the gold SQL for INSERT/UPDATE (or the
label committed for questions). Measured per backend:

- ``start_sample`` latency (the episode's fresh database is created and loaded here);
- per-step latency of ``execute_sql`` and of ``commit_final_answer`` (scoring, table hash);
- gold accuracy over the 300 samples (reward 1 expected, except known data/dialect cases);
- memory per open session: worker RSS (+ mariadbd RSS) with ``--open`` sessions held, minus idle.

Usage (bounded: about a minute)::

    .venv/bin/python bench/dbbench_latency.py      # prints a table, writes bench/results/dbbench_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from agentrl_ext.envs.dbbench.data import load_split
from latency_stats import percentiles, rss_mb

from agentrl_ext.data.store import install_from
from agentrl_ext.env.data_files import DataError, data_dir, require
from agentrl_ext.testing.env_servers import REPO, EnvServers

TASK = "agentrl_ext.envs.dbbench.task:DBBenchTask"
SHARED_DATA = REPO.parent / "shared" / "data"


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }


def timed_post(http: httpx.Client, url: str, **kwargs: Any) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = http.post(url, **kwargs)
    elapsed = (time.perf_counter() - start) * 1000
    response.raise_for_status()
    return response, elapsed


def run_backend(backend: str, root: Path, data: Path, open_sessions: int) -> dict[str, Any]:
    samples = load_split("standard", data)[1]
    kwargs: dict[str, Any] = {"data_dir": str(data), "backend": backend}
    server_pid = None
    env = {
        **os.environ,
        "AGENTRL_MARIADB_DIR": str(root / "mariadb"),
        "AGENTRL_MARIADB_RUN": str(root / "run"),
    }
    script = ["bash", str(REPO / "scripts" / "mariadb.sh")]
    if backend == "mariadb":
        url = subprocess.run([*script, "start"], env=env, capture_output=True, text=True, check=True).stdout
        kwargs["mariadb_url"] = url.strip().splitlines()[-1]
        server_pid = int((root / "run" / "mariadbd.pid").read_text())
    try:
        with EnvServers(root / "logs") as servers, httpx.Client(timeout=60) as http:
            controller = servers.controller(log_level="warning")
            worker = servers.worker(controller, TASK, task_kwargs=kwargs, log_level="warning")
            servers.wait_routable(controller, "dbbench")
            api = controller.api
            starts, steps, commits, rewards = [], [], [], {}
            for index, sample in enumerate(samples):
                response, ms = timed_post(
                    http, f"{api}/start_sample", json={"name": "dbbench", "index": index}
                )
                starts.append(ms)
                session = {"session_id": response.headers["session_id"]}
                count = call("execute_sql", {"query": f"SELECT COUNT(*) FROM `{sample.tables[0].name}`"})
                steps.append(
                    timed_post(http, f"{api}/interact", headers=session, json={"messages": [count]})[1]
                )
                if sample.modifies:
                    gold = call("execute_sql", {"query": sample.gold_sql})
                    steps.append(
                        timed_post(http, f"{api}/interact", headers=session, json={"messages": [gold]})[1]
                    )
                    answer = call("commit_final_answer", {"answers": ["done"]})
                else:
                    answer = call("commit_final_answer", {"answers": list(sample.label)})
                response, ms = timed_post(
                    http, f"{api}/interact", headers=session, json={"messages": [answer]}
                )
                commits.append(ms)
                rewards[index] = response.json()["reward"]
            # memory: idle, then with `open_sessions` sessions open (each holds its database)
            idle = rss_mb(worker.pid) + (rss_mb(server_pid) if server_pid else 0.0)
            held = []
            for index in range(open_sessions):
                response, _ = timed_post(
                    http, f"{api}/start_sample", json={"name": "dbbench", "index": index}
                )
                held.append(response.headers["session_id"])
            loaded = rss_mb(worker.pid) + (rss_mb(server_pid) if server_pid else 0.0)
            for session_id in held:
                http.post(f"{api}/cancel", headers={"session_id": session_id})
            failed = sorted(i for i, r in rewards.items() if r != 1.0)
            return {
                "backend": backend,
                "start_sample": percentiles(starts),
                "execute_sql": percentiles(steps),
                "commit_final_answer": percentiles(commits),
                "gold_reward_1": len(samples) - len(failed),
                "samples": len(samples),
                "gold_not_1": failed,
                "rss_idle_mb": round(idle, 1),
                "rss_with_open_sessions_mb": round(loaded, 1),
                "open_sessions": open_sessions,
                "mb_per_session": round((loaded - idle) / open_sessions, 3),
                "worker_rss_mb": round(rss_mb(worker.pid), 1),
                "server_rss_mb": round(rss_mb(server_pid), 1) if server_pid else None,
            }
    finally:
        if backend == "mariadb":
            subprocess.run([*script, "stop"], env=env, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="data directory (default: agentrl-data's)")
    parser.add_argument("--backends", default="sqlite,mariadb")
    parser.add_argument("--open", type=int, default=32, help="sessions held open for the memory figure")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "dbbench_latency.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dbbench-bench-") as tmp:
        data = data_dir(args.data_dir)
        try:
            require("agentbench/dbbench/standard.jsonl", data)
        except DataError:
            if not (SHARED_DATA / "SHA256SUMS").is_file():
                raise
            data = Path(tmp) / "data"
            install_from(SHARED_DATA, data)
        backends = [b for b in args.backends.split(",") if b]
        if "mariadb" in backends and shutil.which("mariadbd") is None:
            print("mariadbd not installed (scripts/mariadb.sh install): skipping the mariadb backend")
            backends.remove("mariadb")
        results = [run_backend(b, Path(tmp) / b, data, args.open) for b in backends]
    print(
        f"{'backend':<9}{'start_sample p50/p95':>22}{'execute_sql p50/p95':>22}{'commit p50/p95':>18}"
        f"{'gold=1':>9}{'MB/session':>12}{'RSS idle':>10}"
    )
    for r in results:
        s, e, c = r["start_sample"], r["execute_sql"], r["commit_final_answer"]
        print(
            f"{r['backend']:<9}{s['p50_ms']:>12.1f} / {s['p95_ms']:<6.1f} ms{e['p50_ms']:>10.1f} / {e['p95_ms']:<6.1f} ms"
            f"{c['p50_ms']:>7.1f} / {c['p95_ms']:<5.1f} ms{r['gold_reward_1']:>5}/{r['samples']:<4}"
            f"{r['mb_per_session']:>10.2f}{r['rss_idle_mb']:>10.0f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    out.write_text(json.dumps({"machine": machine, "results": results}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
