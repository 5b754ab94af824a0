"""Which workers serve which task: heartbeats, reclaiming (re)joining workers, health checks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pydantic_core

from agentrl_ext.env.asgi import HttpError
from agentrl_ext.env.controller.config import ControllerConfig
from agentrl_ext.env.controller.metrics import ControllerMetrics
from agentrl_ext.env.controller.registry import WorkerRecord, WorkerRegistry, normalize_address
from agentrl_ext.env.controller.upstream import WorkerConnections, WorkerUnreachable
from agentrl_ext.env.protocol import HeartbeatRequest, SampleIndex, WorkerInfo

logger = logging.getLogger(__name__)


def worker_detail(body: bytes) -> str:
    """The error text of a worker answer (FastAPI and ours use ``{"detail": ...}``)."""
    try:
        parsed = pydantic_core.from_json(body)
        if isinstance(parsed, dict) and "detail" in parsed:
            return str(parsed["detail"])
    except ValueError:
        pass
    return body[:300].decode("utf-8", "replace")


class WorkerMembership:
    """The controller's view of its workers.

    Args:
        config: controller settings (heartbeat timeout, grace periods).
        upstream: pooled connections to workers (for ``cancel_all``).
        metrics: where the worker census is published.
        end_sessions: ends every session of a lost worker, with the reason.
    """

    def __init__(
        self,
        config: ControllerConfig,
        upstream: WorkerConnections,
        metrics: ControllerMetrics,
        end_sessions: Callable[[WorkerRecord, str], None],
    ) -> None:
        self.config = config
        self.registry = WorkerRegistry()
        self.upstream = upstream
        self.metrics = metrics
        self._end_sessions = end_sessions
        self._joining: set[str] = set()

    async def receive_heartbeat(self, beat: HeartbeatRequest) -> dict[str, Any]:
        """Register or refresh a worker.

        A worker that is new, returns from being unhealthy, or now serves another task may still
        run sessions the controller does not know (a controller restart, sessions ended while it
        was unreachable). It is sent ``cancel_all`` first, and listed as healthy and routable only
        once that is done; so a task shown healthy by ``list_workers`` takes sessions at once.
        """
        if not beat.address:
            raise HttpError(
                400,
                f"heartbeat from a worker of task {beat.name!r} has no 'address': this controller reaches "
                "workers over HTTP (gRPC transport is not supported); start the worker with its own API URL, "
                "e.g. --self http://127.0.0.1:5021/api",
            )
        address = normalize_address(beat.address)
        known = self.registry.by_address.get(address)
        if known is not None and known.name == beat.name and known.healthy:
            self.registry.heartbeat(beat, time.monotonic())
            return {"status": "ok"}
        if address in self._joining:
            return {"status": "joining"}
        if known is not None and known.name != beat.name:
            self.lost(known, f"its address now serves task {beat.name!r}")
        self._joining.add(address)
        try:
            await self._reclaim(address, beat.name)
        finally:
            self._joining.discard(address)
        record, _ = self.registry.heartbeat(beat, time.monotonic())
        record.routable = True
        logger.info("worker %s of task %r joined (concurrency %d)", address, beat.name, beat.concurrency)
        self.publish(record.name)
        return {"status": "ok"}

    async def _reclaim(self, address: str, name: str) -> None:
        """``cancel_all`` on a (re)joining worker; a 400 answer if its address cannot be reached."""
        try:
            status, body = await self.upstream.request(
                "POST", address, "/cancel_all", b"{}", self.config.cancel_grace_s
            )
        except WorkerUnreachable as exc:
            raise HttpError(
                400,
                f"the controller cannot reach the worker of task {name!r} at the address it announces "
                f"({exc}); announce an address the controller can reach (agentrl-worker: --self, "
                "agentrl-task-worker: --self-address)",
            ) from None
        if status != 200:
            logger.warning(
                "worker %s answered cancel_all with HTTP %d: %s", address, status, worker_detail(body)
            )

    def lost(self, worker: WorkerRecord, reason: str) -> None:
        """Mark a worker unhealthy and end its sessions with ``task error``."""
        if not worker.healthy:
            return
        worker.healthy = False
        worker.routable = False
        logger.warning("worker %s of task %r is unhealthy: %s", worker.address, worker.name, reason)
        self._end_sessions(worker, f"worker {worker.address} of task {worker.name!r} was lost: {reason}")
        self.publish(worker.name)

    def publish(self, name: str) -> None:
        workers = self.registry.workers_of(name)
        healthy = [w for w in workers if w.healthy]
        self.metrics.set_workers(
            name, len(healthy), len(workers) - len(healthy), sum(w.concurrency for w in healthy)
        )

    def list_workers(self) -> dict[str, list[WorkerInfo]]:
        """Workers grouped by task."""
        now = time.monotonic()
        grouped: dict[str, list[WorkerInfo]] = {}
        for worker in self.registry.by_address.values():
            grouped.setdefault(worker.name, []).append(worker.info(now))
        return grouped

    def known_task(self, name: str) -> list[WorkerRecord]:
        workers = self.registry.workers_of(name)
        if not workers:
            tasks = self.registry.tasks()
            known = (
                ", ".join(repr(t) for t in tasks) if tasks else "none (no worker has sent a heartbeat yet)"
            )
            raise HttpError(404, f"no worker serves task {name!r}; tasks with workers: {known}")
        return workers

    def get_indices(self, name: str) -> list[SampleIndex]:
        """The sample indices of task ``name`` (union over its workers, first-seen order)."""
        seen: dict[SampleIndex, None] = {}
        for worker in self.known_task(name):
            for index in worker.indices:
                seen.setdefault(index, None)
        return list(seen)

    def no_capacity(self, name: str, tried: set[str]) -> HttpError:
        """The 503 answer when no worker of ``name`` can take a session now."""
        workers = self.registry.workers_of(name)
        healthy = [w for w in workers if w.healthy]
        if not healthy:
            return HttpError(
                503,
                f"no healthy worker for task {name!r}: {len(workers)} registered, all missed their heartbeats",
                [(b"retry-after", b"5")],
            )
        used = sum(len(w.sessions) for w in healthy)
        capacity = sum(w.concurrency for w in healthy)
        return HttpError(
            503,
            f"all {len(healthy)} workers of task {name!r} are at capacity ({used}/{capacity} sessions"
            f"{', some answered 406 (full)' if tried else ''}); retry later or add workers",
            [(b"retry-after", b"1")],
        )

    def check(self, now: float) -> None:
        """Mark workers that missed their heartbeats as lost; forget long-silent ones."""
        for worker in self.registry.overdue(now, self.config.heartbeat_timeout_s):
            self.lost(
                worker,
                f"no heartbeat for {now - worker.last_heartbeat:.1f}s "
                f"(heartbeat_timeout_s={self.config.heartbeat_timeout_s:g})",
            )
        for worker in self.registry.forget_silent(now, self.config.forget_worker_after_s):
            logger.info("forgot worker %s of task %r (silent)", worker.address, worker.name)
            self.publish(worker.name)
