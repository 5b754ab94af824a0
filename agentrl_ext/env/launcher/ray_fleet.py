"""``placement: ray``: the environment fleet on the Ray cluster the trainer already runs.

The controller (each of its shards) and every task worker is the same server process as with
``placement: local``, started and supervised by a Ray actor on the node Ray chose:

- **where**: workers go to nodes that offer the custom resource :data:`ENV_RESOURCE`
  (``agentrl_env``, one unit per worker), spread over them (Ray's ``SPREAD``), each asking for the
  CPUs and memory its task's spec names (:attr:`~agentrl_ext.env.tasks.TaskSpec.worker_cpus`,
  ``worker_memory_mb``) and for the marker resource of every server it needs on its node
  (:data:`NEED_RESOURCES`: ``agentrl_env_docker``, ``agentrl_env_mariadb``). The controllers
  run on the driver's node (the node of ``agentrl-envs up`` / ``agentrl-train``), where the
  trainer reaches them at the address it would with ``placement: local``.
- **addresses**: each worker binds its own node's address (``ray.util.get_node_ip_address()``)
  on a free port and advertises ``http://NODE_IP:PORT/api`` to the controllers.
- **secrets**: a constructor argument of the actor (Ray's object transport; not in a command
  line, an environment variable or Ray's dashboard), written to a 0600 file on the node that
  the server process is given with ``--secret-file``.
- **supervision**: a server process that exits ends its actor, and Ray restarts the actor (up
  to :data:`MAX_RESTARTS` times); when a node goes away Ray restarts its workers on the nodes
  left (or on the next one that joins, while none has room); the controllers drop the lost
  workers at their next missed heartbeat and end their sessions with ``task error``.
  ``per_node`` workers (``{task: n}``) are placed on every node offering the resource, also on
  nodes that join later (:meth:`RayFleet.reconcile`, every :data:`RECONCILE_INTERVAL_S`).
- **nothing left behind**: :meth:`RayFleet.stop` stops every server process and kills every
  actor; the actors are the driver's (not detached), so Ray also kills them when the driver
  dies, and each server process dies with its actor (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentrl_ext.env.auth import WORKER_SECRET_ENV, is_loopback, require_secret_beyond_loopback
from agentrl_ext.env.launcher.processes import (
    ServerProcess,
    _script,
    api_url,
    controller_argv,
    free_port,
    list_workers,
    local_host,
    script_path,
    wait_until,
    wants_mariadb,
    worker_argv,
)
from agentrl_ext.env.tasks import task_spec

logger = logging.getLogger(__name__)

ENV_RESOURCE = "agentrl_env"
"""The custom resource a node offers to host task workers: one unit per worker
(``ray start --resources '{"agentrl_env": 8}'``)."""
NEED_RESOURCES = {"docker": "agentrl_env_docker", "mariadb": "agentrl_env_mariadb"}
"""A node that runs the server a task needs (``TaskSpec.needs``) says so with this marker
resource (any amount, e.g. ``{"agentrl_env_docker": 1000}``); each worker asks for a sliver of it."""
NEED_SLIVER = 0.001
MAX_RESTARTS = 10
"""How often Ray restarts one actor (a crashed server process, a lost node) before giving up."""
RECONCILE_INTERVAL_S = 2.0
PLACEMENTS = ("local", "ray")


def _private_file(folder: Path, name: str, text: str) -> str:
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return str(path)


def _node_service(script: str, command: str) -> str:
    """The address a node's own server gives (``scripts/mariadb.sh url``, ``dockerd.sh host``)."""
    if _script(script, "status").returncode != 0:
        resource = NEED_RESOURCES["mariadb" if "mariadb" in script else "docker"]
        raise RuntimeError(
            f"this node offers {resource} but its server is not running: run `bash {script_path(script)} start` "
            "on it (or stop offering the resource)"
        )
    return _script(script, command).stdout.strip()


