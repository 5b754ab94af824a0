"""A client that speaks only the raw AgentRL HTTP protocol (``start_sample``, ``interact``,
``cancel``), for tests that drive a task worker through the controller the way any AgentRL
client would: no ``ControllerClient``, no retries, every answer checked for HTTP 200.

    client = RawClient(controller_api, "dbbench")
    session, opening = client.start(0)
    answer = client.step(session, tool_call("execute_sql", {"query": "SELECT 1"}))
"""

from __future__ import annotations

import json
from typing import Any

import httpx


def tool_call(name: str, arguments: Any, call_id: str = "call-0") -> dict[str, Any]:
    """An OpenAI tool call; ``arguments`` as a dict (JSON-encoded here) or a raw string."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


class RawClient:
    """Speaks only the raw AgentRL HTTP protocol to a controller (``start_sample``, ``interact``)."""

    def __init__(self, api: str, task: str, timeout_s: float = 60.0) -> None:
        self.api = api
        self.task = task
        self.http = httpx.Client(timeout=timeout_s)

    def start(self, index: int) -> tuple[str, dict[str, Any]]:
        response = self.http.post(f"{self.api}/start_sample", json={"name": self.task, "index": index})
        assert response.status_code == 200, response.text
        return response.headers["session_id"], response.json()

    def step(self, session_id: str, *calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = list(calls)
        response = self.http.post(
            f"{self.api}/interact", headers={"session_id": session_id}, json={"messages": [message]}
        )
        assert response.status_code == 200, response.text
        return response.json()

    def cancel(self, session_id: str) -> httpx.Response:
        return self.http.post(f"{self.api}/cancel", headers={"session_id": session_id})
