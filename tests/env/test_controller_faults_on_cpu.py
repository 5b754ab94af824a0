"""Faults around the controller: hung workers, restarts, oversized and slow bodies, odd input."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest
from env_helpers import PROBE_TASK, echo_controller, tool_step

from agentrl_ext.env.client import ControllerClient, ControllerError
from agentrl_ext.env.controller import ControllerConfig, create_app
from agentrl_ext.env.controller.app import OVERALL_BODY_LIMIT, START_BODY_LIMIT
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.testing.asgi import call_asgi, chunked_body
from agentrl_ext.testing.env_servers import (
    LOOPBACK,
    EnvServers,
    ServerProcess,
    list_workers,
    wait_routable,
    wait_until,
)

# A functional bound, not a performance figure: the controller must answer within seconds of
# declaring the worker lost, where it used to wait for worker_request_timeout_s.
SOON_AFTER_LOSS_S = 15.0


@pytest.fixture(scope="module")
def echo_stack(module_servers: EnvServers) -> ServerProcess:
    return echo_controller(module_servers, rejoin_grace=0)


def busy_sessions(controller: ServerProcess) -> list[dict[str, Any]]:
    return [s for s in httpx.get(controller.api + "/list_sessions", timeout=5).json() if s["busy"]]


# ------------------------------------------------------------------------------- hung worker


async def test_interact_in_flight_to_a_hung_worker_ends_with_task_error_soon_after_the_loss(servers):
    controller = servers.controller(heartbeat_timeout=2.0, check_interval=0.1)
    worker = servers.worker(controller, PROBE_TASK, heartbeat_interval=0.2)
    wait_routable(controller, "probe")
    async with ControllerClient(controller.api, timeout_s=60) as client:
        started = await client.start_sample("probe", "slow_step")
        await client.interact(started.session_id, tool_step("echo", {"text": "a"}))
        in_flight = asyncio.create_task(
            client.interact(started.session_id, tool_step("echo", {"text": "b"}))
        )  # the worker sleeps 30 s on this step
        await asyncio.to_thread(wait_until, lambda: busy_sessions(controller), what="the step in flight")
        worker.pause()
        paused_at = time.monotonic()
        answer = await in_flight
        waited = time.monotonic() - paused_at
    assert answer.finish and answer.status is SampleStatus.TASK_ERROR
    assert "was lost" in (answer.error or "") and "no heartbeat" in (answer.error or "")
    assert waited < SOON_AFTER_LOSS_S, f"answered {waited:.1f}s after SIGSTOP"
    assert not list_workers(controller)["probe"][0]["healthy"]
    worker.kill()  # hung for good (a graceful stop would wait for its 30 s step)


async def test_start_sample_in_flight_to_a_hung_worker_ends_with_task_error(servers):
    controller = servers.controller(heartbeat_timeout=2.0, check_interval=0.1)
    worker = servers.worker(controller, PROBE_TASK, heartbeat_interval=0.2)
    wait_routable(controller, "probe")
    worker.pause()
    paused_at = time.monotonic()
    async with ControllerClient(controller.api, timeout_s=60) as client:
        started = await client.start_sample("probe", "echo")
        waited = time.monotonic() - paused_at
        assert started.response.finish and started.response.status is SampleStatus.TASK_ERROR
        assert "was lost" in (started.response.error or "")
        assert waited < SOON_AFTER_LOSS_S
        with pytest.raises(ControllerError) as after:
            await client.interact(started.session_id, tool_step("echo", {"text": "x"}))
        assert after.value.status == 409 and "task error" in after.value.detail


async def test_calls_a_live_worker_does_not_answer_in_time_end_with_task_error_and_the_reason(servers):
    controller = servers.controller(worker_timeout=1.0)
    worker = servers.worker(controller, PROBE_TASK)
    wait_routable(controller, "probe")
    async with ControllerClient(controller.api, timeout_s=60) as client:
        slow = await client.start_sample("probe", "slow_start")
        assert slow.response.finish and slow.response.status is SampleStatus.TASK_ERROR
        assert "no answer within 1s" in (slow.response.error or "")

        started = await client.start_sample("probe", "slow_step")
        await client.interact(started.session_id, tool_step("echo", {"text": "a"}))
        answer = await client.interact(started.session_id, tool_step("echo", {"text": "b"}))
        assert answer.finish and answer.status is SampleStatus.TASK_ERROR
        assert "/interact): no answer within 1s" in (answer.error or "")
    assert list_workers(controller)["probe"][0]["healthy"]  # slow is not lost
    await asyncio.to_thread(
        wait_until,
        lambda: httpx.get(worker.api + "/get_sessions", timeout=5).json() == {},
        what="the timed-out sessions cancelled on the worker",
    )


# ------------------------------------------------------------------------------- restarts


async def test_restarted_controller_answers_503_until_workers_rejoin_and_the_client_retries(servers):
    first = servers.controller()
    worker = servers.worker(first, PROBE_TASK, heartbeat_interval=0.2)
    wait_routable(first, "probe")
    first.stop()
    worker.pause()  # it cannot re-register before we have looked
    second = servers.controller(port=first.port, rejoin_grace=3)
    early = httpx.post(second.api + "/start_sample", json={"name": "probe", "index": "echo"}, timeout=5)
    assert early.status_code == 503, early.text
    assert 1 <= int(early.headers["retry-after"]) <= 3
    assert "re-register" in early.json()["detail"]
    indices = httpx.get(second.api + "/get_indices", params={"name": "probe"}, timeout=5)
    assert indices.status_code == 503

    async with ControllerClient(second.api) as client:
        call = asyncio.create_task(client.start_sample("probe", "echo"))
        await asyncio.sleep(0.5)
        worker.resume()
        started = await call  # 503, Retry-After honoured, then served
        assert started.response.status is SampleStatus.RUNNING
        assert await client.get_indices("probe")


def test_unknown_task_is_404_once_the_rejoin_grace_is_over(echo_stack):
    response = httpx.post(echo_stack.api + "/start_sample", json={"name": "nope", "index": 0}, timeout=5)
    assert response.status_code == 404
    assert "tasks with workers: 'echo'" in response.json()["detail"]


# ------------------------------------------------------------------------------- input


def test_boolean_index_is_rejected_not_read_as_1(echo_stack):
    response = httpx.post(echo_stack.api + "/start_sample", json={"name": "echo", "index": True}, timeout=5)
    assert response.status_code == 422, response.text
    assert "not the boolean True" in response.json()["detail"]
    assert httpx.get(echo_stack.api + "/list_sessions", timeout=5).json() == []


def test_metrics_answer_has_one_content_type_prometheus_text(echo_stack):
    response = httpx.get(echo_stack.url + "/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers.get_list("content-type") == ["text/plain; version=0.0.4; charset=utf-8"]
    assert "agentrl_controller_workers" in response.text


def test_oversized_body_is_refused_from_its_content_length_before_it_is_sent(echo_stack):
    head = (
        "POST /api/start_sample HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {70 * 1024 * 1024}\r\n\r\n"
    ).encode()
    with socket.create_connection((LOOPBACK, int(echo_stack.port)), timeout=10) as sock:
        sock.sendall(head)  # and not one byte of the body
        answer = b""
        while chunk := sock.recv(65536):  # the server closes: it will not drain 70 MB
            answer += chunk
    status_line = answer.split(b"\r\n", 1)[0]
    assert b" 413 " in status_line, answer[:300]
    assert b"over the limit" in answer


# ------------------------------------------------------------------------------- body reading, in process


async def test_a_body_in_many_small_chunks_is_read_in_linear_time():
    # 15 MB of invalid JSON in 1 KiB pieces (under the heartbeat's 16 MiB): joined once it is
    # quick; appended piece by piece to a bytes object it is ~115 GB of copying (quadratic),
    # which would not finish in the bound.
    chunks = [b"x" * 1024] * 15_000
    app = create_app(ControllerConfig())
    answer = await asyncio.wait_for(
        call_asgi(app, "/api/receive_heartbeat", chunked_body(chunks)), timeout=60
    )
    assert answer.status == 400
    assert "not valid JSON" in json.loads(answer.body)["detail"]


async def test_a_streamed_body_over_the_limit_is_cut_off_with_413():
    chunks = [b"x" * (1 << 20)] * (START_BODY_LIMIT // (1 << 20) + 1)
    app = create_app(ControllerConfig())
    answer = await call_asgi(app, "/api/start_sample", chunked_body(chunks))
    assert answer.status == 413 and "over the limit" in json.loads(answer.body)["detail"]


async def test_calculate_overall_refuses_a_body_over_its_limit_before_reading_it():
    # it took up to 64 MiB (web.MAX_BODY_BYTES), four times what any other endpoint takes
    read = 0

    def chunks():
        nonlocal read
        while True:
            read += 1
            yield b"x" * (1 << 20)

    app = create_app(ControllerConfig())
    declared = [(b"content-length", str(OVERALL_BODY_LIMIT + 1).encode())]
    answer = await call_asgi(app, "/api/calculate_overall", chunked_body(chunks()), declared)
    assert answer.status == 413 and f"over the limit of {OVERALL_BODY_LIMIT} bytes" in answer.body.decode()
    assert read == 0 and answer.headers.get(b"connection") == b"close"
    # streamed without a length: cut off once it passes the limit, not at 64 MiB
    answer = await call_asgi(app, "/api/calculate_overall", chunked_body(chunks()))
    assert answer.status == 413 and read == OVERALL_BODY_LIMIT // (1 << 20) + 1
    assert 'endpoint="calculate_overall"} 2.0' in app.state.service.metrics.render().decode()
