"""Controllers and task workers as real processes, for tests and benchmarks.

The process helpers are those of :mod:`agentrl_ext.env.launcher` (``agentrl-envs up``), re-exported
here; this module adds the repository defaults (``envs/`` importable, the repository as working
directory) and :class:`EnvServers`, which starts any mix of controllers and workers.

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

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from agentrl_ext.env import launcher
from agentrl_ext.env.launcher import (
    LOOPBACK,
    controller_argv,
    free_port,
    list_workers,
    wait_routable,
    wait_until,
    worker_argv,
)

REPO = Path(__file__).resolve().parents[2]
"""The repository root (``envs/`` lives there; the servers run with it as working directory)."""
ECHO_TASK = "envs.echo.task:EchoTask"


def subprocess_env(python_path: Sequence[str | Path] = ()) -> dict[str, str]:
    """This process's environment with ``python_path`` and the repository first on ``PYTHONPATH``."""
    path = os.pathsep.join([*(str(p) for p in python_path), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


@dataclass
class ServerProcess(launcher.ServerProcess):
    """The launcher's :class:`~agentrl_ext.env.launcher.ServerProcess` run from the repository:
    ``python_path`` entries, then the repository, first on ``PYTHONPATH``; ``cwd`` the repository."""

    cwd: Path | None = REPO

    def environment(self) -> dict[str, str]:
        return {**subprocess_env(self.python_path), **self.env}


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
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        """Start ``argv`` (a server that will listen on ``port``) and wait until it answers HTTP;
        ``env`` adds environment variables (e.g. a secret)."""
        paths = tuple(str(p) for p in (*python_path, *self.python_path))
        log_path = Path(self.log_dir) / f"{name}-{port}.log"
        server = ServerProcess(name, argv, port, log_path, paths, Path(cwd), env=dict(env or {}))
        self.started.append(server)
        self.by_name[name] = server
        server.start().wait_ready(ready_timeout_s)
        return server

    def controller(
        self,
        *,
        port: int | None = None,
        idle_timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        check_interval: float | None = None,
        worker_timeout: float | None = None,
        rejoin_grace: float | None = None,
        shard: int | None = None,
        shards: int | None = None,
        body_idle_timeout: float | None = None,
        head_timeout: float | None = None,
        log_level: str = "info",
        code_dir: str | Path | None = None,
        name: str = "controller",
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        """Start ``agentrl-controller``; options left at None keep the controller's defaults.

        ``code_dir`` runs the controller from another copy of ``agentrl_ext`` (a folder that holds
        an ``agentrl_ext`` package), e.g. to benchmark an older version against this one.
        """
        port = port or free_port()
        argv = controller_argv(
            port,
            idle_timeout=idle_timeout,
            heartbeat_timeout=heartbeat_timeout,
            check_interval=check_interval,
            worker_timeout=worker_timeout,
            rejoin_grace=rejoin_grace,
            shard=shard,
            shards=shards,
            body_idle_timeout=body_idle_timeout,
            head_timeout=head_timeout,
            log_level=log_level,
        )
        if code_dir is None:
            return self.launch(name, argv, port, env=env)
        # ``python -m`` puts the working directory first on sys.path: run from the other copy.
        return self.launch(name, argv, port, python_path=[code_dir], cwd=code_dir, env=env)

    def worker(
        self,
        controller: ServerProcess | Sequence[ServerProcess] | None,
        task: str = ECHO_TASK,
        *,
        name: str | None = None,
        task_kwargs: dict[str, Any] | None = None,
        concurrency: int | None = None,
        heartbeat_interval: float = 0.2,
        log_level: str = "info",
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        """Start ``agentrl-task-worker`` for ``task`` ("module:Class"), registered with ``controller``
        (several: the shards of one fleet; None: stand-alone). ``name`` (default ``worker-<port>``) is what :meth:`kill` takes."""
        port = free_port()
        controllers = [controller] if isinstance(controller, ServerProcess) else list(controller or [])
        api = [c.api for c in controllers]
        argv = worker_argv(task, port, api, task_kwargs, heartbeat_interval, concurrency, log_level)
        return self.launch(name or f"worker-{port}", argv, port, env=env)

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


__all__ = [
    "ECHO_TASK",
    "LOOPBACK",
    "REPO",
    "EnvServers",
    "ServerProcess",
    "env_servers",
    "free_port",
    "list_workers",
    "subprocess_env",
    "wait_routable",
    "wait_until",
]
