"""Every command-line option of the environment service reaches its own setting.

Each test gives every option a value no other option has, then reads where each value landed:
a table that wires ``--body-idle-timeout`` to ``head_timeout_s`` (or one option to no field)
fails here. The expected flag -> field pairs are written out by hand, not read from the tables
under test, and each test also fails when a table grows an option this file does not check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl_ext.env.controller import app as controller_app
from agentrl_ext.env.controller.config import CONFIG_OPTIONS
from agentrl_ext.env.launcher import command, stack
from agentrl_ext.env.launcher.processes import controller_argv, worker_argv
from agentrl_ext.env.worker import cli as worker_cli

# flag -> (ControllerConfig field, a value no other flag gets; the pairs satisfy the config's checks)
CONTROLLER_FLAGS: dict[str, tuple[str, float | int]] = {
    "--idle-timeout": ("idle_timeout_s", 611.0),
    "--heartbeat-timeout": ("heartbeat_timeout_s", 27.0),
    "--check-interval": ("check_interval_s", 2.5),
    "--worker-timeout": ("worker_request_timeout_s", 133.0),
    "--rejoin-grace": ("rejoin_grace_s", 11.0),
    "--body-idle-timeout": ("body_idle_timeout_s", 31.0),
    "--head-timeout": ("head_timeout_s", 37.0),
    "--shard": ("shard", 3),
    "--shards": ("shards", 5),
}


class _Served(Exception):
    """Raised by the stand-in for ``serve``: the command got as far as serving."""


def _capture_serve(monkeypatch: pytest.MonkeyPatch, module: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def serve(app: Any, host: str, port: int, log_level: str = "info", head_timeout_s: float | None = None):
        seen.update(app=app, host=host, port=port, log_level=log_level, head_timeout_s=head_timeout_s)
        raise _Served

    monkeypatch.setattr(module, "serve", serve)
    return seen


def test_the_controller_table_has_exactly_the_checked_options_on_cpu():
    assert sorted(option.flag for option in CONFIG_OPTIONS) == sorted(CONTROLLER_FLAGS)


def test_every_controller_option_reaches_its_own_field_on_cpu(monkeypatch):
    seen = _capture_serve(monkeypatch, controller_app)
    argv = ["--host", "127.0.0.1", "--port", "5099", "--log-level", "warning"]
    for flag, (_field, value) in CONTROLLER_FLAGS.items():
        argv += [flag, str(value)]
    with pytest.raises(_Served):
        controller_app.main(argv)
    config = seen["app"].state.service.config
    landed = {flag: getattr(config, field) for flag, (field, _value) in CONTROLLER_FLAGS.items()}
    assert landed == {flag: value for flag, (_field, value) in CONTROLLER_FLAGS.items()}
    # the head timeout is the HTTP server's, not the app's: it must reach serve() too
    assert seen["head_timeout_s"] == 37.0
    assert (seen["host"], seen["port"], seen["log_level"]) == ("127.0.0.1", 5099, "warning")


def test_the_launchers_controller_keywords_reach_the_controllers_fields_on_cpu(monkeypatch):
    """``controller_argv(idle_timeout=...)`` (what the launcher and the tests spell) -> the field."""
    seen = _capture_serve(monkeypatch, controller_app)
    keywords = {
        flag.removeprefix("--").replace("-", "_"): value for flag, (_f, value) in CONTROLLER_FLAGS.items()
    }
    argv = controller_argv(5098, "127.0.0.1", **keywords)
    assert argv[1:3] == ["-m", "agentrl_ext.env.controller"]
    with pytest.raises(_Served):
        controller_app.main(argv[3:])
    config = seen["app"].state.service.config
    for flag, (field, value) in CONTROLLER_FLAGS.items():
        assert getattr(config, field) == value, flag


def _run_worker(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[dict[str, Any], Any]:
    seen = _capture_serve(monkeypatch, worker_cli)
    built: list[Any] = []
    real = worker_cli.TaskWorker

    def task_worker(*args: Any, **kwargs: Any) -> Any:
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(worker_cli, "TaskWorker", task_worker)
    with pytest.raises(_Served):
        worker_cli.main(argv)
    assert len(built) == 1
    return seen, built[0]


def test_every_worker_option_reaches_its_own_setting_on_cpu(monkeypatch, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    argv = [
        "envs.echo.task:EchoTask",
        "--task-kwargs",
        json.dumps({"num_indices": 7, "max_turns": 3}),
        "--controller-url",
        "http://127.0.0.1:5101/api",
        "--controller-url",
        "http://127.0.0.1:5102/api",
        "--host",
        "127.0.0.2",
        "--port",
        "5103",
        "--self-address",
        "http://127.0.0.3:5104/api",
        "--concurrency",
        "9",
        "--heartbeat-interval",
        "4.5",
        "--secret-file",
        str(secret),
        "--log-level",
        "warning",
    ]
    seen, worker = _run_worker(monkeypatch, argv)
    assert type(worker.task).__name__ == "EchoTask"
    assert (worker.task.num_indices, worker.task.max_turns) == (7, 3)
    assert worker.controller_addresses == ["http://127.0.0.1:5101/api", "http://127.0.0.1:5102/api"]
    assert worker.self_address == "http://127.0.0.3:5104/api"
    assert worker.concurrency == 9
    assert worker.heartbeat_interval_s == 4.5
    assert worker._secret == "s" * 32
    assert (seen["host"], seen["port"], seen["log_level"]) == ("127.0.0.2", 5103, "warning")
    assert seen["app"] is worker.app


def test_the_launchers_worker_command_line_reaches_the_workers_settings_on_cpu(monkeypatch, tmp_path):
    """``worker_argv`` (what the launcher starts each worker with) -> the worker's settings."""
    secret = tmp_path / "secret"
    secret.write_text("w" * 32)
    argv = worker_argv(
        "envs.echo.task:EchoTask",
        5111,
        ["http://127.0.0.1:5112/api", "http://127.0.0.1:5113/api"],
        {"num_indices": 5, "max_turns": 2},
        heartbeat_interval=3.5,
        concurrency=6,
        log_level="error",
        host="127.0.0.4",
        self_address="http://127.0.0.5:5114/api",
        secret_file=str(secret),
    )
    assert argv[1:3] == ["-m", "agentrl_ext.env.worker"]
    seen, worker = _run_worker(monkeypatch, argv[3:])
    assert (worker.task.num_indices, worker.task.max_turns) == (5, 2)
    assert worker.controller_addresses == ["http://127.0.0.1:5112/api", "http://127.0.0.1:5113/api"]
    assert worker.self_address == "http://127.0.0.5:5114/api"
    assert (worker.concurrency, worker.heartbeat_interval_s, worker._secret) == (6, 3.5, "w" * 32)
    assert (seen["host"], seen["port"], seen["log_level"]) == ("127.0.0.4", 5111, "error")


