"""Calling an ASGI app (the controller's, a worker's) in process: no server, no socket.

For tests that are about one handler (how a body is read, what is answered before it is read)
and for ``bench/controller_overhead.py``, which measures the controller's own CPU per request.
Standard library only: the benchmark loads this file from its own checkout to call the
controllers of older revisions the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class AsgiAnswer:
    """What the app sent: the status, the response headers (lower-case bytes) and the body."""

    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""


def http_scope(
    path: str, headers: Sequence[tuple[bytes, bytes]] = (), method: str = "POST"
) -> dict[str, Any]:
    """The ASGI scope of an HTTP/1.1 request for ``path`` from 127.0.0.1 (``host: x`` added first)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"x"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }


def whole_body(body: bytes) -> Receive:
    """A ``receive`` that delivers ``body`` in one message, then a disconnect."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    return receive


def chunked_body(chunks: Iterable[bytes]) -> Receive:
    """A ``receive`` that delivers ``chunks`` one message each, yielding to the event loop before
    each (as a real server does between chunks), then the end of the body."""
    pending = iter(chunks)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0)
        chunk = next(pending, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    return receive


async def call_asgi(
    app: Any,
    path: str,
    receive: Receive | bytes = b"",
    headers: Sequence[tuple[bytes, bytes]] = (),
    method: str = "POST",
) -> AsgiAnswer:
    """One request to ``app``: the body is ``receive`` (bytes: sent whole, see :func:`whole_body`)."""
    answer = AsgiAnswer()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = dict(message["headers"])
        elif message["type"] == "http.response.body":
            answer.body += message.get("body", b"")

    body = whole_body(receive) if isinstance(receive, bytes) else receive
    await app(http_scope(path, headers, method), body, send)
    return answer
