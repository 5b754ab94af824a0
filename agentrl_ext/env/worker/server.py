"""``TaskWorker``: serves one :class:`Task` over the AgentRL worker API and heartbeats to a controller.

Every failure becomes a protocol status, never a crashed worker: an invalid agent step ends the
session with ``agent validation failed`` / ``agent invalid action``, a task exception or a step
over ``step_time_limit_s`` with ``task error`` (and the message in ``error``), a sample over
``session_time_limit_s`` with ``task limit reached``. ``start_sample`` answers 406 when the worker
already runs ``concurrency`` sessions, so the controller tries another worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.middleware import Middleware

from agentrl_ext.env.auth import BearerAuth, bearer
from agentrl_ext.env.protocol import (
    API_PREFIX,
    CUSTOM_TASK_INDEX,
    HEARTBEAT_INTERVAL_S,
    SESSION_ID_HEADER,
    CalculateOverallRequest,
    EnvOutput,
    SampleStatus,
    SessionRef,
    WorkerInteractRequest,
    WorkerStartSampleRequest,
    WorkerStatus,
)
from agentrl_ext.env.web import HttpError, Request, Response, json_app, json_response, parse_json, read_body
from agentrl_ext.env.worker.actions import InvalidAction
from agentrl_ext.env.worker.task import SampleResult, Session, Task, TurnOutput

logger = logging.getLogger(__name__)

_MAX_UNREPORTED = 10_000


@dataclass(eq=False)
class _Running:
    """A session with the asyncio task that plays it."""

    session: Session
    started_at: float
    task: asyncio.Task[None] | None = None
    stop_status: SampleStatus | None = None
    stop_reason: str | None = None

    def stop(self, status: SampleStatus, reason: str) -> None:
        if self.stop_status is None:
            self.stop_status, self.stop_reason = status, reason
        if self.task is not None:
            self.task.cancel()


def _env_output(out: TurnOutput) -> EnvOutput:
    return EnvOutput(
        messages=out.messages,
        tools=out.tools,
        status=out.status,
        finish=out.status.finished,
        reward=out.reward,
        metric=out.metrics,
        error=out.error,
    )


class TaskWorker:
    """Hosts one task: its sessions, the worker HTTP API and the heartbeat to the controller.

    Args:
        task: the environment.
        controller_address: controller API base, e.g. ``http://127.0.0.1:5020/api``, or several
            (the controller shards of one fleet: heartbeats go to each); None runs the worker
            stand-alone (no heartbeats).
        self_address: this worker's API base as the controller should reach it, e.g.
            ``http://127.0.0.1:5021/api``; required with a controller.
        concurrency: session limit (default: ``task.concurrency``).
        heartbeat_interval_s: seconds between heartbeats (AgentRL: 8).
        cancel_grace_s: how long ``cancel`` waits for the task to finish its cleanup.
        split: the data split the task serves (``train``, ``test``, ...), sent with each
            heartbeat so that dataset builders can refuse a held-out split for training.
        secret: the worker secret (see :mod:`agentrl_ext.env.auth`): sent with every heartbeat,
            and required (``Authorization: Bearer``) on every call to this worker's API.
    """

    def __init__(
        self,
        task: Task,
        controller_address: str | Sequence[str] | None = None,
        self_address: str | None = None,
        concurrency: int | None = None,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        cancel_grace_s: float = 10.0,
        split: str | None = None,
        secret: str | None = None,
    ) -> None:
        if controller_address and not self_address:
            raise ValueError(
                f"TaskWorker for task {task.name!r} has a controller ({controller_address}) but no self_address; "
                "pass the URL the controller can reach this worker at, e.g. http://127.0.0.1:5021/api"
            )
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if heartbeat_interval_s <= 0:
            raise ValueError(f"heartbeat_interval_s must be positive, got {heartbeat_interval_s}")
        self.task = task
        addresses = [controller_address] if isinstance(controller_address, str) else controller_address or []
        self.controller_addresses = [address.rstrip("/") for address in addresses if address]
        self.self_address = self_address.rstrip("/") if self_address else None
        self.concurrency = concurrency or task.concurrency
        self.heartbeat_interval_s = heartbeat_interval_s
        self.cancel_grace_s = cancel_grace_s
        self.split = split
        self._secret = secret
        self.running: dict[int, _Running] = {}
        self.unreported: OrderedDict[int, TurnOutput] = OrderedDict()
        self._heartbeat: asyncio.Task[None] | None = None
        self.app = self._build_app()

    # ------------------------------------------------------------------ lifecycle

    async def startup(self) -> None:
        """Set up the task and start heartbeats (called by the ASGI lifespan)."""
        await self.task.setup()
        if self.controller_addresses:
            self._heartbeat = asyncio.create_task(self._heartbeat_loops())

    async def shutdown(self) -> None:
        """Cancel every session, stop heartbeats, tear the task down."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        await self._cancel_all("the worker is shutting down")
        await self.task.teardown()

    async def _heartbeat_loops(self) -> None:
        async with aiohttp.ClientSession(headers=bearer(self._secret)) as http:
            await asyncio.gather(
                *(self._heartbeat_loop(http, address) for address in self.controller_addresses)
            )

    async def _heartbeat_loop(self, http: aiohttp.ClientSession, controller_address: str) -> None:
        url = controller_address + "/receive_heartbeat"
        failures = 0
        while True:
            beat = {
                "name": self.task.name,
                "address": self.self_address,
                "concurrency": self.concurrency,
                "indices": list(self.task.get_indices()),
            }
            if self.split is not None:
                beat["split"] = self.split
            try:
                async with http.post(url, json=beat, timeout=aiohttp.ClientTimeout(total=10)) as response:
                    if response.status != 200:
                        raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:300]}")
                if failures:
                    logger.info("heartbeat to %s works again after %d failures", url, failures)
                failures = 0
            except Exception as exc:  # keep beating whatever happens
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    logger.warning("heartbeat to %s failed (%d in a row): %s", url, failures, exc)
            await asyncio.sleep(self.heartbeat_interval_s)

    # ------------------------------------------------------------------ sessions

    async def _play(self, running: _Running, index: Any, custom_task: dict[str, Any] | None) -> None:
        """Run the task's coroutine and turn however it ends into the session's final output."""
        session = running.session
        loop = asyncio.get_running_loop()
        limit = self.task.session_time_limit_s
        timer = (
            loop.call_later(
                limit,
                running.stop,
                SampleStatus.TASK_LIMIT_REACHED,
                f"the sample exceeded session_time_limit_s={limit:g}",
            )
            if limit
            else None
        )
        status, error = SampleStatus.TASK_ERROR, None
        try:
            if index == CUSTOM_TASK_INDEX:
                result = await self.task.start_custom_sample(custom_task or {}, session)
            else:
                result = await self.task.start_sample(index, session)
            status, error = self._check_result(result, session)
        except InvalidAction as exc:
            status, error = exc.status, exc.reason
        except asyncio.CancelledError:
            status = running.stop_status or SampleStatus.CANCELLED
            error = running.stop_reason or "cancelled"
        except Exception as exc:
            logger.exception("task %r failed in session %d (index %r)", self.task.name, session.id, index)
            status, error = SampleStatus.TASK_ERROR, f"{type(exc).__name__}: {exc}"
        finally:
            if timer is not None:
                timer.cancel()
            if self.running.get(session.id) is running:
                del self.running[session.id]
        final = session.output(status, error)
        if not session.hand_over(final) and status is not SampleStatus.CANCELLED:
            # Ended between turns (a time limit): keep the final word for the agent's next call.
            self.unreported[session.id] = final
            while len(self.unreported) > _MAX_UNREPORTED:
                self.unreported.popitem(last=False)

    def _check_result(self, result: Any, session: Session) -> tuple[SampleStatus, str | None]:
        if not isinstance(result, SampleResult):
            return SampleStatus.TASK_ERROR, (
                f"{type(self.task).__name__}.start_sample returned {type(result).__name__}; it must return a SampleResult"
            )
        if not isinstance(result.status, SampleStatus) or result.status is SampleStatus.RUNNING:
            return (
                SampleStatus.TASK_ERROR,
                f"start_sample returned status {result.status!r}; a finished sample needs a final status",
            )
        if result.reward is not None:
            session.reward = float(result.reward)
        session.metrics.update(result.metrics)
        return result.status, result.error

    async def _next_turn(self, running: _Running, turn: asyncio.Future[TurnOutput]) -> TurnOutput:
        """Wait for the environment's turn, enforcing ``step_time_limit_s``."""
        limit = self.task.step_time_limit_s
        if limit is None:
            return await turn
        try:
            return await asyncio.wait_for(asyncio.shield(turn), limit)
        except asyncio.TimeoutError:
            running.stop(SampleStatus.TASK_ERROR, f"an environment step exceeded step_time_limit_s={limit:g}")
            return await turn

    async def start_sample(self, request: WorkerStartSampleRequest) -> Response:
        """Start a session; its first turn (opening messages and tools) is the answer."""
        if request.session_id in self.running:
            raise HttpError(400, f"session {request.session_id} already exists on this worker")
        if len(self.running) >= self.concurrency:
            raise HttpError(406, f"sample concurrency limit reached: {self.concurrency}")
        if request.index == CUSTOM_TASK_INDEX and not self.task.supports_custom_samples:
            raise HttpError(400, f"task {self.task.name!r} does not support custom samples (index -1)")
        session = Session(
            request.session_id, request.index, list(self.task.tools), self.task.validate_actions
        )
        turn = session.expect_turn()
        running = _Running(session, time.monotonic())
        running.task = asyncio.create_task(self._play(running, request.index, request.custom_task))
        self.running[request.session_id] = running
        out = await self._next_turn(running, turn)
        return json_response(_env_output(out), headers={SESSION_ID_HEADER: str(request.session_id)})

    async def interact(self, request: WorkerInteractRequest) -> Response:
        """Give the agent's step to its session and answer with the environment's next turn."""
        running = self.running.get(request.session_id)
        if running is None:
            final = self.unreported.pop(request.session_id, None)
            if final is not None:
                return json_response({"session_id": request.session_id, "env_out": _env_output(final)})
            raise HttpError(
                404,
                f"no such session {request.session_id} on this worker (finished, cancelled or never started)",
            )
        session = running.session
        if not session.waiting_for_agent:
            raise HttpError(
                409, f"session {request.session_id} is busy with the previous step; send one step at a time"
            )
        turn = session.expect_turn()
        session.deliver(request.messages)
        out = await self._next_turn(running, turn)
        return json_response({"session_id": request.session_id, "env_out": _env_output(out)})

    async def cancel(self, session_id: int, reason: str = "cancelled by the controller") -> bool:
        """Stop a session and wait (up to ``cancel_grace_s``) for its cleanup; False if unknown."""
        running = self.running.get(session_id)
        if running is None:
            return self.unreported.pop(session_id, None) is not None
        running.stop(SampleStatus.CANCELLED, reason)
        assert running.task is not None
        done, _ = await asyncio.wait({running.task}, timeout=self.cancel_grace_s)
        if not done:
            logger.warning(
                "session %d did not finish within %.0fs of its cancellation", session_id, self.cancel_grace_s
            )
            self.running.pop(session_id, None)
        return True

    async def _cancel_all(self, reason: str) -> int:
        ids = list(self.running)
        await asyncio.gather(*(self.cancel(session_id, reason) for session_id in ids))
        return len(ids)

    # ------------------------------------------------------------------ HTTP

    def _build_app(self) -> Starlette:
        async def body(request: Request, model: Any, what: str) -> Any:
            return parse_json(await read_body(request), model, what)

        async def start_sample(request: Request) -> Response:
            return await self.start_sample(await body(request, WorkerStartSampleRequest, "start_sample"))

        async def interact(request: Request) -> Response:
            return await self.interact(await body(request, WorkerInteractRequest, "interact"))

        async def cancel(request: Request) -> Response:
            ref = await body(request, SessionRef, "cancel")
            if not await self.cancel(ref.session_id):
                raise HttpError(404, f"no such session {ref.session_id} on this worker")
            return json_response({"session_id": ref.session_id})

        async def cancel_all(request: Request) -> Response:
            return json_response(
                {"cancelled": await self._cancel_all("cancelled by the controller (cancel_all)")}
            )

        async def worker_status(request: Request) -> Response:
            return json_response(WorkerStatus(concurrency=self.concurrency, current=len(self.running)))

        async def sample_status(request: Request) -> Response:
            ref = await body(request, SessionRef, "sample_status")
            running = self.running.get(ref.session_id)
            if running is None:
                raise HttpError(404, f"no such session {ref.session_id} on this worker")
            return json_response(
                {
                    "session_id": ref.session_id,
                    "index": running.session.index,
                    "status": {
                        "waiting_for_agent": running.session.waiting_for_agent,
                        "turns": running.session.turns,
                        "age_s": round(time.monotonic() - running.started_at, 3),
                    },
                }
            )

        async def get_sessions(request: Request) -> Response:
            return json_response({str(sid): r.session.index for sid, r in self.running.items()})

        async def get_indices(request: Request) -> Response:
            return json_response(list(self.task.get_indices()))

        async def calculate_overall(request: Request) -> Response:
            overall = await body(request, CalculateOverallRequest, "calculate_overall")
            return json_response(self.task.calculate_overall(overall.results))

        routes = [  # matched in this order: the calls of every session first
            ("POST", "/interact", interact),
            ("POST", "/start_sample", start_sample),
            ("POST", "/cancel", cancel),
            ("POST", "/cancel_all", cancel_all),
            ("GET", "/worker_status", worker_status),
            ("POST", "/sample_status", sample_status),
            ("GET", "/get_sessions", get_sessions),
            ("GET", "/get_indices", get_indices),
            ("POST", "/calculate_overall", calculate_overall),
        ]
        return json_app(
            f"task worker {self.task.name!r}",
            [(method, API_PREFIX + path, handler) for method, path, handler in routes],
            on_startup=[self.startup],
            on_shutdown=[self.shutdown],
            middleware=[Middleware(BearerAuth, rules=[(None, self._secret, "its controller")])]
            if self._secret
            else [],
        )
