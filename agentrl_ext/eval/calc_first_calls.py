"""What calc's first calculator call copied, in an evaluation's episodes (a diagnostic for ``calc``).

The opening of ``(a op1 b) op2 c`` has two right first steps: the bracket's ``a op1 b`` and the
other grouping's ``b op2 c``. Each first call falls in one class:

- ``bracket``, ``other grouping``: one of those steps;
- ``mixed``: only the problem's numbers, but no step of it (e.g. ``a op1 c``: the groupings' tokens
  mixed);
- ``off by one``: a number one away from one of the problem's (a habit from another task's numbers,
  docs/learning_runs.md, session 18);
- ``other``: any other step; ``no step``: no calculator call, or an expression that is not one
  step ``x op y``.

    python -m agentrl_ext.eval.calc_first_calls RUN/eval/before_rl.episodes.jsonl [...] [--out calls.json]

prints one column per file (share of the file's calc episodes) and writes the counts as JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentrl_ext import cli
from agentrl_ext.envs.calc.expert import opening_problem
from agentrl_ext.envs.calc.task import parse_step
from agentrl_ext.eval.report import count_episode_files

CLASSES = ("bracket", "other grouping", "mixed", "off by one", "other", "no step")


def classify(messages: list[dict[str, Any]]) -> str:
    """The class (:data:`CLASSES`) of the first assistant call in a calc episode's ``messages``."""
    try:
        a, op1, b, op2, c = opening_problem(messages)
    except ValueError as exc:
        raise ValueError(f"not a calc episode ({exc}): {messages[0]!r}") from exc
    move = next((m for m in messages if m.get("role") == "assistant"), None)
    calls = (move or {}).get("tool_calls") or []
    if not calls or calls[0]["function"]["name"] != "calculator":
        return "no step"
    try:
        expression = json.loads(calls[0]["function"]["arguments"]).get("expression")
    except (json.JSONDecodeError, AttributeError):
        return "no step"
    step = parse_step(expression) if isinstance(expression, str) else None
    if step is None:
        return "no step"
    if step == (a, op1, b):
        return "bracket"
    if step == (b, op2, c):
        return "other grouping"
    numbers = {a, b, c}
    x, _, y = step
    if x in numbers and y in numbers:
        return "mixed"
    if any(abs(v - n) == 1 for v in (x, y) if v not in numbers for n in numbers):
        return "off by one"
    return "other"


def count(episodes: Iterable[dict[str, Any]]) -> Counter[str]:
    """Classes of the calc episodes among ``episodes`` (rows of an ``*.episodes.jsonl``)."""
    return Counter(classify(e["messages"]) for e in episodes if e.get("task") == "calc")


def table(counts: dict[str, Counter[str]]) -> str:
    """A markdown table: one row per class, one column per file (share of its calc episodes)."""
    names = list(counts)
    lines = ["| first calculator call | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for kind in CLASSES:
        cells = []
        for name in names:
            total = sum(counts[name].values())
            cells.append(f"{100 * counts[name][kind] / total:.0f}%" if total else "-")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append("| calc episodes | " + " | ".join(str(sum(counts[n].values())) for n in names) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser("python -m agentrl_ext.eval.calc_first_calls", __doc__)
    parser.add_argument("episodes", nargs="+", type=Path, help="*.episodes.jsonl files of evaluations")
    parser.add_argument("--out", type=Path, default=None, help="write the counts per file as JSON")
    args = parser.parse_args(argv)
    try:
        counts = count_episode_files(args.episodes, count)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    print(table(counts))
    if args.out is not None:
        args.out.write_text(json.dumps({name: dict(c) for name, c in counts.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
