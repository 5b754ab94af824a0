"""``guess``: find a secret number in ``1..high`` from higher/lower feedback.

Each step the agent calls ``guess(number)``; the tool answers ``higher``, ``lower`` or
``correct``. ``correct`` ends the sample ``completed`` with reward 1; ``max_turns`` (6) guesses
without it end with ``task limit reached``, reward 0, or with ``partial_credit`` that share of the
information the answers gave (:func:`information`). With ``show_range`` a ``higher`` or ``lower``
also names the range the answers so far leave (``lower: from 1 to 7``), so that the next guess is
a function of the last answer alone. With ``show_candidates`` the opening and every answer list
the numbers still possible instead (``Guess my number, one of 4 5 6.``, ``lower: one of 4``), so
that binary search's guess is a position in the latest list (its middle number: for three, the
second named), one rule for every range rather than a fact about each range's numbers
(docs/learning_runs.md, session 19). Binary search needs at most
``ceil(log2(high + 1))`` guesses (5 for ``high`` = 16). The secret is ``Random(index)``'s draw;
splits as in :mod:`envs.procedural` (the observation never shows the secret, so train and test
samples share secrets, not seeds).

With ``starts`` > 1 the range moves: sample ``i`` plays ``s..s + high - 1`` for a start ``s`` in
``1..starts``, and the opening names it. Held out are the pairs (start, secret) with the secret at
position ``s % high`` of its range (0 the bottom); the train split draws only the other positions.
Every start opens train samples too, but an answer such as ``lower: from 4 to 4`` after the range
4..6 follows only a test secret: the agent must read the number the answer gives it, as the
guesses it never saw in training require (docs/learning_runs.md, session 15). With ``held_out:
range`` whole ranges are held out instead: of every four starts the middle two (``first + 1``,
``first + 2``, ``first + 5``, ``first + 6``, ...) open only test samples and the others only train
samples, each secret anywhere in its range. Training then shows every position of every range it
opens, so only binary search, and no memorised "where this range's secrets are", wins it all
(docs/learning_runs.md, session 19), and the test asks for that rule on ranges never played. Both
splits hold ranges starting on odd and on even numbers: with every other start held out, a number
left alone by an answer (``lower: from 502 to 502``) was always even in training and odd in the
test, and the warm start copied an odd one wrong 43% of the time (session 20). ``first`` (default 1)
moves the starts to ``first..first + starts - 1``: numbers no other task's observations use, so
that a small model's habits on one task's numbers (here: the middle is the low end plus one) do
not leak into another's copies of the same numbers (docs/learning_runs.md, session 18).
"""

from __future__ import annotations

import math
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import SampleResult, Session, function_tool

from ..procedural import ProceduralTask, integer_argument

#: how a moved range holds out test samples (``held_out``)
HELD_OUT = ("position", "range")
#: with ``held_out: range``, the offsets (from ``first``, modulo 4) of the starts held out
HELD_OUT_RANGES = (1, 2)

TOOLS = [function_tool("guess", "Guess the number.", {"number": {"type": "integer"}})]


def candidates(low: int, high: int) -> str:
    """The numbers ``low..high`` named one by one (``one of 4 5 6``; ``none left`` when empty)."""
    return "one of " + " ".join(map(str, range(low, high + 1))) if low <= high else "none left"


def opening(high: int, max_turns: int, low: int = 1, show_candidates: bool = False) -> str:
    """The user message that starts a sample (the range ``low..high``, or its numbers listed)."""
    numbers = f", {candidates(low, high)}" if show_candidates else f" from {low} to {high}"
    return f"Guess my number{numbers}. I answer higher, lower or correct. You have {max_turns} guesses."


def feedback(
    number: int, secret: int, left: tuple[int, int] | None = None, show_candidates: bool = False
) -> str:
    """The tool's answer to a guess; ``left``: the range still possible after it, to name (its
    numbers listed with ``show_candidates``)."""
    if number == secret:
        return "correct"
    answer = "higher" if number < secret else "lower"
    if left is None:
        return answer
    return f"{answer}: {candidates(*left) if show_candidates else f'from {left[0]} to {left[1]}'}"


def narrow(low: int, high: int, number: int, answer: str) -> tuple[int, int]:
    """The range ``low..high`` still possible after ``number`` was answered ``answer``
    (``higher`` or ``lower``; any other answer leaves it as it was)."""
    if answer == "higher":
        return max(low, number + 1), high
    if answer == "lower":
        return low, min(high, number - 1)
    return low, high


