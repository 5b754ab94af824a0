"""ControllerClient retries: only where a retry cannot apply an agent step twice."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web
from env_helpers import PROBE_TASK, tool_step

from agentrl_ext.env.client import ControllerClient, ControllerError, ControllerUnavailable, RetryPolicy
from agentrl_ext.env.protocol import SESSION_ID_HEADER
from agentrl_ext.testing.env_servers import LOOPBACK, EnvServers, free_port, wait_routable

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05)


async def test_unreachable_controller_is_retried_then_reported():
    url = f"http://{LOOPBACK}:{free_port()}/api"
    async with ControllerClient(url, retry=FAST) as client:
        with pytest.raises(ControllerUnavailable, match="failed 3 times"):
            await client.start_sample("echo", 0)


async def test_interact_is_not_retried_once_the_request_was_sent():
    """A controller that reads the request and drops the connection: retrying could step twice."""
    connections = 0

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(drop, LOOPBACK, 0)
    port = server.sockets[0].getsockname()[1]
    async with server, ControllerClient(f"http://{LOOPBACK}:{port}/api", retry=FAST) as client:
        with pytest.raises(ControllerUnavailable, match="not retried"):
            await client.interact(1, tool_step("echo", {"text": "x"}))
        assert connections == 1


async def test_a_step_that_waited_past_the_connect_timeout_is_retried_and_applied_once():
    """A loaded host: every pooled connection is busy past ``connect_timeout_s``. The step was
    never sent (aiohttp's ConnectionTimeoutError), so it is retried, and the controller gets it once."""
    received: list[str] = []

    async def interact(request: web.Request) -> web.Response:
        received.append(request.headers[SESSION_ID_HEADER])
        if request.headers[SESSION_ID_HEADER] == "1":
            await asyncio.sleep(0.6)  # holds the client's only connection
        return web.json_response({"messages": [{"role": "tool", "content": "ok"}]})

    app = web.Application()
    app.router.add_post("/api/interact", interact)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    port = runner.addresses[0][1]
    patient = RetryPolicy(max_attempts=20, initial_backoff_s=0.05, max_backoff_s=0.1)
    try:
        async with ControllerClient(
            f"http://{LOOPBACK}:{port}/api", retry=patient, connect_timeout_s=0.1, max_connections=1
        ) as client:
            slow = asyncio.create_task(client.interact(1, tool_step("echo", {"text": "x"})))
            await asyncio.sleep(0.1)  # the slow step holds the connection now
            waited = await client.interact(2, tool_step("echo", {"text": "y"}))
            assert waited.messages == [{"role": "tool", "content": "ok"}]
            await slow
    finally:
        await runner.cleanup()
    assert sorted(received) == ["1", "2"]  # each step reached the controller once


async def test_start_sample_waits_for_capacity_with_backoff(servers: EnvServers):
    controller = servers.controller()
    servers.worker(controller, PROBE_TASK, concurrency=1)
    wait_routable(controller, "probe")
    patient = RetryPolicy(max_attempts=20, initial_backoff_s=0.05, max_backoff_s=0.2)
    async with ControllerClient(controller.api, retry=patient) as client:
        first = await client.start_sample("probe", "forever")

        async def free_later() -> None:
            await asyncio.sleep(0.3)
            await client.cancel(first.session_id)

        releaser = asyncio.create_task(free_later())
        second = await client.start_sample("probe", "echo")  # 503 "at capacity" until the cancel
        await releaser
        assert second.session_id != first.session_id
    async with ControllerClient(
        controller.api, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)
    ) as client:
        with pytest.raises(ControllerError) as full:
            await client.start_sample("probe", "forever")
        assert full.value.status == 503


