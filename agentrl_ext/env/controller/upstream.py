"""HTTP calls from the controller to task workers over pooled keep-alive connections."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

logger = logging.getLogger(__name__)

_JSON = {"content-type": "application/json"}


class WorkerUnreachable(Exception):
    """A request to a worker failed below HTTP (refused, reset, timed out).

    ``before_request`` is true when the connection could not even be opened: the worker is
    certainly not running the request, and most likely not running at all.
    """

    def __init__(self, address: str, path: str, cause: BaseException, before_request: bool) -> None:
        kind = "cannot connect to" if before_request else "lost the request to"
        super().__init__(f"{kind} worker {address} ({path}): {type(cause).__name__}: {cause}")
        self.address = address
        self.before_request = before_request


class WorkerConnections:
    """One aiohttp session shared by all worker calls (connections pooled per worker)."""

    def __init__(
        self, connections_per_worker: int, keepalive_timeout_s: float, connect_timeout_s: float
    ) -> None:
        self._connections_per_worker = connections_per_worker
        self._keepalive_timeout_s = keepalive_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

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
            )
        return self._session

    async def request(
        self, method: str, address: str, path: str, body: bytes | None, timeout_s: float
    ) -> tuple[int, bytes]:
        """``method address/path`` with a JSON ``body``; returns (status, body bytes).

        Raises :class:`WorkerUnreachable` on connection failures and timeouts.
        """
        timeout = aiohttp.ClientTimeout(total=timeout_s, connect=self._connect_timeout_s)
        try:
            async with self._client().request(
                method,
                address + path,
                data=body,
                headers=_JSON if body is not None else None,
                timeout=timeout,
            ) as response:
                return response.status, await response.read()
        except aiohttp.ClientConnectorError as exc:
            raise WorkerUnreachable(address, path, exc, before_request=True) from exc
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise WorkerUnreachable(address, path, exc, before_request=False) from exc

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None
