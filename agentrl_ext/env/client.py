"""Async client of the controller API, used by the agent loop and by evaluators.

One :class:`ControllerClient` holds a pool of keep-alive connections; share it between all
episodes of a process. Transport failures are retried with exponential backoff until a deadline
(:class:`RetryPolicy`, 60 s by default), but only where a retry cannot apply an agent step twice: ``interact`` is retried only when the connection could not
be opened (the request never reached the controller), ``start_sample`` also on 503 (no free
worker yet, or a controller that just restarted and waits for its workers to re-register),
``cancel`` and the read-only calls on any transport error (``get_indices`` and
``calculate_overall`` also on 503). A 503's ``Retry-After`` is honoured (up to
``RetryPolicy.max_retry_after_s``).

A start that finds every worker of its task busy (503) may also wait for a free slot beyond the
retry deadline, up to ``capacity_wait_s`` (a whole step's episodes start at once, more than one
worker per task may hold); the time it waited comes back with the session
(:attr:`StartedSample.waited_s`) so that callers can count it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
import pydantic
import pydantic_core

from agentrl_ext.cli import DEFAULT_CONTROLLER_URL
from agentrl_ext.env.auth import CLIENT_SECRET_ENV, bearer, load_secret
from agentrl_ext.env.protocol import (
    CAPACITY_HEADER,
    SESSION_ID_HEADER,
    CancelResponse,
    InteractResponse,
    SampleIndex,
    SessionInfo,
    TaskOutput,
    WorkerInfo,
    error_detail,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 180.0
"""Default longest wait for one controller call. Longer than the controller's own bounds on a
forwarded call (``worker_request_timeout_s`` = 120 s; a lost worker: ``heartbeat_timeout_s`` +
``check_interval_s`` = 26 s), so the controller's ``task error`` answer, with its reason, comes
first; short enough that a hung controller does not stall a rollout for long."""

DEFAULT_CAPACITY_WAIT_S = 900.0
"""Default longest wait of a session start for a free worker slot (503 answers): long enough for
the episodes ahead of it to end (AgentBench's 20-turn episodes take minutes), bounded so that a
fleet that never frees a slot drops the episode instead of hanging the step."""

DEFAULT_RETRY_DEADLINE_S = 60.0
"""Default time a call keeps retrying an unreachable controller or a 503: longer than a
controller restart plus its workers' re-registration (a heartbeat interval, 8 s)."""

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


class ControllerError(Exception):
    """The controller answered with an error status (``status``) and a reason (``detail``)."""

    def __init__(
        self, method: str, url: str, status: int, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{method} {url} -> HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}


class ControllerUnavailable(Exception):
    """The controller could not be reached after every retry."""


def unreachable_message(url: str, option: str = "--controller-url") -> str:
    """The one line a command prints when nothing answers at the controller URL ``url``."""
    return (
        f"no controller answers at {url}: start one (agentrl-envs up --tasks NAME[,NAME...], which serves "
        f"{DEFAULT_CONTROLLER_URL}) or pass the URL of a running one with {option}"
    )


@dataclass(frozen=True)
class RetryPolicy:
    """Retries with exponential backoff and jitter, bounded by time (and optionally by count).

    A call is retried while it fails in a way a retry can fix (see the module docstring: the
    controller was unreachable, or answered 503) until ``deadline_s`` has passed since its first
    attempt, so a controller restart of up to ``deadline_s`` costs a rollout a wait, not an
    episode. Each wait is the backoff, or the server's ``Retry-After`` when that is longer.
    """

    deadline_s: float = DEFAULT_RETRY_DEADLINE_S
    """No retry starts later than this many seconds after the first attempt."""
    max_attempts: int | None = None
    """Optional cap on attempts (None: only ``deadline_s`` bounds them)."""
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    max_retry_after_s: float = 30.0
    """Longest wait a server's ``Retry-After`` may ask for (longer requests are cut to this)."""

    def __post_init__(self) -> None:
        if (
            (self.max_attempts is not None and self.max_attempts < 1)
            or self.deadline_s < 0
            or self.initial_backoff_s < 0
            or self.max_backoff_s < self.initial_backoff_s
            or self.max_retry_after_s < 0
        ):
            raise ValueError(
                "RetryPolicy needs deadline_s >= 0, max_attempts >= 1 (or None), 0 <= initial_backoff_s "
                f"<= max_backoff_s and max_retry_after_s >= 0, got {self}"
            )

    def backoff(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based); at least ``retry_after_s``
        (a server's ``Retry-After``, capped at ``max_retry_after_s``) when given."""
        base = min(self.max_backoff_s, self.initial_backoff_s * 2 ** (attempt - 1))
        wait = base * (0.5 + random.random() / 2)
        if retry_after_s is not None:
            wait = max(wait, min(retry_after_s, self.max_retry_after_s))
        return wait

    def next_wait(self, attempt: int, elapsed_s: float, retry_after_s: float | None = None) -> float | None:
        """The wait before retry number ``attempt``, or None when no retry is left: the attempts
        are used up, or the retry would start after ``deadline_s``."""
        if self.max_attempts is not None and attempt >= self.max_attempts:
            return None
        wait = self.backoff(attempt, retry_after_s)
        if elapsed_s + wait > self.deadline_s:
            left = self.deadline_s - elapsed_s
            # A last retry at the deadline, unless the server asked for a longer wait than is left.
            asked = None if retry_after_s is None else min(retry_after_s, self.max_retry_after_s)
            return left if left > 0 and (asked is None or asked <= left) else None
        return wait


@dataclass(frozen=True)
class StartedSample:
    """A new session: its id and the opening answer (messages, tools)."""

    session_id: int
    response: InteractResponse
    #: seconds the start waited on 503 answers (no free worker slot, or workers re-registering)
    waited_s: float = 0.0


class ControllerClient:
    """Typed async access to a controller, e.g. ``ControllerClient("http://127.0.0.1:5020/api")``.

    Use as ``async with ControllerClient(url) as client: ...`` or call :meth:`close`.
    ``base_url`` may also be a list: the controller shards of one fleet, in shard order (see
    ``agentrl-controller --shard/--shards``); starts are spread over them in turn, and every call
    about a session goes to ``base_urls[session_id % len(base_urls)]``, the shard that holds it.
    ``secret`` is the controller's client secret (sent as ``Authorization: Bearer``); None reads
    ``$AGENTRL_ENV_CLIENT_SECRET`` (:data:`~agentrl_ext.env.auth.CLIENT_SECRET_ENV`), unset: none.
    ``capacity_wait_s``: how long :meth:`start_sample` keeps asking while the controller answers
    503 (every worker of the task at capacity), counted from its first attempt; 0: only as long as
    the retry policy allows (the agent loop waits ``agentrl.agent_loop.env_capacity_wait_s``,
    :data:`DEFAULT_CAPACITY_WAIT_S` by default).
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        retry: RetryPolicy | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = 10.0,
        max_connections: int = 1024,
        secret: str | None = None,
        capacity_wait_s: float = 0.0,
    ) -> None:
        if capacity_wait_s < 0:
            raise ValueError(f"capacity_wait_s={capacity_wait_s} must be >= 0")
        self.capacity_wait_s = capacity_wait_s
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        for url in urls or [""]:
            if not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"controller URL {url!r} must start with http:// or https://, e.g. {DEFAULT_CONTROLLER_URL}"
                )
        self.base_urls = [url.rstrip("/") for url in urls]
        self.base_url = self.base_urls[0]
        self._next_start = itertools.count()
        self.retry = retry or RetryPolicy()
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._max_connections = max_connections
        self._auth = bearer(secret if secret is not None else load_secret(None, CLIENT_SECRET_ENV))
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close pooled connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def close_now(self) -> None:
        """Close without an event loop (e.g. at exit, after the loop has closed): drop the
        session and close its connections' transports."""
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        connector = session.connector
        session.detach()
        if connector is not None:
            connector.close()  # closes the transports now; nothing left to await

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=30),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        session_id: int | None = None,
        params: dict[str, str] | None = None,
        retry_sent: bool,
        retry_statuses: tuple[int, ...] = (),
        base: str | None = None,
        waits: list[float] | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        """One API call with retries; returns (body, headers) of a 200 answer. ``base``: the
        controller to call (default: the session's shard, else the first); ``waits``: gets the
        wait before each retry after a ``retry_statuses`` answer."""
        if base is None:
            base = self.base_url if session_id is None else self.base_urls[session_id % len(self.base_urls)]
        url = base + path
        headers = {"content-type": "application/json", **self._auth}
        if session_id is not None:
            headers[SESSION_ID_HEADER] = str(session_id)
        data = pydantic_core.to_json(body) if body is not None else None
        loop = asyncio.get_running_loop()
        started = loop.time()
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            error: Exception
            try:
                async with self._http().request(
                    method, url, data=data, headers=headers, params=params
                ) as response:
                    payload = await response.read()
                    if response.status == 200:
                        return payload, dict(response.headers)
                    error = ControllerError(
                        method, url, response.status, error_detail(payload), dict(response.headers)
                    )
                    if response.status not in retry_statuses:
                        raise error
                    retry_after = _seconds(response.headers.get("retry-after"))
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                # never reached the controller: no connection (refused, or none made or freed in the
                # pool within connect_timeout_s, as when a loaded host is slow to accept); always
                # safe to retry
                error = exc
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                if not retry_sent:
                    raise ControllerUnavailable(
                        f"{method} {url} failed after the request was sent ({type(exc).__name__}: {exc}); not retried "
                        "because the controller may have applied it"
                    ) from exc
                error = exc
            elapsed = loop.time() - started
            wait = self.retry.next_wait(attempt, elapsed, retry_after)
            if wait is None:
                if isinstance(error, ControllerError):
                    raise error
                raise ControllerUnavailable(
                    f"{method} {url} failed {attempt} times in {elapsed:.1f}s (RetryPolicy: deadline_s="
                    f"{self.retry.deadline_s:g}, max_attempts={self.retry.max_attempts}); last error: "
                    f"{type(error).__name__}: {error}"
                ) from error
            logger.info("%s %s attempt %d failed (%s); retrying in %.2fs", method, path, attempt, error, wait)
            if waits is not None and isinstance(error, ControllerError):
                waits.append(wait)
            await asyncio.sleep(wait)

    async def start_sample(
        self, name: str, index: SampleIndex, custom_task: dict[str, Any] | None = None
    ) -> StartedSample:
        """Start a session of task ``name`` at ``index`` (``-1`` with ``custom_task`` for a custom one).

        While the controller answers 503 because every healthy worker is at capacity
        (``x-agentrl-capacity: full``) the start waits, asking again as its ``Retry-After`` says, for
        up to ``capacity_wait_s``; then the 503 is raised. Other 503s (no healthy worker, workers
        rejoining) are retried only as long as the retry policy allows."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        waits: list[float] = []
        base = self.base_urls[next(self._next_start) % len(self.base_urls)]
        while True:
            try:
                payload, headers = await self._call(
                    "POST",
                    "/start_sample",
                    body={"name": name, "index": index, "custom_task": custom_task},
                    retry_sent=False,
                    retry_statuses=(503,),
                    base=base,
                    waits=waits,
                )
                break
            except ControllerError as exc:
                elapsed = loop.time() - started
                full = exc.status == 503 and exc.headers.get(CAPACITY_HEADER) == "full"
                if not full or elapsed >= self.capacity_wait_s:
                    raise  # a task without a healthy worker is not a capacity wait
                # the retry policy's deadline passed, the capacity wait has not: keep asking
                wait = min(self.capacity_wait_s - elapsed, max(1.0, self.retry.max_backoff_s))
                logger.info(
                    "start_sample %s: no free worker for %.0fs; asking again in %.1fs", name, elapsed, wait
                )
                waits.append(wait)
                await asyncio.sleep(wait)
        raw_id = headers.get(SESSION_ID_HEADER)
        try:
            session_id = int(raw_id)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ControllerError(
                "POST",
                self.base_url + "/start_sample",
                200,
                f"answer has no integer session_id header: {raw_id!r:.40}",
            ) from None
        return StartedSample(session_id, _parse(InteractResponse, payload, "start_sample"), sum(waits))

    async def interact(self, session_id: int, messages: list[dict[str, Any]]) -> InteractResponse:
        """Send the agent's step (assistant messages with tool calls); returns the environment's answer."""
        payload, _ = await self._call(
            "POST", "/interact", body={"messages": messages}, session_id=session_id, retry_sent=False
        )
        return _parse(InteractResponse, payload, "interact")

    async def cancel(self, session_id: int) -> CancelResponse:
        """Cancel a session (safe to repeat)."""
        payload, _ = await self._call("POST", "/cancel", session_id=session_id, retry_sent=True)
        return _parse(CancelResponse, payload, "cancel")

    async def get_indices(self, name: str) -> list[SampleIndex]:
        """Sample indices of task ``name``."""
        payload, _ = await self._call(
            "GET", "/get_indices", params={"name": name}, retry_sent=True, retry_statuses=(503,)
        )
        return list(pydantic_core.from_json(payload))

    async def list_workers(self) -> dict[str, list[WorkerInfo]]:
        """Registered workers by task."""
        payload, _ = await self._call("GET", "/list_workers", retry_sent=True)
        raw = pydantic_core.from_json(payload)
        return {name: [WorkerInfo.model_validate(w) for w in workers] for name, workers in raw.items()}

    async def list_sessions(self, name: str | None = None) -> list[SessionInfo]:
        """Open sessions (optionally of one task), of every controller shard."""
        found: list[SessionInfo] = []
        for base in self.base_urls:
            payload, _ = await self._call(
                "GET", "/list_sessions", params={"name": name} if name else None, retry_sent=True, base=base
            )
            found += [SessionInfo.model_validate(item) for item in pydantic_core.from_json(payload)]
        return found

    async def calculate_overall(self, name: str, results: list[TaskOutput]) -> Any:
        """The task's summary of finished samples."""
        payload, _ = await self._call(
            "POST",
            "/calculate_overall",
            body={"name": name, "results": [r.model_dump(mode="json") for r in results]},
            retry_sent=True,
            retry_statuses=(503,),
        )
        return pydantic_core.from_json(payload)


def _seconds(retry_after: str | None) -> float | None:
    """A ``Retry-After`` given in seconds (the controller's form), else None."""
    try:
        return max(0.0, float(retry_after)) if retry_after is not None else None
    except ValueError:
        return None


def _parse(model: type[ModelT], payload: bytes, what: str) -> ModelT:
    try:
        return model.model_validate_json(payload)
    except pydantic.ValidationError as exc:
        raise ControllerError("POST", what, 200, f"malformed {what} answer: {exc}") from None