async def test_a_start_waits_for_a_free_slot_beyond_the_retry_deadline_and_says_how_long(servers: EnvServers):
    """A step starts more episodes than the workers hold: the extra starts wait (bounded by
    capacity_wait_s) for a slot instead of being dropped when the retry policy gives up."""
    controller = servers.controller()
    servers.worker(controller, PROBE_TASK, concurrency=1)
    wait_routable(controller, "probe")
    brief = RetryPolicy(deadline_s=0.2, initial_backoff_s=0.05, max_backoff_s=0.1)
    async with ControllerClient(controller.api, retry=brief, capacity_wait_s=120) as client:
        first = await client.start_sample("probe", "forever")
        assert first.waited_s == 0.0

        async def free_later() -> None:
            await asyncio.sleep(1.0)  # well past the retry deadline
            await client.cancel(first.session_id)

        releaser = asyncio.create_task(free_later())
        second = await client.start_sample("probe", "echo")  # 503 "at capacity" until the cancel
        await releaser
        assert second.session_id != first.session_id
        assert second.waited_s > brief.deadline_s  # the waits on 503 answers, for the metrics
        await client.cancel(second.session_id)
    # bounded: a slot that never frees ends the wait with the controller's 503
    async with ControllerClient(controller.api, retry=brief, capacity_wait_s=0.5) as client:
        await client.start_sample("probe", "forever")
        with pytest.raises(ControllerError) as full:
            await client.start_sample("probe", "forever")
        assert full.value.status == 503 and "at capacity" in full.value.detail


async def test_a_task_without_a_healthy_worker_is_no_capacity_wait(servers: EnvServers, caplog):
    """Only "every worker at capacity" is worth waiting for: a task whose worker stopped (no
    heartbeats) fails once the retry policy gives up, not after capacity_wait_s."""
    controller = servers.controller(heartbeat_timeout=1.0)
    worker = servers.worker(controller, PROBE_TASK, heartbeat_interval=0.3)
    wait_routable(controller, "probe")
    worker.pause()  # alive, registered, silent: unhealthy after the heartbeat timeout
    try:
        await asyncio.sleep(2.0)
        brief = RetryPolicy(deadline_s=0.5, initial_backoff_s=0.05, max_backoff_s=0.1)
        async with ControllerClient(controller.api, retry=brief, capacity_wait_s=600) as client:
            with (
                caplog.at_level(logging.INFO, logger="agentrl_ext.env.client"),
                pytest.raises(ControllerError) as gone,
            ):
                await client.start_sample("probe", "echo")
    finally:
        worker.resume()
    assert gone.value.status == 503 and "no healthy worker" in gone.value.detail
    assert "x-agentrl-capacity" not in gone.value.headers
    assert not [r for r in caplog.records if "no free worker" in r.getMessage()]  # never a capacity wait


async def test_503_retry_after_is_honoured():
    """A controller that is busy for 0.8 s and says so: the client waits as told instead of giving up."""
    first_call: list[float] = []

    async def start_sample(request: web.Request) -> web.Response:
        now = asyncio.get_running_loop().time()
        first_call.append(now)
        if now - first_call[0] < 0.8:
            return web.json_response(
                {"detail": "workers re-register"}, status=503, headers={"Retry-After": "1"}
            )
        return web.json_response({"messages": []}, headers={"session_id": "7"})

    app = web.Application()
    app.router.add_post("/api/start_sample", start_sample)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, LOOPBACK, port).start()
    try:
        quick = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.01)
        async with ControllerClient(f"http://{LOOPBACK}:{port}/api", retry=quick) as client:
            started = await client.start_sample("echo", 0)
        assert started.session_id == 7 and len(first_call) == 2
    finally:
        await runner.cleanup()


def test_retry_after_is_capped_by_the_policy():
    policy = RetryPolicy(initial_backoff_s=0.0, max_backoff_s=0.0, max_retry_after_s=2.0)
    assert policy.backoff(1) == 0.0
    assert policy.backoff(1, retry_after_s=1.5) == 1.5
    assert policy.backoff(1, retry_after_s=3600) == 2.0


def test_the_clients_wait_out_a_controller_restart_of_a_minute_by_default():
    """What the CLIs' one-line "unreachable" errors come after (their tests shorten it): the
    documented 60 s, in the client and in what the eval runner and the dataset builder use."""
    from agentrl_ext.env.client import ControllerClient

    assert RetryPolicy().deadline_s == 60.0
    assert ControllerClient("http://127.0.0.1:9/api").retry.deadline_s == 60.0
