"""HTTP calls from the controller to task workers over pooled keep-alive connections."""

from __future__ import annotations

import asyncio
import logging
import sys

import aiohttp

logger = logging.getLogger(__name__)

_JSON = {"content-type": "application/json"}


class WorkerUnreachable(Exception):
    """A request to a worker failed below HTTP (refused, reset, timed out).

    ``before_request`` is true when the connection could not even be opened: the worker is
    certainly not running the request, and most likely not running at all.
    """

    def __init__(self, address: str, path: str, reason: str, before_request: bool) -> None:
        kind = "cannot connect to" if before_request else "lost the request to"
        super().__init__(f"{kind} worker {address} ({path}): {reason}")
        self.address = address
        self.before_request = before_request


def _describe(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, asyncio.TimeoutError):  # str() of a timeout is empty: say what ran out
        return f"no answer within {timeout_s:g}s (the controller's worker_request_timeout_s)"
    return f"{type(exc).__name__}: {exc}"


class WorkerConnections:
    """One aiohttp session shared by all worker calls (connections pooled per worker).

    Requests in flight are tracked per worker address, so that :meth:`abort` can end them at once
    when the worker is declared lost (a hung worker keeps its connections open and never answers).
    """

    def __init__(
        self,
        connections_per_worker: int,
        keepalive_timeout_s: float,
        connect_timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._headers = headers or {}
        """Sent with every call (the worker secret's ``Authorization``)."""
        self._connections_per_worker = connections_per_worker
        self._keepalive_timeout_s = keepalive_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._in_flight: dict[str, set[asyncio.Task[object]]] = {}
        self._aborted: dict[asyncio.Task[object], str] = {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0,
                limit_per_host=self._connections_per_worker,
                keepalive_timeout=self._keepalive_timeout_s,
                ttl_dns_cache=300,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                # Workers are ours: skip cookie handling and automatic decompression work.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                headers=self._headers,
            )
        return self._session

    async def request(
        self, method: str, address: str, path: str, body: bytes | None, timeout_s: float
    ) -> tuple[int, bytes]:
        """``method address/path`` with a JSON ``body``; returns (status, body bytes).

        Raises :class:`WorkerUnreachable` on connection failures, timeouts and :meth:`abort`.
        """
        # sock_connect, not connect: waiting for a pooled connection while the worker's others are
        # busy is not a failure to connect (only ``total`` bounds it)
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self._connect_timeout_s)
        task = asyncio.current_task()
        assert task is not None
        flights = self._in_flight.setdefault(address, set())
        flights.add(task)
        try:
            async with self._client().request(
                method,
                address + path,
                data=body,
                headers=_JSON if body is not None else None,
                timeout=timeout,
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # no connection within sock_connect: the worker never got the request
            raise WorkerUnreachable(address, path, _describe(exc, timeout_s), before_request=True) from exc
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise WorkerUnreachable(address, path, _describe(exc, timeout_s), before_request=False) from exc
        except asyncio.CancelledError:
            reason = self._aborted.pop(task, None)
            if reason is None:  # cancelled by someone else (shutdown, client gone): not ours to handle
                raise
            if sys.version_info >= (3, 11):
                task.uncancel()
            raise WorkerUnreachable(address, path, reason, before_request=False) from None
        finally:
            self._aborted.pop(task, None)
            flights.discard(task)
            if not flights and self._in_flight.get(address) is flights:
                del self._in_flight[address]

    def abort(self, address: str, reason: str) -> int:
        """End every request in flight to ``address`` now: each raises :class:`WorkerUnreachable`
        with ``reason``. Returns how many were aborted."""
        tasks = [t for t in self._in_flight.get(address, ()) if t not in self._aborted]
        for task in tasks:
            self._aborted[task] = reason
            task.cancel()
        return len(tasks)

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None
