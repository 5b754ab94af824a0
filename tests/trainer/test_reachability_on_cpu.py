"""The pre-run check that every Ray node where verl runs agent-loop workers reaches the controller.

A real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: two raylets, each its
own Ray node, every Ray service on 127.0.0.1) and a real controller on 127.0.0.1 with a client secret. The second node's processes
get their environment from its raylet, as on a cluster where each node is set up on its own: there
the secret is wrong, so that node cannot use the controller while the head node can.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl_ext.env.auth import CLIENT_SECRET_ENV
from agentrl_ext.env.launcher import free_port
from agentrl_ext.testing.env_servers import EnvServers

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from agentrl_ext.trainer.reachability import (  # noqa: E402
    agent_loop_nodes,
    check_controller_from_every_node,
)

SECRET = "s" * 24 + "-client"
WRONG = "w" * 24 + "-client"


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with EnvServers(tmp_path_factory.mktemp("servers")) as servers:
        yield servers.controller(rejoin_grace=0, env={CLIENT_SECRET_ENV: SECRET}).api


@pytest.fixture(scope="module")
def two_nodes(controller: str) -> Iterator[dict[str, str]]:
    """A head node with the right client secret and a second node with a wrong one; yields the
    second node's id -> its role."""
    if ray.is_initialized():
        ray.shutdown()
    import importlib
    import os

    # Ray resolves 127.0.0.1 to the machine's routable address unless told it runs no multi-host
    # cluster (its public switch, read when ray_constants loads): keep every Ray service on loopback
    switch = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    old_switch = os.environ.get(switch)
    os.environ[switch] = "0"
    importlib.reload(ray._private.ray_constants)
    saved = os.environ.get(CLIENT_SECRET_ENV)
    os.environ[CLIENT_SECRET_ENV] = SECRET  # the head's raylet (and its workers) inherit this process's
    loopback = {"node_ip_address": "127.0.0.1"}  # every Ray service on loopback
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, **loopback})
        second = cluster.add_node(num_cpus=1, env_vars={CLIENT_SECRET_ENV: WRONG}, **loopback)
        cluster.wait_for_nodes()
    finally:  # the raylets have their environments; this process (and servers it starts) goes back
        if saved is None:
            os.environ.pop(CLIENT_SECRET_ENV, None)
        else:
            os.environ[CLIENT_SECRET_ENV] = saved
    try:
        ray.init(address=cluster.address, include_dashboard=False)
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        yield {second.node_id: "second"}
    finally:
        ray.shutdown()
        cluster.shutdown()
        if old_switch is None:
            os.environ.pop(switch, None)
        else:
            os.environ[switch] = old_switch
        importlib.reload(ray._private.ray_constants)


def test_the_probe_runs_on_every_node_verl_places_agent_loop_workers_on_on_cpu(two_nodes, controller):
    nodes = agent_loop_nodes()
    assert len(nodes) == 2  # both raylets: verl's round-robin would put agent-loop workers on each
    with pytest.raises(ConnectionError) as failure:
        check_controller_from_every_node([controller], timeout_s=3)
    message = str(failure.value)
    (second_id,) = two_nodes
    head_id = next(n["NodeID"] for n in nodes if n["NodeID"] != second_id)
    # only the node that cannot use the controller is named, with the controller's answer and the fix
    assert message.startswith("1 of 2 Ray node(s)")
    assert second_id[:12] in message and head_id[:12] not in message
    assert "HTTP 401" in message
    assert "--advertise-host" in message and "agentrl.agent_loop.controller_url" in message


def test_a_controller_no_node_reaches_fails_the_check_naming_every_node_on_cpu(two_nodes):
    nowhere = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    with pytest.raises(
        ConnectionError, match=r"2 of 2 Ray node\(s\).*Their episodes would all fail as env_transport"
    ):
        check_controller_from_every_node([nowhere], timeout_s=2)


def test_a_controller_every_node_reaches_passes_on_cpu(two_nodes, tmp_path):
    # an open controller (no client secret): both nodes reach it
    with EnvServers(tmp_path) as servers:
        url = servers.controller(rejoin_grace=0).api
        probes = check_controller_from_every_node([url], timeout_s=3)
    assert len(probes) == 2 and all(p.error is None for p in probes)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([str(Path(__file__))]))


def test_the_trainer_checks_every_node_before_verl_builds_anything_on_cpu(two_nodes):
    """``trainer.v1.trainer_mode=agentrl_sync`` (and ``agentrl_async``): verl's ``init()`` (which
    loads the models) runs only after every node reached the controller."""
    from omegaconf import OmegaConf

    from agentrl_ext.trainer.agentrl_trainer import AgentRLTrainerHooks, AgentRLTrainerSync

    assert AgentRLTrainerSync.init is AgentRLTrainerHooks.init  # verl's TaskRunner calls trainer.init()
    built: list[str] = []

    class VerlTrainer:  # stands in for verl's PPOTrainer below the hooks
        def init(self) -> None:
            built.append("workers")

    class Trainer(AgentRLTrainerHooks, VerlTrainer):
        pass

    nowhere = f"http://127.0.0.1:{free_port()}/api"
    trainer = Trainer()
    trainer.config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"agent": {"default_agent_loop": "agentrl"}}},
            "agentrl": {"agent_loop": {"controller_url": nowhere}},
        }
    )
    with pytest.raises(ConnectionError, match="2 of 2 Ray node"):
        trainer.init()
    assert built == []
