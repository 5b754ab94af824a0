"""The HTTP layer the controller and the task worker share: Starlette apps that speak JSON.

Why Starlette: it is a maintained ASGI framework, so uvicorn (with uvloop and httptools) keeps
serving, and its plain ``Route`` / ``Request`` / ``Response`` cost the controller about +30 µs of
CPU per request over the hand-written layer it replaces (FastAPI's dependency injection would
add ~100 µs to every forwarded agent step; ``bench/controller_lifecycle.py`` measures it). What
stays ours is small: pydantic validation at the boundary (:func:`parse_json`), one JSON error
shape ``{"detail": "..."}`` that names the bad value (never a bare 500), and the body reader.

Bodies: a declared ``Content-Length`` over :data:`MAX_BODY_BYTES` is refused with 413 before a
byte of the body is read; other bodies are collected chunk by chunk and joined once (linear
time), and cut off with 413 as soon as they pass the limit.
"""

from __future__ import annotations

import gc
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
"""Largest request body accepted (``calculate_overall`` carries whole evaluation histories)."""
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


def describe_validation_error(exc: pydantic.ValidationError, what: str) -> tuple[int, str]:
    """Turn a pydantic error into (status, message): 400 for bad JSON, 422 for wrong fields."""
    problems = []
    for error in exc.errors()[:5]:
        if error["type"] == "json_invalid":
            return 400, f"{what} is not valid JSON: {error['msg']}"
        location = ".".join(str(part) for part in error["loc"]) or "body"
        got_text = repr(error.get("input"))
        if len(got_text) > 80:
            got_text = got_text[:77] + "..."
        problems.append(f"{location}: {error['msg']} (got {got_text})")
    return 422, f"invalid {what}: " + "; ".join(problems)


def _too_large(size: str) -> HttpError:
    # "Connection: close": the server drops the connection instead of draining the rest of the body.
    return HttpError(
        413,
        f"request body of {size} bytes is over the limit of {MAX_BODY_BYTES} bytes; send less per call",
        {"connection": "close"},
    )


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole request body, in linear time; 413 before reading when the declared size is over ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise HttpError(400, f"Content-Length {declared!r} is not a number of bytes") from None
        if size > limit:
            raise _too_large(str(size))
    # The ASGI messages straight from ``request.receive`` (what ``Request.stream`` yields, without
    # an async generator per request): the body is read once, here, and never again.
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        if chunk:
            total += len(chunk)
            if total > limit:
                raise _too_large(f"more than {limit}")
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_json(body: bytes, model: type[ModelT], what: str) -> ModelT:
    """Validate a JSON ``body`` with ``model``; a bad or missing body raises a 400/422 :class:`HttpError`."""
    if not body:
        raise HttpError(400, f"{what} needs a JSON body ({model.__name__})")
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as exc:
        status, detail = describe_validation_error(exc, f"{what} body")
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


def freeze_startup_objects() -> None:
    """Move everything alive after start-up (modules, classes, app state) out of the GC's reach.

    A full collection walks every tracked object; the ~50k objects of the imported libraries
    alone cost ~7 ms per walk, a pause every request in flight would pay. Frozen objects are
    never walked; they are never freed either, which is right for what exists at start-up.
    """
    gc.collect()
    gc.freeze()
