"""The controller's calls to workers: which failures mean the request never reached the worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from agentrl_ext.env.controller.upstream import WorkerConnections
from agentrl_ext.testing.env_servers import LOOPBACK


@pytest.fixture
async def slow_worker() -> AsyncIterator[tuple[str, list[str]]]:
    """A fake worker whose ``/slow`` answers after 0.5 s; yields its address and the paths it got."""
    received: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        received.append(request.path)
        if request.path == "/slow":
            await asyncio.sleep(0.5)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/slow", answer)
    app.router.add_post("/fast", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, 0).start()
    try:
        yield f"http://{LOOPBACK}:{runner.addresses[0][1]}", received
    finally:
        await runner.cleanup()


async def test_waiting_for_a_busy_workers_connection_is_not_a_connect_timeout(slow_worker):
    """One connection per worker, held 0.5 s by a slow call: the next call waits for it (five
    connect timeouts long) and gets its answer, instead of failing as unreachable."""
    address, received = slow_worker
    connections = WorkerConnections(connections_per_worker=1, keepalive_timeout_s=5, connect_timeout_s=0.1)
    try:
        slow = asyncio.create_task(connections.request("POST", address, "/slow", b"{}", timeout_s=5))
        await asyncio.sleep(0.1)
        assert await connections.request("POST", address, "/fast", b"{}", timeout_s=5) == (
            200,
            b'{"ok": true}',
        )
        await slow
    finally:
        await connections.close()
    assert received == ["/slow", "/fast"]
