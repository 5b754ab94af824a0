"""The controller against real task workers, all on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from env_helpers import PROBE_TASK, raw_tool_step, text_step, tool_step

from agentrl_ext.env.client import ControllerClient, ControllerError, RetryPolicy
from agentrl_ext.env.protocol import SampleStatus, TaskOutput
from agentrl_ext.testing.env_servers import (
    ECHO_TASK,
    EnvServers,
    ServerProcess,
    list_workers,
    wait_routable,
    wait_until,
)


def sessions_on(controller: ServerProcess) -> list[dict]:
    return httpx.get(controller.api + "/list_sessions", timeout=5).json()


def metric_value(controller: ServerProcess, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when absent)."""
    text = httpx.get(controller.url + "/metrics", timeout=5).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            sample, value = line.rsplit(" ", 1)
            found = sample[len(name) :].strip("{}")
            if ",".join(sorted(found.split(","))) == wanted:
                return float(value)
    return 0.0


@pytest.fixture(scope="module")
def stack(module_servers: EnvServers) -> tuple[ServerProcess, ServerProcess]:
    """One controller with one probe worker, shared by the tests that do not disturb them.

    No rejoin grace: an unknown task is answered 404 at once (the grace has its own test).
    """
    controller = module_servers.controller(rejoin_grace=0)
    worker = module_servers.worker(controller, PROBE_TASK, concurrency=32)
    wait_routable(controller, "probe")
    return controller, worker


# ------------------------------------------------------------------------------- sessions


async def test_session_runs_to_completion_through_controller(stack):
    controller, _ = stack
    async with ControllerClient(controller.api) as client:
        started = await client.start_sample("probe", "echo")
        assert started.response.status is SampleStatus.RUNNING
        assert [t["function"]["name"] for t in started.response.tools or []] == ["echo", "finish"]
        assert started.response.messages == [{"role": "user", "content": "behaviour echo"}]
        step = await client.interact(started.session_id, tool_step("echo", {"text": "hi"}))
        assert step.messages == [{"role": "tool", "tool_call_id": "call_1", "content": "hi"}]
        assert not step.finish
        done = await client.interact(started.session_id, tool_step("finish", {"answer": "x"}))
        assert done.finish and done.status is SampleStatus.COMPLETED
        assert done.reward == 1.0 and done.metrics == {"turns": 2}
        assert all(s["session_id"] != started.session_id for s in sessions_on(controller))


@pytest.mark.parametrize(
    ("step", "status", "reason"),
    [
        (text_step("no tools today"), SampleStatus.AGENT_VALIDATION_FAILED, "no tool call"),
        (tool_step("format_disk", {}), SampleStatus.AGENT_INVALID_ACTION, "unknown tool 'format_disk'"),
        (
            raw_tool_step("echo", '{"text": "unterminated'),
            SampleStatus.AGENT_VALIDATION_FAILED,
            "not valid JSON",
        ),
    ],
    ids=["no-tool-call", "unknown-tool", "malformed-arguments"],
)
async def test_invalid_actions_end_the_session_with_agentrl_status(stack, step, status, reason):
    controller, _ = stack
    async with ControllerClient(controller.api) as client:
        started = await client.start_sample("probe", "echo")
        answer = await client.interact(started.session_id, step)
        assert answer.finish
        assert answer.status is status
        assert reason in (answer.error or "")


async def test_task_exception_is_task_error_and_worker_keeps_serving(stack):
    controller, worker = stack
    async with ControllerClient(controller.api) as client:
        at_start = await client.start_sample("probe", "raise_on_start")
        assert at_start.response.finish and at_start.response.status is SampleStatus.TASK_ERROR
        assert "RuntimeError: boom at start" in (at_start.response.error or "")

        started = await client.start_sample("probe", "raise_after_action")
        failed = await client.interact(started.session_id, tool_step("echo", {"text": "x"}))
        assert failed.finish and failed.status is SampleStatus.TASK_ERROR
        assert "boom after action" in (failed.error or "")

        healthy = await client.start_sample("probe", "echo")
        done = await client.interact(healthy.session_id, tool_step("finish", {"answer": "ok"}))
        assert done.status is SampleStatus.COMPLETED
    assert worker.alive


