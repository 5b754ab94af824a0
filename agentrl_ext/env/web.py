"""The HTTP layer the controller and the task worker share: Starlette apps that speak JSON.

Why Starlette: it is a maintained ASGI framework, so uvicorn (with uvloop and httptools) keeps
serving, and its plain ``Route`` / ``Request`` / ``Response`` cost the controller about +30 µs of
CPU per request over the hand-written layer it replaces (FastAPI's dependency injection would
add ~100 µs to every forwarded agent step; ``bench/controller_lifecycle.py`` measures it). What
stays ours is small: pydantic validation at the boundary (:func:`parse_json`), one JSON error
shape ``{"detail": "..."}`` that names the bad value (never a bare 500), and the body reader.

Bodies (:func:`read_body`): a declared ``Content-Length`` over the endpoint's limit (at most
:data:`MAX_BODY_BYTES`) is refused with 413 before a byte of the body is read; other bodies are
collected chunk by chunk and joined once (linear time), cut off with 413 as soon as they pass
the limit, and with 408 when they stall. Validation errors quote a bounded prefix of the bad
value (:func:`bounded_repr`). After a large body, freed heap memory is given back to the system
(:func:`release_memory_soon`). Request heads are bounded in the protocol
(:mod:`agentrl_ext.env.http_guard`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pydantic
import pydantic_core
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_BODY_BYTES",
    "HttpError",
    "Request",
    "Response",
    "error_response",
    "json_app",
    "json_response",
    "parse_json",
    "read_body",
]

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)
Handler = Callable[[Request], Awaitable[Response]]
Hook = Callable[[], Awaitable[None]]

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest request body accepted (``calculate_overall`` carries whole evaluation histories);
endpoints with small bodies read with a lower ``limit`` (see the controller's app)."""
BODY_IDLE_TIMEOUT_S = 30.0
"""Longest wait for the next bytes of a request body that is still coming."""
BODY_TIMEOUT_S = 120.0
"""Longest time one request body may take in all."""
SHOW_VALUES_UP_TO_BYTES = 64 * 1024
"""Validation errors of bodies up to this size quote (a bounded prefix of) the bad value."""
LARGE_BODY_BYTES = 1024 * 1024
"""After a body above this size, freed heap memory is given back to the system (see
:func:`release_memory_soon`)."""
TRIM_DELAY_S = 1.0
JSON_MEDIA_TYPE = "application/json"


class HttpError(Exception):
    """Raised by handlers to answer ``status`` with ``{"detail": detail}`` (and ``headers``)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Encode ``payload`` (dicts, lists, pydantic models, enums) as a JSON response."""
    return Response(pydantic_core.to_json(payload), status, headers, JSON_MEDIA_TYPE)


def error_response(status: int, detail: str, headers: dict[str, str] | None = None) -> Response:
    """The ``{"detail": ...}`` answer used for every error."""
    return json_response({"detail": detail}, status, headers)


def bounded_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters without formatting more than that.

    A bad value can be huge (a list of 20 million ints in a 40 MB body): ``repr`` of all of it
    costs seconds of CPU before it is cut. Only the first few items of a container are formatted.
    """
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    if isinstance(value, bytes):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(bounded_repr(item, limit // 4) for item in value[:4])
        more = f", ... ({len(value)} items)" if len(value) > 4 else ""
        text = f"[{shown}{more}]"
    elif isinstance(value, dict):
        items = itertools.islice(value.items(), 4)
        shown = ", ".join(f"{bounded_repr(k, limit // 4)}: {bounded_repr(v, limit // 4)}" for k, v in items)
        more = f", ... ({len(value)} keys)" if len(value) > 4 else ""
        text = f"{{{shown}{more}}}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_validation_error(
    exc: pydantic.ValidationError, what: str, with_input: bool = True
) -> tuple[int, str]:
    """Turn a pydantic error into (status, message): 400 for bad JSON, 422 for wrong fields.

    The message names at most 5 problems, each with a bounded prefix of the bad value
    (:func:`bounded_repr`); ``with_input=False`` leaves the values out (for a large body, pydantic
    would first turn a bad value of any size into Python objects).
    """
    problems = []
    for error in exc.errors(include_url=False, include_context=False, include_input=with_input)[:5]:
        if error["type"] == "json_invalid":
            return 400, f"{what} is not valid JSON: {error['msg']}"
        location = (
            ".".join(
                bounded_repr(part, 40) if isinstance(part, str) and len(part) > 40 else str(part)
                for part in error["loc"]
            )
            or "body"
        )
        got = f" (got {bounded_repr(error['input'])})" if "input" in error else ""
        problems.append(f"{location}: {error['msg']}{got}")
    more = f" ({exc.error_count()} problems in all)" if exc.error_count() > 5 else ""
    return 422, f"invalid {what}: " + "; ".join(problems) + more


def _too_large(size: str, limit: int) -> HttpError:
    # "Connection: close": the server drops the connection instead of draining the rest of the body.
    return HttpError(
        413,
        f"request body of {size} bytes is over the limit of {limit} bytes; send less per call",
        {"connection": "close"},
    )


async def read_body(
    request: Request,
    limit: int = MAX_BODY_BYTES,
    idle_timeout_s: float = BODY_IDLE_TIMEOUT_S,
    total_timeout_s: float = BODY_TIMEOUT_S,
) -> bytes:
    """The whole request body, in linear time.

    413 before reading when the declared ``Content-Length`` is over ``limit`` (and as soon as a
    streamed body passes it); 408 when no byte of the body arrives for ``idle_timeout_s``, or the
    whole body takes longer than ``total_timeout_s`` (a client that declares more than it sends
    holds the connection no longer). Both answers close the connection.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise HttpError(400, f"Content-Length {declared[:40]!r} is not a number of bytes") from None
        if size > limit:
            raise _too_large(str(size), limit)
    # The ASGI messages straight from ``request.receive`` (what ``Request.stream`` yields, without
    # an async generator per request): the body is read once, here, and never again.
    chunks: list[bytes] = []
    total = 0
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async with asyncio.timeout(idle_timeout_s) as deadline:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                if chunk:
                    total += len(chunk)
                    if total > limit:
                        raise _too_large(f"more than {limit}", limit)
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
                deadline.reschedule(min(loop.time() + idle_timeout_s, started + total_timeout_s))
    except TimeoutError:
        raise HttpError(
            408,
            f"the request body stalled after {total} bytes (no byte for {idle_timeout_s:g}s, or longer "
            f"than {total_timeout_s:g}s in all); send the whole body at once",
            {"connection": "close"},
        ) from None
    if total > LARGE_BODY_BYTES:
        release_memory_soon()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_json(body: bytes, model: type[ModelT], what: str) -> ModelT:
    """Validate a JSON ``body`` with ``model``; a bad or missing body raises a 400/422 :class:`HttpError`."""
    if not body:
        raise HttpError(400, f"{what} needs a JSON body ({model.__name__})")
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as exc:
        status, detail = describe_validation_error(
            exc, f"{what} body", with_input=len(body) <= SHOW_VALUES_UP_TO_BYTES
        )
        raise HttpError(status, detail) from None


