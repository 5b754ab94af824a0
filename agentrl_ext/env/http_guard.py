"""Limits on the request head that uvicorn's httptools protocol lacks: size, count and time.

uvicorn bounds the idle time between requests (``timeout_keep_alive``) and, with h11, the size
of an incomplete request head (``h11_max_incomplete_event_size``); with httptools (the fast
parser the controller runs on) a request head is read without any bound: a 100 MB header was
accepted after 23 s of parsing, and a connection that never finishes its head was kept forever.
:class:`GuardedHttpToolsProtocol` is uvicorn's own protocol with three checks added:

- a head (request line and headers) over :data:`MAX_HEAD_BYTES` is answered ``431`` and the
  connection closed, as soon as that many bytes arrived (nothing more is parsed);
- more than :data:`MAX_HEADERS` header fields: ``431``;
- a head not complete :data:`HEAD_TIMEOUT_S` after its first byte (or a new connection that
  sends nothing for that long): ``408`` and closed.

Bodies are bounded where they are read (:func:`agentrl_ext.env.web.read_body`: size, and time
between chunks); connections idle between requests by uvicorn's ``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""Largest request head (request line + headers) accepted; our clients send well under 1 KiB."""
MAX_HEADERS = 100
"""Most header fields in one request."""
HEAD_TIMEOUT_S = 30.0
"""Longest time from a head's first byte (or a new connection) to its end."""

LINGER_S = 2.0
"""How long a refused connection's further bytes are discarded before it is closed."""


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a refused request."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounds on the request head (see the module docstring);
    :func:`guarded_protocol` makes one with other bounds."""

    max_head_bytes = MAX_HEAD_BYTES
    max_headers = MAX_HEADERS
    head_timeout_s = HEAD_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._refused = False
        self._in_head = True  # a new connection: its first bytes are a head
        self._head_bytes = 0
        self._header_count = 0
        self._completed_in_chunk = False
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._arm_head_timer()
        self._completed_in_chunk = False
        super().data_received(data)
        if self._in_head and not self._refused:
            # Bytes of a head that is not complete yet. When a message ended inside this chunk,
            # how much of the rest is the next head is unknown: counted from the next chunk on.
            if not self._completed_in_chunk:
                self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refuse(431, f"request head over {self.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        self._header_count = 0
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._refuse(431, f"more than {self.max_headers} header fields")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        self._completed_in_chunk = True
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # a refusal already answered (its exception surfaces as a parser error)
            super().send_400_response(msg)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            if self._head_bytes == 0 and self.cycle is not None and not self.cycle.response_complete:
                return  # waiting for our own answer, not for the client: not a stalled head
            self._refuse(408, f"request head not complete within {self.head_timeout_s:g}s")

    def _refuse(self, status: int, reason: str) -> None:
        """Answer ``status`` with ``reason`` and close the connection."""
        self._refused = True
        self._disarm_head_timer()
        logger.info("refused a request from %s: %s", self.client, reason)
        body = ('{"detail": "' + reason + '"}').encode()
        phrase = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, phrase, len(body), body)
        )
        # A lingering close: send the answer and our FIN, discard what the client still sends for
        # a moment, then close. Closing at once with unread bytes would reset the connection,
        # and the client could lose the answer that says why.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def guarded_protocol(
    head_timeout_s: float = HEAD_TIMEOUT_S,
    max_head_bytes: int = MAX_HEAD_BYTES,
    max_headers: int = MAX_HEADERS,
) -> type[GuardedHttpToolsProtocol]:
    """A :class:`GuardedHttpToolsProtocol` with these bounds (uvicorn takes a protocol class)."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"head_timeout_s": head_timeout_s, "max_head_bytes": max_head_bytes, "max_headers": max_headers},
    )