async def test_cancel_ends_session_on_worker_and_is_idempotent(stack, tmp_path):
    controller, worker = stack
    async with ControllerClient(controller.api) as client:
        started = await client.start_sample("probe", "forever")
        sid = started.session_id
        assert str(sid) in httpx.get(worker.api + "/get_sessions").json()
        cancelled = await client.cancel(sid)
        assert cancelled.status is SampleStatus.CANCELLED
        assert str(sid) not in httpx.get(worker.api + "/get_sessions").json()
        again = await client.cancel(sid)
        assert again.status is SampleStatus.CANCELLED
        with pytest.raises(ControllerError) as after:
            await client.interact(sid, tool_step("echo", {"text": "x"}))
        assert after.value.status == 409 and "already finished" in after.value.detail
        with pytest.raises(ControllerError) as unknown:
            await client.cancel(12345)
        assert unknown.value.status == 404


async def test_get_indices_list_workers_and_calculate_overall(stack):
    controller, worker = stack
    async with ControllerClient(controller.api) as client:
        assert await client.get_indices("probe") == [
            "echo",
            "raise_on_start",
            "raise_after_action",
            "slow_step",
            "forever",
            "slow_start",
        ]
        workers = await client.list_workers()
        assert [w.address for w in workers["probe"]] == [worker.api]
        overall = await client.calculate_overall(
            "probe",
            [
                TaskOutput(index="echo", status=SampleStatus.COMPLETED),
                TaskOutput(status=SampleStatus.TASK_ERROR),
            ],
        )
        assert overall == {"total": 2, "status": {"completed": 1, "task error": 1}, "completion_rate": 0.5}


async def test_metrics_count_sessions_by_status(stack):
    controller, _ = stack
    before = metric_value(
        controller, "agentrl_controller_sessions_finished_total", task="probe", status="completed"
    )
    async with ControllerClient(controller.api) as client:
        started = await client.start_sample("probe", "echo")
        await client.interact(started.session_id, tool_step("finish", {"answer": "a"}))
    after = metric_value(
        controller, "agentrl_controller_sessions_finished_total", task="probe", status="completed"
    )
    assert after == before + 1
    text = httpx.get(controller.url + "/metrics").text
    for name in (
        "agentrl_controller_sessions_open",
        "agentrl_controller_sessions_started_total",
        "agentrl_controller_request_duration_seconds_bucket",
        "agentrl_controller_worker_request_duration_seconds_bucket",
        'agentrl_controller_workers{state="healthy",task="probe"} 1.0',
    ):
        assert name in text


# ------------------------------------------------------------------------------- bad input

BAD_REQUESTS = [
    ("POST", "/start_sample", b"{not json", {}, 400, "not valid JSON"),
    ("POST", "/start_sample", json.dumps({"name": "probe", "index": [1]}).encode(), {}, 422, "index"),
    ("POST", "/start_sample", json.dumps({"index": 1}).encode(), {}, 422, "name"),
    ("POST", "/start_sample", b"", {}, 400, "JSON body"),
    (
        "POST",
        "/start_sample",
        json.dumps({"name": "nope", "index": 0}).encode(),
        {},
        404,
        "tasks with workers: 'probe'",
    ),
    (
        "POST",
        "/start_sample",
        json.dumps({"name": "probe", "index": "zzz"}).encode(),
        {},
        400,
        "not an index",
    ),
    ("POST", "/start_sample", json.dumps({"name": "probe", "index": -1}).encode(), {}, 422, "custom_task"),
    ("POST", "/interact", json.dumps({"messages": text_step("x")}).encode(), {}, 400, "session_id"),
    (
        "POST",
        "/interact",
        json.dumps({"messages": text_step("x")}).encode(),
        {"session_id": "abc"},
        400,
        "integer",
    ),
    (
        "POST",
        "/interact",
        json.dumps({"messages": text_step("x")}).encode(),
        {"session_id": "77"},
        404,
        "unknown session_id 77",
    ),
    # The session id in the body (older clients): the body is read, and checked, first. (With
    # the header, an unknown session is answered 404 before the body is read: tests/env/test_stalls_on_cpu.py.)
    ("POST", "/interact", json.dumps({"session_id": 77, "messages": "hi"}).encode(), {}, 422, "messages"),
    (
        "POST",
        "/interact",
        json.dumps({"session_id": 77, "messages": [{"content": 1}]}).encode(),
        {},
        422,
        "role",
    ),
    ("POST", "/cancel", b"", {"session_id": "-5"}, 404, "unknown session_id"),
    ("GET", "/start_sample", b"", {}, 405, "use POST"),
    ("GET", "/no_such_endpoint", b"", {}, 404, "endpoints:"),
    ("GET", "/get_indices", b"", {}, 400, "?name="),
    ("POST", "/receive_heartbeat", json.dumps({"name": "t", "concurrency": 1}).encode(), {}, 400, "address"),
    (
        "POST",
        "/receive_heartbeat",
        json.dumps({"name": "t", "address": "http://x", "concurrency": 0}).encode(),
        {},
        422,
        "concurrency",
    ),
    (
        "POST",
        "/calculate_overall",
        json.dumps({"name": "probe", "results": "x"}).encode(),
        {},
        422,
        "results",
    ),
]


