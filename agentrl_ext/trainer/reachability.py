"""Can every node of the Ray cluster reach the environment service?

verl places its agent-loop workers round-robin over every alive Ray node that has CPUs
(``AgentLoopManager._init_agent_loop_workers``: one ``NodeAffinitySchedulingStrategy`` per worker),
and each worker's episodes call the controller from there. A controller URL that only the driver's
node reaches (``127.0.0.1`` on a multi-node cluster, a firewall, a missing client secret) would
drop every episode of the other nodes as ``env_transport``. :func:`check_controller_from_every_node`
runs one probe on each such node, with the client the agent loop uses, before the first step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agentrl_ext.env.auth import is_loopback
from agentrl_ext.env.client import ControllerClient, RetryPolicy

logger = logging.getLogger(__name__)

ROUTABLE_FIX = (
    "serve the environments on an address every node reaches (agentrl-envs up --host 0.0.0.0 "
    "--advertise-host ADDRESS --secret-file FILE, the same secret in $AGENTRL_ENV_CLIENT_SECRET / "
    "$AGENTRL_ENV_WORKER_SECRET on every node where it is set) and point "
    "agentrl.agent_loop.controller_url (and val_controller_url) at http://ADDRESS:PORT/api"
)


@dataclass(frozen=True)
class NodeProbe:
    """What one node saw: its Ray node id and address, and the error (None: the controller answered)."""

    node_id: str
    address: str
    error: str | None


def agent_loop_nodes() -> list[dict[str, Any]]:
    """The Ray nodes verl may place agent-loop workers on: alive, with CPUs (its own filter)."""
    import ray

    return [node for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0]


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is a loopback address (reachable from its own machine only)."""
    return is_loopback(urlsplit(url).hostname or "")


async def _ask(url: str, timeout_s: float) -> None:
    retry = RetryPolicy(deadline_s=timeout_s, initial_backoff_s=0.2, max_backoff_s=1.0)
    async with ControllerClient(url, retry=retry, timeout_s=timeout_s, connect_timeout_s=timeout_s) as client:
        await client.list_workers()


def probe(urls: Sequence[str], timeout_s: float) -> str | None:
    """In this process: ask each controller for its workers; the first failure, or None."""
    for url in urls:
        try:
            asyncio.run(_ask(url, timeout_s))
        except Exception as exc:  # noqa: BLE001  (any failure is the answer)
            return f"{url}: {type(exc).__name__}: {exc}"
    return None


def probe_every_node(urls: Sequence[str], timeout_s: float = 10.0) -> list[NodeProbe]:
    """Run :func:`probe` once on each node of :func:`agent_loop_nodes` (pinned to it, as verl pins its
    agent-loop workers, but not soft: a node that cannot run it is a failure too)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=0)(probe)
    nodes = agent_loop_nodes()
    refs = [
        remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        ).remote(list(urls), timeout_s)
        for node in nodes
    ]
    results = []
    for node, ref in zip(nodes, refs, strict=True):
        try:
            error = ray.get(ref, timeout=timeout_s * (len(urls) + 1) + 60)
        except Exception as exc:  # noqa: BLE001  (the node could not run the probe)
            error = f"the probe did not run there ({type(exc).__name__}: {exc})"
        results.append(NodeProbe(node["NodeID"], str(node.get("NodeManagerAddress", "?")), error))
    return results


def check_controller_from_every_node(urls: Sequence[str], timeout_s: float = 10.0) -> list[NodeProbe]:
    """Raise ConnectionError, naming the nodes, the error and the fix, unless every node where verl
    may run agent-loop workers reaches every controller in ``urls``; returns the probes."""
    urls = [u for u in dict.fromkeys(urls) if u]
    if not urls:
        return []
    results = probe_every_node(urls, timeout_s)
    failed = [r for r in results if r.error]
    if failed:
        lines = "; ".join(f"node {r.address} ({r.node_id[:12]}): {r.error}" for r in failed)
        raise ConnectionError(
            f"{len(failed)} of {len(results)} Ray node(s) where verl runs agent-loop workers cannot use the "
            f"environment service: {lines}. Their episodes would all fail as env_transport. Fix: {ROUTABLE_FIX}"
        )
    logger.info(
        "the environment service at %s answers from all %d Ray node(s)", ", ".join(urls), len(results)
    )
    return results
