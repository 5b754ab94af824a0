"""Clients that survive a controller restart (issue 32 §4), against real processes on 127.0.0.1.

What a client sees when the controller is SIGKILLed with open episodes (documented in
docs/environment_service.md): a call in flight fails at once with ``ControllerUnavailable`` (not
retried: the controller may have applied it); later calls about sessions from before the restart
get 404 "unknown session"; new ``start_sample`` calls wait (connection refused, then 503 +
``Retry-After`` while workers re-register) and are served, within ``RetryPolicy.deadline_s``.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from env_helpers import PROBE_TASK, tool_step

from agentrl_ext.env.client import ControllerClient, ControllerError, ControllerUnavailable, RetryPolicy
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.testing.env_servers import EnvServers, ServerProcess, wait_routable, wait_until

DOWN_FOR_S = 4.0
"""How long the controller stays down: longer than the old client's whole retry budget (~2 s)."""


async def restart_later(servers: EnvServers, old: ServerProcess, delay_s: float, **options) -> ServerProcess:
    await asyncio.sleep(delay_s)
    return await asyncio.to_thread(servers.controller, port=old.port, **options)


async def test_start_sample_waits_out_a_sigkilled_controller_and_its_workers_rejoin(servers: EnvServers):
    first = servers.controller()
    servers.worker(first, PROBE_TASK, heartbeat_interval=0.5)
    wait_routable(first, "probe")
    first.kill()  # SIGKILL: no goodbye to anyone
    async with ControllerClient(first.api) as client:  # the default RetryPolicy: 60 s deadline
        restart = asyncio.create_task(restart_later(servers, first, DOWN_FOR_S))
        started = await client.start_sample("probe", "echo")  # refused, refused, ..., 503, served
        await restart
        assert started.response.status is SampleStatus.RUNNING
        step = await client.interact(started.session_id, tool_step("echo", {"text": "back"}))
    assert step.messages[-1]["content"] == "back"


def test_retry_after_during_the_rejoin_grace_is_when_a_worker_can_be_back(servers: EnvServers):
    first = servers.controller()
    worker = servers.worker(first, PROBE_TASK, heartbeat_interval=0.2)
    wait_routable(first, "probe")
    first.stop()
    worker.pause()
    try:
        second = servers.controller(port=first.port, rejoin_grace=30)
        answer = httpx.post(second.api + "/start_sample", json={"name": "probe", "index": "echo"}, timeout=5)
        assert answer.status_code == 503
        # A worker's next heartbeat can come any moment: not "come back when the 30 s grace ends".
        assert answer.headers["retry-after"] == "1"
        assert "every 8s" in answer.json()["detail"]
    finally:
        worker.resume()


async def test_sigkill_with_open_episodes_what_the_client_sees(servers: EnvServers):
    first = servers.controller()
    worker = servers.worker(first, PROBE_TASK, heartbeat_interval=0.2)
    wait_routable(first, "probe")
    async with ControllerClient(first.api, retry=RetryPolicy(deadline_s=30)) as client:
        idle = await client.start_sample("probe", "echo")
        busy = await client.start_sample("probe", "slow_step")
        await client.interact(busy.session_id, tool_step("echo", {"text": "a"}))
        in_flight = asyncio.create_task(client.interact(busy.session_id, tool_step("echo", {"text": "b"})))
        await asyncio.to_thread(
            wait_until,
            lambda: any(s["busy"] for s in httpx.get(first.api + "/list_sessions", timeout=5).json()),
            what="the step in flight",
        )
        first.kill()

        # 1. The call in flight: at once, not retried (the controller may have applied the step).
        with pytest.raises(ControllerUnavailable, match="not retried"):
            await in_flight

        second = await restart_later(servers, first, 0.5)
        await asyncio.to_thread(wait_routable, second, "probe")
        # 2. Sessions from before the restart: 404, whose reason says why.
        for old in (idle, busy):
            with pytest.raises(ControllerError) as gone:
                await client.interact(old.session_id, tool_step("echo", {"text": "x"}))
            assert gone.value.status == 404 and "in memory only" in gone.value.detail
        # 3. The worker's orphans were reclaimed (cancel_all when it re-registered).
        assert httpx.get(worker.api + "/get_sessions", timeout=5).json() == {}
        # 4. New episodes run.
        fresh = await client.start_sample("probe", "echo")
        assert fresh.response.status is SampleStatus.RUNNING


async def test_a_controller_that_stays_down_fails_the_call_at_the_deadline_not_before(servers: EnvServers):
    first = servers.controller()
    first.kill()
    policy = RetryPolicy(deadline_s=1.5, initial_backoff_s=0.05, max_backoff_s=0.2)
    async with ControllerClient(first.api, retry=policy) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ControllerUnavailable, match="deadline_s=1.5") as down:
            await client.start_sample("probe", "echo")
        waited = loop.time() - t0
    assert waited >= 1.5  # it kept trying until the deadline: a functional bound, not a speed
    assert "ClientConnectorError" in str(down.value)


def test_retry_policy_waits_within_the_deadline():
    policy = RetryPolicy(deadline_s=10, initial_backoff_s=1, max_backoff_s=1, max_retry_after_s=30)
    assert 0.5 <= policy.next_wait(1, elapsed_s=0) <= 1  # type: ignore[operator]
    assert policy.next_wait(1, elapsed_s=0, retry_after_s=3) == 3
    assert policy.next_wait(1, elapsed_s=9.5) == pytest.approx(0.5)  # a last try at the deadline
    assert policy.next_wait(1, elapsed_s=9.5, retry_after_s=3) is None  # told to wait past it
    assert policy.next_wait(1, elapsed_s=10) is None
    assert RetryPolicy(max_attempts=2).next_wait(2, elapsed_s=0) is None
    assert RetryPolicy().deadline_s >= 60
