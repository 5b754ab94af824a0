"""Task workers known to the controller: heartbeats, health and routing by free capacity."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from agentrl_ext.env.protocol import HeartbeatRequest, SampleIndex, WorkerInfo

logger = logging.getLogger(__name__)


def normalize_address(address: str) -> str:
    """Worker base URLs are compared without a trailing slash."""
    return address.rstrip("/")


@dataclass(eq=False)
class WorkerRecord:
    """One task worker, as learned from its heartbeats.

    ``routable`` is false while the worker is unhealthy, and for a record created by
    :meth:`WorkerRegistry.heartbeat` until the caller has reclaimed the worker's old sessions.
    """

    address: str
    name: str
    concurrency: int
    indices: list[SampleIndex]
    last_heartbeat: float
    healthy: bool = True
    routable: bool = False
    sessions: set[int] = field(default_factory=set)
    full_until: float = 0.0
    index_set: frozenset[SampleIndex] = frozenset()
    split: str | None = None

    def __post_init__(self) -> None:
        self.index_set = frozenset(self.indices)

    @property
    def free(self) -> int:
        """Free session slots, by the controller's own count."""
        return self.concurrency - len(self.sessions)

    def info(self, now: float) -> WorkerInfo:
        """The ``list_workers`` view of this worker."""
        return WorkerInfo(
            name=self.name,
            address=self.address,
            concurrency=self.concurrency,
            open_sessions=len(self.sessions),
            healthy=self.healthy,
            routable=self.routable,
            last_heartbeat_age_s=round(now - self.last_heartbeat, 3),
            num_indices=len(self.indices),
            split=self.split,
        )


class WorkerRegistry:
    """All workers by address and by task name."""

    def __init__(self) -> None:
        self.by_address: dict[str, WorkerRecord] = {}

    def heartbeat(self, beat: HeartbeatRequest, now: float) -> tuple[WorkerRecord, bool]:
        """Record a heartbeat; returns the worker and whether it (re)joined just now.

        A worker (re)joins when its address was unknown, was unhealthy, or now serves another
        task. Such a worker may still run sessions the controller no longer knows (controller
        restart, sessions ended while it was unreachable): the caller reclaims them with
        ``cancel_all`` before making the worker routable.
        """
        assert beat.address is not None
        address = normalize_address(beat.address)
        record = self.by_address.get(address)
        if record is None or record.name != beat.name:
            record = WorkerRecord(
                address=address,
                name=beat.name,
                concurrency=beat.concurrency,
                indices=list(beat.indices),
                last_heartbeat=now,
                split=beat.split,
            )
            self.by_address[address] = record
            logger.info("worker %s joined for task %r (concurrency %d)", address, beat.name, beat.concurrency)
            return record, True
        record.last_heartbeat = now
        record.split = beat.split
        if record.concurrency != beat.concurrency:
            record.concurrency = beat.concurrency
        if len(beat.indices) != len(record.indices) or beat.indices != record.indices:
            record.indices = list(beat.indices)
            record.index_set = frozenset(record.indices)
        if not record.healthy:
            record.healthy = True
            logger.info("worker %s of task %r is healthy again", address, record.name)
            return record, True
        return record, False

    def workers_of(self, name: str) -> list[WorkerRecord]:
        """Every worker (healthy or not) registered for task ``name``."""
        return [w for w in self.by_address.values() if w.name == name]

    def tasks(self) -> list[str]:
        """Names of all tasks with at least one registered worker."""
        return sorted({w.name for w in self.by_address.values()})

    def pick(self, name: str, now: float, exclude: set[str]) -> WorkerRecord | None:
        """The routable worker of ``name`` with the most free slots (None when all are full)."""
        best: WorkerRecord | None = None
        for worker in self.by_address.values():
            if (
                worker.name != name
                or not worker.routable
                or worker.address in exclude
                or worker.full_until > now
                or worker.free <= 0
            ):
                continue
            if best is None or worker.free > best.free:
                best = worker
        return best

    def overdue(self, now: float, timeout_s: float) -> list[WorkerRecord]:
        """Healthy workers whose last heartbeat is older than ``timeout_s``."""
        return [w for w in self.by_address.values() if w.healthy and now - w.last_heartbeat > timeout_s]

    def forget_silent(self, now: float, after_s: float) -> list[WorkerRecord]:
        """Drop unhealthy workers silent for ``after_s``; returns them."""
        gone = [w for w in self.by_address.values() if not w.healthy and now - w.last_heartbeat > after_s]
        for worker in gone:
            del self.by_address[worker.address]
        return gone
