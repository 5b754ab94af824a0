"""The ``calc`` expert: calculate the bracket, then the rest, then answer (stateless).

Its demonstrator for a warm start, :func:`feasible_action`, reads every number right (the
problem's, the calculator's results) but picks the grouping at random: the bracket first
(``(a op1 b) op2 c``, right) or the other one (``a op1 (b op2 c)``, right only when both give the
same value). RL must learn which grouping the brackets ask for.
"""

from __future__ import annotations

import random
import re
from typing import Any

from ..procedural import integer_text, opening_text, tool_call_message, tool_exchanges
from .task import calculator_result, parse_step

Move = tuple[str, Any]
"""``("calculator", (x, op, y))`` or ``("answer", value)``."""


def opening_problem(messages: list[dict[str, Any]]) -> tuple[int, str, int, str, int]:
    """``(a, op1, b, op2, c)`` of the problem the opening message states."""
    match = re.search(r"\((-?\d+) ([-+*]) (-?\d+)\) ([-+*]) (-?\d+)", opening_text(messages))
    if match is None:
        raise ValueError("calc expert: the opening message has no expression '(a op b) op c'")
    a, op1, b, op2, c = match.groups()
    return int(a), op1, int(b), op2, int(c)


def _steps(messages: list[dict[str, Any]]) -> list[tuple[tuple[int, str, int] | None, int | None]]:
    """Every calculator step so far: its ``(x, op, y)`` (None if malformed) and its result."""
    steps = []
    for arguments, reply in tool_exchanges(messages):
        steps.append((parse_step(str(arguments.get("expression", ""))), calculator_result(reply)))
    return steps


def feasible_moves(messages: list[dict[str, Any]]) -> list[Move]:
    """The moves that use only numbers the conversation stated, in a well-formed order: first
    either grouping's inner step, then the step that combines its result with the number left,
    then the answer the last result gave."""
    a, op1, b, op2, c = opening_problem(messages)
    steps = _steps(messages)
    if not steps:
        return [("calculator", (a, op1, b)), ("calculator", (b, op2, c))]
    first, result = steps[0]
    if result is None or first not in ((a, op1, b), (b, op2, c)):
        return []  # a step nobody asked for: nothing is consistent any more
    if len(steps) == 1:
        return [("calculator", (result, op2, c) if first == (a, op1, b) else (a, op1, result))]
    last = steps[-1][1]
    return [] if last is None else [("answer", last)]


def _message(move: Move, step: int) -> dict[str, Any]:
    name, value = move
    if name == "answer":
        return tool_call_message("answer", {"value": value}, step)
    x, op, y = value
    return tool_call_message("calculator", {"expression": f"{x} {op} {y}"}, step)


def expert_action(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message (a ``calculator`` or ``answer`` call) after ``messages``."""
    a, op1, b, op2, c = opening_problem(messages)
    results = [calculator_result(reply) for _, reply in tool_exchanges(messages)]
    step = len(results)
    if step == 0:
        return tool_call_message("calculator", {"expression": f"{a} {op1} {b}"}, step)
    if step == 1:
        return tool_call_message("calculator", {"expression": f"{results[0]} {op2} {c}"}, step)
    return tool_call_message("answer", {"value": results[-1]}, step)


def feasible_action(messages: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """A move drawn uniformly from :func:`feasible_moves`: every number read right, the grouping
    chosen at random (the warm start's demonstrator)."""
    moves = feasible_moves(messages)
    if not moves:
        raise ValueError("calc demonstrator: the conversation left its well-formed order")
    return _message(rng.choice(moves), len(tool_exchanges(messages)))


def is_feasible(messages: list[dict[str, Any]], name: str, arguments: dict[str, Any]) -> bool:
    """Whether the call ``name(arguments)`` after ``messages`` is one of :func:`feasible_moves`."""
    if name == "answer":
        value = arguments.get("value")
        if isinstance(value, str):
            value = integer_text(value)
        return ("answer", value) in feasible_moves(messages) and not isinstance(value, bool)
    step = parse_step(str(arguments.get("expression", "")))
    return name == "calculator" and step is not None and ("calculator", step) in feasible_moves(messages)
