"""The main job's RL with its environment fleet on a multi-node Ray cluster (``agentrl.envs.placement=ray``),
run in a loopback-only network namespace (:mod:`agentrl_ext.testing.ray_cluster`); writes what it
observed as JSON. tests/e2e/test_ray_fleet_e2e.py runs it.

A head (8 CPUs: verl's trainer joins it, ``ray_kwargs.ray_init.address``) and two environment
nodes (2 ``agentrl_env`` slots each); ``agentrl-train --config-name cpu_multitask`` shortened to
RL steps only (no warm start, no evaluation), its three tasks' workers spread over the two nodes.
While it trains, ``ray status`` is taken; after it ends, nothing of the fleet may be left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def command(tmp: Path, address: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", "cpu_multitask",
        f"agentrl.envs.port={port}", "agentrl.envs.placement=ray", f"agentrl.envs.ray_address={address}",
        f"+ray_kwargs.ray_init.address={address}",
        "agentrl.sft.enable=false", "agentrl.eval.enable=false",
        "trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"trainer.default_local_dir={tmp / 'run'}", f"hydra.run.dir={tmp / 'hydra'}",
    ]  # fmt: skip


def main(out: Path) -> None:
    from agentrl_ext.env.launcher.processes import free_port
    from agentrl_ext.testing.ray_cluster import LocalCluster, server_processes

    tmp = out.parent
    seen: dict[str, Any] = {}
    cluster = LocalCluster(head_cpus=8, dashboard=True)
    try:
        nodes = [cluster.add_env_node(2) for _ in range(2)]
        seen["env_nodes"] = [n.node_id for n in nodes]
        log = tmp / "job.log"
        env = dict(os.environ, AGENTRL_CACHE_DIR=str(tmp / "cache"))
        t0 = time.monotonic()
        with log.open("w") as sink:
            job = subprocess.Popen(
                command(tmp, cluster.address, free_port()),
                cwd=tmp,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
            status = ""
            while job.poll() is None and time.monotonic() - t0 < 1500:
                if not status and "step:1 " in log.read_text(errors="replace"):  # while verl trains
                    status = subprocess.run(
                        ["ray", "status", "--address", cluster.address],
                        capture_output=True,
                        text=True,
                        timeout=60,
                    ).stdout
                    seen["server_processes_while_training"] = [a for _p, a in server_processes()]
                time.sleep(1.0)
            if job.poll() is None:
                job.kill()
            job.wait(60)
        seen["wall_s"] = time.monotonic() - t0
        seen["returncode"] = job.returncode
        seen["ray_status"] = status
        text = log.read_text(errors="replace")
        seen["log_tail"] = text[-6000:]
        fleet = (
            text.split("environment fleet on Ray:", 1)[-1][:3000]
            if "environment fleet on Ray:" in text
            else ""
        )
        seen["fleet_lines"] = [
            line for line in fleet.splitlines() if line.startswith(("worker", "controller"))
        ]
        metrics = tmp / "run" / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        seen["steps"] = sorted({r["step"] for r in rows})
        seen["metric_keys"] = sorted({k for r in rows for k in r["data"] if k.startswith("agentrl/task/")})
        time.sleep(2.0)
        seen["server_processes_after"] = [a for _p, a in server_processes()]
        import ray
        from ray.util.state import list_actors

        ray.init(address=cluster.address, log_to_driver=False)
        seen["actors_alive_after"] = [
            f"{a.class_name} {a.state}" for a in list_actors(limit=1000) if a.state != "DEAD"
        ]
        ray.shutdown()
    finally:
        cluster.shutdown()
        out.write_text(json.dumps(seen, indent=1, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
