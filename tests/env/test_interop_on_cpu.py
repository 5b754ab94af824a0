"""Wire compatibility with AgentRL's published packages (``agentrl-worker`` 0.4.0, ``agentrl-eval`` 0.1.2).

Their packages run from a separate cached venv (see ``interop_venv.py`` for why); the first run
builds it from PyPI (about a minute). Without PyPI access the tests skip with pip's reason, which
fails the run in strict mode (``scripts/test.sh``, ``CI=true``; docs/testing.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from env_helpers import TESTS_ENV, text_step, tool_step
from interop_venv import ensure_interop_venv

from agentrl_ext.env.client import ControllerClient
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


@pytest.fixture
def agentrl_worker(
    servers: EnvServers, interop_python: Path, tmp_path: Path
) -> tuple[ServerProcess, ServerProcess]:
    """Our controller, and a task worker written with and served by agentrl-worker 0.4.0."""
    controller = servers.controller()
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
    argv += ["--controller", controller.api, "--self", f"http://{LOOPBACK}:{port}/api"]
    argv += ["--host", LOOPBACK, "--port", str(port), "--log-level", "WARNING"]
    worker = servers.launch("agentrl-worker", argv, port, ready_timeout_s=60)
    wait_routable(controller, "add")
    return controller, worker


async def test_agentrl_worker_task_registers_and_completes_a_session(agentrl_worker):
    controller, _ = agentrl_worker
    async with ControllerClient(controller.api) as client:
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


def test_agentrl_eval_client_completes_a_sample_on_our_worker(servers: EnvServers, interop_python: Path):
    controller = servers.controller()
    servers.worker(controller, ECHO_TASK)
    wait_routable(controller, "echo")
    env = {**subprocess_env([TESTS_ENV]), "NO_PROXY": "*", "no_proxy": "*"}
    env = {k: v for k, v in env.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    result = subprocess.run(
        [str(interop_python), str(TESTS_ENV / "agentrl_eval_driver.py"), controller.api],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=os.fspath(TESTS_ENV),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["indices"] == [0, 1, 2, 3, 4]
    assert seen["status"] == "completed" and seen["reward"] == 1.0
    assert seen["turns"] == 2 and seen["tools"] == ["echo", "finish"]
    assert seen["trace_roles"] == ["system", "user", "assistant", "tool", "assistant"]
    assert isinstance(seen["session_id"], int)
