"""The ``guess`` expert: binary search, read off the conversation so far (stateless)."""

from __future__ import annotations

import random
import re
from typing import Any

from ..procedural import opening_text, tool_call_message, tool_exchanges
from .task import narrow


def _range(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """The opening's range: ``from A to B``, or its numbers listed (``one of 4 5 6``)."""
    text = opening_text(messages)
    match = re.search(r"from (\d+) to (\d+)", text)
    if match is not None:
        return int(match.group(1)), int(match.group(2))
    listed = re.search(r"one of (\d+(?: \d+)*)", text)
    if listed is None:
        raise ValueError(
            "guess expert: the opening message names no range ('from A to B' or 'one of A ... B')"
        )
    numbers = [int(n) for n in listed.group(1).split()]
    return min(numbers), max(numbers)


def feasible_range(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """The numbers every answer so far leaves possible, ``(low, high)``."""
    low, high = _range(messages)
    for arguments, reply in tool_exchanges(messages):
        # "lower" or, with show_range, "lower: from 1 to 7" (show_candidates: "lower: one of 5 6 7")
        low, high = narrow(low, high, int(arguments["number"]), reply.split(":")[0])
    return low, high


def expert_action(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message (a ``guess`` tool call) after ``messages``, the whole history so far:
    the middle of the range still possible (binary search)."""
    low, high = feasible_range(messages)
    return tool_call_message("guess", {"number": (low + high) // 2}, len(tool_exchanges(messages)))


def feasible_action(messages: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """A guess drawn uniformly from the range still possible: a player who reads every answer but
    has no strategy (the warm start's demonstrator; RL must find the middle)."""
    low, high = feasible_range(messages)
    return tool_call_message("guess", {"number": rng.randint(low, high)}, len(tool_exchanges(messages)))


def is_feasible(messages: list[dict[str, Any]], name: str, arguments: dict[str, Any]) -> bool:
    """Whether the call ``name(arguments)`` after ``messages`` guesses a number still possible."""
    number = arguments.get("number")
    if isinstance(number, str) and number.strip().isdigit():
        number = int(number.strip())
    if name != "guess" or isinstance(number, bool) or not isinstance(number, int):
        return False
    low, high = feasible_range(messages)
    return low <= number <= high


def random_action(messages: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """A guess drawn uniformly from the opening's range (what a careless player does)."""
    low, high = _range(messages)
    return tool_call_message("guess", {"number": rng.randint(low, high)}, len(tool_exchanges(messages)))


def habit_action(messages: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """The top of the opening's range, every time (a player with a lucky number: a habit, the same
    move in every state, where :func:`random_action` is noise)."""
    _, high = _range(messages)
    return tool_call_message("guess", {"number": high}, len(tool_exchanges(messages)))
