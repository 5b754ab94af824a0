"""kg benchmark: worker start-up, latency per tool and memory per session, through controller -> worker.

Everything runs on 127.0.0.1: one controller and one kg worker (offline graph, ``--split``).
The client (this process) speaks the raw AgentRL protocol and plays every question of the split
with its gold action sequence, then ``Final Answer: #k``. Measured:

- worker start-up: from process start until it listens (graph build + question generation);
- ``start_sample`` latency; per-step latency of each tool and of the final answer (scoring);
- gold accuracy over the split (reward 1 expected for every question);
- memory per open session: worker RSS with ``--open`` sessions held (each after its gold
  actions, so its variables are cached), minus idle RSS.

Usage (bounded: well under a minute)::

    .venv/bin/python bench/kg_latency.py      # prints a table, writes bench/results/kg_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from agentrl_ext.envs.kg.offline import build_offline_graph
from agentrl_ext.envs.kg.questions import generate_questions, split_questions
from latency_stats import percentiles, rss_mb

from agentrl_ext.testing.env_servers import REPO, EnvServers

TASK = "agentrl_ext.envs.kg.task:KGTask"
PARAMETERS = {
    "get_relations": ["variable"],
    "get_neighbors": ["variable", "relation"],
    "intersection": ["variable1", "variable2"],
    "get_attributes": ["variable"],
    "argmax": ["variable", "attribute"],
    "argmin": ["variable", "attribute"],
    "count": ["variable"],
}


def step_message(action: str) -> tuple[str, dict[str, Any]]:
    """AgentBench's action notation as an assistant message with one tool call."""
    match = re.fullmatch(r"(\w+)\((.*)\)", action)
    assert match, action
    name, values = match.group(1), match.group(2).split(",")
    arguments = json.dumps(dict(zip(PARAMETERS[name], values, strict=True)))
    call = {"id": "c0", "type": "function", "function": {"name": name, "arguments": arguments}}
    return name, {"role": "assistant", "content": None, "tool_calls": [call]}


def timed_post(http: httpx.Client, url: str, **kwargs: Any) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = http.post(url, **kwargs)
    elapsed = (time.perf_counter() - start) * 1000
    response.raise_for_status()
    return response, elapsed


def play(
    http: httpx.Client, api: str, index: int, actions: tuple[str, ...], timings: dict[str, list[float]]
) -> str:
    """Start ``index`` and run its gold actions; returns the session id (the session stays open)."""
    response, ms = timed_post(http, f"{api}/start_sample", json={"name": "kg", "index": index})
    timings["start_sample"].append(ms)
    session = response.headers["session_id"]
    for action in actions:
        name, message = step_message(action)
        _, ms = timed_post(
            http, f"{api}/interact", headers={"session_id": session}, json={"messages": [message]}
        )
        timings[name].append(ms)
    return session


def run(split: str, root: Path, open_sessions: int) -> dict[str, Any]:
    questions = split_questions(generate_questions(build_offline_graph()), seed=0)[split]
    with EnvServers(root / "logs") as servers, httpx.Client(timeout=60) as http:
        controller = servers.controller(log_level="warning")
        started = time.perf_counter()
        worker = servers.worker(controller, TASK, task_kwargs={"split": split}, log_level="warning")
        startup_s = time.perf_counter() - started
        servers.wait_routable(controller, "kg")
        api = controller.api
        timings: dict[str, list[float]] = defaultdict(list)
        failed = []
        for index, question in enumerate(questions):
            session = play(http, api, index, question.actions, timings)
            variables = sum(
                1 for a in question.actions if not a.startswith(("get_relations(", "get_attributes("))
            )
            final = {"role": "assistant", "content": f"Final Answer: #{variables - 1}"}
            response, ms = timed_post(
                http, f"{api}/interact", headers={"session_id": session}, json={"messages": [final]}
            )
            timings["final_answer"].append(ms)
            if response.json()["reward"] != 1.0:
                failed.append(index)
        idle = rss_mb(worker.pid)
        held = [
            play(http, api, i % len(questions), questions[i % len(questions)].actions, defaultdict(list))
            for i in range(open_sessions)
        ]
        loaded = rss_mb(worker.pid)
        for session in held:
            http.post(f"{api}/cancel", headers={"session_id": session})
        tools = sorted(k for k in timings if k not in ("start_sample", "final_answer"))
        every_step = [ms for name in tools for ms in timings[name]]
        return {
            "split": split,
            "questions": len(questions),
            "gold_reward_1": len(questions) - len(failed),
            "gold_not_1": failed,
            "worker_startup_s": round(startup_s, 2),
            "start_sample": percentiles(timings["start_sample"]),
            "tool_step": percentiles(every_step),
            "per_tool": {name: percentiles(timings[name]) for name in tools},
            "final_answer": percentiles(timings["final_answer"]),
            "rss_idle_mb": round(idle, 1),
            "rss_with_open_sessions_mb": round(loaded, 1),
            "open_sessions": open_sessions,
            "mb_per_session": round((loaded - idle) / open_sessions, 3),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="test", choices=["test", "dev", "train"])
    parser.add_argument("--open", type=int, default=32, help="sessions held open for the memory figure")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "kg_latency.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kg-bench-") as tmp:
        r = run(args.split, Path(tmp), args.open)
    s, t, f = r["start_sample"], r["tool_step"], r["final_answer"]
    print(
        f"kg {r['split']}: gold reward 1 on {r['gold_reward_1']}/{r['questions']}; worker start-up {r['worker_startup_s']} s"
    )
    print(f"  start_sample p50/p95 {s['p50_ms']:.2f} / {s['p95_ms']:.2f} ms")
    print(f"  tool step    p50/p95 {t['p50_ms']:.2f} / {t['p95_ms']:.2f} ms (n={t['n']})")
    for name, p in r["per_tool"].items():
        print(f"    {name:<15} p50/p95 {p['p50_ms']:.2f} / {p['p95_ms']:.2f} ms (n={p['n']})")
    print(f"  final answer p50/p95 {f['p50_ms']:.2f} / {f['p95_ms']:.2f} ms")
    print(
        f"  memory: idle {r['rss_idle_mb']} MB, {r['mb_per_session']} MB per open session ({r['open_sessions']} open)"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 1),  # the machine is shared: figures scale with it
    }
    out.write_text(json.dumps({"machine": machine, "results": [r]}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
