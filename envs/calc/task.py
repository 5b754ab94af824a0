"""``calc``: compute ``(a op1 b) op2 c`` with a calculator tool, then answer.

Tools: ``calculator(expression)`` computes one step ``a op b`` (``op`` one of ``+ - *``) and
answers the result as text (anything else: ``error: ...``, the step still counts);
``answer(value)`` ends the sample ``completed``, reward 1 when ``value`` is right, else 0.
``max_turns`` (5) steps without an answer end with ``task limit reached``, reward 0. The expert
needs 3 steps: two calculations and the answer. Operands are 1..20 (``Random(index)``); train
samples never repeat a test sample's expression (see :mod:`envs.procedural`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import InvalidAction, SampleResult, Session, function_tool

from ..procedural import ProceduralTask, integer_argument

OPS = ("+", "-", "*")
TOOLS = [
    function_tool("calculator", "Compute one step like 3 * 4.", {"expression": {"type": "string"}}),
    function_tool("answer", "Give the final answer.", {"value": {"type": "integer"}}),
]
STEP = re.compile(r"\s*(-?\d{1,6})\s*([-+*])\s*(-?\d{1,6})\s*")
STEP_ERROR = "error: write one step like 3 * 4"


def apply(a: int, op: str, b: int) -> int:
    """``a op b`` for ``op`` in :data:`OPS`."""
    return a + b if op == "+" else a - b if op == "-" else a * b


def calculate(expression: str) -> str:
    """The calculator's answer to ``expression`` (one step ``a op b``), or :data:`STEP_ERROR`."""
    match = STEP.fullmatch(expression)
    if match is None:
        return STEP_ERROR
    return str(apply(int(match.group(1)), match.group(2), int(match.group(3))))


@dataclass(frozen=True)
class Problem:
    """``(a op1 b) op2 c``."""

    a: int
    op1: str
    b: int
    op2: str
    c: int

    @property
    def expression(self) -> str:
        return f"({self.a} {self.op1} {self.b}) {self.op2} {self.c}"

    @property
    def value(self) -> int:
        return apply(apply(self.a, self.op1, self.b), self.op2, self.c)


def make_problem(rng: random.Random, largest: int = 20) -> Problem:
    """A problem drawn from ``rng``: operands in ``1..largest``, operators from :data:`OPS`."""
    return Problem(
        rng.randint(1, largest),
        rng.choice(OPS),
        rng.randint(1, largest),
        rng.choice(OPS),
        rng.randint(1, largest),
    )


def opening(problem: Problem, max_turns: int) -> str:
    """The user message that starts a sample."""
    return (
        f"Compute {problem.expression}. Use the calculator one step at a time, then answer. "
        f"You have {max_turns} steps."
    )


class CalcTask(ProceduralTask):
    """Two-step arithmetic with a calculator tool."""

    name = "calc"
    tools = TOOLS
    default_max_turns = 5
    disjoint_content = True

    def __init__(self, largest: int = 20, **kwargs: Any) -> None:
        if not isinstance(largest, int) or largest < 2:
            raise ValueError(f"CalcTask: largest must be an integer >= 2, got {largest!r}")
        self.largest = largest
        super().__init__(**kwargs)

    def content_key(self, index: int) -> Problem:
        return make_problem(random.Random(index), self.largest)

    def problem(self, index: SampleIndex) -> Problem:
        """The problem of sample ``index``."""
        return make_problem(self.rng(index), self.largest)

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        problem = self.problem(index)
        session.inject({"role": "user", "content": opening(problem, self.max_turns)})
        calculations = 0
        for _ in range(self.max_turns):
            action = await session.action()
            call = action.tool_calls[0]
            if call.name == "answer":
                value = integer_argument(call, "value")
                right = value == problem.value
                session.report(float(right), calculations=calculations)
                return SampleResult(SampleStatus.COMPLETED, reward=float(right), result={"answer": value})
            expression = call.arguments.get("expression")
            if not isinstance(expression, str):
                raise InvalidAction(
                    SampleStatus.AGENT_VALIDATION_FAILED,
                    f"calculator: argument 'expression' must be a string, got {expression!r}",
                )
            calculations += 1
            session.inject({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
        return SampleResult(
            SampleStatus.TASK_LIMIT_REACHED, reward=0.0, metrics={"calculations": calculations}
        )