class ServerActor:
    """A Ray actor that runs one server process (a controller or a task worker) on its node and
    ends when the process does (so that Ray restarts both)."""

    def __init__(self, role: str, name: str, options: dict[str, Any], secrets: dict[str, str | None]) -> None:
        import ray

        self.role = role
        self.name = name
        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.folder = Path(tempfile.mkdtemp(prefix=f"agentrl-ray-{role}-"))
        secret_files = {
            key: _private_file(self.folder, f"{key}.secret", value) for key, value in secrets.items() if value
        }
        env: dict[str, str] = {}
        if role == "controller":
            host, port = options["host"], int(options["port"])
            argv = controller_argv(
                port,
                host,
                worker_secret_file=secret_files.get("worker"),
                client_secret_file=secret_files.get("client"),
                **options.get("controller_options", {}),
            )
            advertised = options.get("advertise_host") or self.node_ip
        else:
            host, port = self.node_ip, free_port(self.node_ip)
            kwargs = dict(options["kwargs"])
            if wants_mariadb(options["task"], kwargs):
                kwargs["mariadb_url"] = _node_service("mariadb.sh", "url")
            if "docker" in task_spec(options["task"]).needs:
                env["DOCKER_HOST"] = _node_service("dockerd.sh", "host")
            argv = worker_argv(
                task_spec(options["task"]).task_class,
                port,
                options["controllers"],
                kwargs,
                heartbeat_interval=options.get("heartbeat_interval"),
                host=host,
                self_address=api_url(self.node_ip, port),
                secret_file=secret_files.get("worker"),
            )
            advertised = self.node_ip
        self.process = ServerProcess(
            name,
            argv,
            port,
            self.folder / f"{role}.log",
            env=env,
            die_with_parent=True,
            host=advertised,
        )
        self._stopping = False
        self.process.start()
        try:
            self.process.wait_ready(float(options.get("ready_timeout_s", 120.0)))
        except BaseException:
            self.process.stop()
            raise
        finally:  # read at start-up: no copy stays on the node's disk, whether the server came up or not
            for path in secret_files.values():
                Path(path).unlink(missing_ok=True)
        threading.Thread(target=self._watch, name=f"watch-{name}", daemon=True).start()

    def _watch(self) -> None:
        while not self._stopping:
            if not self.process.alive and not self._stopping:
                logging.getLogger(__name__).error(
                    "%s exited (%s); ending the actor so that Ray restarts it:\n%s",
                    self.name,
                    self.process.proc.returncode if self.process.proc else "?",
                    self.process.log_tail(),
                )
                os._exit(1)
            time.sleep(0.5)

    def info(self) -> dict[str, Any]:
        """Where the server runs: node, address, pid, log."""
        return {
            "role": self.role,
            "name": self.name,
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "api": self.process.api,
            "pid": self.process.pid,
            "actor_pid": os.getpid(),
            "log": str(self.process.log_path),
        }

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines)

    def stop(self) -> bool:
        """Stop the server process (SIGTERM, then SIGKILL after 10 s) and remove its files."""
        import shutil

        self._stopping = True
        self.process.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
        return True


@dataclass
class _Member:
    key: str
    task: str | None
    actor: Any
    node_id: str | None = None  # per-node members: the node they are pinned to
    info: dict[str, Any] | None = None


