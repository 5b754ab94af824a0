"""The ``calc`` expert: calculate the bracket, then the rest, then answer (stateless)."""

from __future__ import annotations

import re
from typing import Any

from ..procedural import opening_text, tool_call_message, tool_exchanges


def expert_action(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message (a ``calculator`` or ``answer`` call) after ``messages``."""
    match = re.search(r"\((-?\d+) ([-+*]) (-?\d+)\) ([-+*]) (-?\d+)", opening_text(messages))
    if match is None:
        raise ValueError("calc expert: the opening message has no expression '(a op b) op c'")
    a, op1, b, op2, c = match.groups()
    results = [int(reply) for _, reply in tool_exchanges(messages)]
    step = len(results)
    if step == 0:
        return tool_call_message("calculator", {"expression": f"{a} {op1} {b}"}, step)
    if step == 1:
        return tool_call_message("calculator", {"expression": f"{results[0]} {op2} {c}"}, step)
    return tool_call_message("answer", {"value": results[-1]}, step)
