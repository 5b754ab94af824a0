"""The task worker on its own (AgentRL worker API), served by uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from env_helpers import PROBE_TASK, tool_step

from agentrl_ext.testing.env_servers import EnvServers, ServerProcess, wait_until


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def worker(module_servers: EnvServers, marker_dir: Path) -> ServerProcess:
    """A stand-alone probe worker (no controller) with 3 slots."""
    return module_servers.worker(None, PROBE_TASK, task_kwargs={"marker_dir": str(marker_dir)}, concurrency=3)


@pytest.fixture(scope="module")
def limited(module_servers: EnvServers) -> ServerProcess:
    """A probe worker with short step and session time limits."""
    kwargs = {"step_time_limit_s": 0.5, "session_time_limit_s": 1.5}
    return module_servers.worker(None, PROBE_TASK, task_kwargs=kwargs)


_next_id = iter(range(1, 10**6))


def start(worker: ServerProcess, index: str, session_id: int | None = None) -> tuple[int, httpx.Response]:
    sid = session_id or next(_next_id)
    return sid, httpx.post(worker.api + "/start_sample", json={"index": index, "session_id": sid}, timeout=10)


def interact(worker: ServerProcess, sid: int, step: list[dict]) -> httpx.Response:
    return httpx.post(worker.api + "/interact", json={"session_id": sid, "messages": step}, timeout=10)


def test_worker_speaks_agentrl_worker_api(worker):
    sid, response = start(worker, "echo")
    assert response.status_code == 200
    assert response.headers["session_id"] == str(sid)
    body = response.json()
    assert body["status"] == "running" and body["finish"] is False and body["metric"] == {}
    assert [t["function"]["name"] for t in body["tools"]] == ["echo", "finish"]
    assert httpx.get(worker.api + "/get_sessions").json() == {str(sid): "echo"}
    assert httpx.get(worker.api + "/worker_status").json() == {"concurrency": 3, "current": 1}
    status = httpx.post(worker.api + "/sample_status", json={"session_id": sid}).json()
    assert status["index"] == "echo" and status["status"]["waiting_for_agent"] is True
    step = interact(worker, sid, tool_step("echo", {"text": "a"})).json()
    assert step["session_id"] == sid
    assert step["env_out"]["messages"] == [{"role": "tool", "tool_call_id": "call_1", "content": "a"}]
    assert step["env_out"]["tools"] is None  # tool schemas are sent once, at start_sample
    done = interact(worker, sid, tool_step("finish", {"answer": "b"})).json()["env_out"]
    assert done["finish"] is True and done["status"] == "completed" and done["reward"] == 1.0
    assert httpx.get(worker.api + "/get_sessions").json() == {}


def test_concurrency_limit_answers_406_and_frees_slots(worker):
    ids = [start(worker, "forever")[0] for _ in range(3)]
    sid, response = start(worker, "forever")
    assert response.status_code == 406 and "concurrency limit" in response.json()["detail"]
    assert httpx.post(worker.api + "/cancel", json={"session_id": ids[0]}).status_code == 200
    sid, response = start(worker, "forever")
    assert response.status_code == 200
    assert httpx.post(worker.api + "/cancel_all").json() == {"cancelled": 3}
    assert httpx.get(worker.api + "/worker_status").json()["current"] == 0


def test_cancel_reaches_the_task_and_runs_its_cleanup(worker, marker_dir):
    sid, _ = start(worker, "forever")
    assert not (marker_dir / f"{sid}.end").exists()
    assert httpx.post(worker.api + "/cancel", json={"session_id": sid}).json() == {"session_id": sid}
    assert (marker_dir / f"{sid}.end").read_text() == "forever"
    assert httpx.post(worker.api + "/cancel", json={"session_id": sid}).status_code == 404


async def test_concurrent_step_on_one_session_is_rejected(worker):
    sid, _ = start(worker, "slow_step")
    assert interact(worker, sid, tool_step("echo", {"text": "1"})).status_code == 200
    async with httpx.AsyncClient(timeout=10) as client:
        slow = asyncio.create_task(
            client.post(
                worker.api + "/interact",
                json={"session_id": sid, "messages": tool_step("echo", {"text": "2"})},
            )
        )
        await asyncio.sleep(0.3)
        second = await client.post(
            worker.api + "/interact", json={"session_id": sid, "messages": tool_step("echo", {"text": "3"})}
        )
        assert second.status_code == 409 and "busy" in second.json()["detail"]
        assert (await client.post(worker.api + "/cancel", json={"session_id": sid})).status_code == 200
        cancelled = (await slow).json()["env_out"]
    assert cancelled["finish"] is True and cancelled["status"] == "cancelled"


def test_step_over_time_limit_is_task_error(limited):
    sid, _ = start(limited, "slow_step")
    interact(limited, sid, tool_step("echo", {"text": "1"}))
    out = interact(limited, sid, tool_step("echo", {"text": "2"})).json()["env_out"]
    assert out["finish"] is True and out["status"] == "task error"
    assert "step_time_limit_s=0.5" in out["error"]


def test_session_over_time_limit_is_task_limit_reached(limited):
    sid, _ = start(limited, "forever")

    def ended() -> dict | None:
        response = interact(limited, sid, tool_step("echo", {"text": "x"}))
        return response.json()["env_out"] if response.json()["env_out"]["finish"] else None

    out = wait_until(ended, timeout_s=20, interval_s=0.2, what="session time limit")
    assert out["status"] == "task limit reached" and "session_time_limit_s=1.5" in out["error"]


@pytest.mark.parametrize(
    ("path", "body", "status", "text"),
    [
        ("/start_sample", {"index": "echo"}, 422, "session_id"),
        ("/start_sample", {"index": -1, "session_id": 5}, 400, "custom samples"),
        ("/interact", {"session_id": 424242, "messages": tool_step("echo")}, 404, "no such session"),
        ("/cancel", {"session_id": "x"}, 422, "session_id"),
        ("/calculate_overall", {"results": [{"status": "nonsense"}]}, 422, "status"),
    ],
)
def test_worker_rejects_bad_requests_with_4xx(worker, path, body, status, text):
    response = httpx.post(worker.api + path, json=body, timeout=5)
    assert response.status_code == status, response.text
    assert text in response.json()["detail"]


def test_duplicate_session_id_is_rejected(worker):
    sid, first = start(worker, "forever")
    _, again = start(worker, "forever", session_id=sid)
    assert again.status_code == 400 and "already exists" in again.json()["detail"]
    httpx.post(worker.api + "/cancel", json={"session_id": sid})