class _Built(Exception):
    """Raised by the stand-in for ``EnvStack``: the command built its stack."""


def _capture_stack(monkeypatch: pytest.MonkeyPatch, module: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def env_stack(**kwargs: Any) -> Any:
        seen.update(kwargs)
        raise _Built

    monkeypatch.setattr(module, "EnvStack", env_stack)
    return seen


def test_every_envs_up_option_reaches_its_own_stack_field_on_cpu(monkeypatch, tmp_path):
    seen = _capture_stack(monkeypatch, command)
    argv = [
        "up",
        "--tasks",
        "guess,calc",
        "--port",
        "5121",
        "--host",
        "127.0.0.6",
        "--advertise-host",
        "127.0.0.7",
        "--secret-file",
        str(tmp_path / "secret"),
        "--replicas",
        "guess=2,calc=3",
        "--docker",
        "--split",
        "test",
        "--task-kwargs",
        'guess={"show_range": true}',
        "--log-dir",
        str(tmp_path / "logs"),
        "--ready-timeout",
        "77",
        "--front-port",
        "5122",
    ]
    with pytest.raises(_Built):
        command.main(argv)
    expected = {
        "tasks": ["guess", "calc"],
        "port": 5121,
        "host": "127.0.0.6",
        "advertise_host": "127.0.0.7",
        "secret_file": str(tmp_path / "secret"),
        "replicas": {"guess": 2, "calc": 3},
        "docker": True,
        "split": "test",
        "kwargs": {"guess": {"show_range": True}},
        "log_dir": Path(tmp_path / "logs"),
        "ready_timeout_s": 77.0,
        "front_port": 5122,
    }
    assert {key: seen[key] for key in expected} == expected


def test_every_envs_config_field_reaches_its_own_stack_field_on_cpu(monkeypatch):
    """``agentrl.envs`` (what ``agentrl-train`` launches from) -> the stack's fields."""
    from agentrl_ext.config import EnvsConfig

    seen = _capture_stack(monkeypatch, stack)
    envs = EnvsConfig(
        launch=True,
        tasks=["guess", "calc"],
        port=5131,
        host="127.0.0.8",
        advertise_host="127.0.0.9",
        secret_file="/run/secret-x",
        replicas={"guess": 4},
        split="test",
        docker=True,
        task_kwargs={"calc": {"max_turns": 6}},
        ready_timeout_s=88.0,
    )
    with pytest.raises(_Built), stack.launch_from_config(envs):
        pass
    expected = {
        "tasks": ["guess", "calc"],
        "port": 5131,
        "host": "127.0.0.8",
        "advertise_host": "127.0.0.9",
        "secret_file": "/run/secret-x",
        "replicas": {"guess": 4},
        "split": "test",
        "docker": True,
        "kwargs": {"calc": {"max_turns": 6}},
        "ready_timeout_s": 88.0,
    }
    assert {key: seen[key] for key in expected} == expected
