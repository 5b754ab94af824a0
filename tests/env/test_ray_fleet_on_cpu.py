"""``placement: ray``: the environment fleet on a real multi-node Ray cluster (several Ray nodes on
this machine, in a loopback-only network namespace: :mod:`agentrl_ext.testing.ray_cluster`).

The cluster scenario runs once (tests/env/ray_fleet_scenarios.py, ~1 min) and each test checks
one of its observations; the rest are the placement's configuration and command-line checks.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from agentrl_ext.env.launcher import command, stack
from agentrl_ext.env.launcher.ray_fleet import RayFleet
from agentrl_ext.env.launcher.stack import EnvStack
from agentrl_ext.testing.ray_cluster import in_loopback_namespace, namespace_unavailable

SCENARIOS = Path(__file__).with_name("ray_fleet_scenarios.py")
sys.path.insert(0, str(SCENARIOS.parent))
import ray_fleet_scenarios as scenario  # noqa: E402  (its constants: the bounds checked here)


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    if reason := namespace_unavailable():
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("ray_fleet") / "seen.json"
    done = in_loopback_namespace([sys.executable, str(SCENARIOS), str(out)], timeout_s=600)
    if not out.exists() or done.returncode != 0:
        pytest.fail(
            f"the scenario failed (exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
        )
    observed = json.loads(out.read_text())
    yield observed
    for folder in observed.get("folders_left", []):  # the vanished node's log folders (see below)
        shutil.rmtree(folder, ignore_errors=True)


def test_workers_spread_over_the_nodes_offering_the_resource_on_cpu(seen):
    ids = seen["node_ids"]
    workers = [p for p in seen["placements"] if p["role"] == "worker"]
    controllers = [p for p in seen["placements"] if p["role"] == "controller"]
    guess_nodes = [p["node_id"] for p in workers if p["name"].startswith("guess")]
    assert len(guess_nodes) == 3 and set(guess_nodes) == {ids["a"], ids["b"]}
    # per_node: one calc worker on each environment node; nothing on the head (it offers no slot)
    assert sorted(p["node_id"] for p in workers if p["name"].startswith("calc")) == sorted(
        [ids["a"], ids["b"]]
    )
    assert [p["node_id"] for p in controllers] == [ids["head"]]  # the driver's node
    # each worker advertises its own node's address and its own port
    assert len({p["api"] for p in workers}) == 5
    assert all(p["api"].startswith(f"http://{p['node_ip']}:") for p in workers)


def test_a_fleet_the_cluster_cannot_host_is_refused_naming_the_fix_on_cpu(seen):
    message = seen["capacity_error"]
    assert message is not None
    assert "agentrl_env: needs 9, the cluster offers 8" in message
    assert "ray start --address HEAD:PORT --resources" in message
    assert seen["connected_after_refusal"] is False  # a failed start leaves no Ray connection


def test_a_start_that_fails_half_way_stops_what_started_on_cpu(seen):
    error = seen["failed_start_error"]
    assert error is not None and "worker guess could not start on its node" in error
    assert "high must be an integer >= 2" in error  # the server's own words, from its log
    assert seen["servers_after_failed_start"] == []  # the controller it had started is gone too
    assert seen["connected_after_failed_start"] is False


def test_the_secret_is_in_no_command_line_environment_or_ray_table_on_cpu(seen):
    assert seen["server_processes"] == 6  # 1 controller + 3 guess + 2 calc, all checked
    assert seen["secret_in_argv"] is False
    assert seen["secret_in_environ"] is False
    assert seen["secret_in_ray_tables"] is False  # Ray's state API: what its dashboard shows
    assert seen["secret_files_left"] == []  # the 0600 file is removed once the server has read it


def test_a_vanished_node_ends_its_sessions_within_the_heartbeat_bound_on_cpu(seen):
    assert seen["frozen_processes"] >= 4  # its raylet, Ray's workers and our two servers
    assert seen["workers_on_b"]
    bound = scenario.HEARTBEAT_TIMEOUT_S + 2 * scenario.CHECK_INTERVAL_S + 2.0
    ended = seen["mid_run"]
    assert len(ended) == 8
    assert all(r["status"] in ("SampleStatus.COMPLETED", "SampleStatus.TASK_ERROR") for r in ended)
    errors = [r for r in ended if r["status"] == "SampleStatus.TASK_ERROR"]
    assert errors, "no episode ran on the vanished node: the scenario tests nothing"
    assert all("was lost: no heartbeat" in r["error"] for r in errors)
    assert max(r["after_loss_s"] for r in ended) < bound


def test_ray_restarts_the_lost_workers_and_the_next_batch_runs_on_the_survivors_on_cpu(seen):
    # recovery: Ray declares the node dead (~NODE_DEATH_S here), restarts its worker on node A
    assert seen["recovery_s"] < scenario.NODE_DEATH_S + 60
    guess = seen["after_loss_workers"]["guess"]
    assert sum(w["healthy"] and w["routable"] for w in guess) == 3
    assert seen["next_batch"] == ["SampleStatus.COMPLETED"] * 6


def test_a_node_that_joins_gets_its_per_node_workers_and_traffic_on_cpu(seen):
    assert seen["join_s"] < 60
    sessions = seen["calc_sessions_by_worker"]
    assert sessions.get(seen["calc_on_c"], 0) > 0  # the new node's worker takes sessions


def test_stop_leaves_no_actor_process_or_file_on_cpu(seen):
    assert seen["stop_s"] < 60
    assert seen["actors_alive_after_stop"] == []
    assert seen["server_processes_after_stop"] == []
    assert seen["pids_alive_after_stop"] == []
    assert seen["folders_left_on_survivors"] == []
    # only the vanished node's log folders stay (its actors were killed with it); no secret in them
    assert len(seen["folders_left"]) == len(seen["workers_on_b"])
    assert not [f for folder in seen["folders_left"] for f in Path(folder).glob("*.secret")]


def test_a_killed_fleet_driver_leaves_no_server_behind_on_cpu(seen):
    assert seen["servers_under_killed_driver"] == 2  # its controller and its guess worker
    assert seen["servers_left_after_driver_killed"] == []


def test_ctrl_c_to_the_fleet_command_stops_every_server_on_cpu(seen):
    assert seen["servers_before_ctrl_c"] == 2
    assert seen["ctrl_c_exit"] == 0  # agentrl-envs up: Ctrl-C is the normal way to stop it
    assert seen["servers_left_after_ctrl_c"] == []


# ---------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"placement": "k8s"}, r"placement 'k8s'; expected one of \('local', 'ray'\)"),
        ({"shards": 2}, "shards=2 and per_node={} need placement ray"),
        ({"per_node": {"guess": 1}}, "need placement ray"),
        ({"placement": "ray", "docker": True}, "worker containers .* are a local placement"),
        ({"placement": "ray", "front_port": 5999}, "--front-port is a local placement"),
    ],
)
def test_placement_options_are_checked_naming_the_fix_on_cpu(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EnvStack(tasks=["guess"], **kwargs)


def test_no_cluster_to_join_is_one_error_naming_the_fix_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no ray_current_cluster: "auto" finds nothing
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fleet = RayFleet(tasks=["guess"], task_kwargs={}, replicas={"guess": 1}, port=5020)
    with pytest.raises(
        RuntimeError, match=r"placement ray: no Ray cluster at 'auto'.*--ray-address HEAD:6379"
    ):
        fleet.start()


def test_per_node_names_started_tasks_on_cpu():
    with pytest.raises(
        ValueError, match=r"per_node \{'calc': 1\}: each count must be >= 1 and name a started task"
    ):
        RayFleet(tasks=["guess"], task_kwargs={}, replicas={}, port=5020, per_node={"calc": 1})


def test_a_worker_asks_ray_for_its_tasks_resources_on_cpu():
    fleet = RayFleet(
        tasks=["guess", "dbbench", "os"],
        task_kwargs={"dbbench": {"backend": "sqlite"}},
        replicas={},
        port=5020,
        resource="env_slot",
    )
    assert fleet.worker_resources("guess") == {
        "num_cpus": 1.0,
        "memory": 512 << 20,
        "resources": {"env_slot": 1},
    }
    # os needs the node's Docker engine: a sliver of the marker resource such nodes offer
    assert fleet.worker_resources("os")["resources"] == {"env_slot": 1, "agentrl_env_docker": 0.001}
    # dbbench on SQLite needs no MariaDB server on its node
    assert fleet.worker_resources("dbbench")["resources"] == {"env_slot": 1}
    fleet.task_kwargs = {}
    assert fleet.worker_resources("dbbench")["resources"] == {"env_slot": 1, "agentrl_env_mariadb": 0.001}


def test_the_trainers_fleet_command_line_rebuilds_the_same_stack_on_cpu(monkeypatch, tmp_path):
    """``agentrl-train`` drives the fleet from a child ``agentrl-envs up --placement ray``: every
    field it sets must reach the child's stack (distinct values, read back by field)."""
    (tmp_path / "secret").write_text("s" * 32)
    parent = EnvStack(
        tasks=["guess", "calc"],
        port=5141,
        host="127.0.0.11",
        advertise_host="127.0.0.12",
        secret_file=str(tmp_path / "secret"),
        split="test",
        replicas={"guess": 3},
        per_node={"calc": 2},
        kwargs={"guess": {"show_range": True}},
        ready_timeout_s=71.0,
        placement="ray",
        ray_address="127.0.0.13:6399",
        ray_resource="env_slot",
        controller_options={"heartbeat_timeout": 9.0},
        heartbeat_interval=2.5,
        fleet_process=True,
    )
    argv = parent.fleet_argv()
    assert argv[1:4] == ["-m", "agentrl_ext.env.launcher", "up"]
    child: dict = {}

    def capture(**kwargs):
        child.update(kwargs)
        raise KeyboardInterrupt  # built: stop before anything starts

    monkeypatch.setattr(command, "EnvStack", capture)
    with pytest.raises(KeyboardInterrupt):
        command.main(argv[3:])
    for name in (
        "tasks",
        "port",
        "host",
        "advertise_host",
        "secret_file",
        "split",
        "placement",
        "ray_address",
        "ray_resource",
        "controller_options",
        "heartbeat_interval",
    ):
        assert child[name] == getattr(parent, name), name
    assert child["ready_timeout_s"] == 71.0
    assert child["replicas"] == {"guess": 3}  # calc: per-node only, as in the parent
    assert child["per_node"] == {"calc": 2}
    assert child["kwargs"] == {"guess": {"show_range": True}}
    assert child["shards"] == 1


