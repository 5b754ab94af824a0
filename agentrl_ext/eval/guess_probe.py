"""What a checkpoint guesses at the deciding node of each secret (a diagnostic for ``guess``).

For every secret the expert's binary search is played up to the node where its next guess is
the secret; the checkpoint then samples its next turn there, ``samples`` times. The table shows,
per secret, the expert's guesses, the depth and the checkpoint's guesses by count (``bad``: no
parsable ``guess`` call). A policy that solves depth 3 but not depth 4 shows it at once, and
two checkpoints side by side show which nodes RL moved (runs K4 and D1 in docs/learning_runs.md).

    python -m agentrl_ext.eval.guess_probe CHECKPOINT [--samples 32] [--temperature 0.7] [--show-range] [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl_ext.envs.guess.expert import expert_action
from agentrl_ext.envs.guess.task import TOOLS, GuessTask, feedback, narrow, opening
from agentrl_ext.eval.warm_start_probe import hf_sampler as batch_sampler
from agentrl_ext.eval.warm_start_probe import parse_move

#: ``messages`` (the conversation up to the node) -> the texts of ``samples`` sampled next turns
Sampler = Callable[[list[dict[str, Any]]], list[str]]
BAD = "bad"


def deciding_node(
    secret: int, high: int, max_turns: int, show_range: bool = False
) -> tuple[list[dict[str, Any]], list[int]]:
    """The conversation up to the expert's guess of ``secret``, and all the expert's guesses
    (``show_range``: the answers name the range left, as the task's ``show_range`` does)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": opening(high, max_turns)}]
    guesses: list[int] = []
    left = (1, high)
    while True:
        action = expert_action(messages)
        number = int(json.loads(action["tool_calls"][0]["function"]["arguments"])["number"])
        guesses.append(number)
        if number == secret or len(guesses) > high:
            return messages, guesses
        left = narrow(*left, number, feedback(number, secret))
        messages = [
            *messages,
            action,
            {
                "role": "tool",
                "tool_call_id": action["tool_calls"][0]["id"],
                "content": feedback(number, secret, left if show_range else None),
            },
        ]


def guessed_number(text: str) -> int | str:
    """The number a sampled turn guesses, read as the guess worker reads it, or :data:`BAD`
    (the worker would end the sample: no call, another tool, arguments that are not a number)."""
    from agentrl_ext.env.worker import InvalidAction
    from agentrl_ext.env.worker.actions import ToolCall
    from agentrl_ext.envs.procedural import integer_argument

    move = parse_move(text, ["guess"])
    if move is None:
        return BAD
    try:
        return integer_argument(ToolCall(None, *move), "number")
    except InvalidAction:
        return BAD


def probe(
    sample: Sampler, high: int = 16, max_turns: int = 6, show_range: bool = False
) -> list[dict[str, Any]]:
    """One row per secret ``1..high``: expert guesses, depth, the sampled guesses, share correct."""
    rows = []
    for secret in range(1, high + 1):
        messages, guesses = deciding_node(secret, high, max_turns, show_range)
        counts = Counter(guessed_number(text) for text in sample(messages))
        total = sum(counts.values())
        rows.append(
            {
                "secret": secret,
                "depth": len(guesses),
                "expert": guesses,
                "guesses": {str(k): v for k, v in counts.most_common()},
                "correct": counts.get(secret, 0) / total if total else 0.0,
            }
        )
    return rows


def hf_sampler(
    checkpoint: str | Path, samples: int, temperature: float, max_tokens: int, seed: int
) -> Sampler:
    """Samples next turns from a local HF checkpoint (greedy at temperature 0): the warm-start
    probe's sampler (:func:`agentrl_ext.eval.warm_start_probe.hf_sampler`) on guess's tools."""
    batch = batch_sampler(checkpoint, samples, temperature, max_tokens=max_tokens, seed=seed)
    return lambda messages: batch([(messages, TOOLS)])[0]


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'secret':>6}  {'depth':>5}  {'expert guesses':<18}  {'correct':>7}  checkpoint's guesses (count)"
    ]
    for row in rows:
        guesses = ", ".join(f"{k}: {v}" for k, v in row["guesses"].items())
        expert = " ".join(map(str, row["expert"]))
        lines.append(
            f"{row['secret']:>6}  {row['depth']:>5}  {expert:<18}  {row['correct']:>7.0%}  {guesses}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentrl_ext.eval.guess_probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "checkpoint", help="a local HF checkpoint folder (e.g. RUN/global_step_30/actor/huggingface)"
    )
    parser.add_argument("--samples", type=int, default=32, help="next turns sampled per node (default 32)")
    parser.add_argument(
        "--temperature", type=float, default=0.7, help="0: greedy (default 0.7, the recipe's)"
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="cap on the sampled turn's tokens")
    parser.add_argument("--high", type=int, default=16, help="the task's range 1..high (default 16)")
    parser.add_argument(
        "--max-turns", type=int, default=GuessTask.default_max_turns, help="as the task's opening says"
    )
    parser.add_argument(
        "--show-range", action="store_true", help="the answers name the range left (the task's show_range)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON rows")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.temperature < 0 or args.high < 2:
        parser.error(
            f"need --samples >= 1, --temperature >= 0, --high >= 2 (got {args.samples}, {args.temperature}, {args.high})"
        )
    if not Path(args.checkpoint).is_dir():
        parser.error(f"checkpoint {args.checkpoint} is not a folder (a local HF checkpoint)")
    sampler = hf_sampler(args.checkpoint, args.samples, args.temperature, args.max_tokens, args.seed)
    rows = probe(sampler, high=args.high, max_turns=args.max_turns, show_range=args.show_range)
    print(format_table(rows))
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {
                    "checkpoint": str(args.checkpoint),
                    "settings": vars(args) | {"out": str(args.out)},
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
