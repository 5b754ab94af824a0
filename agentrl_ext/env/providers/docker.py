"""``DockerProvider``: one container per session, with limits, no network and cleanup by label.

Every container carries labels naming its task, session and owner process, so that leftovers
of a crashed worker can be found and removed: :meth:`DockerProvider.sweep_orphans` removes the
containers of dead owner processes on this host, :meth:`DockerProvider.sweep` every labelled
one (``agentrl-docker-sweep --all``). Commands run through ``docker exec`` under coreutils
``timeout``; only the first bytes of their output are kept.

The docker SDK is synchronous; its calls run in a private thread pool so the worker's event loop
never blocks on the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import docker
import docker.errors
from docker.models.containers import Container

from agentrl_ext import cli
from agentrl_ext.env.providers.base import (
    TIMEOUT_EXIT_CODE,
    ExecResult,
    ResourceProvider,
    ResourceSpec,
    SessionResource,
    truncate_output,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

LABEL_MANAGED = "agentrl.managed"
LABEL_TASK = "agentrl.task"
LABEL_SESSION = "agentrl.session"
LABEL_OWNER = "agentrl.owner"
LABEL_CREATED = "agentrl.created"
_KEEP_ALIVE = ["sleep", "infinity"]
_OUTPUT_READ_FACTOR = 4  # bytes kept per output character (UTF-8 worst case)


def _process_start_ticks(pid: int) -> str | None:
    """Start time of ``pid`` (clock ticks since boot), None if no such process; tells reused pids apart."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_label(pid: int | None = None) -> str:
    """``host:pid:start_ticks`` of a process (default: this one)."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_process_start_ticks(pid)}"


def owner_is_alive(owner: str) -> bool:
    """False when ``owner`` names a process of this host that no longer runs; other hosts count as alive."""
    host, _, rest = owner.partition(":")
    pid_text, _, ticks = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return True
    return _process_start_ticks(int(pid_text)) == ticks


class DockerSessionResource(SessionResource):
    """A running container; commands go through ``docker exec``."""

    def __init__(self, provider: DockerProvider, container: Container, spec: ResourceSpec) -> None:
        self._provider = provider
        self._container = container
        self._spec = spec
        self._closed = False

    @property
    def id(self) -> str:
        return str(self._container.id)

    @property
    def container(self) -> Container:
        """The docker SDK container (for tasks that need more than exec)."""
        return self._container

    async def exec(
        self,
        command: str,
        *,
        timeout_s: float = 30.0,
        max_output_chars: int = 800,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        programs_dir: str | None = None,
        launcher: Sequence[str] = (),
    ) -> ExecResult:
        if self._closed:
            raise RuntimeError(f"container {self.id[:12]} was already released; exec needs an open session")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        started = time.monotonic()
        where = f"{programs_dir.rstrip('/')}/" if programs_dir else ""
        wrapped = [*launcher, f"{where}timeout", "--kill-after=2", f"{timeout_s:g}"]
        wrapped += [*launcher, f"{where}bash", "-c", command]
        exit_code, raw, dropped = await self._provider.run(
            functools.partial(
                self._exec_blocking, wrapped, max_output_chars * _OUTPUT_READ_FACTOR, workdir, env
            ),
            # The in-container timeout does the killing; this guard only covers a stuck engine.
            timeout_s=timeout_s + 30,
        )
        text, truncated = truncate_output(raw.decode("utf-8", "replace"), max_output_chars, dropped)
        timed_out = exit_code == TIMEOUT_EXIT_CODE and time.monotonic() - started >= timeout_s
        return ExecResult(exit_code, text, truncated, timed_out, round(time.monotonic() - started, 3))

    def _exec_blocking(
        self, command: list[str], keep_bytes: int, workdir: str | None, env: dict[str, str] | None
    ) -> tuple[int, bytes, int]:
        api = self._provider.client.api
        exec_id = api.exec_create(
            self._container.id,
            command,
            stdout=True,
            stderr=True,
            workdir=workdir or self._spec.workdir,
            environment=env,
        )["Id"]
        kept = bytearray()
        dropped = 0
        for chunk in api.exec_start(exec_id, stream=True):
            room = keep_bytes - len(kept)
            if room > 0:
                kept += chunk[:room]
            dropped += max(0, len(chunk) - max(room, 0))
        exit_code = api.exec_inspect(exec_id).get("ExitCode")
        return (exit_code if exit_code is not None else -1), bytes(kept), dropped

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._provider.remove(self._container)


class DockerProvider(ResourceProvider):
    """Per-session containers on a Docker engine.

    Args:
        client: a docker SDK client (default: ``docker.from_env()``, honouring ``DOCKER_HOST``).
        default_spec: limits used when ``acquire`` gets no spec.
        max_parallel: engine calls in flight at once (threads).
    """

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        default_spec: ResourceSpec | None = None,
        max_parallel: int = 16,
    ) -> None:
        self.client = client or docker.from_env(max_pool_size=max_parallel)
        self.default_spec = default_spec or ResourceSpec()
        self.owner = owner_label()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_parallel, thread_name_prefix="agentrl-docker")
        self._held: dict[str, Container] = {}

    async def run(self, call: Callable[[], T], timeout_s: float | None = None) -> T:
        """Run a blocking docker SDK call in the provider's threads."""
        future = asyncio.get_running_loop().run_in_executor(self._pool, call)
        return await (asyncio.wait_for(future, timeout_s) if timeout_s else future)

    async def acquire(
        self, task: str, session_id: int | str, spec: ResourceSpec | None = None
    ) -> DockerSessionResource:
        spec = spec or self.default_spec
        labels = {
            LABEL_MANAGED: "true",
            LABEL_TASK: task,
            LABEL_SESSION: str(session_id),
            LABEL_OWNER: self.owner,
            LABEL_CREATED: str(int(time.time())),
        }
        name = f"agentrl-{task}-{session_id}-{uuid.uuid4().hex[:6]}".replace("_", "-")
        run_kwargs: dict[str, Any] = {
            "command": _KEEP_ALIVE,
            "detach": True,
            "name": name,
            "labels": labels,
            "mem_limit": spec.memory_bytes,
            "memswap_limit": spec.memory_bytes,  # equal to mem_limit: no swap
            "nano_cpus": int(spec.cpus * 1e9),
            "pids_limit": spec.pids_limit,
            "network_mode": spec.network,
            "working_dir": spec.workdir,
            "environment": spec.env,
            "read_only": spec.read_only,
            "volumes": {name: {"bind": path, "mode": "ro"} for name, path in spec.read_only_volumes.items()},
            "init": True,  # reaps the zombies of killed commands
        }
        try:
            container = await self.run(
                functools.partial(self.client.containers.run, spec.image, **run_kwargs)
            )
        except docker.errors.ImageNotFound:
            raise RuntimeError(
                f"image {spec.image!r} is not on the Docker engine; build the base image with "
                "`agentrl-build-base-image` (or give ResourceSpec(image=...))"
            ) from None
        self._held[container.id] = container
        logger.debug("container %s started for %s session %s", container.short_id, task, session_id)
        return DockerSessionResource(self, container, spec)

    async def remove(self, container: Container) -> None:
        """Force-remove a container (gone already is fine)."""
        self._held.pop(container.id, None)
        try:
            await self.run(functools.partial(container.remove, force=True))
        except docker.errors.NotFound:
            pass

    async def close(self) -> None:
        for container in list(self._held.values()):
            await self.remove(container)
        self._pool.shutdown(wait=False)

    def labelled(self, task: str | None = None) -> list[Container]:
        """Every container (running or not) carrying our labels, optionally of one task."""
        filters = [f"{LABEL_MANAGED}=true"] + ([f"{LABEL_TASK}={task}"] if task else [])
        return list(self.client.containers.list(all=True, filters={"label": filters}))

    def sweep(self, task: str | None = None, keep_live_owners: bool = False) -> int:
        """Remove labelled containers (of ``task``); with ``keep_live_owners`` only orphans. Returns the count."""
        removed = 0
        for container in self.labelled(task):
            owner = container.labels.get(LABEL_OWNER, "")
            if keep_live_owners and (owner == self.owner or owner_is_alive(owner)):
                continue
            try:
                container.remove(force=True)
                removed += 1
            except docker.errors.NotFound:
                pass
        if removed:
            logger.info("swept %d leftover container(s)%s", removed, f" of task {task!r}" if task else "")
        return removed

    def sweep_orphans(self, task: str | None = None) -> int:
        """Remove containers whose owner process (on this host) is gone, e.g. after a worker crash."""
        return self.sweep(task, keep_live_owners=True)


def main(argv: list[str] | None = None) -> int:
    """``agentrl-docker-sweep [--all] [--tasks T]``: remove leftover session containers."""
    parser = cli.parser("agentrl-docker-sweep", "Remove leftover agentrl session containers.")
    parser.add_argument(
        "--all", action="store_true", help="remove every labelled container, not only orphans"
    )
    cli.add_tasks(parser, required=False, help="only containers of these tasks, comma-separated (none: all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        provider = DockerProvider()
    except docker.errors.DockerException as exc:
        logger.error("no Docker engine reachable (%s); set DOCKER_HOST, e.g. $(scripts/dockerd.sh host)", exc)
        return 1
    tasks = cli.tasks_of(args.tasks)
    selected: list[str | None] = list(tasks) or [None]
    removed = sum(provider.sweep(task, keep_live_owners=not args.all) for task in selected)
    logger.info("removed %d container(s)", removed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
