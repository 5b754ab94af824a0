"""The ``guess`` expert: binary search, read off the conversation so far (stateless)."""

from __future__ import annotations

import random
import re
from typing import Any

from ..procedural import opening_text, tool_call_message, tool_exchanges
from .task import narrow


def _range(messages: list[dict[str, Any]]) -> tuple[int, int]:
    match = re.search(r"from (\d+) to (\d+)", opening_text(messages))
    if match is None:
        raise ValueError("guess expert: the opening message names no range 'from A to B'")
    return int(match.group(1)), int(match.group(2))


def expert_action(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message (a ``guess`` tool call) after ``messages``, the whole history so far."""
    low, high = _range(messages)
    for arguments, reply in tool_exchanges(messages):
        # "lower" or, with show_range, "lower: from 1 to 7"
        low, high = narrow(low, high, int(arguments["number"]), reply.split(":")[0])
    return tool_call_message("guess", {"number": (low + high) // 2}, len(tool_exchanges(messages)))


def random_action(messages: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """A guess drawn uniformly from the opening's range (what a careless player does)."""
    low, high = _range(messages)
    return tool_call_message("guess", {"number": rng.randint(low, high)}, len(tool_exchanges(messages)))


def habit_action(messages: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """The top of the opening's range, every time (a player with a lucky number: a habit, the same
    move in every state, where :func:`random_action` is noise)."""
    _, high = _range(messages)
    return tool_call_message("guess", {"number": high}, len(tool_exchanges(messages)))
