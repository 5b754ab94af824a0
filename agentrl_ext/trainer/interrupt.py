"""Ctrl-C (SIGINT) and SIGTERM for ``agentrl-train``: every stage unwinds, and one that cannot is ended.

The first signal raises ``KeyboardInterrupt`` in the main thread, so each stage's ``finally``
stops what it started, last started first: verl's Ray cluster (``ray.shutdown``), the SFT
trainer's process group, the controllers and the workers, MariaDB and dockerd when the job
started them. ``agentrl-train`` then exits with 130 (128 + SIGINT, what a shell reports for a
command stopped by Ctrl-C), for SIGTERM too.

Unwinding needs the main thread back in Python and every clean-up to finish; a stage blocked in
native code, or a clean-up that waits on a process that does not answer, would keep the job
alive. So the first signal also arms a deadline: when the process still runs ``grace_s`` later,
or at a second signal, :meth:`JobInterrupt.force` ends it: SIGTERM, then SIGKILL after
``kill_after_s``, to every process the job started (its descendants, whatever their session or
process group), then the clean-ups registered with :meth:`JobInterrupt.on_force` (servers that
are not descendants: MariaDB, dockerd, worker containers), then exit 130.

    with JobInterrupt() as interrupt:
        stack = ...                      # started by the job
        interrupt.on_force(stack.stop)
        run_stages()
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import psutil

logger = logging.getLogger(__name__)

__all__ = ["INTERRUPTED_EXIT_CODE", "JobInterrupt", "stop_descendants"]

#: the exit code of a job stopped by Ctrl-C or SIGTERM (128 + SIGINT)
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _gone_is_fine() -> contextlib.suppress:
    return contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied)


def stop_descendants(kill_after_s: float = 10.0, rounds: int = 3) -> list[str]:
    """SIGTERM every descendant of this process, SIGKILL those left after ``kill_after_s``; again
    for processes started meanwhile (a Ray raylet starting workers), up to ``rounds`` times.
    Returns the command lines of the processes that had to be killed."""
    killed: list[str] = []
    for _ in range(rounds):
        processes = psutil.Process().children(recursive=True)
        if not processes:
            break
        for process in processes:
            with _gone_is_fine():
                process.terminate()
        _gone, alive = psutil.wait_procs(processes, timeout=kill_after_s)
        for process in alive:
            with _gone_is_fine():
                killed.append(" ".join(process.cmdline())[:160])
                process.kill()
        psutil.wait_procs(alive, timeout=5.0)
    return killed


class JobInterrupt:
    """SIGINT/SIGTERM handling for the job's lifetime (a context manager; a no-op off the main thread).

    Args:
        grace_s: how long the stages get to unwind after the first signal before :meth:`force`.
        kill_after_s: how long :meth:`force` waits after SIGTERM before SIGKILL.
        cleanup_timeout_s: how long :meth:`force` waits for the registered clean-ups.
    """

    def __init__(self, grace_s: float = 60.0, kill_after_s: float = 10.0, cleanup_timeout_s: float = 60.0):
        self.grace_s = grace_s
        self.kill_after_s = kill_after_s
        self.cleanup_timeout_s = cleanup_timeout_s
        self.signalled: str | None = None
        self._cleanups: list[Callable[[], None]] = []
        self._previous: dict[int, Any] = {}
        self._forcing = threading.Lock()

    def on_force(self, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` (last registered first) if the job has to be ended by :meth:`force`."""
        self._cleanups.append(cleanup)

    def __enter__(self) -> JobInterrupt:
        if threading.current_thread() is threading.main_thread():
            for number in _SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        # once signalled, the handler stays: a second Ctrl-C during the remaining clean-up (Ray's
        # shutdown runs at exit) ends the job instead of interrupting that clean-up half-way
        if self.signalled is None:
            for number, previous in self._previous.items():
                signal.signal(number, previous)
        self._previous.clear()

    def _handle(self, number: int, _frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        if self.signalled is not None:
            self.force(f"{name} again")
            return
        self.signalled = name
        logger.warning(
            "%s: stopping everything the job started (%s again, or %.0f s from now, ends it at once)",
            name,
            "Ctrl-C" if number == signal.SIGINT else name,
            self.grace_s,
        )
        threading.Thread(target=self._deadline, name="agentrl-interrupt-deadline", daemon=True).start()
        raise KeyboardInterrupt(name)

    def _deadline(self) -> None:
        # daemon: it also covers Python's exit (the atexit clean-ups, non-daemon threads)
        threading.Event().wait(self.grace_s)
        self.force(f"still running {self.grace_s:.0f} s after {self.signalled}")

    def force(self, reason: str) -> None:
        """End the job now: stop every descendant, run the registered clean-ups, exit 130."""
        if not self._forcing.acquire(blocking=False):
            return  # another thread is already ending the job
        logger.error("%s: stopping every process the job started and exiting", reason)
        killed = stop_descendants(self.kill_after_s)
        if killed:
            logger.error("killed after %.0f s without stopping: %s", self.kill_after_s, killed)
        cleanups = threading.Thread(target=self._run_cleanups, name="agentrl-interrupt-cleanup", daemon=True)
        cleanups.start()
        cleanups.join(self.cleanup_timeout_s)
        if cleanups.is_alive():
            logger.error("the clean-ups did not finish within %.0f s", self.cleanup_timeout_s)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(INTERRUPTED_EXIT_CODE)

    def _run_cleanups(self) -> None:
        for cleanup in reversed(self._cleanups):
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - keep running the others
                logger.exception("clean-up %r failed", cleanup)