@dataclass
class RayFleet:
    """The controllers and task workers of one stack as Ray actors (see the module's docs).

    Args:
        tasks: task names; ``task_kwargs`` their kwargs (the split's, with overrides).
        replicas: workers per task spread over the nodes offering ``resource``.
        per_node: workers per task on every node offering ``resource`` (also nodes that join).
        port / host / advertise_host: the first controller's port, the address it binds and the
            address others reach it at (default: the driver node's address); shard k uses port + k.
        shards: controller processes serving the fleet (each worker heartbeats to all).
        address: the Ray cluster (``auto``: ``$RAY_ADDRESS`` or the one running on this node).
        secrets: ``{"worker": ..., "client": ...}``, each None for none.
        controller_options: more ``agentrl-controller`` options (``heartbeat_timeout=...``).
        heartbeat_interval: the workers' heartbeat interval (None: the SDK's 8 s).
    """

    tasks: Sequence[str]
    task_kwargs: dict[str, dict[str, Any]]
    replicas: dict[str, int]
    port: int
    host: str = "127.0.0.1"
    advertise_host: str | None = None
    shards: int = 1
    per_node: dict[str, int] = field(default_factory=dict)
    address: str = "auto"
    resource: str = ENV_RESOURCE
    secrets: dict[str, str | None] = field(default_factory=dict)
    controller_options: dict[str, Any] = field(default_factory=dict)
    heartbeat_interval: float | None = None
    ready_timeout_s: float = 180.0
    controllers: list[_Member] = field(default_factory=list, init=False)
    workers: dict[str, _Member] = field(default_factory=dict, init=False)
    _connected: bool = field(default=False, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tasks = list(self.tasks)
        if self.shards < 1:
            raise ValueError(f"shards={self.shards}: at least one controller")
        bad = {t: n for t, n in self.per_node.items() if t not in self.tasks or n < 1}
        if bad:
            raise ValueError(
                f"per_node {bad}: each count must be >= 1 and name a started task ({self.tasks})"
            )
        self.fleet_id = uuid.uuid4().hex[:8]

    # ------------------------------------------------------------------ demand
    def worker_resources(self, task: str) -> dict[str, Any]:
        """The Ray options one worker of ``task`` asks for: CPUs, memory, a ``resource`` slot,
        and a sliver of each marker resource of the servers it needs on its node."""
        spec = task_spec(task)
        kwargs = self.task_kwargs.get(task, {})
        markers = {
            NEED_RESOURCES[need]: NEED_SLIVER
            for need in spec.needs
            if need in NEED_RESOURCES and (need != "mariadb" or wants_mariadb(task, kwargs))
        }
        return {
            "num_cpus": spec.worker_cpus,
            "memory": int(spec.worker_memory_mb) * 1024 * 1024,
            "resources": {self.resource: 1, **markers},
        }

    def check_addresses(self) -> None:
        """Refuse (ValueError naming the fix) a fleet whose workers could not reach the controllers,
        or would serve beyond loopback without a worker secret."""
        beyond = sorted(
            {n["NodeManagerAddress"] for n in self.env_nodes() if not is_loopback(n["NodeManagerAddress"])}
        )
        if not beyond:
            return
        require_secret_beyond_loopback(
            beyond[0],
            self.secrets.get("worker"),
            "placement ray",
            "--secret-file (agentrl.envs.secret_file)",
            WORKER_SECRET_ENV,
        )
        if is_loopback(self.host) or (self.advertise_host and is_loopback(self.advertise_host)):
            raise ValueError(
                f"placement ray: workers on nodes {', '.join(beyond)} cannot reach a controller on {self.host}; "
                f"bind the controller beyond loopback and advertise the driver node's address "
                f"(--host 0.0.0.0 --advertise-host {self._driver_ip}; agentrl.envs.host / advertise_host)"
            )

    def check_capacity(self) -> None:
        """Refuse (ValueError naming the fix) when the cluster lacks what the spread workers need."""
        import ray

        offered = ray.cluster_resources()
        nodes = self.env_nodes()
        wanted: dict[str, float] = {}
        for task in self.tasks:
            count = self.replicas.get(task, 0) + self.per_node.get(task, 0) * len(nodes)
            for name, amount in self.worker_resources(task)["resources"].items():
                wanted[name] = wanted.get(name, 0.0) + amount * count
        short = {
            name: (need, offered.get(name, 0.0))
            for name, need in wanted.items()
            if offered.get(name, 0) < need - 1e-9
        }
        if short:
            detail = ", ".join(
                f"{name}: needs {need:g}, the cluster offers {have:g}" for name, (need, have) in short.items()
            )
            raise ValueError(
                f"placement ray: the cluster at {self.address} cannot host the fleet ({detail}). Start nodes for "
                f"the environments with `ray start --address HEAD:PORT --resources '{{\"{self.resource}\": N}}'` "
                f'(N workers each; add "agentrl_env_docker" / "agentrl_env_mariadb" where those servers run), '
                "or lower the workers per task"
            )

    # ------------------------------------------------------------------ lifecycle
    @property
    def apis(self) -> list[str]:
        """The controllers' API bases as advertised (shard order)."""
        host = self.advertise_host or self._driver_ip
        return [api_url(host, self.port + k) for k in range(self.shards)]

    def start(self) -> RayFleet:
        """Connect, check the cluster's resources, start the controllers and the workers, and wait
        until every worker is routable; on failure stop what started."""
        import ray

        try:
            if not ray.is_initialized():
                try:
                    ray.init(
                        address=self.address, namespace=f"agentrl-envs-{self.fleet_id}", log_to_driver=False
                    )
                except ConnectionError as exc:
                    raise RuntimeError(
                        f"placement ray: no Ray cluster at {self.address!r} ({exc}). Start one (`ray start --head` "
                        f"on the head, `ray start --address HEAD:6379 --resources '{{\"{self.resource}\": N}}'` on "
                        "each environment node), or name it: --ray-address HEAD:6379 (agentrl.envs.ray_address)"
                    ) from None
                self._connected = True
            self._driver_ip = ray.util.get_node_ip_address()
            self.check_addresses()
            self.check_capacity()
            self._start_controllers()
            for task in self.tasks:
                for i in range(self.replicas.get(task, 0)):
                    key = task if i == 0 else f"{task}#{i + 1}"
                    self.workers[key] = _Member(key, task, self._worker_actor(task, key))
            self.reconcile()
            self.wait_ready(self.ready_timeout_s)
            self._thread = threading.Thread(
                target=self._reconcile_loop, name="agentrl-ray-fleet", daemon=True
            )
            self._thread.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _actor_class(self) -> Any:
        import ray

        return ray.remote(ServerActor)

    def _start_controllers(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        for k in range(self.shards):
            options = {
                "host": self.host,
                "port": self.port + k,
                "advertise_host": self.advertise_host,
                "controller_options": {
                    **self.controller_options,
                    **({"shard": k, "shards": self.shards} if self.shards > 1 else {}),
                },
                "ready_timeout_s": 60.0,
            }
            actor = (
                self._actor_class()
                .options(
                    name=f"agentrl-controller-{k}-{self.fleet_id}",
                    num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
                    max_restarts=MAX_RESTARTS,
                )
                .remote("controller", f"controller-{k}", options, self.secrets)
            )
            member = _Member(f"controller-{k}", None, actor, node_id=here)
            self.controllers.append(member)
        for member in self.controllers:
            member.info = ray.get(member.actor.info.remote(), timeout=120)
            logger.info(
                "controller %s at %s (node %s)", member.key, member.info["api"], member.info["node_ip"]
            )

    def _worker_options(self, task: str) -> dict[str, Any]:
        return {
            "task": task,
            "kwargs": self.task_kwargs.get(task, {}),
            "controllers": self.apis,
            "heartbeat_interval": self.heartbeat_interval,
            "ready_timeout_s": self.ready_timeout_s,
        }

    def _worker_actor(self, task: str, key: str, node_id: str | None = None) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy: Any = (
            "SPREAD" if node_id is None else NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        )
        return (
            self._actor_class()
            .options(
                name=f"agentrl-worker-{key}-{self.fleet_id}",
                scheduling_strategy=strategy,
                # pinned to its node: replaced by reconcile() there, not restarted elsewhere
                max_restarts=MAX_RESTARTS if node_id is None else 0,
                **self.worker_resources(task),
            )
            .remote("worker", key, self._worker_options(task), self.secrets)
        )

    def env_nodes(self) -> list[dict[str, Any]]:
        """The alive nodes offering the fleet's resource."""
        import ray

        return [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get(self.resource, 0) > 0]

    def reconcile(self) -> None:
        """``per_node`` workers: place the missing ones on every node offering the resource (nodes
        that joined included) and forget those of nodes that are gone."""
        if not self.per_node:
            return
        import ray

        with self._lock:
            alive = {n["NodeID"]: n for n in self.env_nodes()}
            for key, member in list(self.workers.items()):
                if member.node_id is not None and member.node_id not in alive:
                    logger.warning("node %s is gone: forgetting worker %s", member.node_id[:8], key)
                    ray.kill(member.actor, no_restart=True)
                    del self.workers[key]
            for node_id in alive:
                for task, count in self.per_node.items():
                    for i in range(count):
                        key = f"{task}@{node_id[:8]}#{i + 1}"
                        if key not in self.workers:
                            logger.info("placing worker %s on node %s", key, node_id[:8])
                            self.workers[key] = _Member(
                                key, task, self._worker_actor(task, key, node_id), node_id
                            )

    def _reconcile_loop(self) -> None:
        while not self._stop.wait(RECONCILE_INTERVAL_S):
            try:
                self.reconcile()
                self._forget_dead_pinned()
            except Exception as exc:  # noqa: BLE001 - keep supervising; a lost driver ends the run anyway
                logger.warning("fleet reconcile failed: %s", exc)

    def _forget_dead_pinned(self) -> None:
        """A pinned worker whose actor died on a live node is replaced at the next reconcile."""
        import ray
        from ray.exceptions import RayActorError

        for key, member in list(self.workers.items()):
            if member.node_id is None:
                continue
            try:
                ray.get(member.actor.info.remote(), timeout=10)
            except RayActorError:
                with self._lock:
                    self.workers.pop(key, None)
            except Exception:  # noqa: BLE001 - busy or starting: look again next round
                pass

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until every worker actor is up and the controllers list each task's workers routable."""
        import ray

        deadline = time.monotonic() + timeout_s
        for member in list(self.workers.values()):
            left = max(1.0, deadline - time.monotonic())
            try:
                member.info = ray.get(member.actor.info.remote(), timeout=left)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(
                    f"worker {member.key} was not placed within {timeout_s:g}s: no node offers what it asks "
                    f"({self.worker_resources(str(member.task))}); see `ray status`"
                ) from None
            except ray.exceptions.RayActorError as exc:  # its server did not start: the log says why
                cause = getattr(exc, "cause", None) or getattr(exc, "error_msg", None) or exc
                raise RuntimeError(f"worker {member.key} could not start on its node: {cause}") from None
        counts: dict[str, int] = {}
        for member in self.workers.values():
            counts[str(member.task)] = counts.get(str(member.task), 0) + 1
        names = {task: str(self.task_kwargs.get(task, {}).get("name", task)) for task in counts}

        def routable() -> bool:
            for api in self.local_apis:
                try:
                    listed = list_workers(api)
                except httpx.HTTPError:
                    return False
                for task, count in counts.items():
                    if sum(bool(w["healthy"] and w["routable"]) for w in listed.get(names[task], [])) < count:
                        return False
            return True

        wait_until(routable, max(1.0, deadline - time.monotonic()), 0.2, what="every worker routable")

    @property
    def local_apis(self) -> list[str]:
        """The controllers' API bases as this (the driver's) node reaches them."""
        return [api_url(local_host(self.host), self.port + k) for k in range(self.shards)]

    def placements(self) -> list[dict[str, Any]]:
        """Each server's current role, name, node and address (asked of the actors now)."""
        import ray

        out = []
        for member in [*self.controllers, *self.workers.values()]:
            try:
                out.append(ray.get(member.actor.info.remote(), timeout=30))
            except Exception as exc:  # noqa: BLE001 - restarting or gone: say so
                out.append(
                    {"role": "worker" if member.task else "controller", "name": member.key, "error": str(exc)}
                )
        return out

    def dead(self) -> list[str]:
        """Controllers Ray gave up on (a worker that died is restarted or replaced)."""
        import ray
        from ray.exceptions import RayActorError

        gone = []
        for member in self.controllers:
            try:
                ray.get(member.actor.info.remote(), timeout=30)
            except RayActorError:
                gone.append(member.key)
            except Exception:  # noqa: BLE001 - restarting
                pass
        return gone

    def stop(self) -> None:
        """Stop every server process and kill every actor (workers first), then disconnect."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            import ray
        except ImportError:  # pragma: no cover - start() needs ray
            return
        if not ray.is_initialized():
            return
        members = [*reversed(list(self.workers.values())), *reversed(self.controllers)]
        for group in (members[: len(self.workers)], members[len(self.workers) :]):
            pending = {member.key: member.actor.stop.remote() for member in group}
            for member in group:
                try:
                    ray.get(pending[member.key], timeout=30)
                except Exception as exc:  # noqa: BLE001 - dead or unplaced: kill it all the same
                    logger.debug("stop %s: %s", member.key, exc)
                ray.kill(member.actor, no_restart=True)
        self.workers.clear()
        self.controllers.clear()
        if self._connected:
            ray.shutdown()
            self._connected = False

    def describe(self) -> list[str]:
        """One line per server: where it runs."""
        lines = []
        for info in self.placements():
            if "error" in info:
                lines.append(f"{info['role']:<10} {info['name']:<16} ({info['error'].splitlines()[0][:120]})")
            else:
                lines.append(
                    f"{info['role']:<10} {info['name']:<16} {info['api']}  (node {info['node_id'][:8]} "
                    f"{info['node_ip']}, pid {info['pid']}, log {info['log']} on that node)"
                )
        return lines
