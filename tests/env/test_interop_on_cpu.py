"""Wire compatibility with AgentRL's published packages (``agentrl-worker`` 0.4.0, ``agentrl-eval`` 0.1.2),
on an open controller and, through the secret-adding front (``agentrl-envs front``), on one with secrets.

Their packages run from a separate cached venv (see ``interop_venv.py`` for why); the first run
builds it from PyPI (about a minute). Without PyPI access the tests skip with pip's reason, which
fails the run in strict mode (``scripts/test.sh``, ``CI=true``; docs/testing.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from env_helpers import TESTS_ENV, text_step, tool_step
from interop_venv import ensure_interop_venv

from agentrl_ext.env.auth import CLIENT_SECRET_ENV, WORKER_SECRET_ENV
from agentrl_ext.env.client import ControllerClient
from agentrl_ext.env.launcher import front_argv
from agentrl_ext.env.protocol import SampleStatus, TaskOutput
from agentrl_ext.testing.env_servers import (
    ECHO_TASK,
    LOOPBACK,
    EnvServers,
    ServerProcess,
    free_port,
    subprocess_env,
    wait_routable,
)


@pytest.fixture(scope="module")
def interop_python() -> Path:
    try:
        return ensure_interop_venv()
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        pytest.skip(f"cannot install agentrl-worker/agentrl-eval from PyPI here: {exc}")


WORKER_SECRET = "w" * 20 + "-interop-worker"
CLIENT_SECRET = "c" * 20 + "-interop-client"
SECRETS = {WORKER_SECRET_ENV: WORKER_SECRET, CLIENT_SECRET_ENV: CLIENT_SECRET}


def start_agentrl_worker(
    servers: EnvServers, interop_python: Path, tmp_path: Path, controller_api: str
) -> ServerProcess:
    """A task worker written with and served by agentrl-worker 0.4.0, heartbeating to ``controller_api``."""
    config = tmp_path / "tasks.yaml"
    config.write_text(
        json.dumps(
            {
                "add": {
                    "module": "agentrl_worker_task.AddTask",
                    "parameters": {"name": "add", "concurrency": 4},
                }
            }
        )
    )
    port = free_port()
    argv = [str(interop_python), "-m", "agentrl.worker", "add", "--config", str(config)]
    argv += ["--controller", controller_api, "--self", f"http://{LOOPBACK}:{port}/api"]
    argv += ["--host", LOOPBACK, "--port", str(port), "--log-level", "WARNING"]
    return servers.launch("agentrl-worker", argv, port, ready_timeout_s=60)


@pytest.fixture
def agentrl_worker(
    servers: EnvServers, interop_python: Path, tmp_path: Path
) -> tuple[ServerProcess, ServerProcess]:
    """Our controller, and a task worker written with and served by agentrl-worker 0.4.0."""
    controller = servers.controller()
    worker = start_agentrl_worker(servers, interop_python, tmp_path, controller.api)
    wait_routable(controller, "add")
    return controller, worker


@pytest.fixture
def secret_controller(servers: EnvServers) -> tuple[ServerProcess, ServerProcess]:
    """Our controller with a worker and a client secret, and the front that adds them."""
    controller = servers.controller(env=SECRETS)
    port = free_port()
    front = servers.launch("front", front_argv(port, controller.api), port, env=SECRETS)
    return controller, front


async def play_add_task(api: str, secret: str | None = None) -> None:
    """The add task's sessions through ``api``: completed, failed validation, cancelled, overall."""
    async with ControllerClient(api, secret=secret) as client:
        assert await client.get_indices("add") == [0, 1, 2]
        started = await client.start_sample("add", 2)
        assert started.response.messages == [{"role": "user", "content": "What is 2 + 10?"}]
        assert [t["function"]["name"] for t in started.response.tools or []] == ["add", "answer"]
        step = await client.interact(started.session_id, tool_step("add", {"a": 2, "b": 10}, "c1"))
        assert not step.finish
        assert step.messages[-1] == {"role": "tool", "tool_call_id": "c1", "content": "12"}
        done = await client.interact(started.session_id, tool_step("answer", {"value": 12}, "c2"))
        assert done.finish and done.status is SampleStatus.COMPLETED and done.reward == 1.0

        invalid = await client.start_sample("add", 0)
        failed = await client.interact(invalid.session_id, text_step("no tools"))
        assert failed.finish and failed.status is SampleStatus.AGENT_VALIDATION_FAILED

        cancelled = await client.start_sample("add", 1)
        assert (await client.cancel(cancelled.session_id)).status is SampleStatus.CANCELLED
        assert await client.list_sessions() == []
        overall = await client.calculate_overall("add", [TaskOutput(index=2, status=SampleStatus.COMPLETED)])
        assert overall == {"samples": 1}


async def test_agentrl_worker_task_registers_and_completes_a_session(agentrl_worker):
    controller, _ = agentrl_worker
    await play_add_task(controller.api)


async def test_agentrl_worker_registers_through_the_front_with_a_secret_protected_controller(
    secret_controller, servers: EnvServers, interop_python: Path, tmp_path: Path
):
    controller, front = secret_controller
    beat = {"name": "add", "address": f"http://{LOOPBACK}:1/api", "concurrency": 1, "indices": [0]}
    # what agentrl-worker sends on its own is refused: no Authorization header
    assert httpx.post(controller.api + "/receive_heartbeat", json=beat, timeout=5).status_code == 401
    start_agentrl_worker(servers, interop_python, tmp_path, front.api)
    # registered through the front (the front's client secret also reads list_workers)
    wait_routable(front, "add")
    assert httpx.get(controller.api + "/list_workers", timeout=5).status_code == 401
    await play_add_task(controller.api, secret=CLIENT_SECRET)  # our client, with the secret
    await play_add_task(front.api)  # any client without it, through the front


def run_agentrl_eval(interop_python: Path, api: str) -> subprocess.CompletedProcess[str]:
    """agentrl-eval 0.1.2's client plays one echo sample through ``api`` (agentrl_eval_driver.py)."""

    env = {**subprocess_env([TESTS_ENV]), "NO_PROXY": "*", "no_proxy": "*"}
    env = {k: v for k, v in env.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    return subprocess.run(
        [str(interop_python), str(TESTS_ENV / "agentrl_eval_driver.py"), api],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=os.fspath(TESTS_ENV),
    )


def assert_one_echo_sample_completed(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["indices"] == [0, 1, 2, 3, 4]
    assert seen["status"] == "completed" and seen["reward"] == 1.0
    assert seen["turns"] == 2 and seen["tools"] == ["echo", "finish"]
    assert seen["trace_roles"] == ["system", "user", "assistant", "tool", "assistant"]
    assert isinstance(seen["session_id"], int)


def test_agentrl_eval_client_completes_a_sample_on_our_worker(servers: EnvServers, interop_python: Path):
    controller = servers.controller()
    servers.worker(controller, ECHO_TASK)
    wait_routable(controller, "echo")
    assert_one_echo_sample_completed(run_agentrl_eval(interop_python, controller.api))


def test_agentrl_eval_evaluates_through_the_front_with_a_secret_protected_controller(
    secret_controller, servers: EnvServers, interop_python: Path
):
    controller, front = secret_controller
    servers.worker(controller, ECHO_TASK, env={WORKER_SECRET_ENV: WORKER_SECRET})
    wait_routable(front, "echo")
    refused = run_agentrl_eval(interop_python, controller.api)  # straight to the controller: no secret
    assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr[-3000:]
    assert_one_echo_sample_completed(run_agentrl_eval(interop_python, front.api))
