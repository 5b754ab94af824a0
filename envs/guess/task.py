"""``guess``: find a secret number in ``1..high`` from higher/lower feedback.

Each step the agent calls ``guess(number)``; the tool answers ``higher``, ``lower`` or
``correct``. ``correct`` ends the sample ``completed`` with reward 1; ``max_turns`` (6) guesses
without it end with ``task limit reached``, reward 0. Binary search needs at most
``ceil(log2(high + 1))`` guesses (5 for ``high`` = 16). The secret is ``Random(index)``'s draw;
splits as in :mod:`envs.procedural` (the observation never shows the secret, so train and test
samples share secrets, not seeds).
"""

from __future__ import annotations

from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import SampleResult, Session, function_tool

from ..procedural import ProceduralTask, integer_argument

TOOLS = [function_tool("guess", "Guess the number.", {"number": {"type": "integer"}})]


def opening(high: int, max_turns: int) -> str:
    """The user message that starts a sample."""
    return (
        f"Guess my number from 1 to {high}. I answer higher, lower or correct. You have {max_turns} guesses."
    )


def feedback(number: int, secret: int) -> str:
    """The tool's answer to a guess."""
    if number < secret:
        return "higher"
    if number > secret:
        return "lower"
    return "correct"


class GuessTask(ProceduralTask):
    """Number guessing with higher/lower feedback (binary search is optimal)."""

    name = "guess"
    tools = TOOLS
    default_max_turns = 6

    def __init__(self, high: int = 16, **kwargs: Any) -> None:
        if not isinstance(high, int) or high < 2:
            raise ValueError(f"GuessTask: high must be an integer >= 2, got {high!r}")
        self.high = high
        super().__init__(**kwargs)

    def secret(self, index: SampleIndex) -> int:
        """The number to find in sample ``index``."""
        return self.rng(index).randint(1, self.high)

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        secret = self.secret(index)
        session.inject({"role": "user", "content": opening(self.high, self.max_turns)})
        for turn in range(1, self.max_turns + 1):
            action = await session.action()
            call = action.tool_calls[0]
            number = integer_argument(call, "number")
            answer = feedback(number, secret)
            session.inject({"role": "tool", "tool_call_id": call.id, "content": answer})
            if answer == "correct":
                return SampleResult(SampleStatus.COMPLETED, reward=1.0, metrics={"guesses": turn})
        return SampleResult(SampleStatus.TASK_LIMIT_REACHED, reward=0.0, metrics={"guesses": self.max_turns})
