"""Who may register workers and start episodes: the attacks of issue 32 §1, then their failure.

Each test runs the attack a stranger on the network (or on this machine) could run against a
real controller on 127.0.0.1, and asserts that it no longer works.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from env_helpers import PROBE_TASK, tool_step

from agentrl_ext.env.auth import CLIENT_SECRET_ENV, WORKER_SECRET_ENV
from agentrl_ext.env.client import ControllerClient, ControllerError
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.testing.env_servers import (
    ECHO_TASK,
    LOOPBACK,
    EnvServers,
    free_port,
    list_workers,
    wait_routable,
    wait_until,
)

WORKER_SECRET = "w" * 20 + "-worker-secret"
CLIENT_SECRET = "c" * 20 + "-client-secret"


async def heartbeat(
    api: str, name: str, address: str, concurrency: int = 100_000, **headers: str
) -> httpx.Response:
    """One heartbeat (async: the fake workers below answer from this test's event loop)."""
    beat = {"name": name, "address": address, "concurrency": concurrency, "indices": [0, 1, 2, 3, 4]}
    async with httpx.AsyncClient(timeout=15) as http:
        return await http.post(api + "/receive_heartbeat", json=beat, headers=headers)


class FakeWorker:
    """An HTTP server on 127.0.0.1 that records every request; answers as configured per path."""

    def __init__(self, answers: dict[str, tuple[int, Any]]) -> None:
        self.answers = answers
        self.seen: list[tuple[str, str]] = []
        self.port = free_port()
        self.api = f"http://{LOOPBACK}:{self.port}/api"

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path))
        status, body = self.answers.get(request.path.removeprefix("/api"), (404, {"detail": "Not Found"}))
        return web.json_response(body, status=status)

    async def __aenter__(self) -> FakeWorker:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, LOOPBACK, self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


@pytest.fixture
async def refusing_worker() -> AsyncIterator[FakeWorker]:
    """Looks like a worker (``worker_status``), refuses every start with 422."""
    answers = {
        "/worker_status": (200, {"concurrency": 100_000, "current": 0}),
        "/cancel_all": (200, {"cancelled": 0}),
        "/start_sample": (422, {"detail": "no"}),
    }
    async with FakeWorker(answers) as fake:
        yield fake


# ------------------------------------------------------------------------------- worker secret


async def test_without_the_worker_secret_no_worker_registers_and_no_worker_call_is_taken(servers: EnvServers):
    controller = servers.controller(rejoin_grace=0, env={WORKER_SECRET_ENV: WORKER_SECRET})
    worker = servers.worker(controller, ECHO_TASK, env={WORKER_SECRET_ENV: WORKER_SECRET})
    wait_routable(controller, "echo")

    # Attack: a fake worker announcing huge capacity, to receive every new episode.
    refused = await heartbeat(controller.api, "echo", f"http://{LOOPBACK}:{free_port()}/api")
    assert refused.status_code == 401, refused.text
    assert "only for task workers" in refused.json()["detail"]
    wrong = await heartbeat(controller.api, "echo", "http://x/api", authorization="Bearer " + "x" * 30)
    assert wrong.status_code == 401 and "a wrong secret" in wrong.json()["detail"]
    assert [w["address"] for w in list_workers(controller)["echo"]] == [worker.api]

    # Attack: calling the worker's own API around the controller.
    direct = httpx.post(worker.api + "/cancel_all", json={}, timeout=5)
    assert direct.status_code == 401
    async with ControllerClient(controller.api) as client:  # the controller sends the secret
        started = await client.start_sample("echo", 1)
        answer = await client.interact(started.session_id, tool_step("echo", {"text": "1"}))
        assert answer.status is SampleStatus.RUNNING


