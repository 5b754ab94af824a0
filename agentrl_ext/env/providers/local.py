"""``LocalProvider``: a temporary directory and plain ``bash -c`` subprocesses per session.

The embedded default where no Docker engine exists (laptops, CI without Docker). It isolates
nothing but the working directory: commands run as the worker's user, see the host's network and
files. A memory limit is applied with ``ulimit -v`` and every command runs in its own process
group, killed as a whole at its time limit. Use it only for trusted tasks and tests.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from agentrl_ext.env.providers.base import (
    TIMEOUT_EXIT_CODE,
    ExecResult,
    ResourceProvider,
    ResourceSpec,
    SessionResource,
    truncate_output,
)

logger = logging.getLogger(__name__)

_READ_CHUNK = 65536
_OUTPUT_READ_FACTOR = 4


class LocalSessionResource(SessionResource):
    """A private temporary directory; commands run in it."""

    def __init__(self, provider: LocalProvider, directory: Path, spec: ResourceSpec) -> None:
        self._provider = provider
        self.directory = directory
        self._spec = spec
        self._closed = False
        self._running: set[asyncio.subprocess.Process] = set()

    @property
    def id(self) -> str:
        return str(self.directory)

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
            raise RuntimeError(
                f"session directory {self.directory} was already released; exec needs an open session"
            )
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        cwd = self.directory / workdir.lstrip("/") if workdir else self.directory
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.directory),
            "LANG": "C.UTF-8",
            **self._spec.env,
            **(env or {}),
        }
        limited = f"ulimit -v {self._spec.memory_bytes // 1024} 2>/dev/null; {command}"
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *launcher,
            f"{programs_dir.rstrip('/')}/bash" if programs_dir else "bash",
            "-c",
            limited,
            cwd=cwd,
            env=environment,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
        )
        self._running.add(process)
        kept = bytearray()
        dropped = 0
        keep_bytes = max_output_chars * _OUTPUT_READ_FACTOR

        async def read_all() -> None:
            nonlocal dropped
            assert process.stdout is not None
            while chunk := await process.stdout.read(_READ_CHUNK):
                room = keep_bytes - len(kept)
                if room > 0:
                    kept.extend(chunk[:room])
                dropped += max(0, len(chunk) - max(room, 0))
            await process.wait()

        timed_out = False
        try:
            await asyncio.wait_for(read_all(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            _kill_group(process)
            await process.wait()
        finally:
            self._running.discard(process)
            if process.returncode is None:  # cancelled: do not leave the command running
                _kill_group(process)
        exit_code = (
            TIMEOUT_EXIT_CODE if timed_out else (process.returncode if process.returncode is not None else -1)
        )
        text, truncated = truncate_output(kept.decode("utf-8", "replace"), max_output_chars, dropped)
        return ExecResult(exit_code, text, truncated, timed_out, round(time.monotonic() - started, 3))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for process in list(self._running):
            _kill_group(process)
        self._provider.release(self)
        await asyncio.to_thread(shutil.rmtree, self.directory, True)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class LocalProvider(ResourceProvider):
    """Temporary directories under ``root`` (default: the system temp dir)."""

    def __init__(self, root: Path | None = None, default_spec: ResourceSpec | None = None) -> None:
        self.root = root
        self.default_spec = default_spec or ResourceSpec()
        self._held: set[LocalSessionResource] = set()
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)

    async def acquire(
        self, task: str, session_id: int | str, spec: ResourceSpec | None = None
    ) -> LocalSessionResource:
        directory = Path(tempfile.mkdtemp(prefix=f"agentrl-{task}-{session_id}-", dir=self.root))
        resource = LocalSessionResource(self, directory, spec or self.default_spec)
        self._held.add(resource)
        return resource

    def release(self, resource: LocalSessionResource) -> None:
        """Forget a closed resource (called by the resource itself)."""
        self._held.discard(resource)

    async def close(self) -> None:
        for resource in list(self._held):
            await resource.close()