@pytest.mark.parametrize(("method", "path", "body", "headers", "status", "text"), BAD_REQUESTS)
def test_malformed_requests_get_4xx_with_a_reason(stack, method, path, body, headers, status, text):
    controller, _ = stack
    response = httpx.request(method, controller.api + path, content=body, headers=headers, timeout=5)
    assert response.status_code == status, response.text
    assert text in response.json()["detail"]


# ------------------------------------------------------------------------------- routing and health


async def test_start_sample_routes_to_worker_with_most_free_capacity(servers):
    controller = servers.controller()
    big = servers.worker(controller, PROBE_TASK, concurrency=4)
    small = servers.worker(controller, PROBE_TASK, concurrency=2)
    wait_routable(controller, "probe", 2)
    async with ControllerClient(controller.api) as client:
        for _ in range(6):
            free = {
                w["address"]: w["concurrency"] - w["open_sessions"] for w in list_workers(controller)["probe"]
            }
            started = await client.start_sample("probe", "forever")
            chosen = next(
                s["worker"] for s in sessions_on(controller) if s["session_id"] == started.session_id
            )
            assert free[chosen] == max(free.values()), (free, chosen)
        per_worker = {w["address"]: w["open_sessions"] for w in list_workers(controller)["probe"]}
        assert per_worker == {big.api: 4, small.api: 2}
        async with ControllerClient(controller.api, retry=_no_retry()) as once:
            with pytest.raises(ControllerError) as full:
                await once.start_sample("probe", "forever")
        assert full.value.status == 503 and "at capacity (6/6 sessions)" in full.value.detail


def _no_retry() -> RetryPolicy:
    return RetryPolicy(max_attempts=1)


async def test_406_from_a_full_worker_is_retried_on_another(servers):
    controller = servers.controller()
    lying = servers.worker(controller, PROBE_TASK, concurrency=2)
    spare = servers.worker(controller, PROBE_TASK, concurrency=1)
    wait_routable(controller, "probe", 2)
    # Fill the first worker behind the controller's back: it still looks free to the controller.
    for sid in (900001, 900002):
        response = httpx.post(lying.api + "/start_sample", json={"index": "forever", "session_id": sid})
        assert response.status_code == 200
    assert (
        httpx.post(lying.api + "/start_sample", json={"index": "forever", "session_id": 3}).status_code == 406
    )
    async with ControllerClient(controller.api) as client:
        started = await client.start_sample("probe", "forever")
    chosen = next(s["worker"] for s in sessions_on(controller) if s["session_id"] == started.session_id)
    assert chosen == spare.api
    assert (
        metric_value(controller, "agentrl_controller_start_sample_retries_total", task="probe", reason="full")
        == 1
    )