async def test_client_secret_guards_sessions_but_not_health(servers: EnvServers):
    controller = servers.controller(rejoin_grace=0, env={CLIENT_SECRET_ENV: CLIENT_SECRET})
    servers.worker(controller, ECHO_TASK)  # no worker secret configured: workers register as before
    bearer = {"authorization": f"Bearer {CLIENT_SECRET}"}
    wait_until(
        lambda: httpx.get(controller.api + "/list_workers", headers=bearer, timeout=5).json().get("echo"),
        what="the echo worker",
    )
    stranger = httpx.post(controller.api + "/start_sample", json={"name": "echo", "index": 0}, timeout=5)
    assert stranger.status_code == 401
    assert httpx.get(controller.api + "/list_sessions", timeout=5).status_code == 401
    assert httpx.get(controller.url + "/metrics", timeout=5).status_code == 401
    assert httpx.get(controller.api + "/health", timeout=5).status_code == 200
    async with ControllerClient(controller.api, secret=CLIENT_SECRET) as client:
        started = await client.start_sample("echo", 0)
        assert started.response.status is SampleStatus.RUNNING


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_controller_refuses_to_bind_beyond_loopback_without_a_worker_secret(host: str):
    env = {k: v for k, v in os.environ.items() if k != WORKER_SECRET_ENV}
    result = subprocess.run(
        [sys.executable, "-m", "agentrl_ext.env.controller", "--host", host, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "--worker-secret-file" in result.stderr and WORKER_SECRET_ENV in result.stderr


def test_a_short_secret_is_refused_naming_how_to_make_one(tmp_path):
    short = tmp_path / "secret"
    short.write_text("hunter2\n")
    result = subprocess.run(
        [sys.executable, "-m", "agentrl_ext.env.controller", "--worker-secret-file", str(short)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "holds 7 characters" in result.stderr and "secrets.token_urlsafe" in result.stderr


# ------------------------------------------------------------------------------- isolation


async def test_session_ids_are_unguessable_so_a_neighbour_session_cannot_be_touched(servers: EnvServers):
    controller = servers.controller(rejoin_grace=0)
    servers.worker(controller, ECHO_TASK, concurrency=64)
    wait_routable(controller, "echo")
    async with ControllerClient(controller.api) as client:
        ids = [(await client.start_sample("echo", i % 5)).session_id for i in range(20)]
        # Attack: the ids next to one's own name other clients' sessions.
        for guess in (ids[0] + 1, ids[0] - 1, ids[-1] + 1):
            with pytest.raises(ControllerError) as unknown:
                await client.cancel(guess)
            assert unknown.value.status == 404
    assert all(0 < i < 2**63 for i in ids) and len(set(ids)) == 20
    # 20 ids drawn from 63 bits all inside a window of 2**55: chance 2**-152
    assert max(ids) - min(ids) > 2**55
    assert len(httpx.get(controller.api + "/list_sessions", timeout=5).json()) == 20


async def test_a_worker_that_refuses_starts_does_not_block_the_task(servers: EnvServers, refusing_worker):
    controller = servers.controller(rejoin_grace=0)
    servers.worker(controller, ECHO_TASK, concurrency=4)
    wait_routable(controller, "echo")
    # Attack: a worker with the largest capacity (picked first) that answers 422 to every start.
    assert (await heartbeat(controller.api, "echo", refusing_worker.api)).status_code == 200
    await asyncio.to_thread(wait_routable, controller, "echo", 2)
    async with ControllerClient(controller.api) as client:
        for index in range(3):
            started = await client.start_sample("echo", index)
            assert started.response.status is SampleStatus.RUNNING
    assert ("POST", "/api/start_sample") in refusing_worker.seen  # it was tried, and passed over


async def test_a_task_whose_only_worker_refuses_gets_that_refusal(servers: EnvServers, refusing_worker):
    controller = servers.controller(rejoin_grace=0)
    assert (await heartbeat(controller.api, "fake", refusing_worker.api)).status_code == 200
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(controller.api + "/start_sample", json={"name": "fake", "index": 0})
    assert answer.status_code == 422
    assert "every worker of task 'fake' that was tried refused" in answer.json()["detail"]


async def test_a_heartbeat_cannot_take_over_the_address_of_another_tasks_live_worker(servers: EnvServers):
    controller = servers.controller(rejoin_grace=0)
    worker = servers.worker(controller, PROBE_TASK)
    wait_routable(controller, "probe")
    async with ControllerClient(controller.api) as client:
        started = await client.start_sample("probe", "echo")
        # Attack: one heartbeat naming the real worker's address under another task.
        takeover = await heartbeat(controller.api, "other", worker.api)
        assert takeover.status_code == 409, takeover.text
        assert "registered by a live worker of task 'probe'" in takeover.json()["detail"]
        step = await client.interact(started.session_id, tool_step("echo", {"text": "still here"}))
    assert step.status is SampleStatus.RUNNING  # no cancel_all reached the worker
    assert list(list_workers(controller)) == ["probe"] and list_workers(controller)["probe"][0]["healthy"]
    assert len(httpx.get(worker.api + "/get_sessions", timeout=5).json()) == 1


async def test_an_address_that_is_not_a_worker_is_never_sent_cancel_all_nor_probed_by_the_answer(
    servers: EnvServers,
):
    controller = servers.controller(rejoin_grace=0)
    async with FakeWorker({}) as bystander:  # some other HTTP service: 404 everywhere
        # Attack: registering another service's address (here also the controller's own).
        to_bystander = await heartbeat(controller.api, "echo", bystander.api)
        to_itself = await heartbeat(controller.api, "echo", controller.api)
        to_nothing = await heartbeat(controller.api, "echo", f"http://{LOOPBACK}:{free_port()}/api")
    assert bystander.seen == [("GET", "/api/worker_status")]  # a read, never POST cancel_all
    answers = [to_bystander, to_itself, to_nothing]
    assert [a.status_code for a in answers] == [400, 400, 400]
    # One answer whatever the address is: a heartbeat does not tell what listens where.
    assert len({a.json()["detail"] for a in answers}) == 1
    assert list_workers(controller) == {}
    async with ControllerClient(controller.api) as client:
        with pytest.raises(ControllerError) as no_task:
            await client.start_sample("echo", 0)
    assert no_task.value.status == 404