def _guarded(app_name: str, handler: Handler) -> Handler:
    """``handler`` with every failure turned into a JSON answer (a bug of ours: logged, 500)."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except HttpError as exc:
            return error_response(exc.status, exc.detail, exc.headers)
        except ClientDisconnect:
            return error_response(499, "client disconnected")
        except Exception as exc:
            logger.exception("%s: unhandled error in %s %s", app_name, request.method, request.url.path)
            return error_response(
                500, f"internal error in {app_name} handling {request.method} {request.url.path}: {exc!r}"
            )

    return endpoint


def json_app(
    name: str,
    routes: Sequence[tuple[str, str, Handler]],
    on_startup: Sequence[Hook] = (),
    on_shutdown: Sequence[Hook] = (),
    middleware: Sequence[Middleware] = (),
) -> Starlette:
    """A Starlette app serving ``(method, path, handler)`` routes, every answer JSON.

    After the start-up hooks, everything alive is frozen out of the garbage collector's reach
    (see :func:`freeze_startup_objects`). ``middleware`` wraps the app (e.g.
    :class:`~agentrl_ext.env.auth.BearerAuth`). Unknown paths get 404 naming the endpoints; a known
    path with another method gets 405 naming the allowed ones.
    """
    paths = sorted({path for _, path, _ in routes})

    async def routing_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            headers = {key.lower(): value for key, value in (exc.headers or {}).items()}
            allowed = [m for m in headers.get("allow", "").split(", ") if m and m != "HEAD"]
            return error_response(
                405,
                f"{request.method} is not allowed on {request.url.path}; use {' or '.join(allowed)}",
                {"allow": ", ".join(allowed)},
            )
        if exc.status_code == 404:
            return error_response(
                404, f"no endpoint {request.url.path} on {name}; endpoints: {', '.join(paths)}"
            )
        return error_response(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for hook in on_startup:
            await hook()
        freeze_startup_objects()
        try:
            yield
        finally:
            for hook in on_shutdown:
                try:
                    await hook()
                except Exception:
                    logger.exception("%s: shutdown hook failed", name)

    return Starlette(
        routes=[Route(path, _guarded(name, handler), methods=[method]) for method, path, handler in routes],
        exception_handlers={HTTPException: routing_error},
        lifespan=lifespan,
        middleware=list(middleware),
    )


def _load_malloc_trim() -> Callable[[int], int] | None:
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    try:
        trim = ctypes.CDLL(libc_name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_malloc_trim = _load_malloc_trim()
_trim_scheduled = False


def release_memory_soon() -> None:
    """Give freed heap memory back to the system shortly (glibc ``malloc_trim``), at most once per
    :data:`TRIM_DELAY_S`.

    Why: a large body, and the Python objects parsed from it, are freed when the request ends,
    but glibc keeps the freed pages of its heap (and of the arenas of other threads) mapped for
    reuse; after a few tens of MB-sized bodies the process kept ~400 MB it no longer used.
    ``malloc_trim`` returns them; it is called from the event loop a moment after the request,
    when its objects are gone.
    """
    global _trim_scheduled
    if _malloc_trim is None or _trim_scheduled:
        return
    _trim_scheduled = True
    asyncio.get_running_loop().call_later(TRIM_DELAY_S, _trim_now)


def _trim_now() -> None:
    global _trim_scheduled
    _trim_scheduled = False
    assert _malloc_trim is not None
    _malloc_trim(0)


def freeze_startup_objects() -> None:
    """Move everything alive after start-up (modules, classes, app state) out of the GC's reach.

    A full collection walks every tracked object; the ~50k objects of the imported libraries
    alone cost ~7 ms per walk, a pause every request in flight would pay. Frozen objects are
    never walked; they are never freed either, which is right for what exists at start-up.
    """
    gc.collect()
    gc.freeze()
