"""Where guess's moves go, in an evaluation's episodes (a diagnostic for ``guess``).

Two questions, one table each, one column per file:

- **the first guess**: the middle of the opening's range (binary search's guess, ``(low + high) //
  2``), its bottom, its top, another number inside it, a number outside it, or no guess (no
  ``guess`` call with an integer ``number``), with how many of those episodes were won;
- **the guess after an answer that left one number** (``lower: from 527 to 527``, ``lower: one of
  527``): that number copied, one below it, one above it, another number, or no guess. A policy
  that reads the answers copies it every time; a split whose test answers leave numbers training
  never left shows here (docs/learning_runs.md, session 20).

    python -m agentrl_ext.eval.guess_moves RUN/eval/before_rl.episodes.jsonl [...] [--out moves.json]

prints both tables and writes the counts as JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentrl_ext import cli
from agentrl_ext.envs.guess.expert import feasible_range
from agentrl_ext.eval.report import count_episode_files

FIRST = ("middle", "bottom", "top", "other inside", "outside", "no guess")
AFTER_ONE_LEFT = ("copied", "one below", "one above", "other", "no guess")


def _guesses(messages: list[dict[str, Any]]) -> list[int | None]:
    """The number of each assistant turn's first ``guess`` call (None: no such call)."""
    numbers: list[int | None] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or []
        number = None
        if calls and calls[0].get("function", {}).get("name") == "guess":
            try:
                value = json.loads(calls[0]["function"]["arguments"]).get("number")
            except (json.JSONDecodeError, AttributeError, TypeError):
                value = None
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            if isinstance(value, int) and not isinstance(value, bool):
                number = value
        numbers.append(number)
    return numbers


def _before_turn(messages: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """The conversation up to (not including) the ``turn``-th assistant message."""
    seen = 0
    for position, message in enumerate(messages):
        if message.get("role") == "assistant":
            if seen == turn:
                return messages[:position]
            seen += 1
    return messages


def first_guess(messages: list[dict[str, Any]]) -> str:
    """The class (:data:`FIRST`) of the first guess of a guess episode's ``messages``."""
    try:
        low, high = feasible_range(_before_turn(messages, 0))
    except ValueError as exc:
        raise ValueError(f"not a guess episode ({exc}): {messages[:1]!r}") from exc
    guesses = _guesses(messages)
    number = guesses[0] if guesses else None
    if number is None:
        return "no guess"
    if not low <= number <= high:
        return "outside"
    if number == (low + high) // 2:
        return "middle"
    return "bottom" if number == low else "top" if number == high else "other inside"


def after_one_left(messages: list[dict[str, Any]]) -> list[str]:
    """The class (:data:`AFTER_ONE_LEFT`) of each guess made where the answers left one number."""
    classes = []
    for turn, number in enumerate(_guesses(messages)):
        if turn == 0:
            continue
        try:
            low, high = feasible_range(_before_turn(messages, turn))
        except (ValueError, KeyError, TypeError):  # an earlier call the task could not read
            break
        if low != high:
            continue
        if number is None:
            classes.append("no guess")
        else:
            classes.append({0: "copied", -1: "one below", 1: "one above"}.get(number - low, "other"))
    return classes


def count(episodes: Iterable[dict[str, Any]]) -> dict[str, Counter[str]]:
    """For the guess episodes among ``episodes`` (rows of an ``*.episodes.jsonl``): first guesses
    (``first``), how many of each were won (``won``) and the guesses after one number was left
    (``after_one_left``)."""
    first: Counter[str] = Counter()
    won: Counter[str] = Counter()
    after: Counter[str] = Counter()
    for episode in episodes:
        if episode.get("task") != "guess":
            continue
        kind = first_guess(episode["messages"])
        first[kind] += 1
        won[kind] += bool(episode.get("success"))
        after.update(after_one_left(episode["messages"]))
    return {"first": first, "won": won, "after_one_left": after}


def tables(counts: dict[str, dict[str, Counter[str]]]) -> str:
    """Two markdown tables, one column per file: first guesses (episodes, won), then guesses after
    one number was left (share)."""
    names = list(counts)
    lines = ["| first guess | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for kind in FIRST:
        cells = [f"{counts[n]['first'][kind]} ({counts[n]['won'][kind]} won)" for n in names]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines += ["", "| guess after one number was left | " + " | ".join(names) + " |"]
    lines.append("|---" * (len(names) + 1) + "|")
    for kind in AFTER_ONE_LEFT:
        cells = []
        for name in names:
            total = sum(counts[name]["after_one_left"].values())
            share = counts[name]["after_one_left"][kind]
            cells.append(f"{share} ({100 * share / total:.0f}%)" if total else "-")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser("python -m agentrl_ext.eval.guess_moves", __doc__)
    parser.add_argument("episodes", nargs="+", type=Path, help="*.episodes.jsonl files of evaluations")
    parser.add_argument("--out", type=Path, default=None, help="write the counts per file as JSON")
    args = parser.parse_args(argv)
    try:
        counts = count_episode_files(args.episodes, count)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    print(tables(counts))
    if args.out is not None:
        out = {name: {key: dict(c) for key, c in parts.items()} for name, parts in counts.items()}
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
