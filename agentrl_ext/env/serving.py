"""Running our ASGI apps (see :mod:`agentrl_ext.env.web`) on uvicorn with the fastest event loop
and HTTP parser available."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import uvicorn

from agentrl_ext.env.http_guard import HEAD_TIMEOUT_S, guarded_protocol

logger = logging.getLogger(__name__)

# Longer than any pooled client keeps an idle connection (the controller: 4 s, aiohttp's
# default: 15 s), so the server never closes a connection a client is about to reuse.
KEEPALIVE_TIMEOUT_S = 75
MAX_CONCURRENCY = 16_384
"""Open connections (and requests in flight) one server accepts; more are answered 503. Far
above a training run's need (one pooled connection per episode step in flight)."""


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def uvicorn_config(
    app: Any, host: str, port: int, log_level: str = "info", head_timeout_s: float = HEAD_TIMEOUT_S
) -> uvicorn.Config:
    """A uvicorn config tuned for many small JSON requests over keep-alive connections.

    uvloop and httptools roughly halve the per-request CPU against the pure-Python asyncio loop
    and h11 parser; the protocol is uvicorn's httptools one with bounds on the request head
    (:class:`~agentrl_ext.env.http_guard.GuardedHttpToolsProtocol`).
    """
    loop = "uvloop" if _available("uvloop") else "asyncio"
    if loop == "asyncio":
        logger.info("serving with the asyncio loop; install uvloop (uvicorn[standard]) for more throughput")
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop=loop,
        # httptools (a dependency) with bounds on the request head (agentrl_ext.env.http_guard);
        # open connections plus requests in flight are bounded too (503 above).
        http=guarded_protocol(head_timeout_s),
        limit_concurrency=MAX_CONCURRENCY,
        lifespan="on",
        access_log=False,
        log_level=log_level.lower(),
        timeout_keep_alive=KEEPALIVE_TIMEOUT_S,
        backlog=4096,
        # Plain loopback/cluster service: no proxy header rewriting, no per-response date/server headers.
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )


def serve(
    app: Any, host: str, port: int, log_level: str = "info", head_timeout_s: float = HEAD_TIMEOUT_S
) -> None:
    """Serve ``app`` until interrupted (SIGINT/SIGTERM shut it down gracefully)."""
    uvicorn.Server(uvicorn_config(app, host, port, log_level, head_timeout_s)).run()
