"""The one launcher for the environment service: a controller and task workers as real processes.

Tests (``tests/env``, ``tests/rollout``, ``tests/trainer``, ``tests/e2e``) and the benchmarks
(``bench/``) start their controllers and workers here, on free ports of 127.0.0.1, so they see
exactly what users see: HTTP, heartbeats, processes that die or hang.

    with EnvServers(tmp_path) as servers:
        controller = servers.controller()
        servers.worker(controller, "envs.echo.task:EchoTask")
        servers.wait_routable(controller, "echo")
        ...  # talk to controller.api

``env_servers([(process name, task name, "module:Class"), ...], log_dir)`` does the same for a
whole set of workers in one call.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx

from agentrl_ext.env.protocol import API_PREFIX

REPO = Path(__file__).resolve().parents[2]
"""The repository root (``envs/`` lives there; the servers run with it as working directory)."""
LOOPBACK = "127.0.0.1"
ECHO_TASK = "envs.echo.task:EchoTask"

T = TypeVar("T")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Callable[[], T | None],
    timeout_s: float = 20.0,
    interval_s: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll ``condition()`` until it returns a truthy value, which is returned.

    Raises TimeoutError naming ``what`` after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def subprocess_env(python_path: Sequence[str | Path] = ()) -> dict[str, str]:
    """This process's environment with ``python_path`` and the repository first on ``PYTHONPATH``."""
    path = os.pathsep.join([*(str(p) for p in python_path), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


@dataclass
class ServerProcess:
    """A controller or worker process listening on ``127.0.0.1:port``.

    ``python_path`` entries come first on the process's ``PYTHONPATH`` (then the repository);
    ``cwd`` is the working directory (default: the repository).
    """

    name: str
    argv: list[str]
    port: int
    log_path: Path
    python_path: tuple[str, ...] = ()
    cwd: Path = REPO
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def api(self) -> str:
        """The API base, ``http://127.0.0.1:PORT/api`` (a process serving the AgentRL API)."""
        return self.url + API_PREFIX

    @property
    def pid(self) -> int:
        """The process id (the process must have been started)."""
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    def start(self) -> ServerProcess:
        """Start the process, its output going to ``log_path``."""
        env = subprocess_env(self.python_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd
            )
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> ServerProcess:
        """Wait until the port answers HTTP; raises RuntimeError with the log if the process exits."""

        def answers() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                httpx.get(self.url + "/", timeout=1.0)
            except httpx.TransportError:
                return False
            return True

        wait_until(answers, timeout_s, what=f"{self.name} to listen on port {self.port}")
        return self

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the process's output."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    @property
    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the process hangs (no heartbeats, no answers, connections stay open)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL at once: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """Graceful stop (SIGTERM, resuming a paused process first); SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _option(argv: list[str], flag: str, value: Any) -> None:
    if value is not None:
        argv += [flag, str(value)]


@dataclass
class EnvServers:
    """Starts controllers and workers (and any other server process) and stops them all at the end.

    Args:
        log_dir: where each process writes ``<name>-<port>.log``.
        python_path: extra import roots for every process (e.g. a folder of test tasks).
    """

    log_dir: Path
    python_path: Sequence[str | Path] = ()
    started: list[ServerProcess] = field(default_factory=list)
    by_name: dict[str, ServerProcess] = field(default_factory=dict)

    def __enter__(self) -> EnvServers:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def launch(
        self,
        name: str,
        argv: list[str],
        port: int,
        python_path: Sequence[str | Path] = (),
        ready_timeout_s: float = 30.0,
        cwd: str | Path = REPO,
    ) -> ServerProcess:
        """Start ``argv`` (a server that will listen on ``port``) and wait until it answers HTTP."""
        paths = tuple(str(p) for p in (*python_path, *self.python_path))
        log_path = Path(self.log_dir) / f"{name}-{port}.log"
        server = ServerProcess(name, argv, port, log_path, paths, Path(cwd))
        self.started.append(server)
        self.by_name[name] = server
        return server.start().wait_ready(ready_timeout_s)

    def controller(
        self,
        *,
        port: int | None = None,
        idle_timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        check_interval: float | None = None,
        worker_timeout: float | None = None,
        rejoin_grace: float | None = None,
        log_level: str = "info",
        code_dir: str | Path | None = None,
        name: str = "controller",
    ) -> ServerProcess:
        """Start ``agentrl-controller``; options left at None keep the controller's defaults.

        ``code_dir`` runs the controller from another copy of ``agentrl_ext`` (a folder that holds
        an ``agentrl_ext`` package), e.g. to benchmark an older version against this one.
        """
        port = port or free_port()
        argv = [sys.executable, "-m", "agentrl_ext.env.controller", "--host", LOOPBACK, "--port", str(port)]
        _option(argv, "--idle-timeout", idle_timeout)
        _option(argv, "--heartbeat-timeout", heartbeat_timeout)
        _option(argv, "--check-interval", check_interval)
        _option(argv, "--worker-timeout", worker_timeout)
        _option(argv, "--rejoin-grace", rejoin_grace)
        argv += ["--log-level", log_level]
        if code_dir is None:
            return self.launch(name, argv, port)
        # ``python -m`` puts the working directory first on sys.path: run from the other copy.
        return self.launch(name, argv, port, python_path=[code_dir], cwd=code_dir)

    def worker(
        self,
        controller: ServerProcess | None,
        task: str = ECHO_TASK,
        *,
        name: str | None = None,
        task_kwargs: dict[str, Any] | None = None,
        concurrency: int | None = None,
        heartbeat_interval: float = 0.2,
        log_level: str = "info",
    ) -> ServerProcess:
        """Start ``agentrl-task-worker`` for ``task`` ("module:Class"), registered with ``controller``
        (None: stand-alone). ``name`` (default ``worker-<port>``) is what :meth:`kill` takes."""
        port = free_port()
        argv = [sys.executable, "-m", "agentrl_ext.env.worker", task]
        argv += ["--host", LOOPBACK, "--port", str(port), "--heartbeat-interval", str(heartbeat_interval)]
        if task_kwargs:
            argv += ["--task-kwargs", json.dumps(task_kwargs)]
        if controller is not None:
            argv += ["--controller", controller.api]
        _option(argv, "--concurrency", concurrency)
        argv += ["--log-level", log_level]
        return self.launch(name or f"worker-{port}", argv, port)

    @property
    def controller_url(self) -> str:
        """API base of the controller started last."""
        controllers = [s for s in self.started if "agentrl_ext.env.controller" in s.argv]
        if not controllers:
            raise RuntimeError("no controller was started")
        return controllers[-1].api

    def kill(self, name: str) -> None:
        """SIGKILL the process started last under ``name``."""
        self.by_name[name].kill()

    def wait_routable(
        self, controller: ServerProcess | str, task: str, count: int = 1, timeout_s: float = 30.0
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` workers of ``task`` are registered, healthy and routable."""
        return wait_routable(controller, task, count, timeout_s)

    def stop_all(self) -> None:
        """Stop every process started here, the last one first."""
        for server in reversed(self.started):
            server.stop()


def list_workers(controller: ServerProcess | str) -> dict[str, list[dict[str, Any]]]:
    """The controller's ``list_workers`` answer (``controller``: a process or an API base URL)."""
    api = controller.api if isinstance(controller, ServerProcess) else controller
    return httpx.get(api + "/list_workers", timeout=5).json()


def wait_routable(
    controller: ServerProcess | str, task: str, count: int = 1, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """Wait until ``count`` workers of ``task`` are registered, healthy and routable; returns them."""

    def ready() -> list[dict[str, Any]] | None:
        try:
            workers = list_workers(controller).get(task, [])
        except httpx.HTTPError:
            return None
        ready = [w for w in workers if w["healthy"] and w["routable"]]
        return ready if len(ready) >= count else None

    return wait_until(ready, timeout_s, what=f"{count} routable worker(s) of task {task!r}")


@contextmanager
def env_servers(
    workers: Sequence[tuple[str, str, str]], log_dir: Path, heartbeat_s: float = 1.0, timeout_s: float = 60.0
) -> Iterator[EnvServers]:
    """A controller (default settings) plus one worker per ``(process name, task name, "module:Class")``.

    Yields once every task has a routable worker; ``servers.controller_url`` is the API base and
    ``servers.kill(process name)`` crashes one worker.
    """
    with EnvServers(log_dir) as servers:
        controller = servers.controller()
        for name, _task, spec in workers:
            servers.worker(controller, spec, name=name, heartbeat_interval=heartbeat_s)
        for task, count in Counter(task for _, task, _ in workers).items():
            wait_routable(controller, task, count, timeout_s)
        yield servers
