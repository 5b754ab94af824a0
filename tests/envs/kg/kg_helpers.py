"""Helpers of the kg tests: a raw AgentRL protocol client and gold-action replay."""

from __future__ import annotations

import re
from typing import Any

from agentrl_ext.testing.raw_protocol import RawClient as ProtocolClient
from agentrl_ext.testing.raw_protocol import tool_call as call

KG_TASK = "agentrl_ext.envs.kg.task:KGTask"


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


class RawClient(ProtocolClient):
    """The raw AgentRL protocol client (``agentrl_ext.testing.raw_protocol``) with kg's tools."""

    def __init__(self, api: str, task: str = "kg") -> None:
        super().__init__(api, task, timeout_s=60)

    def play(self, index: int, actions: list[str] | tuple[str, ...], final: str) -> tuple[list[dict], dict]:
        """Start ``index``, run ``actions`` one per step, then say ``final``; (tool messages, last answer)."""
        session, _ = self.start(index)
        observations = []
        for number, action in enumerate(actions):
            answer = self.step(session, action_call(action, f"call-{number}"))
            assert answer["status"] == "running", (action, answer)
            observations += answer["messages"]
        return observations, self.step(session, content=final)
