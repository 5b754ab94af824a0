"""A minimal JSON-over-HTTP ASGI application, shared by the controller and the task worker.

Why not FastAPI: the controller forwards every agent step, and on a 2-core machine its own
per-request CPU decides how many round trips per second the whole system sustains. Routing by
an exact ``(method, path)`` dict lookup and validating bodies with pydantic directly costs a few
microseconds, where a full framework's dependency injection costs ~100 µs. Bodies are still
validated by pydantic models at the boundary (see :meth:`Request.parse`), and every client
error becomes a 4xx JSON answer ``{"detail": "..."}`` that names the bad value, never a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qs

import pydantic
import pydantic_core

logger = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)
Handler = Callable[["Request"], Awaitable["Response"]]
Hook = Callable[[], Awaitable[None]]

MAX_BODY_BYTES = 64 * 1024 * 1024
_JSON_HEADERS = [(b"content-type", b"application/json")]


class HttpError(Exception):
    """Raised by handlers to answer ``status`` with ``{"detail": detail}``."""

    def __init__(self, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or []


@dataclass(slots=True)
class Response:
    """A JSON answer: ``body`` is already-encoded JSON."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def json_response(
    payload: Any, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None
) -> Response:
    """Encode ``payload`` (dicts, lists, pydantic models, enums) as a JSON response."""
    return Response(status, pydantic_core.to_json(payload), headers or [])


def error_response(status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> Response:
    """The ``{"detail": ...}`` answer used for every error."""
    return Response(status, pydantic_core.to_json({"detail": detail}), headers or [])


def describe_validation_error(exc: pydantic.ValidationError, what: str) -> tuple[int, str]:
    """Turn a pydantic error into (status, message): 400 for bad JSON, 422 for wrong fields."""
    problems = []
    status = 422
    for error in exc.errors()[:5]:
        if error["type"] == "json_invalid":
            return 400, f"{what} is not valid JSON: {error['msg']}"
        location = ".".join(str(part) for part in error["loc"]) or "body"
        got = error.get("input")
        got_text = repr(got)
        if len(got_text) > 80:
            got_text = got_text[:77] + "..."
        problems.append(f"{location}: {error['msg']} (got {got_text})")
    return status, f"invalid {what}: " + "; ".join(problems)


@dataclass(slots=True)
class Request:
    """An HTTP request with its whole body read."""

    method: str
    path: str
    raw_headers: list[tuple[bytes, bytes]]
    query_string: bytes
    body: bytes

    def header(self, name: bytes) -> str | None:
        """Value of header ``name`` (lower-case bytes), or None."""
        for key, value in self.raw_headers:
            if key == name:
                return value.decode("latin-1")
        return None

    def query(self, name: str) -> str | None:
        """First value of query parameter ``name``, or None."""
        values = parse_qs(self.query_string.decode("latin-1")).get(name)
        return values[0] if values else None

    def parse(self, model: type[ModelT], what: str | None = None) -> ModelT:
        """Validate the JSON body with ``model``; a bad body raises a 400/422 :class:`HttpError`."""
        if not self.body:
            raise HttpError(400, f"{what or self.path} needs a JSON body ({model.__name__})")
        try:
            return model.model_validate_json(self.body)
        except pydantic.ValidationError as exc:
            status, detail = describe_validation_error(exc, f"{what or self.path} body")
            raise HttpError(status, detail) from None


class JsonApp:
    """ASGI app routing ``(method, path)`` to async handlers that return :class:`Response`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._routes: dict[tuple[str, str], Handler] = {}
        self._paths: set[str] = set()
        self.on_startup: list[Hook] = []
        self.on_shutdown: list[Hook] = []

    def route(self, method: str, path: str, handler: Handler) -> None:
        """Register ``handler`` for ``method path`` (exact match, no path parameters)."""
        self._routes[(method.upper(), path)] = handler
        self._paths.add(path)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    for hook in self.on_startup:
                        await hook()
                except Exception as exc:  # report to the server, which then exits
                    logger.exception("%s failed to start", self.name)
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for hook in self.on_shutdown:
                    try:
                        await hook()
                    except Exception:
                        logger.exception("%s: shutdown hook failed", self.name)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        handler = self._routes.get((method, path))
        if handler is None:
            response = self._no_route(method, path)
        else:
            response = await self._dispatch(handler, scope, receive, method, path)
        headers = [*_JSON_HEADERS, (b"content-length", str(len(response.body)).encode()), *response.headers]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})

    async def _dispatch(
        self, handler: Handler, scope: dict[str, Any], receive: Any, method: str, path: str
    ) -> Response:
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return error_response(499, "client disconnected")
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY_BYTES:
                return error_response(413, f"request body over {MAX_BODY_BYTES} bytes")
        request = Request(method, path, scope["headers"], scope.get("query_string", b""), body)
        try:
            return await handler(request)
        except HttpError as exc:
            return error_response(exc.status, exc.detail, exc.headers)
        except Exception as exc:  # a bug of ours: log it, answer 500 with the reason
            logger.exception("%s: unhandled error in %s %s", self.name, method, path)
            return error_response(500, f"internal error in {self.name} handling {method} {path}: {exc!r}")

    def _no_route(self, method: str, path: str) -> Response:
        if path in self._paths:
            allowed = sorted(m for (m, p) in self._routes if p == path)
            return error_response(
                405,
                f"{method} is not allowed on {path}; use {' or '.join(allowed)}",
                [(b"allow", ", ".join(allowed).encode())],
            )
        return error_response(
            404, f"no endpoint {path} on {self.name}; endpoints: {', '.join(sorted(self._paths))}"
        )
