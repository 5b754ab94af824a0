"""``calc``: compute ``(a op1 b) op2 c`` with a calculator tool, then answer.

Tools: ``calculator(expression)`` computes one step ``a op b`` (``op`` one of ``+ - *``) and
answers the result as text (anything else: ``error: ...``, the step still counts);
``answer(value)`` ends the sample ``completed``, reward 1 when ``value`` is right, else 0.
``max_turns`` (5) steps without an answer end with ``task limit reached``, reward 0. The expert
needs 3 steps: two calculations and the answer. Operands are 1..20 (``Random(index)``); train
samples never repeat a test sample's expression (see :mod:`envs.procedural`).

With ``show_rest`` every calculator answer also restates what is left of the problem once the
step is done, the result in place of the step it computed: for ``(12 + 4) - 19`` the step
``12 + 4`` answers ``16. Left: 16 - 19.``, then ``16 - 19`` answers ``-3. Left: -3.``. The other
grouping's step ``4 - 19`` answers ``-15. Left: 12 + -15.``: the calculator substitutes whatever
sub-expression it was asked, so choosing the grouping stays the agent's. A step that is no part of
what is left leaves it as it was. As gridroom's answers restate the whole room, every copy after
the first step is then a copy from the latest message. (An opening that also stated the problem
as ``Left: (12 + 4) - 19.`` read no better and worse in the main job: docs/learning_runs.md,
sessions 18 and 19.)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import InvalidAction, SampleResult, Session, function_tool

from ..procedural import ProceduralTask, integer_argument, integer_text

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


LEFT = ". Left: "


def parse_step(expression: str) -> tuple[int, str, int] | None:
    """``(a, op, b)`` of one step ``a op b``, or None when ``expression`` is not one."""
    match = STEP.fullmatch(expression)
    return None if match is None else (int(match.group(1)), match.group(2), int(match.group(3)))


def calculate(expression: str) -> str:
    """The calculator's answer to ``expression`` (one step ``a op b``), or :data:`STEP_ERROR`."""
    step = parse_step(expression)
    return STEP_ERROR if step is None else str(apply(*step))


def calculator_result(reply: str) -> int | None:
    """The number a calculator answer gave (its text before :data:`LEFT` with ``show_rest``), or
    None (an error)."""
    return integer_text(reply.split(LEFT, 1)[0])


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


#: what is left of a problem: ``(a op1 b) op2 c`` (nothing done), ``x op y`` (one step done) or
#: ``(v,)`` (a single number)
Rest = Problem | tuple[int, str, int] | tuple[int]


def rest_text(rest: Rest) -> str:
    """``(12 + 4) - 19``, ``16 - 19`` or ``-3``."""
    return rest.expression if isinstance(rest, Problem) else " ".join(str(part) for part in rest)


def reduce_rest(rest: Rest, step: tuple[int, str, int]) -> Rest:
    """What is left after the calculator computed ``step``: its result in place of the
    sub-expression ``step`` is, or ``rest`` unchanged when ``step`` is none of them."""
    value = apply(*step)
    if isinstance(rest, Problem):
        if step == (rest.a, rest.op1, rest.b):
            return (value, rest.op2, rest.c)
        if step == (rest.b, rest.op2, rest.c):
            return (rest.a, rest.op1, value)
        return rest
    return (value,) if step == rest else rest


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

    def __init__(self, largest: int = 20, show_rest: bool = False, **kwargs: Any) -> None:
        if not isinstance(largest, int) or largest < 2:
            raise ValueError(f"CalcTask: largest must be an integer >= 2, got {largest!r}")
        if not isinstance(show_rest, bool):
            raise ValueError(f"CalcTask: show_rest must be true or false, got {show_rest!r}")
        self.largest = largest
        self.show_rest = show_rest
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
        rest: Rest = problem
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
            reply = calculate(expression)
            if self.show_rest:
                step = parse_step(expression)
                rest = rest if step is None else reduce_rest(rest, step)
                reply += f"{LEFT}{rest_text(rest)}."
            session.inject({"role": "tool", "tool_call_id": call.id, "content": reply})
        return SampleResult(
            SampleStatus.TASK_LIMIT_REACHED, reward=0.0, metrics={"calculations": calculations}
        )
