"""Controllers and task workers as real uvicorn servers (subprocesses) on 127.0.0.1 free ports.

Tests see exactly what users see: HTTP, heartbeats, processes that die or hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl_ext.testing.env_servers import free_port  # noqa: F401  (re-exported for the env tests)

REPO = Path(__file__).resolve().parents[2]
TESTS_ENV = Path(__file__).resolve().parent
LOOPBACK = "127.0.0.1"
PROBE_TASK = "probe_tasks:ProbeTask"
ECHO_TASK = "envs.echo.task:EchoTask"


def wait_until(
    condition: Any, timeout_s: float = 20.0, interval_s: float = 0.05, what: str = "condition"
) -> Any:
    """Poll ``condition()`` until it returns a truthy value; fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def subprocess_env() -> dict[str, str]:
    """Environment for servers: the repo and tests/env importable."""
    path = os.pathsep.join([str(REPO), str(TESTS_ENV), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


@dataclass
class ServerProcess:
    """A controller or worker process listening on ``127.0.0.1:port``."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def api(self) -> str:
        return self.url + "/api"

    def start(self) -> ServerProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, env=subprocess_env(), cwd=REPO
        )
        log.close()
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> ServerProcess:
        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                httpx.get(self.url + "/", timeout=1.0)
            except httpx.TransportError:
                return False
            return True

        wait_until(answers, timeout_s, what=f"{self.name} to listen on port {self.port}")
        return self

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the process hangs (no heartbeats, no answers)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@dataclass
class Servers:
    """Starts controllers and workers for a test and stops them all afterwards."""

    log_dir: Path
    started: list[ServerProcess] = field(default_factory=list)

    def _launch(self, name: str, argv: list[str], port: int) -> ServerProcess:
        server = ServerProcess(name, argv, port, self.log_dir / f"{name}-{port}.log").start()
        self.started.append(server)
        return server.wait_ready()

    def controller(
        self,
        idle_timeout: float = 600.0,
        heartbeat_timeout: float = 25.0,
        check_interval: float = 0.1,
        port: int | None = None,
    ) -> ServerProcess:
        port = port or free_port()
        argv = [sys.executable, "-m", "agentrl_ext.env.controller", "--host", LOOPBACK, "--port", str(port)]
        argv += ["--idle-timeout", str(idle_timeout), "--heartbeat-timeout", str(heartbeat_timeout)]
        argv += ["--check-interval", str(check_interval), "--log-level", "info"]
        return self._launch("controller", argv, port)

    def worker(
        self,
        controller: ServerProcess | None,
        task: str = PROBE_TASK,
        task_kwargs: str = "{}",
        concurrency: int | None = None,
        heartbeat_interval: float = 0.2,
    ) -> ServerProcess:
        port = free_port()
        argv = [sys.executable, "-m", "agentrl_ext.env.worker", task, "--task-kwargs", task_kwargs]
        argv += ["--host", LOOPBACK, "--port", str(port), "--heartbeat-interval", str(heartbeat_interval)]
        if controller is not None:
            argv += ["--controller", controller.api]
        if concurrency is not None:
            argv += ["--concurrency", str(concurrency)]
        return self._launch("worker", argv, port)

    def stop_all(self) -> None:
        for server in reversed(self.started):
            server.stop()


def list_workers(controller: ServerProcess) -> dict[str, list[dict[str, Any]]]:
    return httpx.get(controller.api + "/list_workers", timeout=5).json()


def wait_routable(controller: ServerProcess, task: str, count: int = 1) -> list[dict[str, Any]]:
    """Wait until ``count`` workers of ``task`` are registered, healthy and routable."""

    def ready() -> list[dict[str, Any]] | None:
        workers = [w for w in list_workers(controller).get(task, []) if w["healthy"] and w["routable"]]
        return workers if len(workers) >= count else None

    return wait_until(ready, what=f"{count} routable worker(s) of task {task!r}")
