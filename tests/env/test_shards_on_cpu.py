"""Several controller processes serving one worker fleet (issue 32 §5), on 127.0.0.1.

Each controller is a shard (``--shard k --shards n``): its session ids are ``k`` modulo ``n``, so
a session's calls are routed to ``controllers[session_id % n]`` with no shared session table;
every worker heartbeats to every shard.
"""

from __future__ import annotations

import httpx
import pytest
from env_helpers import PROBE_TASK, tool_step

from agentrl_ext.env.client import ControllerClient
from agentrl_ext.env.controller import ControllerConfig
from agentrl_ext.env.controller.sessions import SessionTable
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.testing.env_servers import EnvServers, wait_routable


async def test_two_shards_route_by_session_id_and_share_the_workers(servers: EnvServers):
    shards = [servers.controller(shard=k, shards=2) for k in range(2)]
    worker = servers.worker(shards, PROBE_TASK, concurrency=16)
    for shard in shards:
        wait_routable(shard, "probe")
    async with ControllerClient([s.api for s in shards]) as client:
        started = [await client.start_sample("probe", "echo") for _ in range(6)]
        ids = [s.session_id for s in started]
        assert [i % 2 for i in ids] == [0, 1, 0, 1, 0, 1]  # starts alternate, each shard's ids its own
        for k, shard in enumerate(shards):
            held = {s["session_id"] for s in httpx.get(shard.api + "/list_sessions", timeout=5).json()}
            assert held == {i for i in ids if i % 2 == k}
        for session_id in ids:
            step = await client.interact(session_id, tool_step("echo", {"text": str(session_id)}))
            assert step.messages[-1]["content"] == str(session_id)
        assert len(await client.list_sessions()) == 6
    assert len(httpx.get(worker.api + "/get_sessions", timeout=5).json()) == 6


async def test_a_restarted_shard_reclaims_only_its_own_sessions(servers: EnvServers):
    shards = [servers.controller(shard=k, shards=2) for k in range(2)]
    worker = servers.worker(shards, PROBE_TASK, concurrency=16, heartbeat_interval=0.2)
    for shard in shards:
        wait_routable(shard, "probe")
    async with ControllerClient([s.api for s in shards]) as client:
        ids = [(await client.start_sample("probe", "echo")).session_id for _ in range(4)]
        shards[1].stop()
        restarted = servers.controller(port=shards[1].port, shard=1, shards=2)
        wait_routable(restarted, "probe")  # the worker rejoined: shard 1's orphans were cancelled
        on_worker = {int(i) for i in httpx.get(worker.api + "/get_sessions", timeout=5).json()}
        assert on_worker == {i for i in ids if i % 2 == 0}  # shard 0's sessions are untouched
        for session_id in (i for i in ids if i % 2 == 0):
            step = await client.interact(session_id, tool_step("echo", {"text": "alive"}))
            assert step.status is SampleStatus.RUNNING


def test_shard_ids_are_random_and_carry_the_shard():
    for shard in range(3):
        ids = [SessionTable(10, 10, shard, 3).new_id() for _ in range(100)]
        assert all(i % 3 == shard and 0 < i < 2**63 for i in ids) and len(set(ids)) == 100
        assert max(ids) - min(ids) > 2**55


@pytest.mark.parametrize(("shard", "shards"), [(2, 2), (-1, 2), (0, 0)])
def test_a_shard_outside_its_fleet_is_refused(shard: int, shards: int):
    with pytest.raises(ValueError, match="number the controllers of one fleet"):
        ControllerConfig(shard=shard, shards=shards)
