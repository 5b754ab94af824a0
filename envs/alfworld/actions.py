"""From the agent's ``action`` argument to a game command, as AgentBench does it, plus ``put``/``move``.

AgentBench's ``process_action``: the text is stripped, lower-cased and cut at its first line; a
command that is admissible is taken as it is; otherwise the admissible command with the highest
sentence BLEU against it (NLTK, smoothing method 4) is taken when that score is above 0.01, and
else the text goes to the game unchanged (which answers ``Nothing happens.``).

One addition: the two ALFWorld grammars. The test games (ALFWorld 0.2.2 files) say
``put X in/on Y``; the vendored train games (newer files) say ``move X to Y`` for the same
action. Before the BLEU fallback, a command in one form whose other form is admissible becomes
that one, so an agent may use either wording in every game.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

BLEU_THRESHOLD = 0.01
_PUT = re.compile(r"^put (?P<object>.+?) in/on (?P<receptacle>.+)$")
_MOVE = re.compile(r"^move (?P<object>.+?) to (?P<receptacle>.+)$")


def normalize(text: str) -> str:
    """AgentBench's normalisation: stripped, lower case, first line only."""
    return text.strip().lower().split("\n")[0]


def other_wording(command: str) -> str | None:
    """``put X in/on Y`` <-> ``move X to Y``; None for any other command."""
    if match := _PUT.match(command):
        return f"move {match['object']} to {match['receptacle']}"
    if match := _MOVE.match(command):
        return f"put {match['object']} in/on {match['receptacle']}"
    return None


@dataclass(frozen=True)
class Resolved:
    """The command sent to the game and how it was found."""

    command: str
    how: str
    """``exact``, ``wording`` (put/move), ``bleu``, ``unmatched`` or ``no choices``."""


@cache
def _bleu() -> Callable[[str, str], float]:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    smoothing = SmoothingFunction().method4

    def score(reference: str, candidate: str) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(sentence_bleu([reference.split()], candidate.split(), smoothing_function=smoothing))

    return score


def resolve(text: str, admissible: Sequence[str], fuzzy: bool = True) -> Resolved:
    """The game command for the agent's ``text`` given the ``admissible`` commands.

    ``fuzzy=False`` turns the BLEU fallback off (only exact commands and the put/move wording).
    """
    action = normalize(text)
    if not admissible:
        return Resolved(action, "no choices")
    if action in admissible:
        return Resolved(action, "exact")
    alternative = other_wording(action)
    if alternative is not None and alternative in admissible:
        return Resolved(alternative, "wording")
    if fuzzy:
        score = _bleu()
        scores = [score(choice, action) for choice in admissible]
        best = max(range(len(scores)), key=scores.__getitem__)  # the first of equal scores, as numpy's argmax
        if scores[best] > BLEU_THRESHOLD:
            return Resolved(admissible[best], "bleu")
    return Resolved(action, "unmatched")
