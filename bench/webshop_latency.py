"""webshop benchmark: start_sample and per-step latency, and worker memory, through controller -> worker.

Everything runs on 127.0.0.1: one controller and one webshop worker (test split). The client
(this process) speaks the raw AgentRL protocol and plays every test goal along the gold path:
``search_action`` with the product's title, ``click_action`` on its ASIN, on each goal option,
then ``Buy Now``. Measured:

- worker start: from launching the process to its port answering (catalogue read, search index
  built, goals made);
- ``start_sample`` latency (the start page);
- per-step latency of a search (BM25 over the 1000 products, results page), a click (item page
  or option) and the purchase (reward);
- the same operations in-process (no HTTP), to separate the environment's own cost;
- worker memory: RSS with the catalogue loaded (idle), and with ``--open`` sessions held open
  on their results page (per-session memory);
- the rewards of the gold path (1.0 expected except WebShop's colour-option quirk, see the README).

Usage (bounded: well under a minute on an idle 2-core machine)::

    .venv/bin/python bench/webshop_latency.py    # prints a table, writes bench/results/webshop_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from agentrl_ext.envs.webshop.catalogue import load_catalogue
from agentrl_ext.envs.webshop.env import Episode, Shop
from agentrl_ext.envs.webshop.goals import split_goals
from latency_stats import percentiles, rss_mb

from agentrl_ext.data.store import install_from
from agentrl_ext.env.data_files import DataError, data_dir, require
from agentrl_ext.testing.env_servers import REPO, EnvServers
from agentrl_ext.testing.vendored_data import vendored_data_dir

TASK = "agentrl_ext.envs.webshop.task:WebShopTask"


def step(name: str, **arguments: str) -> dict[str, Any]:
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


def query_of(title: str) -> str:
    return re.sub(r"[\[\]]", " ", title)  # "[...]" would end WebShop's action text


def in_process(data: Path) -> dict[str, Any]:
    """The environment's own cost per operation (no HTTP, no worker)."""
    catalogue = load_catalogue(data)
    shop = Shop(catalogue)
    goals = split_goals(catalogue, "test")
    searches, clicks, buys, pages = [], [], [], []
    for goal in goals:
        episode = Episode(shop, goal)
        start = time.perf_counter()
        episode.step(f"search[{query_of(catalogue.by_asin[goal.asin].name)}]")
        searches.append((time.perf_counter() - start) * 1000)
        for value in (goal.asin, *goal.option_values):
            start = time.perf_counter()
            episode.step(f"click[{value}]")
            clicks.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        _ = episode.observation, episode.available_actions()
        pages.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        episode.step("click[Buy Now]")
        buys.append((time.perf_counter() - start) * 1000)
    return {
        "search": percentiles(searches, 3),
        "click": percentiles(clicks, 3),
        "render_item_page": percentiles(pages, 3),
        "buy": percentiles(buys, 3),
    }


def through_controller(root: Path, data: Path, open_sessions: int) -> dict[str, Any]:
    goals = split_goals(load_catalogue(data), "test")
    names = {p.asin: p.name for p in load_catalogue(data).products}
    with EnvServers(root / "logs") as servers, httpx.Client(timeout=60) as http:
        controller = servers.controller(log_level="warning")
        started = time.perf_counter()
        worker = servers.worker(controller, TASK, task_kwargs={"data_dir": str(data)}, log_level="warning")
        worker_start_s = time.perf_counter() - started
        servers.wait_routable(controller, "webshop", timeout_s=120)
        api = controller.api
        starts, searches, clicks, buys, rewards = [], [], [], [], []
        for index, goal in enumerate(goals):
            response, ms = timed_post(http, f"{api}/start_sample", json={"name": "webshop", "index": index})
            starts.append(ms)
            session = {"session_id": response.headers["session_id"]}
            search = step("search_action", keywords=query_of(names[goal.asin]))
            searches.append(
                timed_post(http, f"{api}/interact", headers=session, json={"messages": [search]})[1]
            )
            for value in (goal.asin.lower(), *goal.option_values):
                click = step("click_action", value=value)
                clicks.append(
                    timed_post(http, f"{api}/interact", headers=session, json={"messages": [click]})[1]
                )
            response, ms = timed_post(
                http,
                f"{api}/interact",
                headers=session,
                json={"messages": [step("click_action", value="Buy Now")]},
            )
            buys.append(ms)
            rewards.append(response.json()["reward"])
        idle = rss_mb(worker.pid)
        held = []
        for index in range(open_sessions):
            response, _ = timed_post(http, f"{api}/start_sample", json={"name": "webshop", "index": index})
            session = {"session_id": response.headers["session_id"]}
            timed_post(
                http,
                f"{api}/interact",
                headers=session,
                json={"messages": [step("search_action", keywords="shoes")]},
            )
            held.append(session)
        loaded = rss_mb(worker.pid)
        for session in held:
            http.post(f"{api}/cancel", headers=session)
        return {
            "worker_start_s": round(worker_start_s, 2),
            "start_sample": percentiles(starts, 3),
            "search_action": percentiles(searches, 3),
            "click_action": percentiles(clicks, 3),
            "buy_now": percentiles(buys, 3),
            "goals": len(goals),
            "gold_reward_1": sum(r == 1.0 for r in rewards),
            "gold_mean_reward": round(statistics.fmean(rewards), 4),
            "rss_idle_mb": round(idle, 1),
            "rss_with_open_sessions_mb": round(loaded, 1),
            "open_sessions": open_sessions,
            "mb_per_session": round((loaded - idle) / open_sessions, 3),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="data directory (default: agentrl-data's)")
    parser.add_argument("--open", type=int, default=64, help="sessions held open for the memory figure")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "webshop_latency.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="webshop-bench-") as tmp:
        data = data_dir(args.data_dir)
        try:
            require("webshop/items_shuffle_1000.reconstructed.json.xz", data)
        except DataError:
            shared = vendored_data_dir()
            if not (shared / "SHA256SUMS").is_file():
                raise
            data = Path(tmp) / "data"
            install_from(shared, data)
        local = in_process(data)
        served = through_controller(Path(tmp), data, args.open)
    print(f"{'operation':<14}{'controller -> worker p50 / p95':>32}{'in-process p50 / p95':>26}")
    for name, remote, inner in [
        ("start_sample", served["start_sample"], None),
        ("search", served["search_action"], local["search"]),
        ("click", served["click_action"], local["click"]),
        ("buy", served["buy_now"], local["buy"]),
    ]:
        inside = f"{inner['p50_ms']:.2f} / {inner['p95_ms']:.2f} ms" if inner else "-"
        print(f"{name:<14}{remote['p50_ms']:>20.2f} / {remote['p95_ms']:<6.2f} ms{inside:>26}")
    print(
        f"worker start {served['worker_start_s']} s; RSS idle {served['rss_idle_mb']} MB, "
        f"{served['mb_per_session']} MB per open session ({served['open_sessions']} held); "
        f"gold path reward 1 on {served['gold_reward_1']}/{served['goals']} test goals"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],  # a shared machine: others' load
    }
    out.write_text(
        json.dumps({"machine": machine, "controller": served, "in_process": local}, indent=1) + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
