"""The controller's session table: open sessions in idle order, and recently ended ones."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

from agentrl_ext.env.controller.registry import WorkerRecord
from agentrl_ext.env.protocol import SampleIndex, SampleStatus, SessionInfo

SESSION_ID_BITS = 63
"""Random bits in a session id: every id is a positive signed 64-bit integer."""


@dataclass(slots=True, eq=False)
class OpenSession:
    """A running session and the worker that holds it."""

    session_id: int
    name: str
    index: SampleIndex
    worker: WorkerRecord
    started_at: float
    last_active: float
    busy: bool = False

    def info(self, now: float) -> SessionInfo:
        """The ``list_sessions`` view of this session."""
        return SessionInfo(
            session_id=self.session_id,
            name=self.name,
            index=self.index,
            worker=self.worker.address,
            age_s=round(now - self.started_at, 3),
            idle_s=round(now - self.last_active, 3),
            busy=self.busy,
        )


class EndedSession(NamedTuple):
    """The final word on a session that is no longer open.

    ``reported`` is false when the controller ended the session on its own (worker lost, idle
    expiry): the client has not seen the final status yet and learns it at its next call.
    A tuple of plain values on purpose: the garbage collector stops tracking such tuples, so
    tens of thousands of remembered sessions add nothing to its pauses.
    """

    name: str
    status_value: str
    reason: str | None
    reported: bool
    ended_at: float

    @property
    def status(self) -> SampleStatus:
        """The final status."""
        return SampleStatus(self.status_value)


class SessionTable:
    """Open sessions ordered by last activity (oldest first), so expiry is O(expired)."""

    def __init__(self, max_unreported: int, max_reported: int, shard: int = 0, shards: int = 1) -> None:
        self.open: OrderedDict[int, OpenSession] = OrderedDict()
        # Two bounded records, so that the many normally finished sessions never push out the
        # few whose final status a client has yet to learn (and the GC has less to walk).
        self.unreported: OrderedDict[int, EndedSession] = OrderedDict()
        self.reported: OrderedDict[int, EndedSession] = OrderedDict()
        self._max_unreported = max_unreported
        self._max_reported = max_reported
        self._shard, self._shards = shard, shards

    def new_id(self) -> int:
        """A fresh, unguessable session id: 63 random bits (a positive int64, what AgentRL's
        clients parse with ``int()``), never one that is open or remembered. With several
        controller shards the id is also ``shard`` modulo ``shards`` (its lowest bits then carry
        the shard: log2(shards) bits less to guess).

        Knowing one's own ids tells nothing about another client's (ids used to be consecutive,
        so any client could interact with or cancel the next one's session); and an id from
        before a controller restart names no new session (a chance of 2**-63 per pair).
        """
        while True:
            session_id = secrets.randbits(SESSION_ID_BITS)
            session_id += self._shard - session_id % self._shards
            if (
                0 < session_id < 2**SESSION_ID_BITS
                and session_id not in self.open
                and self.ended(session_id) is None
            ):
                return session_id

    def add(self, session: OpenSession) -> None:
        """Register an open session."""
        self.open[session.session_id] = session

    def touch(self, session: OpenSession, now: float) -> None:
        """Mark activity: the session moves to the young end of the idle order."""
        session.last_active = now
        self.open.move_to_end(session.session_id)

    def end(
        self, session_id: int, status: SampleStatus, reason: str | None, reported: bool, now: float
    ) -> OpenSession | None:
        """Close a session; remembers its final status. Returns it if it was open."""
        session = self.open.pop(session_id, None)
        if session is None:
            return None
        session.worker.sessions.discard(session_id)
        self._remember(session_id, EndedSession(session.name, status.value, reason, reported, now))
        return session

    def _remember(self, session_id: int, ended: EndedSession) -> None:
        if ended.reported:
            record, limit = self.reported, self._max_reported
        else:
            record, limit = self.unreported, self._max_unreported
        record[session_id] = ended
        while len(record) > limit:
            record.popitem(last=False)

    def ended(self, session_id: int) -> EndedSession | None:
        """The final status of a recently ended session, or None."""
        return self.unreported.get(session_id) or self.reported.get(session_id)

    def mark_reported(self, session_id: int) -> None:
        """The client has now seen the final status of ``session_id``."""
        ended = self.unreported.pop(session_id, None)
        if ended is not None:
            self._remember(session_id, ended._replace(reported=True))

    def idle_since(self, cutoff: float) -> list[OpenSession]:
        """Open sessions idle since before ``cutoff``; busy ones (a step in flight) are skipped."""
        found: list[OpenSession] = []
        busy: list[OpenSession] = []
        for session in self.open.values():
            if session.last_active >= cutoff:
                break
            (busy if session.busy else found).append(session)
        for session in busy:
            self.open.move_to_end(session.session_id)
        return found

    def forget_ended(self, cutoff: float) -> None:
        """Drop final statuses of sessions that ended before ``cutoff``."""
        for record in (self.unreported, self.reported):
            while record:
                session_id, ended = next(iter(record.items()))
                if ended.ended_at >= cutoff:
                    break
                del record[session_id]
