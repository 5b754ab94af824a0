"""``agentrl-envs up``: the environment stack (controller, task workers, the servers they need) in one command.

    agentrl-envs up --tasks dbbench,kg,guess                # local worker processes
    agentrl-envs up --tasks dbbench,kg --docker --port 5020 # each worker in its own container
    agentrl-envs up --tasks alfworld,webshop --replicas alfworld=7,webshop=2 \
        --host 0.0.0.0 --advertise-host HEAD_IP --secret-file secret.txt  # for a multi-node trainer
    agentrl-envs list                                       # the known tasks

``up`` starts what the tasks need (the MariaDB server of ``scripts/mariadb.sh`` for dbbench
unless it runs on SQLite, the private Docker engine of ``scripts/dockerd.sh`` for ``--docker``
and for tasks with per-session containers), the controller on ``HOST:PORT`` (127.0.0.1 unless
``--host``), ``--replicas`` workers per task (default one; a local process, or with ``--docker`` a container of the task's image built by
``scripts/build_task_image.sh``), waits until every worker is healthy and routable, prints
where everything listens, and on Ctrl-C / SIGTERM stops all of it, last started first, leaving
no process or container behind (and the servers it started itself, not those it found running).

The tasks it can start are the task catalogue's (:mod:`agentrl_ext.env.tasks`). The process
helpers here (:class:`ServerProcess`, :func:`wait_routable`, ...) are also what the tests start
their servers with (:mod:`agentrl_ext.testing.env_servers`). ``agentrl-train`` starts the same
stack from the recipe with :func:`launch_from_config` (``agentrl.envs.launch=true``).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from agentrl_ext import cli
from agentrl_ext.env.protocol import API_PREFIX
from agentrl_ext.env.tasks import SPLITS, task_spec, task_specs

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
WILDCARD_HOSTS = ("0.0.0.0", "::")
DEFAULT_PORT = cli.DEFAULT_CONTROLLER_PORT
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
"""``scripts/`` of the source tree (mariadb.sh, dockerd.sh, build_task_image.sh)."""
CONTAINER_LABEL = "agentrl_ext.launcher"

T = TypeVar("T")


# ---------------------------------------------------------------------------- the tasks


def wants_mariadb(name: str, kwargs: dict[str, Any]) -> bool:
    """Whether the task runs on the MariaDB server (needs it, and no SQLite backend was asked for)."""
    return (
        "mariadb" in task_spec(name).needs
        and kwargs.get("backend") != "sqlite"
        and not kwargs.get("mariadb_url")
    )


# ---------------------------------------------------------------------------- processes


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def listening(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts connections on ``host:port`` (a wildcard host: on 127.0.0.1)."""
    host = LOOPBACK if host in WILDCARD_HOSTS else host.strip("[]")
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


