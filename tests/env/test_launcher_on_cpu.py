"""``agentrl-envs up``: the whole stack starts healthy, serves episodes, and Ctrl-C leaves nothing behind.

The launcher runs as a real subprocess (``python -m agentrl_ext.env.launcher up``) with dbbench
(SQLite), kg and guess; the test plays episodes through its controller with raw HTTP, then
sends SIGINT and checks that every process the launcher started is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from launcher_helpers import descendants, launcher, read_until, running

from agentrl_ext.config import AgentRLConfig
from agentrl_ext.env.launcher import launch_from_config
from agentrl_ext.env.tasks import task_specs
from agentrl_ext.testing.env_servers import free_port, list_workers, wait_until
from agentrl_ext.testing.vendored_data import vendored_data_dir

DBBENCH_STANDARD = vendored_data_dir() / "agentbench" / "dbbench" / "standard.jsonl"


def play_guess(api: str, index: int) -> dict:
    """Binary search on guess's higher/lower feedback, through the controller (raw protocol)."""
    http = httpx.Client(timeout=30)
    started = http.post(f"{api}/start_sample", json={"name": "guess", "index": index})
    assert started.status_code == 200, started.text
    session, low, high = started.headers["session_id"], 1, 16
    for step in range(6):
        number = (low + high) // 2
        call = {
            "id": f"c{step}",
            "type": "function",
            "function": {"name": "guess", "arguments": json.dumps({"number": number})},
        }
        answer = http.post(
            f"{api}/interact",
            headers={"session_id": session},
            json={"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]},
        ).json()
        if answer["finish"]:
            return answer
        feedback = answer["messages"][0]["content"].lower()
        low, high = (number + 1, high) if "higher" in feedback else (low, number - 1)
    return answer


def test_up_serves_dbbench_kg_guess_and_ctrl_c_leaves_nothing_on_cpu(tmp_path):
    if not DBBENCH_STANDARD.is_file():
        pytest.skip(f"no vendored data copy at {DBBENCH_STANDARD.parents[2]}")
    port = free_port()
    dbbench = json.dumps({"backend": "sqlite", "data_dir": str(vendored_data_dir())})
    proc = launcher(
        "--tasks",
        "dbbench,kg,guess",
        "--split",
        "test",  # the held-out samples the checks below read (dbbench standard.jsonl, guess 0..99)
        "--port",
        str(port),
        "--task-kwargs",
        f"dbbench={dbbench}",
        log_dir=tmp_path,
    )
    try:
        printed = read_until(proc, "agentrl-envs: ready", timeout_s=300, log_dir=tmp_path)
        api = f"http://127.0.0.1:{port}/api"
        assert f"controller  {api}" in printed
        assert "serving the held-out test split, for evaluation" in printed
        for task in ("dbbench", "kg", "guess"):
            assert f"worker {task}" in printed
        workers = list_workers(api)
        assert {t: [w["healthy"] and w["routable"] for w in ws] for t, ws in workers.items()} == {
            "dbbench": [True],
            "kg": [True],
            "guess": [True],
        }
        # episodes through the launched stack: guess solved by binary search, a dbbench label committed
        done = play_guess(api, 0)
        assert (done["status"], done["reward"]) == ("completed", 1.0), done
        first = json.loads(DBBENCH_STANDARD.read_text().splitlines()[0])
        http = httpx.Client(timeout=30)
        started = http.post(f"{api}/start_sample", json={"name": "dbbench", "index": 0})
        commit = {
            "id": "c0",
            "type": "function",
            "function": {"name": "commit_final_answer", "arguments": json.dumps({"answers": first["label"]})},
        }
        done = http.post(
            f"{api}/interact",
            headers={"session_id": started.headers["session_id"]},
            json={"messages": [{"role": "assistant", "content": None, "tool_calls": [commit]}]},
        ).json()
        assert (done["status"], done["reward"]) == ("completed", 1.0), done
        started = http.post(f"{api}/start_sample", json={"name": "kg", "index": 0})
        assert (
            started.status_code == 200 and started.json()["tools"][0]["function"]["name"] == "get_relations"
        )

        children = descendants(proc.pid)
        assert len(children) >= 4  # the controller and three workers
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, proc.stdout.read() if proc.stdout else ""
        wait_until(
            lambda: not any(running(pid) for pid in children), 30, what="the launcher's processes to exit"
        )
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_worker_that_dies_stops_the_whole_stack_on_cpu(tmp_path):
    port = free_port()
    proc = launcher("--tasks", "guess", "--port", str(port), log_dir=tmp_path)
    try:
        read_until(proc, "agentrl-envs: ready", timeout_s=300, log_dir=tmp_path)
        (worker,) = list_workers(f"http://127.0.0.1:{port}/api")["guess"]
        worker_port = int(worker["address"].rsplit(":", 1)[1].split("/")[0])
        children = descendants(proc.pid)
        (worker_pid,) = [
            pid
            for pid in children
            if f"--port\x00{worker_port}\x00" in Path(f"/proc/{pid}/cmdline").read_text()
        ]
        os.kill(worker_pid, signal.SIGKILL)
        assert proc.wait(60) == 1  # it notices, stops the rest and says so
        assert not any(running(pid) for pid in children)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_unknown_task_lists_the_known_ones_on_cpu(tmp_path):
    proc = launcher("--tasks", "kg,nosuch", log_dir=tmp_path)
    output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 2
    assert "unknown task 'nosuch'; known tasks: " + ", ".join(task_specs()) in output


def test_launch_from_config_starts_and_stops_the_stack_on_cpu():
    off = AgentRLConfig.from_config({})
    with launch_from_config(off) as stack:
        assert stack is None  # agentrl.envs.launch defaults to false
    port = free_port()
    config = AgentRLConfig.from_config(
        {"envs": {"launch": True, "tasks": ["guess"], "port": port, "split": "test", "ready_timeout_s": 120}}
    )
    with launch_from_config(config) as stack:
        assert stack is not None and stack.api == f"http://127.0.0.1:{port}/api"
        done = play_guess(stack.api, 3)
        assert (done["status"], done["reward"]) == ("completed", 1.0)
        pids = [stack.controller.pid, stack.workers["guess"].pid]  # type: ignore[union-attr]
        # a second stack on the same port refuses to start (its workers would join this
        # controller, and lose it when this run ends)
        with pytest.raises(RuntimeError, match=rf"port {port} on 127.0.0.1 is in use.*agentrl.envs.port=N"):
            with launch_from_config(config):
                pass
        assert play_guess(stack.api, 4)["status"] == "completed"  # and this stack still serves
    assert not any(running(pid) for pid in pids)
    with pytest.raises(ValueError, match="unknown task 'nosuch'; known tasks: "):
        AgentRLConfig.from_config({"envs": {"launch": True, "tasks": ["nosuch"]}})


def test_replicas_per_task_and_the_bind_address_reach_every_worker_on_cpu(tmp_path):
    """``agentrl.envs.replicas`` starts that many workers of a task; ``host`` is where the controller
    and the workers listen and what every URL names (here IPv6 loopback, bracketed in URLs)."""
    port = free_port()
    config = AgentRLConfig.from_config(
        {"envs": {"launch": True, "tasks": ["guess", "calc"], "port": port, "host": "::1",
                  "replicas": {"guess": 3}, "ready_timeout_s": 120}}
    )  # fmt: skip
    with launch_from_config(config) as stack:
        assert stack is not None and stack.api == f"http://[::1]:{port}/api"
        workers = list_workers(stack.api)
        guess = [w for w in workers["guess"] if w["healthy"] and w["routable"]]
        assert len(guess) == 3 and len(workers["calc"]) == 1
        assert all(w["address"].startswith("http://[::1]:") for w in [*guess, *workers["calc"]])
        assert sorted(stack.workers) == ["calc", "guess", "guess#2", "guess#3"]
        assert play_guess(stack.api, 10003)["status"] == "completed"  # the train split's seeds


def test_an_address_beyond_loopback_needs_a_secret_and_an_advertised_address_on_cpu(monkeypatch):
    from agentrl_ext.env.auth import WORKER_SECRET_ENV
    from agentrl_ext.env.launcher import EnvStack

    monkeypatch.delenv(WORKER_SECRET_ENV, raising=False)
    # nothing is started: both are refused while the stack is described
    with pytest.raises(ValueError, match=r"0.0.0.0 binds every address.*--advertise-host ADDRESS"):
        EnvStack(tasks=["guess"], host="0.0.0.0")
    with pytest.raises(ValueError, match=r"refuses to bind '0.0.0.0' without a worker secret.*--secret-file"):
        EnvStack(tasks=["guess"], host="0.0.0.0", advertise_host="envs.cluster.test")
    with pytest.raises(ValueError, match=r"replicas .* must be >= 1"):
        EnvStack(tasks=["guess"], replicas={"guess": 0})


def test_ctrl_c_while_a_server_starts_stops_that_server_on_cpu(monkeypatch, tmp_path):
    """Ctrl-C during ``mariadb.sh start``: the server it began to start (``nohup``, not a child of
    ours) is stopped with the rest, although its start never returned."""
    from agentrl_ext.env.launcher import stack as stack_module

    calls: list[tuple[str, ...]] = []

    def fake_script(name, *args, env=None):
        calls.append((name, *args))
        if args == ("start",):
            raise KeyboardInterrupt  # the signal arrives while the script waits for the server
        return subprocess.CompletedProcess([name, *args], 1 if args == ("status",) else 0, "", "")

    monkeypatch.setattr(stack_module, "_script", fake_script)
    stack = stack_module.EnvStack(tasks=["dbbench"], port=free_port(), log_dir=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        stack.start()
    assert calls == [
        ("mariadb.sh", "status"),
        ("mariadb.sh", "install"),
        ("mariadb.sh", "start"),
        ("mariadb.sh", "stop"),
    ]
    assert stack.controller is None and not stack.workers
