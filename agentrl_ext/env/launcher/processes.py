"""Process supervision for the environment stack: server processes (the controller, task workers)
started, health-checked, paused and stopped; their command lines; free ports; waiting until the
workers are routable. The tests start their servers with the same helpers
(:mod:`agentrl_ext.testing.env_servers`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from agentrl_ext import cli
from agentrl_ext.env.auth import CLIENT_SECRET_ENV, bearer, load_secret
from agentrl_ext.env.protocol import API_PREFIX
from agentrl_ext.env.tasks import task_spec

LOOPBACK = "127.0.0.1"
WILDCARD_HOSTS = ("0.0.0.0", "::")
DEFAULT_PORT = cli.DEFAULT_CONTROLLER_PORT
DEFAULT_FRONT_PORT = 5030
"""Where ``agentrl-envs front`` listens by default (on 127.0.0.1)."""

T = TypeVar("T")

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"
"""``scripts/`` of the source tree (mariadb.sh, dockerd.sh, build_task_image.sh)."""


def free_port(host: str = LOOPBACK) -> int:
    """A free TCP port on ``host`` (an IPv4 address; 127.0.0.1 by default)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def local_host(host: str) -> str:
    """The address this host reaches a server bound to ``host`` at (loopback for a wildcard)."""
    return LOOPBACK if host in WILDCARD_HOSTS else host


def wants_mariadb(name: str, kwargs: dict[str, Any]) -> bool:
    """Whether the task runs on the MariaDB server (needs it, and no SQLite backend was asked for)."""
    return (
        "mariadb" in task_spec(name).needs
        and kwargs.get("backend") != "sqlite"
        and not kwargs.get("mariadb_url")
    )


def listening(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts connections on ``host:port`` (a wildcard host: on 127.0.0.1)."""
    host = local_host(host).strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


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


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:  # not glibc Linux: children do not follow a killed launcher
        return None


_PRCTL = _libc_prctl()  # loaded here: the child between fork and exec only calls it


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM when the launcher dies (even by SIGKILL)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class ServerProcess:
    """A controller or worker process listening on ``127.0.0.1:port``.

    ``python_path`` entries come first on the process's ``PYTHONPATH``; ``env`` adds variables;
    ``cwd`` is the working directory (None: this process's). ``die_with_parent`` (Linux) stops
    the process when the launcher's main thread dies; ``new_session`` keeps a terminal's Ctrl-C
    from reaching it (the launcher stops it in order instead).
    """

    name: str
    argv: list[str]
    port: int
    log_path: Path
    python_path: tuple[str, ...] = ()
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    die_with_parent: bool = False
    new_session: bool = False
    #: the address others reach it at (the address it binds, unless that is a wildcard)
    host: str = LOOPBACK

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (127.0.0.1 by default)."""
        return f"http://{_url_host(self.host)}:{self.port}"

    @property
    def api(self) -> str:
        """The API base, ``http://127.0.0.1:PORT/api`` (a process serving the AgentRL API)."""
        return self.url + API_PREFIX

    @property
    def pid(self) -> int:
        """The process id (the process must have been started)."""
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    def environment(self) -> dict[str, str]:
        """The process's environment: this one's, ``python_path`` first on PYTHONPATH, then ``env``."""
        path = os.pathsep.join([*self.python_path, os.environ.get("PYTHONPATH", "")])
        return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **self.env}

    def start(self) -> ServerProcess:
        """Start the process, its output going to ``log_path``."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self.cwd,
                preexec_fn=_die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
                start_new_session=self.new_session,
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

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM, resuming a paused process first); SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _url_host(host: str) -> str:
    """``host`` as it goes into a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def api_url(host: str, port: int) -> str:
    """The protocol's API base of a server on ``host:port``, ``http://HOST:PORT/api``."""
    return f"http://{_url_host(host)}:{port}{API_PREFIX}"


def controller_argv(port: int, host: str = LOOPBACK, **options: Any) -> list[str]:
    """``python -m agentrl_ext.env.controller`` on ``host:port``; None options keep the defaults."""
    argv = [sys.executable, "-m", "agentrl_ext.env.controller", "--host", host, "--port", str(port)]
    for key, value in options.items():
        if value is not None:
            argv += ["--" + key.replace("_", "-"), str(value)]
    return argv


def front_argv(
    port: int,
    controller_api: str,
    host: str = LOOPBACK,
    worker_secret_file: str | None = None,
    client_secret_file: str | None = None,
) -> list[str]:
    """``agentrl-envs front`` on ``host:port`` forwarding to ``controller_api``; secret files left
    at None come from the environment (:mod:`agentrl_ext.env.front`)."""
    argv = [sys.executable, "-m", "agentrl_ext.env.launcher", "front", "--controller-url", controller_api]
    argv += ["--host", host, "--port", str(port)]
    if worker_secret_file is not None:
        argv += ["--worker-secret-file", worker_secret_file]
    if client_secret_file is not None:
        argv += ["--client-secret-file", client_secret_file]
    return argv


def worker_argv(
    task: str,
    port: int,
    controller_api: str | Sequence[str] | None,
    kwargs: dict[str, Any] | None = None,
    heartbeat_interval: float | None = None,
    concurrency: int | None = None,
    log_level: str = "info",
    python: Sequence[str] = (sys.executable, "-m", "agentrl_ext.env.worker"),
    host: str = LOOPBACK,
    self_address: str | None = None,
    secret_file: str | None = None,
) -> list[str]:
    """The task-worker command line for ``task`` ("module:Class") on ``host:port``
    (``controller_api``: one controller, or the shards of one fleet; ``self_address``: the URL
    the controller reaches it at, when ``host`` is not that address)."""
    argv = [*python, task, "--host", host, "--port", str(port)]
    if self_address is not None:
        argv += ["--self-address", self_address]
    if secret_file is not None:
        argv += ["--secret-file", secret_file]
    if heartbeat_interval is not None:
        argv += ["--heartbeat-interval", str(heartbeat_interval)]
    if kwargs:
        argv += ["--task-kwargs", json.dumps(kwargs)]
    for api in [controller_api] if isinstance(controller_api, str) else controller_api or []:
        argv += ["--controller-url", api]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    return argv + ["--log-level", log_level]


def list_workers(controller: ServerProcess | str) -> dict[str, list[dict[str, Any]]]:
    """The controller's ``list_workers`` answer (``controller``: a process or an API base URL),
    asked with the client secret of ``$AGENTRL_ENV_CLIENT_SECRET`` when set (as
    :class:`~agentrl_ext.env.client.ControllerClient` does)."""
    api = controller.api if isinstance(controller, ServerProcess) else controller
    answer = httpx.get(api + "/list_workers", headers=bearer(load_secret(None, CLIENT_SECRET_ENV)), timeout=5)
    answer.raise_for_status()  # a refusal is not "no workers"
    return answer.json()


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


def script_path(name: str) -> Path:
    """``scripts/<name>`` of the source tree, else the copy a wheel ships (``agentrl_ext/scripts/``:
    ``mariadb.sh`` and ``dockerd.sh``; the image builders need a source checkout)."""
    for folder in (SCRIPTS, Path(__file__).resolve().parents[2] / "scripts"):
        if (folder / name).is_file():
            return folder / name
    raise RuntimeError(
        f"{SCRIPTS / name} not found: the wheel ships mariadb.sh and dockerd.sh; {name} runs from a source "
        "checkout of agentrl_ext (git clone, then pip install -e .)"
    )


def _script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = script_path(name)
    return subprocess.run(["bash", str(path), *args], capture_output=True, text=True, timeout=600, env=env)