def test_launch_from_config_drives_a_ray_fleet_from_a_child_process_on_cpu(monkeypatch):
    from agentrl_ext.config import EnvsConfig

    seen: dict = {}

    def capture(**kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(stack, "EnvStack", capture)
    envs = EnvsConfig(
        launch=True,
        tasks=["guess"],
        placement="ray",
        ray_address="127.0.0.1:6380",
        ray_resource="env_slot",
        per_node={"guess": 2},
    )
    with pytest.raises(KeyboardInterrupt), stack.launch_from_config(envs):
        pass
    assert (seen["placement"], seen["ray_address"], seen["ray_resource"]) == (
        "ray",
        "127.0.0.1:6380",
        "env_slot",
    )
    assert seen["per_node"] == {"guess": 2} and seen["fleet_process"] is True


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"placement": "slurm"}, "agentrl.envs.placement='slurm'; expected local or ray"),
        ({"per_node": {"guess": 1}}, "agentrl.envs.per_node=.* set agentrl.envs.placement=ray"),
        ({"placement": "ray", "per_node": {"calc": 1}}, r"agentrl.envs.per_node \{'calc': 1\}"),
    ],
)
def test_envs_config_checks_the_placement_on_cpu(fields, message):
    from agentrl_ext.config import EnvsConfig

    with pytest.raises(ValueError, match=message):
        EnvsConfig(launch=True, tasks=["guess"], **fields)