def _url_host(host: str) -> str:
    """``host`` as it goes into a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def controller_argv(port: int, host: str = LOOPBACK, **options: Any) -> list[str]:
    """``python -m agentrl_ext.env.controller`` on ``host:port``; None options keep the defaults."""
    argv = [sys.executable, "-m", "agentrl_ext.env.controller", "--host", host, "--port", str(port)]
    for key, value in options.items():
        if value is not None:
            argv += ["--" + key.replace("_", "-"), str(value)]
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


# ---------------------------------------------------------------------------- the stack


def script_path(name: str) -> Path:
    """``scripts/<name>`` of the source tree, else the copy a wheel ships (``agentrl_ext/scripts/``:
    ``mariadb.sh`` and ``dockerd.sh``; the image builders need a source checkout)."""
    for folder in (SCRIPTS, Path(__file__).resolve().parents[1] / "scripts"):
        if (folder / name).is_file():
            return folder / name
    raise RuntimeError(
        f"{SCRIPTS / name} not found: the wheel ships mariadb.sh and dockerd.sh; {name} runs from a source "
        "checkout of agentrl_ext (git clone, then pip install -e .)"
    )


def _script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = script_path(name)
    return subprocess.run(["bash", str(path), *args], capture_output=True, text=True, timeout=600, env=env)


@dataclass
class EnvStack:
    """The controller, one worker per task and the servers they need; a context manager.

    Args:
        tasks: names in the task catalogue (:func:`~agentrl_ext.env.tasks.task_specs`).
        port: the controller's port.
        host: the address the controller and the workers bind (default 127.0.0.1); beyond
            loopback a worker secret is required (``secret_file`` or ``$AGENTRL_ENV_WORKER_SECRET``).
        advertise_host: the address the workers and the trainer's nodes reach them at (default
            ``host``; required when ``host`` is a wildcard such as 0.0.0.0).
        secret_file: the worker secret's file, given to the controller and to every worker.
        replicas: workers per task (default 1), e.g. ``{"alfworld": 7}``.
        docker: each worker in its own container (``agentrl-<task>:latest``, built when missing).
        split: ``train`` or ``test``: the table's kwargs for that split.
        kwargs: per-task kwargs on top of the table's, e.g. ``{"dbbench": {"backend": "sqlite"}}``.
        log_dir: where each process writes its log (default: a new temporary folder).
        ready_timeout_s: how long to wait for each worker to be healthy.
        heartbeat_interval: the workers' heartbeat interval (None: the SDK's).
        die_with_parent: workers and controller die with this process's main thread (CLI use).
    """

    tasks: Sequence[str]
    port: int = DEFAULT_PORT
    docker: bool = False
    split: str = "train"
    kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    log_dir: Path | None = None
    ready_timeout_s: float = 180.0
    heartbeat_interval: float | None = None
    die_with_parent: bool = False
    host: str = LOOPBACK
    advertise_host: str | None = None
    secret_file: str | None = None
    replicas: dict[str, int] = field(default_factory=dict)
    controller: ServerProcess | None = field(default=None, init=False)
    workers: dict[str, ServerProcess] = field(default_factory=dict, init=False)
    containers: dict[str, Any] = field(default_factory=dict, init=False)
    services: dict[str, str] = field(default_factory=dict, init=False)
    """Servers in use: ``mariadb`` -> its URL, ``dockerd`` -> DOCKER_HOST."""
    started_services: list[str] = field(default_factory=list, init=False)
    _client: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.tasks = list(self.tasks)
        if not self.tasks:
            raise ValueError(f"no task to start; known tasks: {', '.join(task_specs())}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks {self.tasks} name a task twice")
        for name in [*self.tasks, *self.kwargs]:
            task_spec(name)
        extra = sorted(set(self.kwargs) - set(self.tasks))
        if extra:
            raise ValueError(f"task kwargs given for {extra}, which are not started (tasks: {self.tasks})")
        self.task_kwargs = {
            name: task_spec(name).kwargs_for(self.split, self.kwargs.get(name)) for name in self.tasks
        }
        self.replicas = {name: int(self.replicas.get(name, 1)) for name in self.tasks} | {
            name: int(n) for name, n in self.replicas.items()
        }
        extra = sorted(set(self.replicas) - set(self.tasks))
        bad = {name: n for name, n in self.replicas.items() if n < 1}
        if extra or bad:
            raise ValueError(
                f"replicas {dict(self.replicas)}: every count must be >= 1 and name a started task ({self.tasks})"
            )
        if self.advertise_host is None:
            if self.host in WILDCARD_HOSTS:
                raise ValueError(
                    f"host {self.host} binds every address; give the address the trainer's nodes and the "
                    "workers reach the controller at (agentrl-envs up --advertise-host ADDRESS, "
                    "agentrl.envs.advertise_host=ADDRESS)"
                )
            self.advertise_host = self.host
        from agentrl_ext.env.auth import WORKER_SECRET_ENV, load_secret, require_secret_beyond_loopback

        # the controller and the workers refuse to start without it; say so before starting anything
        require_secret_beyond_loopback(
            self.host,
            load_secret(self.secret_file, WORKER_SECRET_ENV),
            "agentrl-envs up",
            "--secret-file (agentrl.envs.secret_file)",
            WORKER_SECRET_ENV,
        )
        if self.docker:
            missing = [n for n in self.tasks if not (SCRIPTS.parent / "envs" / n / "Dockerfile").is_file()]
            if missing:
                raise ValueError(
                    f"--docker runs each worker in its task's image, but {missing} have no envs/<task>/Dockerfile; "
                    "start them without --docker"
                )

    def served_name(self, name: str) -> str:
        """The name the worker of ``name`` registers under (a ``name`` kwarg renames it, e.g. ``kg_test``)."""
        return str(self.task_kwargs[name].get("name", name))

    @property
    def api(self) -> str:
        """The controller's API base as advertised, ``http://ADVERTISE_HOST:PORT/api``."""
        return f"http://{_url_host(self.advertise_host or self.host)}:{self.port}{API_PREFIX}"

    def worker_names(self, name: str) -> list[str]:
        """The keys of task ``name``'s workers in :attr:`workers` / :attr:`containers`: ``name``,
        then ``name#2``, ``name#3``... for its further replicas."""
        return [name] + [f"{name}#{i}" for i in range(2, self.replicas.get(name, 1) + 1)]

    def __enter__(self) -> EnvStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> EnvStack:
        """Start everything and wait until every worker is healthy; on any failure stop what started."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        if listening(self.port, self.host):
            # the new controller could not bind, and its readiness check would be answered by the
            # process already there: the workers would join another run's controller
            raise RuntimeError(
                f"port {self.port} on {self.host} is in use (another agentrl-train or agentrl-envs up?); "
                "stop it, or choose a free port (agentrl.envs.port=N, agentrl-envs up --port N)"
            )
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="agentrl-envs-"))
        self.log_dir = log_dir
        if any(wants_mariadb(n, self.task_kwargs[n]) for n in self.tasks):
            self._service("mariadb", "mariadb.sh", "url")
            for name in self.tasks:
                if wants_mariadb(name, self.task_kwargs[name]):
                    self.task_kwargs[name]["mariadb_url"] = self.services["mariadb"]
        if self.docker or any("docker" in task_spec(n).needs for n in self.tasks):
            self._service("dockerd", "dockerd.sh", "host")
        secret = {"worker_secret_file": self.secret_file} if self.secret_file else {}
        self.controller = ServerProcess(
            "controller",
            controller_argv(self.port, self.host, **secret),
            self.port,
            log_dir / "controller.log",
            die_with_parent=self.die_with_parent,
            new_session=self.die_with_parent,
            host=str(self.advertise_host),
        )
        self.controller.start().wait_ready(60)
        for name in self.tasks:
            for key in self.worker_names(name):
                if self.docker:
                    self._start_container(name, key)
                else:
                    self._start_worker(name, log_dir, key)
        for name in self.tasks:
            for key in self.worker_names(name):
                if key in self.workers:
                    self.workers[key].wait_ready(self.ready_timeout_s)
            self._wait_healthy(name)

    def _service(self, name: str, script: str, address_command: str) -> None:
        env = {**os.environ}
        if _script(script, "status", env=env).returncode != 0:
            if name == "mariadb":
                _script(script, "install", env=env)
            result = _script(script, "start", env=env)
            if result.returncode != 0:
                raise RuntimeError(f"scripts/{script} start failed:\n{result.stdout}{result.stderr}")
            self.started_services.append(name)
        self.services[name] = _script(script, address_command, env=env).stdout.strip()
        logger.info(
            "%s: %s%s", name, self.services[name], " (started)" if name in self.started_services else ""
        )

    def _worker_address(self, port: int) -> dict[str, Any]:
        """The bind address, advertised URL and secret of a worker on ``port`` (worker_argv's)."""
        return {
            "host": self.host,
            "self_address": f"http://{_url_host(str(self.advertise_host))}:{port}{API_PREFIX}",
            "secret_file": self.secret_file,
        }

    def _start_worker(self, name: str, log_dir: Path, key: str | None = None) -> None:
        key = key or name
        port = free_port()
        argv = worker_argv(
            task_spec(name).task_class,
            port,
            self.api,
            self.task_kwargs[name],
            heartbeat_interval=self.heartbeat_interval,
            **self._worker_address(port),
        )
        env = {"DOCKER_HOST": self.services["dockerd"]} if "dockerd" in self.services else {}
        worker = ServerProcess(
            key,
            argv,
            port,
            log_dir / f"worker-{key.replace('#', '-')}.log",
            env=env,
            die_with_parent=self.die_with_parent,
            new_session=self.die_with_parent,
            host=str(self.advertise_host),
        )
        self.workers[key] = worker.start()

    def _docker(self) -> Any:
        """The engine's client (one per stack, closed by :meth:`stop`)."""
        import docker

        if self._client is None:
            self._client = docker.DockerClient(base_url=self.services["dockerd"])
        return self._client

    def _start_container(self, name: str, key: str | None = None) -> None:
        key = key or name
        import docker

        from agentrl_ext.env.providers.docker import owner_is_alive, owner_label

        client = self._docker()
        for leftover in client.containers.list(all=True, filters={"label": CONTAINER_LABEL}):
            if not owner_is_alive(leftover.labels.get(CONTAINER_LABEL, "")):
                _remove_worker_container(client, leftover)  # of a launcher that died: sweep on restart
        image = f"agentrl-{name}:latest"
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            logger.info("building %s (scripts/build_task_image.sh %s)", image, name)
            built = _script(
                "build_task_image.sh", name, env={**os.environ, "DOCKER_HOST": self.services["dockerd"]}
            )
            if built.returncode != 0:
                raise RuntimeError(
                    f"scripts/build_task_image.sh {name} failed:\n{built.stdout}{built.stderr}"
                ) from None
        port = free_port()
        kwargs = {k: v for k, v in self.task_kwargs[name].items() if k != "data_dir"}
        address = self._worker_address(port)
        if address["secret_file"]:  # the file is on this host: its folder goes into the container
            folder = str(Path(address["secret_file"]).resolve().parent)
            volumes_secret = {folder: {"bind": folder, "mode": "ro"}}
            address["secret_file"] = str(Path(address["secret_file"]).resolve())
        else:
            volumes_secret = {}
        command = worker_argv("", port, self.api, kwargs, self.heartbeat_interval, python=(), **address)[1:]
        volumes = dict(volumes_secret)
        if "data" in task_spec(name).needs:
            from agentrl_ext.env.data_files import data_dir

            volumes[str(data_dir(self.task_kwargs[name].get("data_dir")))] = {"bind": "/data", "mode": "ro"}
        socket_url = str(kwargs.get("mariadb_url", ""))
        if socket_url.startswith("unix://"):
            folder = str(Path(socket_url.removeprefix("unix://").split("?")[0]).parent)
            volumes[folder] = {"bind": folder, "mode": "rw"}
        environment = {}
        if "docker" in task_spec(name).needs:  # its per-session containers: the engine's socket, same path
            engine = self.services["dockerd"]
            if engine.startswith("unix://"):
                path = engine.removeprefix("unix://")
                volumes[path] = {"bind": path, "mode": "rw"}
            environment["DOCKER_HOST"] = engine
        container_name = f"agentrl-envs-{key.replace('#', '-')}-{os.getpid()}"
        self.containers[key] = client.containers.run(
            image,
            command=command,
            name=container_name,
            # its own host name: the owner labels of the session containers it starts (host:pid:ticks,
            # pids of its own namespace) must not pass for this host's processes, or a sweep here (or
            # its own sweep there) would take live sessions for orphans and remove them
            hostname=container_name,
            network_mode="host",
            labels={CONTAINER_LABEL: owner_label()},
            volumes=volumes,
            environment=environment,
            detach=True,
        )

    def _remove_own_containers(self) -> None:
        """Remove every container labelled as this process's, also one never recorded (a Ctrl-C
        between the engine creating it and ``containers.run`` returning it)."""
        from agentrl_ext.env.providers.docker import owner_label

        try:
            client = self._docker()
            for container in client.containers.list(
                all=True, filters={"label": f"{CONTAINER_LABEL}={owner_label()}"}
            ):
                _remove_worker_container(client, container)
        except Exception as exc:  # noqa: BLE001 - the engine is gone: nothing left to remove there
            logger.warning("could not sweep this launcher's containers: %s", exc)

    def _wait_healthy(self, name: str) -> None:
        count = len(self.worker_names(name))

        def ready() -> bool:
            for key in self.worker_names(name):
                container = self.containers.get(key)
                if container is not None:
                    container.reload()
                    if container.status in ("exited", "dead"):
                        logs = container.logs(tail=40).decode(errors="replace")
                        raise RuntimeError(f"the {key} worker container exited; log:\n{logs}")
                worker = self.workers.get(key)
                if worker is not None and not worker.alive:
                    raise RuntimeError(f"the {key} worker exited; log:\n{worker.log_tail()}")
            try:
                workers = list_workers(self._local_api).get(self.served_name(name), [])
            except httpx.HTTPError:
                return False
            return sum(bool(w["healthy"] and w["routable"]) for w in workers) >= count

        what = f"{count} healthy, routable {self.served_name(name)} worker(s)"
        wait_until(ready, self.ready_timeout_s, 0.2, what=what)

    @property
    def _local_api(self) -> str:
        """The controller's API as this host reaches it (the bind address; loopback for a wildcard)."""
        host = LOOPBACK if self.host in WILDCARD_HOSTS else self.host
        return f"http://{_url_host(host)}:{self.port}{API_PREFIX}"

    def dead(self) -> list[str]:
        """Names of the parts that stopped on their own (the controller, workers, containers)."""
        gone = [n for n, w in self.workers.items() if not w.alive]
        if self.controller is not None and not self.controller.alive:
            gone.append("controller")
        for name, container in self.containers.items():
            try:
                container.reload()
                if container.status in ("exited", "dead"):
                    gone.append(name)
            except Exception:  # noqa: BLE001 - the engine itself is gone
                gone.append(name)
        return gone

    def stop(self) -> None:
        """Stop what was started, last first: workers, containers, controller, then our own servers."""
        for worker in reversed(list(self.workers.values())):
            worker.stop()
        for name, container in reversed(list(self.containers.items())):
            try:
                container.stop(timeout=10)
                _remove_worker_container(self._docker(), container)
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                logger.warning("could not remove the %s container: %s", name, exc)
        self.containers.clear()
        if self.docker and "dockerd" in self.services:
            self._remove_own_containers()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.controller is not None:
            self.controller.stop()
        for service in reversed(self.started_services):
            script = "mariadb.sh" if service == "mariadb" else "dockerd.sh"
            _script(script, "stop")
        self.started_services.clear()

    def describe(self) -> str:
        """Where everything listens, one line each."""
        lines = [f"controller  {self.api}" + (f"  (pid {self.controller.pid})" if self.controller else "")]
        for name in self.tasks:
            for key in self.worker_names(name):
                if key in self.workers:
                    worker = self.workers[key]
                    lines.append(f"worker {key:<10} {worker.api}  (pid {worker.pid}, log {worker.log_path})")
                elif key in self.containers:
                    lines.append(f"worker {key:<10} container {self.containers[key].name} (network host)")
        for service, address in self.services.items():
            started = "started here" if service in self.started_services else "already running"
            lines.append(f"{service:<11} {address}  ({started})")
        return "\n".join(lines)


def _remove_worker_container(client: Any, container: Any) -> None:
    """Remove a worker container and the session containers its worker started (their owner label
    names the worker container's host name), which a killed worker leaves behind."""
    import docker.errors

    from agentrl_ext.env.providers.docker import LABEL_OWNER

    hostname = str(container.attrs.get("Config", {}).get("Hostname") or container.name)
    sessions = [
        c
        for c in client.containers.list(all=True, filters={"label": LABEL_OWNER})
        if c.labels.get(LABEL_OWNER, "").startswith(f"{hostname}:")
    ]
    for each in [container, *sessions]:
        try:
            each.remove(force=True)
        except docker.errors.NotFound:
            pass  # gone meanwhile (a worker closing its own session)


@contextmanager
def launch_from_config(config: Any) -> Iterator[EnvStack | None]:
    """The stack of ``agentrl.envs`` for ``agentrl-train``: started on entry, stopped on exit.

    ``config``: the typed ``AgentRLConfig`` (or its ``envs`` node, an ``EnvsConfig``). Yields
    None when ``envs.launch`` is false; else the running :class:`EnvStack` (``stack.api`` is the
    controller URL for ``agentrl.agent_loop.controller_url``).
    """
    envs = getattr(config, "envs", config)
    if not envs.launch:
        yield None
        return
    stack = EnvStack(
        tasks=list(envs.tasks or []),
        port=envs.port,
        docker=envs.docker,
        split=envs.split,
        kwargs={name: dict(values) for name, values in dict(envs.task_kwargs or {}).items()},
        ready_timeout_s=envs.ready_timeout_s,
        host=envs.host,
        advertise_host=envs.advertise_host,
        secret_file=envs.secret_file,
        replicas=dict(envs.replicas or {}),
    )
    with stack:
        yield stack


# ---------------------------------------------------------------------------- the command


class _Shutdown(BaseException):
    """Raised in the main thread by SIGINT / SIGTERM."""


def _parse_kwargs(values: list[str]) -> dict[str, dict[str, Any]]:
    parsed: dict[str, dict[str, Any]] = {}
    for value in values:
        name, _, text = value.partition("=")
        try:
            kwargs = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--task-kwargs {value!r}: not TASK=JSON ({exc})") from None
        if not isinstance(kwargs, dict):
            raise ValueError(f"--task-kwargs {value!r}: the JSON must be an object")
        parsed.setdefault(name, {}).update(kwargs)
    return parsed


def _parse_replicas(text: str) -> dict[str, int]:
    """``alfworld=7,webshop=2`` -> ``{"alfworld": 7, "webshop": 2}``."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, count = item.partition("=")
        if not count.strip().isdigit():
            raise ValueError(f"--replicas {text!r}: {item!r} is not TASK=N (N a whole number >= 1)")
        out[name.strip()] = int(count)
    return out


def main(argv: list[str] | None = None) -> int:
    """``agentrl-envs up|list``."""
    defaults = cli.HelpFormatter
    parser = cli.parser("agentrl-envs", __doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the known tasks", formatter_class=defaults)
    up = commands.add_parser(
        "up", help="start the controller and task workers; Ctrl-C stops them", formatter_class=defaults
    )
    cli.add_tasks(up, help=f"comma-separated, of: {','.join(task_specs())}")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help="the controller's port")
    up.add_argument(
        "--host",
        default=LOOPBACK,
        help="the address the controller and the workers bind; beyond loopback --secret-file (or "
        "$AGENTRL_ENV_WORKER_SECRET) is required",
    )
    up.add_argument(
        "--advertise-host",
        default=None,
        help="the address the trainer's nodes and the workers reach the controller at (default: --host; "
        "required with --host 0.0.0.0)",
    )
    up.add_argument(
        "--secret-file", default=None, help="the worker secret, given to the controller and the workers"
    )
    up.add_argument(
        "--replicas",
        default="",
        metavar="TASK=N[,TASK=N...]",
        help="workers per task (default 1 each), e.g. alfworld=7,webshop=2",
    )
    up.add_argument("--docker", action="store_true", help="each worker in its own container")
    up.add_argument(
        "--split",
        default="train",
        choices=SPLITS,
        help="the tasks' split: train for training data, test (held out) for evaluation",
    )
    up.add_argument(
        "--task-kwargs",
        action="append",
        default=[],
        metavar="TASK=JSON",
        help='e.g. dbbench=\'{"backend": "sqlite"}\'',
    )
    up.add_argument("--log-dir", type=Path, default=None, help="process logs (none: a temporary folder)")
    up.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for each worker")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health poll
    if args.command == "list":
        for name, row in task_specs().items():
            print(
                f"{name:<10} {row.task_class}  needs: {','.join(row.needs) or '-'}  splits: {row.splits or '-'}"
                f"  expert: {row.expert or '-'}"
            )
        return 0
    try:
        stack = EnvStack(
            tasks=cli.tasks_of(args.tasks),
            port=args.port,
            docker=args.docker,
            split=args.split,
            kwargs=_parse_kwargs(args.task_kwargs),
            log_dir=args.log_dir,
            ready_timeout_s=args.ready_timeout,
            die_with_parent=threading.current_thread() is threading.main_thread(),
            host=args.host,
            advertise_host=args.advertise_host,
            secret_file=args.secret_file,
            replicas=_parse_replicas(args.replicas),
        )
    except ValueError as exc:
        parser.error(str(exc))

    def shutdown(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not break the clean-up
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Shutdown(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    code = 0
    try:
        with stack:
            print(stack.describe(), flush=True)
            if stack.split != "train":
                print(
                    f"agentrl-envs: serving the held-out {stack.split} split, for evaluation; "
                    "agentrl-build-dataset refuses to build a training set from it (--allow-held-out overrides)",
                    flush=True,
                )
            print(f"agentrl-envs: ready ({', '.join(stack.tasks)}); Ctrl-C stops everything", flush=True)
            while not (dead := stack.dead()):
                time.sleep(0.5)
            logger.error(
                "stopped on its own: %s; stopping the rest (logs in %s)", ", ".join(dead), stack.log_dir
            )
            code = 1
    except _Shutdown as reason:
        logger.info("%s: stopped everything", reason)
    except (RuntimeError, TimeoutError) as exc:
        logger.error("%s", exc)
        code = 1
    return code


__all__ = [
    "EnvStack",
    "ServerProcess",
    "free_port",
    "launch_from_config",
    "list_workers",
    "main",
    "wait_routable",
    "wait_until",
    "worker_argv",
]


if __name__ == "__main__":
    sys.exit(main())
