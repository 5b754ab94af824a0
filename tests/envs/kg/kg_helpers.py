"""Helpers of the kg tests: a raw AgentRL protocol client and gold-action replay."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

KG_TASK = "agentrl_ext.envs.kg.task:KGTask"


def call(name: str, arguments: Any, call_id: str = "call-0") -> dict[str, Any]:
    """An OpenAI tool call; ``arguments`` as a dict (JSON-encoded here) or a raw string."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


PARAMETERS = {
    "get_relations": ["variable"],
    "get_neighbors": ["variable", "relation"],
    "intersection": ["variable1", "variable2"],
    "get_attributes": ["variable"],
    "argmax": ["variable", "attribute"],
    "argmin": ["variable", "attribute"],
    "count": ["variable"],
}
"""AgentBench's tool parameters, written out here (not taken from the code under test)."""


def action_call(action: str, call_id: str = "call-0") -> dict[str, Any]:
    """AgentBench's gold-action notation ``get_neighbors(#0,rel)`` as a tool call."""
    match = re.fullmatch(r"(\w+)\((.*)\)", action)
    assert match, action
    name, values = match.group(1), [v.strip() for v in match.group(2).split(",")]
    return call(name, dict(zip(PARAMETERS[name], values, strict=True)), call_id)


def variables_made(actions: list[str] | tuple[str, ...]) -> int:
    """How many variables a gold action sequence makes (every tool but get_relations/get_attributes)."""
    return sum(1 for a in actions if not a.startswith(("get_relations(", "get_attributes(")))


class RawClient:
    """Speaks only the raw AgentRL HTTP protocol to a controller (``start_sample``, ``interact``)."""

    def __init__(self, api: str, task: str = "kg") -> None:
        self.api = api
        self.task = task
        self.http = httpx.Client(timeout=60)

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

    def play(self, index: int, actions: list[str] | tuple[str, ...], final: str) -> tuple[list[dict], dict]:
        """Start ``index``, run ``actions`` one per step, then say ``final``; (tool messages, last answer)."""
        session, _ = self.start(index)
        observations = []
        for number, action in enumerate(actions):
            answer = self.step(session, action_call(action, f"call-{number}"))
            assert answer["status"] == "running", (action, answer)
            observations += answer["messages"]
        return observations, self.step(session, content=final)
