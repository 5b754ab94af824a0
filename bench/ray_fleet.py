"""The environment fleet on Ray (``placement: ray``) against ``placement: local``, side by side in one run.

On one machine, Ray nodes are simulated (``ray.cluster_utils.Cluster``: a raylet per node, each
with its own resources), all in a loopback-only network namespace
(:mod:`agentrl_ext.testing.ray_cluster`; the bench re-runs itself under ``unshare --net``). For Ray
with 1, 2 and 3 environment nodes, each right after a ``local`` run (the ratios compare
neighbours in time), measured from the user's side:

- **bring-up**: from ``EnvStack.start()`` to every one of ``--workers`` guess workers routable
  through the controller (Ray: the cluster already running, as on a user's cluster);
- **episodes/s**: ``--episodes`` expert guess episodes (1..16, ~4 steps each) through the
  controller, ``--concurrency`` at a time (``ControllerClient``; the same client for every
  placement);
- **recovery** (Ray with 2 and 3 nodes): one environment node vanishes (every process of it frozen:
  nothing answers, nothing closes); reported: the time until the controller has dropped its
  workers (heartbeat timeout), and until the fleet has ``--workers`` routable workers again on
  the survivors (Ray's node-death detection, then the restarted actors). With Ray's default
  health checks (about 65 s to declare a node dead) unless ``--node-death-s`` is given.

Writes ``bench/results/ray_fleet.json``. On a 2-core machine the nodes share the cores, so the
figures say what placement costs, not what more machines give.

Usage (about 6 minutes on 2 cores; run as root)::

    .venv/bin/python bench/ray_fleet.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HEARTBEAT_S = 2.0
HEARTBEAT_TIMEOUT_S = 6.0


async def _episodes(api: str, count: int, concurrency: int) -> float:
    from agentrl_ext.data.expert import play_expert_episodes

    t0 = time.perf_counter()
    episodes = await play_expert_episodes(
        api, "guess", list(range(10_000, 10_000 + count)), concurrency=concurrency
    )
    elapsed = time.perf_counter() - t0
    won = sum(e.won for e in episodes)
    if won != count:
        raise RuntimeError(f"{count - won} of {count} expert episodes did not win")
    return count / elapsed


def _stack(placement: str, workers: int, address: str | None) -> Any:
    from agentrl_ext.env.launcher.processes import free_port
    from agentrl_ext.env.launcher.stack import EnvStack

    extra: dict[str, Any] = {"placement": "ray", "ray_address": address} if placement == "ray" else {}
    return EnvStack(
        tasks=["guess"],
        port=free_port(),
        replicas={"guess": workers},
        heartbeat_interval=HEARTBEAT_S,
        controller_options={"heartbeat_timeout": HEARTBEAT_TIMEOUT_S, "check_interval": 0.5},
        ready_timeout_s=300,
        **extra,
    )


def _routable(api: str) -> list[str]:
    from agentrl_ext.env.launcher.processes import list_workers

    try:
        return [w["address"] for w in list_workers(api).get("guess", []) if w["healthy"] and w["routable"]]
    except Exception:  # noqa: BLE001 - the controller is busy: ask again
        return []


def _measure(args: argparse.Namespace, placement: str, nodes: int) -> dict[str, Any]:
    from agentrl_ext.testing.ray_cluster import LocalCluster

    row: dict[str, Any] = {"placement": placement, "nodes": nodes if placement == "ray" else 1}
    cluster = None
    try:
        if placement == "ray":
            cluster = LocalCluster(head_cpus=2, node_death_s=args.node_death_s)
            # room on the survivors for a lost node's workers: the fleet fits on nodes - 1 of them
            per_node = -(-args.workers // max(1, nodes - 1))
            env_nodes = [cluster.add_env_node(per_node) for _ in range(nodes)]
        stack = _stack(placement, args.workers, cluster.address if cluster else None)
        t0 = time.perf_counter()
        stack.start()
        row["bring_up_s"] = time.perf_counter() - t0
        try:
            rates = [
                asyncio.run(_episodes(stack.api, args.episodes, args.concurrency)) for _ in range(args.repeat)
            ]
            row["episodes_per_s"] = statistics.median(rates)
            row["episodes_per_s_runs"] = rates
            if cluster is not None and nodes >= 2:
                assert stack.fleet is not None
                victim = env_nodes[-1]
                lost = {p["api"] for p in stack.fleet.placements() if p.get("node_id") == victim.node_id}
                cluster.freeze(victim)
                t_lost = time.perf_counter()
                while lost & set(_routable(stack.api)):
                    time.sleep(0.2)
                row["workers_dropped_s"] = time.perf_counter() - t_lost
                while True:
                    now = set(_routable(stack.api))
                    if len(now) >= args.workers and not lost & now:
                        break
                    if time.perf_counter() - t_lost > 600:
                        raise TimeoutError("the fleet did not recover within 600 s")
                    time.sleep(0.2)
                row["recovered_s"] = time.perf_counter() - t_lost
                row["lost_workers"] = len(lost)
                cluster.remove(victim)
                row["episodes_per_s_after_recovery"] = asyncio.run(
                    _episodes(stack.api, args.episodes, args.concurrency)
                )
        finally:
            t0 = time.perf_counter()
            stack.stop()
            row["stop_s"] = time.perf_counter() - t0
    finally:
        if cluster is not None:
            cluster.shutdown()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=6, help="guess workers in the fleet")
    parser.add_argument("--nodes", default="1,2,3", help="Ray environment nodes to try, comma-separated")
    parser.add_argument("--episodes", type=int, default=240, help="expert episodes per measurement")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="episode runs per placement (median)")
    parser.add_argument(
        "--node-death-s",
        type=float,
        default=None,
        help="how soon Ray declares a silent node dead (default: Ray's)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ray_fleet.json")
    args = parser.parse_args()

    from agentrl_ext.testing.ray_cluster import in_loopback_namespace, only_loopback

    if not only_loopback():  # re-run in a network namespace of our own, loopback only
        done = in_loopback_namespace([sys.executable, *sys.argv], timeout_s=3600, capture=False)
        sys.exit(done.returncode)

    rows = []
    for nodes in [int(n) for n in args.nodes.split(",") if n]:
        # the local placement measured right before each Ray one: each ratio compares neighbours
        rows.append(_measure(args, "local", 1))
        rows.append(_measure(args, "ray", nodes))
        rows[-1]["vs_local"] = rows[-1]["episodes_per_s"] / rows[-2]["episodes_per_s"]
        print(json.dumps(rows[-2]), json.dumps(rows[-1]), flush=True)
    print(
        f"\n{args.workers} guess workers; {args.episodes} expert episodes at concurrency {args.concurrency}, "
        f"median of {args.repeat}; each Ray row right after its own local row"
    )
    print(
        f"{'placement':<10}{'nodes':>6}{'bring-up s':>12}{'episodes/s':>12}{'vs local':>10}"
        f"{'dropped s':>11}{'recovered s':>13}"
    )
    for row in rows:
        print(
            f"{row['placement']:<10}{row['nodes']:>6}{row['bring_up_s']:>12.1f}{row['episodes_per_s']:>12.1f}"
            f"{row.get('vs_local', 1.0):>10.2f}"
            f"{row.get('workers_dropped_s', float('nan')):>11.1f}{row.get('recovered_s', float('nan')):>13.1f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                # paths relative to the checkout: the results say nothing of the machine they ran on
                "settings": {
                    k: (os.path.relpath(v, REPO) if isinstance(v, Path) else v) for k, v in vars(args).items()
                },
                "heartbeat_s": HEARTBEAT_S,
                "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "rows": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
