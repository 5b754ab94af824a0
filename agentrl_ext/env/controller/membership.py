"""Which workers serve which task: heartbeats, reclaiming (re)joining workers, health checks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pydantic_core

from agentrl_ext.env.controller.config import ControllerConfig
from agentrl_ext.env.controller.metrics import ControllerMetrics
from agentrl_ext.env.controller.registry import WorkerRecord, WorkerRegistry, normalize_address
from agentrl_ext.env.controller.upstream import WorkerConnections, WorkerUnreachable
from agentrl_ext.env.protocol import (
    CAPACITY_HEADER,
    HEARTBEAT_INTERVAL_S,
    HeartbeatRequest,
    SampleIndex,
    WorkerInfo,
    error_detail,
)
from agentrl_ext.env.web import HttpError

logger = logging.getLogger(__name__)


REJOIN_RETRY_AFTER_S = 1
"""``Retry-After`` while workers may still re-register: each can be back at any moment."""


def _looks_like_worker_status(body: bytes) -> bool:
    """Whether ``body`` is a task worker's ``worker_status`` answer (``{"concurrency": n, "current": m}``)."""
    try:
        parsed = pydantic_core.from_json(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and all(
        isinstance(parsed.get(key), int) and not isinstance(parsed.get(key), bool)
        for key in ("concurrency", "current")
    )


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
        self._joining: dict[str, str] = {}  # address -> task, while cancel_all reclaims the worker
        self.started = time.monotonic()
        """When the controller started serving (the rejoin grace counts from here)."""

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
        if known is not None and known.name != beat.name and known.healthy:
            # A heartbeat is a claim, not a proof: it never ends another task's live worker.
            raise HttpError(
                409,
                f"address {address} is registered by a live worker of task {known.name!r}; a worker of task "
                f"{beat.name!r} can take it over only after that one misses its heartbeats for "
                f"heartbeat_timeout_s={self.config.heartbeat_timeout_s:g}; give each worker its own address",
            )
        if address in self._joining:
            return {"status": "joining"}
        self._joining[address] = beat.name
        try:
            await self._confirm_worker(address, beat.name)
            if known is not None and known.name != beat.name:
                self.lost(known, f"its address now serves task {beat.name!r}")
            await self._reclaim(address, beat.name)
        finally:
            del self._joining[address]
        record, _ = self.registry.heartbeat(beat, time.monotonic())
        record.routable = True
        logger.info("worker %s of task %r joined (concurrency %d)", address, beat.name, beat.concurrency)
        self.publish(record.name)
        return {"status": "ok"}

    async def _confirm_worker(self, address: str, name: str) -> None:
        """Ask the announced address for its ``worker_status`` (a read) before anything is sent to it.

        Only an address that answers like a task worker is reclaimed with ``cancel_all`` and
        routed to; anything else (nothing listening, another service, the controller itself) gets
        one 400 answer that does not say which it was (the log does), so that heartbeats cannot be
        used to probe what answers where.
        """
        problem: str | None = None
        try:
            status, body = await self.upstream.request(
                "GET", address, "/worker_status", None, self.config.worker_connect_timeout_s
            )
        except WorkerUnreachable as exc:
            problem = str(exc)
        else:
            if status != 200 or not _looks_like_worker_status(body):
                problem = f"GET worker_status answered HTTP {status}: {error_detail(body, 120)}"
        if problem is not None:
            logger.warning("refused the heartbeat of task %r for %s: %s", name, address, problem)
            raise HttpError(
                400,
                f"the controller could not confirm a task worker of {name!r} at the address this heartbeat "
                "announces (it asks GET <address>/worker_status; the controller's log says why); announce "
                "the address the controller reaches this worker at (agentrl-worker: --self, "
                "agentrl-task-worker: --self-address)",
            )

    async def _reclaim(self, address: str, name: str) -> None:
        """End what a (re)joining, confirmed worker still runs for this controller: ``cancel_all``
        when this controller is the only one; with several shards, only this shard's sessions
        (``get_sessions``, then ``cancel`` those whose id is this shard's), since the others'
        sessions on the same worker are alive."""
        try:
            if self.config.shards == 1:
                status, body = await self.upstream.request(
                    "POST", address, "/cancel_all", b"{}", self.config.cancel_grace_s
                )
            else:
                status, body = await self._cancel_own_sessions(address)
        except WorkerUnreachable as exc:
            logger.warning("reclaiming joining worker %s of task %r failed: %s", address, name, exc)
            raise HttpError(
                503,
                f"the controller could not reclaim the sessions of this worker of task {name!r}; "
                "it will try again at the next heartbeat",
            ) from None
        if status != 200:
            logger.warning(
                "worker %s answered its reclaim with HTTP %d: %s", address, status, error_detail(body)
            )

    async def _cancel_own_sessions(self, address: str) -> tuple[int, bytes]:
        status, body = await self.upstream.request(
            "GET", address, "/get_sessions", None, self.config.worker_connect_timeout_s
        )
        if status != 200:
            return status, body
        listed = pydantic_core.from_json(body)
        mine = [
            int(sid)
            for sid in (listed if isinstance(listed, (dict, list)) else ())
            if str(sid).isdigit() and int(sid) % self.config.shards == self.config.shard
        ]
        for session_id in mine:
            status, body = await self.upstream.request(
                "POST",
                address,
                "/cancel",
                pydantic_core.to_json({"session_id": session_id}),
                self.config.cancel_grace_s,
            )
        return 200, b""

    def lost(self, worker: WorkerRecord, reason: str) -> None:
        """Mark a worker unhealthy, end its sessions with ``task error`` and abort the calls in flight
        to it (their clients get the same ``task error`` and reason now, not at a timeout)."""
        if not worker.healthy:
            return
        worker.healthy = False
        worker.routable = False
        logger.warning("worker %s of task %r is unhealthy: %s", worker.address, worker.name, reason)
        why = f"worker {worker.address} of task {worker.name!r} was lost: {reason}"
        self._end_sessions(worker, why)
        aborted = self.upstream.abort(worker.address, why)
        if aborted:
            logger.warning("aborted %d call(s) in flight to lost worker %s", aborted, worker.address)
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
        """The workers of task ``name``; without any: 503 while workers may still (re)join, else 404."""
        workers = self.registry.workers_of(name)
        if workers:
            return workers
        if name in self._joining.values():
            raise HttpError(
                503,
                f"the worker of task {name!r} is joining (the controller is reclaiming its old sessions); retry in a second",
                {"retry-after": "1"},
            )
        waited = time.monotonic() - self.started
        if waited < self.config.rejoin_grace_s:
            # Each worker's next heartbeat may come at any moment of its interval (8 s), so a
            # worker can be back any second now: ask for a retry in one, not at the grace's end.
            raise HttpError(
                503,
                f"no worker serves task {name!r} yet: the controller started {waited:.1f}s ago and workers "
                f"re-register with their next heartbeat (every {HEARTBEAT_INTERVAL_S:g}s; rejoin_grace_s="
                f"{self.config.rejoin_grace_s:g}); retry in {REJOIN_RETRY_AFTER_S}s",
                {"retry-after": str(REJOIN_RETRY_AFTER_S)},
            )
        tasks = self.registry.tasks()
        known = ", ".join(repr(t) for t in tasks) if tasks else "none (no worker has sent a heartbeat yet)"
        raise HttpError(404, f"no worker serves task {name!r}; tasks with workers: {known}")

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
                {"retry-after": "5"},
            )
        used = sum(len(w.sessions) for w in healthy)
        capacity = sum(w.concurrency for w in healthy)
        return HttpError(
            503,
            f"all {len(healthy)} workers of task {name!r} are at capacity ({used}/{capacity} sessions"
            f"{', some answered 406 (full)' if tried else ''}); retry later or add workers",
            {"retry-after": "1", CAPACITY_HEADER: "full"},
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
