"""The main job's RL with ``agentrl.envs.placement=ray``: its fleet on a multi-node Ray cluster
that verl's trainer joins (tests/e2e/ray_fleet_train_scenario.py, in a loopback-only network
namespace; ~3 min)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentrl_ext.testing.ray_cluster import in_loopback_namespace, namespace_unavailable

pytestmark = pytest.mark.slow

SCENARIO = Path(__file__).with_name("ray_fleet_train_scenario.py")


def test_main_job_trains_with_its_fleet_on_ray_nodes_on_cpu(tmp_path):
    if reason := namespace_unavailable():
        pytest.skip(reason)
    out = tmp_path / "seen.json"
    done = in_loopback_namespace([sys.executable, str(SCENARIO), str(out)], timeout_s=1700)
    assert out.exists(), f"the scenario failed (exit {done.returncode}):\n{done.stderr[-6000:]}"
    seen = json.loads(out.read_text())
    assert seen["returncode"] == 0, seen["log_tail"]
    # the three tasks' workers on the two environment nodes, the controller on the driver's node
    workers = [line for line in seen["fleet_lines"] if line.startswith("worker")]
    assert sorted(line.split()[1] for line in workers) == ["calc", "gridroom", "guess"]
    assert {line.split("(node ")[1][:8] for line in workers} <= {n[:8] for n in seen["env_nodes"]}
    # verl's trainer ran its steps on the same cluster and wrote its metrics where the job said
    assert seen["steps"] == [1, 2]
    for task in ("guess", "calc", "gridroom"):
        assert f"agentrl/task/{task}/success_rate" in seen["metric_keys"]
    # ray status while training: the fleet's slots in use beside verl's CPUs
    assert "3.0/4.0 agentrl_env" in seen["ray_status"], seen["ray_status"]
    # the job's end stopped the fleet: no server process, no actor
    assert seen["server_processes_after"] == []
    assert seen["actors_alive_after"] == []
