"""The ``gridroom`` expert: shortest path to the key, then to the door (stateless).

Every observation restates the whole state, so the expert reads only the latest one.
"""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any

from ..procedural import tool_call_message
from .task import MOVES, SIZE, Cell, Layout, open_moves

_CELL = r"(\d),(\d)"


def _cell(match: re.Match[str] | None, what: str) -> Cell:
    if match is None:
        raise ValueError(f"gridroom expert: the latest observation names no {what}")
    return int(match.group(1)), int(match.group(2))


def first_move(start: Cell, goal: Cell, blocked: Cell | None) -> str:
    """The first move of a shortest path from ``start`` to ``goal`` avoiding ``blocked``."""
    first: dict[Cell, str | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            move = first[cell]
            assert move is not None, "start == goal"
            return move
        for name, (d_row, d_col) in MOVES.items():
            nxt = (cell[0] + d_row, cell[1] + d_col)
            if 0 <= nxt[0] < SIZE and 0 <= nxt[1] < SIZE and nxt != blocked and nxt not in first:
                first[nxt] = first[cell] or name
                queue.append(nxt)
    raise ValueError(f"gridroom expert: no path from {start} to {goal}")


def _state(messages: list[dict[str, Any]]) -> tuple[Cell, Cell, Cell | None]:
    """The agent, the door and the key (None once taken), read off the latest observation."""
    observation = next(
        str(m.get("content") or "") for m in reversed(messages) if m.get("role") in ("user", "tool")
    )
    agent = _cell(re.search("You at " + _CELL, observation), "agent position")
    door = _cell(re.search("Door at " + _CELL, observation), "door")
    key = re.search("Key at " + _CELL, observation)
    return agent, door, None if key is None else _cell(key, "key")


def expert_action(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message (a ``move`` call) after ``messages``, the whole history so far."""
    agent, door, key = _state(messages)
    if key is not None:
        direction = first_move(agent, key, blocked=door)
    else:
        direction = first_move(agent, door, blocked=None)
    steps = sum(1 for m in messages if m.get("role") == "assistant")
    return tool_call_message("move", {"direction": direction}, steps)


def legal_moves(messages: list[dict[str, Any]]) -> list[str]:
    """The directions that move the agent after ``messages``: not into the outer wall, not into the
    door while it is locked (every observation says where both are)."""
    agent, door, key = _state(messages)
    return open_moves(agent, key is None, Layout(agent, key or agent, door))


def feasible_action(messages: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """A legal move drawn uniformly (:func:`legal_moves`): a player who reads the room but has no
    plan (the warm start's demonstrator; RL must find the shortest way)."""
    steps = sum(1 for m in messages if m.get("role") == "assistant")
    return tool_call_message("move", {"direction": rng.choice(legal_moves(messages))}, steps)


def is_feasible(messages: list[dict[str, Any]], name: str, arguments: dict[str, Any]) -> bool:
    """Whether the call ``name(arguments)`` after ``messages`` is a legal move."""
    direction = arguments.get("direction")
    return name == "move" and isinstance(direction, str) and direction.strip() in legal_moves(messages)


def random_action(messages: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """A move in a direction drawn uniformly (what a careless player does)."""
    steps = sum(1 for m in messages if m.get("role") == "assistant")
    return tool_call_message("move", {"direction": rng.choice(list(MOVES))}, steps)
