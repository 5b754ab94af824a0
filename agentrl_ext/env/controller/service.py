"""What the controller does for each request: routing, forwarding, health, expiry.

State lives in memory only. A controller restart loses every open session and every worker
registration: workers re-register with their next heartbeat (within 8 s for AgentRL workers),
and the controller then sends them ``cancel_all`` to reclaim sessions orphaned by the restart;
until then (``rejoin_grace_s``) calls naming a task without workers get 503 with ``Retry-After``,
which clients retry. Clients holding a session id from before the restart get 404 "unknown
session" (ids are 63 random bits, so an old id names no new session) and start a
new sample.

Calls forwarded to a worker end when it answers, after ``worker_request_timeout_s``, or as soon
as the worker is declared lost; the last two end the session with ``task error`` and the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import pydantic
import pydantic_core

from agentrl_ext.env.auth import bearer
from agentrl_ext.env.controller.config import ControllerConfig
from agentrl_ext.env.controller.membership import WorkerMembership
from agentrl_ext.env.controller.metrics import ControllerMetrics
from agentrl_ext.env.controller.registry import WorkerRecord, WorkerRegistry
from agentrl_ext.env.controller.sessions import EndedSession, OpenSession, SessionTable
from agentrl_ext.env.controller.upstream import WorkerConnections, WorkerUnreachable
from agentrl_ext.env.protocol import (
    CUSTOM_TASK_INDEX,
    CancelResponse,
    EnvOutput,
    HeartbeatRequest,
    InteractRequest,
    InteractResponse,
    SampleIndex,
    SampleStatus,
    SessionInfo,
    StartSampleRequest,
    WorkerInfo,
    WorkerInteractResponse,
    error_detail,
)
from agentrl_ext.env.web import HttpError, describe_validation_error

logger = logging.getLogger(__name__)

_MAX_PARALLEL_BACKGROUND_CANCELS = 64


def _describe_indices(indices: list[SampleIndex]) -> str:
    if not indices:
        return "none"
    if len(indices) <= 6:
        return ", ".join(repr(i) for i in indices)
    return f"{indices[0]!r}, {indices[1]!r}, ..., {indices[-1]!r} ({len(indices)} in all)"


def _all_refused(request: StartSampleRequest, refusals: list[HttpError]) -> HttpError:
    """Every worker of the task refused the start: their status if all said the same 4xx, else 502."""
    statuses = {r.status for r in refusals}
    status = statuses.pop() if len(statuses) == 1 else 502
    shown = "; ".join(r.detail for r in refusals[:3])
    more = f" (and {len(refusals) - 3} more)" if len(refusals) > 3 else ""
    return HttpError(
        status,
        f"every worker of task {request.name!r} that was tried refused start_sample: {shown}{more}",
    )


class ControllerService:
    """The controller's state and request logic, independent of the HTTP layer."""

    def __init__(self, config: ControllerConfig | None = None, worker_secret: str | None = None) -> None:
        self.config = config or ControllerConfig()
        self.sessions = SessionTable(
            self.config.max_unreported_sessions,
            self.config.max_reported_sessions,
            self.config.shard,
            self.config.shards,
        )
        self.metrics = ControllerMetrics()
        self.upstream = WorkerConnections(
            self.config.max_connections_per_worker,
            self.config.keepalive_timeout_s,
            self.config.worker_connect_timeout_s,
            headers=bearer(worker_secret),
        )
        self.workers = WorkerMembership(self.config, self.upstream, self.metrics, self._end_sessions_of)
        self.started_at = time.time()
        self._background: set[asyncio.Task[Any]] = set()
        self._cancel_slots: asyncio.Semaphore | None = None
        self._maintenance: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the health/expiry loop (call from inside the server's event loop)."""
        self.workers.started = time.monotonic()
        self._cancel_slots = asyncio.Semaphore(_MAX_PARALLEL_BACKGROUND_CANCELS)
        self._maintenance = asyncio.create_task(self._maintenance_loop())

    async def stop(self) -> None:
        """Stop background work and close worker connections."""
        tasks = [t for t in (self._maintenance, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.upstream.close()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @property
    def registry(self) -> WorkerRegistry:
        """All known workers."""
        return self.workers.registry

    async def receive_heartbeat(self, beat: HeartbeatRequest) -> dict[str, Any]:
        """See :meth:`WorkerMembership.receive_heartbeat`."""
        return await self.workers.receive_heartbeat(beat)

    def list_workers(self) -> dict[str, list[WorkerInfo]]:
        """Workers grouped by task."""
        return self.workers.list_workers()

    def get_indices(self, name: str) -> list[SampleIndex]:
        """The sample indices of task ``name``."""
        return self.workers.get_indices(name)

    # ------------------------------------------------------------------ sessions

    def _end_sessions_of(self, worker: WorkerRecord, reason: str) -> None:
        """End every session of a lost worker with ``task error``; the clients learn it next call."""
        now = time.monotonic()
        for session_id in list(worker.sessions):
            self._end(session_id, SampleStatus.TASK_ERROR, reason, reported=False, now=now)
        worker.sessions.clear()

    def _end(
        self, session_id: int, status: SampleStatus, reason: str | None, reported: bool, now: float
    ) -> OpenSession | None:
        session = self.sessions.end(session_id, status, reason, reported, now)
        if session is not None:
            session.worker.full_until = 0.0
            self.metrics.session_finished(session.name, status)
        return session

    def _check_index(self, request: StartSampleRequest, workers: list[WorkerRecord]) -> None:
        if request.index == CUSTOM_TASK_INDEX:
            if request.custom_task is None:
                raise HttpError(422, "index -1 starts a custom task and needs a 'custom_task' object")
            return
        advertised = [w for w in workers if w.indices]
        if advertised and not any(request.index in w.index_set for w in advertised):
            raise HttpError(
                400,
                f"index {request.index!r} is not an index of task {request.name!r} "
                f"(indices: {_describe_indices(advertised[0].indices)}); see GET get_indices?name={request.name}",
            )

    async def start_sample(self, request: StartSampleRequest) -> tuple[int, InteractResponse]:
        """Start a session on the healthy worker with the most free slots.

        A worker that is full (406), unreachable, refuses (any other error status) or answers
        with a malformed body does not end the attempt: the next worker is tried, so one bad
        worker never blocks a task. Only when every worker refused is the refusal passed on.
        """
        started = time.perf_counter()
        self._check_index(request, self.workers.known_task(request.name))
        tried: set[str] = set()
        refusals: list[HttpError] = []
        worker_s = 0.0
        try:
            while True:
                worker = self.workers.registry.pick(request.name, time.monotonic(), tried)
                if worker is None:
                    if refusals:
                        raise _all_refused(request, refusals)
                    raise self.workers.no_capacity(request.name, tried)
                tried.add(worker.address)
                t0 = time.perf_counter()
                try:
                    opened = await self._start_on(worker, request)
                finally:
                    worker_s += time.perf_counter() - t0
                if isinstance(opened, HttpError):
                    refusals.append(opened)
                    self.metrics.start_retry(request.name, "refused")
                elif opened is not None:
                    return opened
        finally:
            self.metrics.observe("start_sample", time.perf_counter() - started, worker_s)

    async def _start_on(
        self, worker: WorkerRecord, request: StartSampleRequest
    ) -> tuple[int, InteractResponse] | HttpError | None:
        """One start attempt on ``worker``; None (full, unreachable) or an HttpError (refused): try the next."""
        session_id = self.sessions.new_id()
        worker.sessions.add(session_id)  # reserve the slot while the worker starts the sample
        payload = pydantic_core.to_json(
            {"index": request.index, "custom_task": request.custom_task, "session_id": session_id}
        )
        try:
            status, body = await self.upstream.request(
                "POST", worker.address, "/start_sample", payload, self.config.worker_request_timeout_s
            )
        except WorkerUnreachable as exc:
            worker.sessions.discard(session_id)
            if exc.before_request:
                self.workers.lost(worker, str(exc))
                self.metrics.start_retry(request.name, "unreachable")
                return None
            # The worker may have started the sample: the session exists and ends at once.
            self._spawn(self._cancel_on_worker(worker, session_id))
            return session_id, self._failed_start(request, worker, session_id, str(exc))
        if status == 406:
            worker.sessions.discard(session_id)
            worker.full_until = time.monotonic() + self.config.full_backoff_s
            self.metrics.start_retry(request.name, "full")
            return None
        if status != 200:
            worker.sessions.discard(session_id)
            logger.info("worker %s refused start_sample of %r: HTTP %d", worker.address, request.name, status)
            return HttpError(
                status if 400 <= status < 500 else 502,
                f"worker {worker.address} refused start_sample for task {request.name!r} index "
                f"{request.index!r}: HTTP {status}: {error_detail(body, 300)[:300]}",
            )
        return self._opened(request, worker, session_id, body)

    def _failed_start(
        self, request: StartSampleRequest, worker: WorkerRecord, session_id: int, reason: str
    ) -> InteractResponse:
        """A session whose start never answered (worker lost, or no answer in time): ``task error``."""
        now = time.monotonic()
        self.sessions.add(OpenSession(session_id, request.name, request.index, worker, now, now))
        self.metrics.session_started(request.name)
        self._end(session_id, SampleStatus.TASK_ERROR, reason, reported=True, now=now)
        return InteractResponse(finish=True, status=SampleStatus.TASK_ERROR, error=reason)

    def _opened(
        self, request: StartSampleRequest, worker: WorkerRecord, session_id: int, body: bytes
    ) -> tuple[int, InteractResponse] | HttpError:
        try:
            answer = EnvOutput.model_validate_json(body).to_interact_response()
        except pydantic.ValidationError as exc:
            worker.sessions.discard(session_id)
            self._spawn(self._cancel_on_worker(worker, session_id))
            return HttpError(
                502,
                f"worker {worker.address} answered start_sample with a malformed body: "
                f"{describe_validation_error(exc, 'its answer')[1]}",
            )
        now = time.monotonic()
        if not worker.healthy:  # declared lost while the sample was starting
            reason = f"worker {worker.address} of task {request.name!r} was lost while starting the sample"
            return session_id, self._failed_start(request, worker, session_id, reason)
        self.sessions.add(OpenSession(session_id, request.name, request.index, worker, now, now))
        self.metrics.session_started(request.name)
        if answer.finish:
            self._end(session_id, answer.status, answer.error, reported=True, now=now)
        return session_id, answer

    def _ended_answer(self, session_id: int, endpoint: str) -> InteractResponse:
        """Answer for a session that is not open: its final status once, else 404/409."""
        ended: EndedSession | None = self.sessions.ended(session_id)
        if ended is None:
            raise self._unknown_session(session_id)
        if ended.reported:
            raise HttpError(
                409,
                f"session {session_id} already finished with status {ended.status.value!r}; {endpoint} needs a running session",
            )
        self.sessions.mark_reported(session_id)
        return InteractResponse(finish=True, status=ended.status, error=ended.reason)

    def check_known(self, session_id: int) -> None:
        """404 (closing the connection: the request body is left unread) for a session that is
        neither open nor remembered as ended."""
        if session_id not in self.sessions.open and self.sessions.ended(session_id) is None:
            error = self._unknown_session(session_id)
            error.headers = {"connection": "close"}
            raise error

    def _unknown_session(self, session_id: int) -> HttpError:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at))
        return HttpError(
            404,
            f"unknown session_id {session_id}: never started on this controller, or ended more than "
            f"{self.config.ended_session_ttl_s:.0f}s ago; the controller keeps sessions in memory only, so "
            f"sessions from before its start at {started} are gone: start a new sample",
        )

    async def interact(self, session_id: int, request: InteractRequest) -> InteractResponse:
        """Forward one agent step to the session's worker and relay the environment's answer."""
        started = time.perf_counter()
        worker_s: float | None = None
        try:
            session = self.sessions.open.get(session_id)
            if session is None:
                return self._ended_answer(session_id, "interact")
            if session.busy:
                raise HttpError(
                    409,
                    f"session {session_id} is busy: its previous interact has not returned yet; send one step at a time",
                )
            worker = session.worker
            session.busy = True
            self.sessions.touch(session, time.monotonic())
            payload = pydantic_core.to_json({"session_id": session_id, "messages": request.messages})
            t0 = time.perf_counter()
            try:
                status, body = await self.upstream.request(
                    "POST", worker.address, "/interact", payload, self.config.worker_request_timeout_s
                )
            except WorkerUnreachable as exc:
                if exc.before_request:
                    self.workers.lost(worker, str(exc))
                else:
                    self._end(
                        session_id, SampleStatus.TASK_ERROR, str(exc), reported=False, now=time.monotonic()
                    )
                    self._spawn(self._cancel_on_worker(worker, session_id))
                return self._ended_answer(session_id, "interact")
            finally:
                worker_s = time.perf_counter() - t0
                session.busy = False
                if session_id in self.sessions.open:
                    self.sessions.touch(session, time.monotonic())
            return self._relay(session, status, body)
        finally:
            self.metrics.observe("interact", time.perf_counter() - started, worker_s)

    def _relay(self, session: OpenSession, status: int, body: bytes) -> InteractResponse:
        worker = session.worker
        session_id = session.session_id
        if status == 200:
            try:
                answer = WorkerInteractResponse.model_validate_json(body).env_out.to_interact_response()
            except pydantic.ValidationError as exc:
                raise HttpError(
                    502, f"worker {worker.address} answered interact with a malformed body: {exc}"
                ) from None
            if answer.finish:
                self._end(session_id, answer.status, answer.error, reported=True, now=time.monotonic())
            return answer
        detail = error_detail(body)
        if status == 404 or (status == 400 and "no such session" in detail.lower()):
            # The worker restarted (or expired the session itself): the session is gone.
            reason = f"worker {worker.address} no longer holds session {session_id}: {detail}"
            self._end(session_id, SampleStatus.TASK_ERROR, reason, reported=True, now=time.monotonic())
            return InteractResponse(finish=True, status=SampleStatus.TASK_ERROR, error=reason)
        raise HttpError(
            status if 400 <= status < 500 else 502,
            f"worker {worker.address} rejected interact for session {session_id}: HTTP {status}: {detail}",
        )

    async def cancel(self, session_id: int) -> CancelResponse:
        """Cancel a session on its worker; cancelling an ended session reports its final status."""
        started = time.perf_counter()
        worker_s: float | None = None
        try:
            session = self.sessions.open.get(session_id)
            if session is None:
                ended = self.sessions.ended(session_id)
                if ended is None:
                    raise self._unknown_session(session_id)
                self.sessions.mark_reported(session_id)
                return CancelResponse(session_id=session_id, status=ended.status)
            t0 = time.perf_counter()
            await self._cancel_on_worker(session.worker, session_id)
            worker_s = time.perf_counter() - t0
            ended_session = self._end(
                session_id, SampleStatus.CANCELLED, "cancelled by the client", True, time.monotonic()
            )
            if ended_session is None:  # an interact in flight ended it first
                final = self.sessions.ended(session_id)
                return CancelResponse(
                    session_id=session_id, status=final.status if final else SampleStatus.CANCELLED
                )
            return CancelResponse(session_id=session_id, status=SampleStatus.CANCELLED)
        finally:
            self.metrics.observe("cancel", time.perf_counter() - started, worker_s)

    async def _cancel_on_worker(self, worker: WorkerRecord, session_id: int) -> None:
        """Best-effort ``cancel`` on the worker; failures are logged, never raised.

        A lost worker is not called (it would hold a slot for ``cancel_grace_s``): it gets
        ``cancel_all`` when it rejoins.
        """
        assert self._cancel_slots is not None
        if not worker.healthy:
            return
        async with self._cancel_slots:
            try:
                status, body = await self.upstream.request(
                    "POST",
                    worker.address,
                    "/cancel",
                    pydantic_core.to_json({"session_id": session_id}),
                    self.config.cancel_grace_s,
                )
            except WorkerUnreachable as exc:
                logger.info("cancel of session %d not delivered: %s", session_id, exc)
                return
        if status != 200:
            logger.debug(
                "worker %s answered cancel %d with HTTP %d: %s",
                worker.address,
                session_id,
                status,
                error_detail(body),
            )

    def list_sessions(self, name: str | None) -> list[SessionInfo]:
        """Open sessions, optionally of one task."""
        now = time.monotonic()
        return [s.info(now) for s in self.sessions.open.values() if name is None or s.name == name]

    async def calculate_overall(self, name: str, body: bytes) -> tuple[int, bytes]:
        """Forward ``calculate_overall`` to a healthy worker of the task (body passed through)."""
        workers = [w for w in self.workers.known_task(name) if w.healthy]
        if not workers:
            raise HttpError(503, f"no healthy worker for task {name!r} to calculate_overall")
        try:
            status, answer = await self.upstream.request(
                "POST", workers[0].address, "/calculate_overall", body, self.config.worker_request_timeout_s
            )
        except WorkerUnreachable as exc:
            raise HttpError(502, f"calculate_overall for task {name!r} failed: {exc}") from None
        if status != 200:
            raise HttpError(
                status if 400 <= status < 500 else 502,
                f"worker {workers[0].address}: {error_detail(answer)}",
            )
        return status, answer

    # ------------------------------------------------------------------ maintenance

    async def _maintenance_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval_s)
            try:
                self.check_once()
            except Exception:  # keep the loop alive whatever happens
                logger.exception("controller maintenance failed")

    def check_once(self) -> None:
        """One round of health checks, idle expiry and forgetting old records."""
        now = time.monotonic()
        self.workers.check(now)
        for session in self.sessions.idle_since(now - self.config.idle_timeout_s):
            reason = (
                f"session idle for {now - session.last_active:.0f}s, longer than "
                f"idle_timeout_s={self.config.idle_timeout_s:g}; it was cancelled"
            )
            self._end(session.session_id, SampleStatus.CANCELLED, reason, reported=False, now=now)
            self.metrics.session_expired(session.name)
            self._spawn(self._cancel_on_worker(session.worker, session.session_id))
        self.sessions.forget_ended(now - self.config.ended_session_ttl_s)