async def test_lost_heartbeat_marks_worker_unhealthy_and_ends_its_sessions(servers):
    controller = servers.controller(heartbeat_timeout=1.0, check_interval=0.1)
    worker = servers.worker(controller, PROBE_TASK, heartbeat_interval=0.2)
    wait_routable(controller, "probe")
    async with ControllerClient(controller.api) as client:
        started = await client.start_sample("probe", "forever")
        worker.pause()  # hung worker: no heartbeats
        wait_until(
            lambda: not list_workers(controller)["probe"][0]["healthy"], what="worker marked unhealthy"
        )
        assert sessions_on(controller) == []
        answer = await client.interact(started.session_id, tool_step("echo", {"text": "x"}))
        assert answer.finish and answer.status is SampleStatus.TASK_ERROR
        assert "was lost" in (answer.error or "") and "no heartbeat" in (answer.error or "")
        async with ControllerClient(controller.api, retry=_no_retry()) as once:
            with pytest.raises(ControllerError) as no_worker:
                await once.start_sample("probe", "echo")
        assert no_worker.value.status == 503 and "no healthy worker" in no_worker.value.detail

        worker.resume()  # back: reclaimed with cancel_all, then routable again
        wait_routable(controller, "probe")
        assert httpx.get(worker.api + "/get_sessions").json() == {}
        again = await client.start_sample("probe", "echo")
        done = await client.interact(again.session_id, tool_step("finish", {"answer": "a"}))
        assert done.status is SampleStatus.COMPLETED


async def test_idle_session_expires_and_is_cancelled_on_worker(servers, tmp_path: Path):
    controller = servers.controller(idle_timeout=0.5, check_interval=0.1)
    worker = servers.worker(controller, PROBE_TASK, task_kwargs={"marker_dir": str(tmp_path)})
    wait_routable(controller, "probe")
    async with ControllerClient(controller.api) as client:
        started = await client.start_sample("probe", "forever")
        wait_until(lambda: sessions_on(controller) == [], what="idle session to expire")
        wait_until(
            lambda: (tmp_path / f"{started.session_id}.end").exists(), what="task cleanup after expiry"
        )
        assert httpx.get(worker.api + "/get_sessions").json() == {}
        answer = await client.interact(started.session_id, tool_step("echo", {"text": "late"}))
        assert answer.finish and answer.status is SampleStatus.CANCELLED
        assert "idle" in (answer.error or "")
    assert metric_value(controller, "agentrl_controller_sessions_expired_total", task="probe") == 1


async def test_controller_restart_forgets_sessions_and_reclaims_them_on_workers(servers, tmp_path: Path):
    first = servers.controller()
    worker = servers.worker(first, PROBE_TASK, task_kwargs={"marker_dir": str(tmp_path)})
    wait_routable(first, "probe")
    async with ControllerClient(first.api) as client:
        old = await client.start_sample("probe", "forever")
    first.stop()
    second = servers.controller(port=first.port)
    wait_routable(second, "probe")
    wait_until(lambda: (tmp_path / f"{old.session_id}.end").exists(), what="orphaned session reclaimed")
    assert httpx.get(worker.api + "/get_sessions").json() == {}
    async with ControllerClient(second.api) as client:
        with pytest.raises(ControllerError) as gone:
            await client.interact(old.session_id, tool_step("echo", {"text": "x"}))
        assert gone.value.status == 404 and "in memory only" in gone.value.detail
        new = await client.start_sample("probe", "echo")
        assert new.session_id != old.session_id  # random 63-bit ids: never the old one


async def test_worker_that_dies_ends_session_at_next_call(servers):
    controller = servers.controller()
    worker = servers.worker(controller, ECHO_TASK)
    wait_routable(controller, "echo")
    async with ControllerClient(controller.api) as client:
        started = await client.start_sample("echo", 1)
        worker.stop()
        answer = await client.interact(started.session_id, tool_step("echo", {"text": "x"}))
        assert answer.finish and answer.status is SampleStatus.TASK_ERROR
        assert "cannot connect to worker" in (answer.error or "")
        assert not list_workers(controller)["echo"][0]["healthy"]