def information(low: int, high: int, top: int) -> float:
    """The share of the bits needed to find the secret in ``1..top`` that the answers gave when
    ``low..high`` is left: 0 with the whole range, 0.5 with a quarter of 16, 1 with one number."""
    return 1.0 - math.log2(high - low + 1) / math.log2(top)


class GuessTask(ProceduralTask):
    """Number guessing with higher/lower feedback (binary search is optimal)."""

    name = "guess"
    tools = TOOLS
    default_max_turns = 6

    def __init__(
        self,
        high: int = 16,
        show_range: bool = False,
        show_candidates: bool = False,
        partial_credit: float = 0.0,
        starts: int = 1,
        first: int = 1,
        held_out: str = "position",
        **kwargs: Any,
    ) -> None:
        if not isinstance(high, int) or isinstance(high, bool) or high < 2:
            raise ValueError(f"GuessTask: high must be an integer >= 2, got {high!r}")
        if not isinstance(starts, int) or isinstance(starts, bool) or starts < 1:
            raise ValueError(
                f"GuessTask: starts must be an integer >= 1 (1: the range is always 1..high), got {starts!r}"
            )
        if not isinstance(first, int) or isinstance(first, bool) or first < 1:
            raise ValueError(
                f"GuessTask: first must be an integer >= 1 (the lowest range's start), got {first!r}"
            )
        if held_out not in HELD_OUT:
            raise ValueError(
                f"GuessTask: held_out must be one of {', '.join(HELD_OUT)} (position: one secret position "
                f"of every range; range: two of every four ranges), got {held_out!r}"
            )
        if held_out == "range" and starts < 2:
            raise ValueError(
                f"GuessTask: held_out: range needs starts >= 2 (a range for each split), got starts={starts!r}"
            )
        if not isinstance(show_range, bool):
            raise ValueError(f"GuessTask: show_range must be true or false, got {show_range!r}")
        if not isinstance(show_candidates, bool):
            raise ValueError(f"GuessTask: show_candidates must be true or false, got {show_candidates!r}")
        if show_range and show_candidates:
            raise ValueError(
                "GuessTask: show_range and show_candidates are both true, and both name what the answers "
                "leave: set show_range: false to list the numbers ('one of 4 5 6'), or show_candidates: "
                "false to name the range ('from 4 to 6')"
            )
        if isinstance(partial_credit, bool) or not (
            isinstance(partial_credit, (int, float)) and 0.0 <= partial_credit < 1.0
        ):
            raise ValueError(
                f"GuessTask: partial_credit must be a number in [0, 1) (a solved sample gets 1), got {partial_credit!r}"
            )
        self.high = high
        self.starts = starts
        self.first = first
        self.held_out = held_out
        self.show_range = show_range
        self.show_candidates = show_candidates
        self.partial_credit = float(partial_credit)
        super().__init__(**kwargs)

    def sample(self, index: SampleIndex) -> tuple[int, int, int]:
        """``(low, high, secret)`` of sample ``index``: its range and the number to find."""
        rng = self.rng(index)
        if (self.starts, self.first) == (1, 1):
            return 1, self.high, rng.randint(1, self.high)
        if self.held_out == "range":
            # of every four starts, the middle two are test, the outer two train (HELD_OUT_RANGES)
            test = index in self.test_indices
            offsets = [i for i in range(self.starts) if (i % 4 in HELD_OUT_RANGES) == test]
            start = self.first + rng.choice(offsets)
            return start, start + self.high - 1, start + rng.randrange(self.high)
        start = rng.randint(self.first, self.first + self.starts - 1)
        held_out = start % self.high
        if index in self.test_indices:
            position = held_out
        else:
            position = rng.choice([p for p in range(self.high) if p != held_out])
        return start, start + self.high - 1, start + position

    def secret(self, index: SampleIndex) -> int:
        """The number to find in sample ``index``."""
        return self.sample(index)[2]

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        low, high, secret = self.sample(index)
        session.inject({"role": "user", "content": opening(high, self.max_turns, low, self.show_candidates)})
        for turn in range(1, self.max_turns + 1):
            action = await session.action()
            call = action.tool_calls[0]
            number = integer_argument(call, "number")
            answer = feedback(number, secret)
            low, high = narrow(low, high, number, answer)
            if self.show_range or self.show_candidates:
                answer = feedback(number, secret, (low, high), self.show_candidates)
            session.inject({"role": "tool", "tool_call_id": call.id, "content": answer})
            if answer == "correct":
                return SampleResult(SampleStatus.COMPLETED, reward=1.0, metrics={"guesses": turn})
        found = information(low, high, self.high)
        return SampleResult(
            SampleStatus.TASK_LIMIT_REACHED,
            reward=self.partial_credit * found,
            metrics={"guesses": self.max_turns, "information": found},
        )
