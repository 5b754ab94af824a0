"""The environment stack: :class:`EnvStack` starts what its tasks need (MariaDB for dbbench unless
it runs on SQLite, the private Docker engine for ``docker`` and for tasks with per-session
containers), the controller, and each task's workers (local processes, or containers with
``docker``: :mod:`.containers`); waits until every worker is healthy and routable; stops all of
it, last started first, the servers it started itself and not those it found running.
:func:`launch_from_config` is the same stack from a recipe (``agentrl.envs.launch=true``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentrl_ext.env.auth import (
    CLIENT_SECRET_ENV,
    WORKER_SECRET_ENV,
    ServiceSecrets,
    load_secret,
    require_secret_beyond_loopback,
)
from agentrl_ext.env.front import check_front
from agentrl_ext.env.launcher.containers import ContainerWorkers, _remove_worker_container
from agentrl_ext.env.launcher.processes import (
    DEFAULT_PORT,
    LOOPBACK,
    SCRIPTS,
    WILDCARD_HOSTS,
    ServerProcess,
    _script,
    api_url,
    controller_argv,
    free_port,
    front_argv,
    list_workers,
    listening,
    local_host,
    wait_until,
    wants_mariadb,
    worker_argv,
)
from agentrl_ext.env.launcher.ray_fleet import ENV_RESOURCE, PLACEMENTS, RayFleet
from agentrl_ext.env.tasks import task_spec, task_specs

logger = logging.getLogger(__name__)

READY_LINE = "agentrl-envs: ready"
"""What ``agentrl-envs up`` prints once every worker is routable."""


@dataclass
class EnvStack(ContainerWorkers):
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
        front_port: also start a secret-adding front (:mod:`agentrl_ext.env.front`) on
            ``127.0.0.1:front_port`` for AgentRL's ``agentrl-worker`` / ``agentrl-eval`` on this
            host; it holds ``secret_file`` and ``$AGENTRL_ENV_CLIENT_SECRET`` (None: no front).
        placement: ``local`` (processes or containers on this host) or ``ray``: the controllers
            and workers as Ray actors on the cluster at ``ray_address``, workers on the nodes
            offering ``ray_resource`` (:mod:`.ray_fleet`); the nodes run the servers their tasks
            need themselves.
        shards: controller processes (``ray`` placement; shard k on ``port + k``).
        per_node: ``ray`` placement: workers per task on every node offering ``ray_resource``, on
            top of ``replicas`` (nodes that join get theirs too).
        controller_options: more ``agentrl-controller`` options, e.g. ``{"heartbeat_timeout": 10}``.
        fleet_process: ``ray`` placement: drive the fleet from a child ``agentrl-envs up --placement
            ray`` process (its own Ray driver) instead of this process. ``agentrl-train`` does: one
            process holds one Ray connection, and verl's trainer makes its own (with its runtime
            environment) in the trainer's process.
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
    front_port: int | None = None
    placement: str = "local"
    ray_address: str = "auto"
    ray_resource: str = ENV_RESOURCE
    shards: int = 1
    per_node: dict[str, int] = field(default_factory=dict)
    controller_options: dict[str, Any] = field(default_factory=dict)
    fleet_process: bool = False
    fleet: RayFleet | None = field(default=None, init=False)
    driver: ServerProcess | None = field(default=None, init=False)
    controller: ServerProcess | None = field(default=None, init=False)
    front: ServerProcess | None = field(default=None, init=False)
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
        self._explicit_replicas = set(self.replicas)
        self.replicas = {name: int(self.replicas.get(name, 1)) for name in self.tasks} | {
            name: int(n) for name, n in self.replicas.items()
        }
        extra = sorted(set(self.replicas) - set(self.tasks))
        bad = {name: n for name, n in self.replicas.items() if n < 1}
        if extra or bad:
            raise ValueError(
                f"replicas {dict(self.replicas)}: every count must be >= 1 and name a started task ({self.tasks})"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r}; expected one of {PLACEMENTS}")
        if self.placement == "local" and (self.shards != 1 or self.per_node):
            raise ValueError(
                f"shards={self.shards} and per_node={self.per_node} need placement ray "
                "(--placement ray, agentrl.envs.placement=ray)"
            )
        if self.placement == "ray":
            if self.docker:
                raise ValueError(
                    "placement ray runs each worker as a process under a Ray actor on its node; worker "
                    "containers (--docker) are a local placement (per-session containers work on both)"
                )
            if self.front_port is not None:
                raise ValueError(
                    "--front-port is a local placement: run agentrl-envs front on the controller's node"
                )
        if self.advertise_host is None:
            if self.host in WILDCARD_HOSTS:
                raise ValueError(
                    f"host {self.host} binds every address; give the address the trainer's nodes and the "
                    "workers reach the controller at (agentrl-envs up --advertise-host ADDRESS, "
                    "agentrl.envs.advertise_host=ADDRESS)"
                )
            self.advertise_host = self.host
        worker_secret = load_secret(self.secret_file, WORKER_SECRET_ENV)
        # the controller and the workers refuse to start without it; say so before starting anything
        require_secret_beyond_loopback(
            self.host,
            worker_secret,
            "agentrl-envs up",
            "--secret-file (agentrl.envs.secret_file)",
            WORKER_SECRET_ENV,
        )
        if self.front_port is not None:  # the front refuses to start without a secret to add
            secrets = ServiceSecrets(worker_secret, load_secret(None, CLIENT_SECRET_ENV))
            check_front(LOOPBACK, self.api, secrets)
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
        return api_url(self.advertise_host or self.host, self.port)

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
        if self.placement == "ray":
            self._start_fleet()
            return
        if listening(self.port, self.host):
            # the new controller could not bind, and its readiness check would be answered by the
            # process already there: the workers would join another run's controller
            raise RuntimeError(
                f"port {self.port} on {self.host} is in use (another agentrl-train or agentrl-envs up?); "
                "stop it, or choose a free port (agentrl.envs.port=N, agentrl-envs up --port N)"
            )
        if self.front_port is not None and listening(self.front_port):
            raise RuntimeError(
                f"port {self.front_port} on {LOOPBACK} is in use; choose another for the front (--front-port N)"
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
            controller_argv(self.port, self.host, **secret, **self.controller_options),
            self.port,
            log_dir / "controller.log",
            die_with_parent=self.die_with_parent,
            new_session=self.die_with_parent,
            host=str(self.advertise_host),
        )
        self.controller.start().wait_ready(60)
        if self.front_port is not None:
            self.front = ServerProcess(
                "front",
                front_argv(self.front_port, self._local_api, worker_secret_file=self.secret_file),
                self.front_port,
                log_dir / "front.log",
                die_with_parent=self.die_with_parent,
                new_session=self.die_with_parent,
            )
            self.front.start().wait_ready(60)
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

    def _start_fleet(self) -> None:
        if self.fleet_process:
            self._start_fleet_process()
            return
        self.fleet = RayFleet(
            tasks=self.tasks,
            task_kwargs=self.task_kwargs,
            replicas=self.spread_replicas(),
            per_node={name: int(n) for name, n in self.per_node.items()},
            port=self.port,
            host=self.host,
            advertise_host=self.advertise_host if self.advertise_host != self.host else None,
            shards=self.shards,
            address=self.ray_address,
            resource=self.ray_resource,
            secrets={
                "worker": load_secret(self.secret_file, WORKER_SECRET_ENV),
                "client": load_secret(None, CLIENT_SECRET_ENV),
            },
            controller_options=self.controller_options,
            heartbeat_interval=self.heartbeat_interval,
            ready_timeout_s=self.ready_timeout_s,
        )
        self.fleet.start()

    def spread_replicas(self) -> dict[str, int]:
        """``ray`` placement: the workers per task Ray spreads over the nodes. A task in
        ``per_node`` has only its per-node workers, unless ``replicas`` named it too."""
        return {
            name: 0 if name in self.per_node and name not in self._explicit_replicas else n
            for name, n in self.replicas.items()
        }

    def fleet_argv(self) -> list[str]:
        """The ``agentrl-envs up --placement ray`` command line of this stack (``fleet_process``)."""
        argv = [sys.executable, "-m", "agentrl_ext.env.launcher", "up", "--placement", "ray"]
        argv += ["--tasks", ",".join(self.tasks), "--port", str(self.port), "--host", self.host]
        argv += [
            "--split",
            self.split,
            "--ray-address",
            self.ray_address,
            "--ray-resource",
            self.ray_resource,
        ]
        argv += ["--ready-timeout", str(self.ready_timeout_s), "--shards", str(self.shards)]
        if self.advertise_host and self.advertise_host != self.host:
            argv += ["--advertise-host", self.advertise_host]
        if self.secret_file:
            argv += ["--secret-file", self.secret_file]
        replicas = {name: n for name, n in self.spread_replicas().items() if n}
        if replicas:
            argv += ["--replicas", ",".join(f"{n}={c}" for n, c in replicas.items())]
        if self.per_node:
            argv += ["--per-node", ",".join(f"{n}={c}" for n, c in self.per_node.items())]
        for name, kwargs in self.kwargs.items():
            argv += ["--task-kwargs", f"{name}={json.dumps(kwargs)}"]
        for key, value in self.controller_options.items():
            argv += ["--controller-option", f"{key}={value}"]
        if self.heartbeat_interval is not None:
            argv += ["--heartbeat-interval", str(self.heartbeat_interval)]
        return argv

    def _start_fleet_process(self) -> None:
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="agentrl-envs-"))
        self.log_dir = log_dir
        self.driver = ServerProcess(
            "fleet",
            self.fleet_argv(),
            self.port,
            log_dir / "fleet.log",
            die_with_parent=True,
            new_session=True,
            host=str(self.advertise_host),
        )
        self.driver.start()

        def ready() -> bool:
            if not self.driver or not self.driver.alive:
                tail = self.driver.log_tail() if self.driver else ""
                raise RuntimeError(f"agentrl-envs up --placement ray exited; log:\n{tail}")
            return READY_LINE in self.driver.log_tail(400)

        wait_until(ready, self.ready_timeout_s + 120, 0.5, what="the Ray fleet to be ready")
        logger.info("environment fleet on Ray:\n%s", self.driver.log_tail(400).split(READY_LINE)[0][-4000:])

    def _service(self, name: str, script: str, address_command: str) -> None:
        env = {**os.environ}
        if _script(script, "status", env=env).returncode != 0:
            if name == "mariadb":
                _script(script, "install", env=env)
            try:
                result = _script(script, "start", env=env)
            except BaseException:
                # cut short (Ctrl-C): the server it began to start may run; stop() stops it
                self.started_services.append(name)
                raise
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
            "self_address": api_url(str(self.advertise_host), port),
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
        return api_url(local_host(self.host), self.port)

    def dead(self) -> list[str]:
        """Names of the parts that stopped on their own (the controller, workers, containers; with
        placement ray the controllers Ray gave up on: workers are restarted by Ray)."""
        if self.fleet is not None:
            return self.fleet.dead()
        if self.driver is not None:
            return [] if self.driver.alive else ["fleet"]
        gone = [n for n, w in self.workers.items() if not w.alive]
        if self.controller is not None and not self.controller.alive:
            gone.append("controller")
        if self.front is not None and not self.front.alive:
            gone.append("front")
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
        if self.fleet is not None:
            self.fleet.stop()
        if self.driver is not None:
            self.driver.stop(timeout_s=120)  # it stops every actor and server process first
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
        if self.front is not None:
            self.front.stop()
        if self.controller is not None:
            self.controller.stop()
        for service in reversed(self.started_services):
            script = "mariadb.sh" if service == "mariadb" else "dockerd.sh"
            _script(script, "stop")
        self.started_services.clear()

    def describe(self) -> str:
        """Where everything listens, one line each."""
        if self.fleet is not None:
            return "\n".join(self.fleet.describe())
        lines = [f"controller  {self.api}" + (f"  (pid {self.controller.pid})" if self.controller else "")]
        if self.front is not None:
            lines.append(
                f"front       {self.front.api}  (pid {self.front.pid}; for agentrl-worker / agentrl-eval)"
            )
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


@contextmanager
def launch_from_config(
    config: Any, register_stop: Callable[[Callable[[], None]], None] | None = None
) -> Iterator[EnvStack | None]:
    """The stack of ``agentrl.envs`` for ``agentrl-train``: started on entry, stopped on exit.

    ``config``: the typed ``AgentRLConfig`` (or its ``envs`` node, an ``EnvsConfig``). Yields
    None when ``envs.launch`` is false; else the running :class:`EnvStack` (``stack.api`` is the
    controller URL for ``agentrl.agent_loop.controller_url``). ``register_stop`` is given the
    stack's :meth:`EnvStack.stop` before the stack starts (the main job's
    :meth:`~agentrl_ext.trainer.interrupt.JobInterrupt.on_force`).
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
        placement=envs.placement,
        ray_address=envs.ray_address,
        ray_resource=envs.ray_resource,
        per_node=dict(envs.per_node or {}),
        fleet_process=True,
    )
    if register_stop is not None:
        register_stop(stack.stop)
    with stack:
        yield stack
