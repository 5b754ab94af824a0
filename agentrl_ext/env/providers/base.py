"""The provider interface: per-session resources in which a task runs the agent's commands.

A task asks its provider for a resource when a session starts and releases it when the session
ends (``async with provider.session(task, session_id) as box: await box.exec("ls")``). Two
implementations share this interface: :class:`~agentrl_ext.env.providers.docker.DockerProvider`
(an isolated container per session) and :class:`~agentrl_ext.env.providers.local.LocalProvider`
(a temporary directory and plain subprocesses, for machines without a Docker engine).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

DEFAULT_IMAGE = "agentrl-base:bookworm"
ALLOWED_NETWORKS = ("none", "host")
TIMEOUT_EXIT_CODE = 124
"""Exit code reported for a command killed by its time limit (as coreutils ``timeout`` does)."""


def truncate_output(text: str, limit: int, dropped: int = 0) -> tuple[str, bool]:
    """Cut ``text`` to ``limit`` characters plus a marker saying how much was left out.

    ``dropped`` counts output already discarded while reading (bytes, roughly characters).
    """
    if len(text) <= limit and not dropped:
        return text, False
    more = max(0, len(text) - limit) + dropped
    return text[:limit] + f"\n[output truncated: {more} more characters]", True


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command: exit code, (truncated) combined stdout+stderr, timing."""

    exit_code: int
    output: str
    truncated: bool = False
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass(frozen=True)
class ResourceSpec:
    """Limits of one session's resource (AgentRL's OS task: 1 GiB, no swap, 2 CPUs).

    ``network`` is ``"none"`` (default: no network at all) or ``"host"``; nothing else is allowed,
    so a session can never reach a bridge or an outside address.
    """

    image: str = DEFAULT_IMAGE
    memory_bytes: int = 1 << 30
    cpus: float = 2.0
    pids_limit: int = 256
    network: str = "none"
    workdir: str = "/root"
    env: dict[str, str] = field(default_factory=dict)
    read_only: bool = False
    read_only_volumes: dict[str, str] = field(default_factory=dict)
    """Named Docker volumes mounted read-only: volume name -> path in the container (the local
    provider has no volumes and ignores them)."""

    def __post_init__(self) -> None:
        if self.network not in ALLOWED_NETWORKS:
            raise ValueError(
                f"ResourceSpec.network={self.network!r} is not allowed; use 'none' (no network) or 'host' "
                "(services bound to 127.0.0.1); bridge networks are never used"
            )
        if self.memory_bytes < 6 * 1024 * 1024:
            raise ValueError(
                f"ResourceSpec.memory_bytes={self.memory_bytes} is below Docker's minimum of 6 MiB"
            )
        if self.cpus <= 0:
            raise ValueError(f"ResourceSpec.cpus must be positive, got {self.cpus}")
        if self.pids_limit < 4:
            raise ValueError(
                f"ResourceSpec.pids_limit={self.pids_limit} is too small to run a shell; use >= 4"
            )


class SessionResource(ABC):
    """One session's sandbox."""

    @property
    @abstractmethod
    def id(self) -> str:
        """A name for logs (container id, directory)."""

    @abstractmethod
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
        """Run ``command`` with ``bash -c``; killed after ``timeout_s`` (exit code 124, ``timed_out``).

        ``programs_dir``: a folder in the sandbox whose ``timeout`` and ``bash`` run the command
        (e.g. a read-only mount the session cannot change); None: the sandbox's own, on ``PATH``.
        ``launcher``: argv put before each of those programs, e.g. a dynamic loader the session
        cannot change with its ``--library-path`` (so not even the sandbox's loader runs them).
        """

    @abstractmethod
    async def close(self) -> None:
        """Release the resource (idempotent)."""


class ResourceProvider(ABC):
    """Creates and removes per-session resources."""

    @abstractmethod
    async def acquire(
        self, task: str, session_id: int | str, spec: ResourceSpec | None = None
    ) -> SessionResource:
        """A new resource for ``session_id`` of ``task``; release it with ``close()``."""

    @abstractmethod
    async def close(self) -> None:
        """Release every resource this provider still holds."""

    @asynccontextmanager
    async def session(
        self, task: str, session_id: int | str, spec: ResourceSpec | None = None
    ) -> AsyncIterator[SessionResource]:
        """``async with provider.session(...) as box``: the resource is removed at session end,
        also when the session is cancelled or fails."""
        resource = await self.acquire(task, session_id, spec)
        try:
            yield resource
        finally:
            await resource.close()
