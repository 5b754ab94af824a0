"""The ``guess`` expert: binary search, read off the conversation so far (stateless)."""

from __future__ import annotations

import re
from typing import Any

from ..procedural import opening_text, tool_call_message, tool_exchanges


def expert_action(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message (a ``guess`` tool call) after ``messages``, the whole history so far."""
    match = re.search(r"from (\d+) to (\d+)", opening_text(messages))
    if match is None:
        raise ValueError("guess expert: the opening message names no range 'from A to B'")
    low, high = int(match.group(1)), int(match.group(2))
    for arguments, reply in tool_exchanges(messages):
        number = int(arguments["number"])
        if reply == "higher":
            low = max(low, number + 1)
        elif reply == "lower":
            high = min(high, number - 1)
    return tool_call_message("guess", {"number": (low + high) // 2}, len(tool_exchanges(messages)))
