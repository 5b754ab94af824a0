"""The secret-adding front (``agentrl-envs front``, :mod:`agentrl_ext.env.front`): what it adds,
where it may listen, and the launcher's front beside its stack. AgentRL's own worker and evaluator
through it: ``test_interop_on_cpu.py``."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from launcher_helpers import running

from agentrl_ext.env.auth import CLIENT_SECRET_ENV, WORKER_SECRET_ENV, ServiceSecrets
from agentrl_ext.env.front import check_front
from agentrl_ext.env.launcher import EnvStack, front_argv
from agentrl_ext.testing.env_servers import ECHO_TASK, LOOPBACK, EnvServers, free_port, wait_routable

WORKER_SECRET = "w" * 20 + "-front-worker"
CLIENT_SECRET = "c" * 20 + "-front-client"


def test_the_front_adds_only_the_secrets_it_holds_and_passes_answers_through(servers: EnvServers):
    controller = servers.controller(env={WORKER_SECRET_ENV: WORKER_SECRET, CLIENT_SECRET_ENV: CLIENT_SECRET})
    servers.worker(controller, ECHO_TASK, env={WORKER_SECRET_ENV: WORKER_SECRET})
    port = free_port()
    # a front for an evaluator: the client secret only
    front = servers.launch(
        "front", front_argv(port, controller.api), port, env={CLIENT_SECRET_ENV: CLIENT_SECRET}
    )
    wait_routable(front, "echo")
    assert httpx.get(controller.api + "/get_indices", params={"name": "echo"}, timeout=5).status_code == 401
    # query string, body, the session_id header both ways: as if the client held the secret
    assert httpx.get(front.api + "/get_indices", params={"name": "echo"}, timeout=5).json()[:2] == [0, 1]
    started = httpx.post(front.api + "/start_sample", json={"name": "echo", "index": 1}, timeout=5)
    assert started.status_code == 200 and int(started.headers["session_id"]) > 0
    cancelled = httpx.post(
        front.api + "/cancel", headers={"session_id": started.headers["session_id"]}, timeout=5
    )
    assert cancelled.json()["status"] == "cancelled"
    # the controller's errors come back as they are
    unknown = httpx.post(
        front.api + "/interact", headers={"session_id": "12345"}, json={"messages": []}, timeout=5
    )
    assert unknown.status_code == 404 and "unknown session" in unknown.json()["detail"]
    # it holds no worker secret: a heartbeat through it is refused, not signed with the client's
    beat = {"name": "echo", "address": f"http://{LOOPBACK}:1/api", "concurrency": 1, "indices": [0]}
    refused = httpx.post(front.api + "/receive_heartbeat", json=beat, timeout=5)
    assert refused.status_code == 401 and "task workers" in refused.json()["detail"]
    controller.stop()
    gone = httpx.get(front.api + "/list_workers", timeout=10)
    assert gone.status_code == 502 and "could not reach the controller" in gone.json()["detail"]


@pytest.mark.parametrize(
    ("host", "secrets", "api", "says"),
    [
        ("0.0.0.0", ServiceSecrets(client=CLIENT_SECRET), "http://127.0.0.1:5020/api", "refuses to bind"),
        ("192.0.2.2", ServiceSecrets(worker=WORKER_SECRET), "http://127.0.0.1:5020/api", "refuses to bind"),
        (LOOPBACK, ServiceSecrets(), "http://127.0.0.1:5020/api", "holds no secret"),
        (LOOPBACK, ServiceSecrets(client=CLIENT_SECRET), "127.0.0.1:5020", "not the controller's API base"),
    ],
)
def test_a_front_beyond_loopback_without_a_secret_or_a_url_is_refused(host, secrets, api, says):
    with pytest.raises(ValueError, match=says):
        check_front(host, api, secrets)


def test_the_front_command_refuses_a_wildcard_address_naming_why():
    argv = [sys.executable, "-m", "agentrl_ext.env.launcher", "front", "--controller-url"]
    argv += ["http://127.0.0.1:5020/api", "--host", "0.0.0.0", "--port", str(free_port())]
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin", CLIENT_SECRET_ENV: CLIENT_SECRET},
    )
    assert result.returncode == 2 and "whoever reaches it acts with them" in result.stderr


def test_the_launchers_front_serves_its_stack_with_a_client_secret_on_cpu(tmp_path, monkeypatch):
    # also: the stack itself waits for its workers with the client secret of the environment
    secret_file = tmp_path / "worker.secret"
    secret_file.write_text(WORKER_SECRET)
    monkeypatch.setenv(CLIENT_SECRET_ENV, CLIENT_SECRET)  # the stack's controller and front read it
    front_port = free_port()
    stack = EnvStack(
        tasks=["guess"],
        port=free_port(),
        secret_file=str(secret_file),
        front_port=front_port,
        log_dir=tmp_path,
    )
    with stack:
        assert (
            stack.front is not None and f"front       http://127.0.0.1:{front_port}/api" in stack.describe()
        )
        front_api = f"http://127.0.0.1:{front_port}/api"
        assert httpx.get(stack.api + "/list_workers", headers={}, timeout=5).status_code == 401
        with httpx.Client(timeout=5) as http:  # no secret here: the front adds it
            assert http.get(front_api + "/list_workers").json()["guess"][0]["healthy"]
            index = http.get(front_api + "/get_indices", params={"name": "guess"}).json()[0]
            started = http.post(front_api + "/start_sample", json={"name": "guess", "index": index})
            assert started.status_code == 200, started.text
        pid = stack.front.pid
    assert not running(pid)
