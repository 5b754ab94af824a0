"""Running our ASGI apps (see :mod:`agentrl_ext.env.web`) on uvicorn with the fastest event loop
and HTTP parser available."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import uvicorn

logger = logging.getLogger(__name__)

# Longer than any pooled client keeps an idle connection (the controller: 4 s, aiohttp's
# default: 15 s), so the server never closes a connection a client is about to reuse.
KEEPALIVE_TIMEOUT_S = 75


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def uvicorn_config(app: Any, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    """A uvicorn config tuned for many small JSON requests over keep-alive connections.

    uvloop and httptools (``uvicorn[standard]``) roughly halve the per-request CPU; without them
    the pure-Python asyncio loop and h11 parser are used.
    """
    loop = "uvloop" if _available("uvloop") else "asyncio"
    http = "httptools" if _available("httptools") else "h11"
    if loop == "asyncio" or http == "h11":
        logger.info("serving with loop=%s http=%s; install uvicorn[standard] for more throughput", loop, http)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop=loop,
        http=http,
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


def serve(app: Any, host: str, port: int, log_level: str = "info") -> None:
    """Serve ``app`` until interrupted (SIGINT/SIGTERM shut it down gracefully)."""
    uvicorn.Server(uvicorn_config(app, host, port, log_level)).run()
