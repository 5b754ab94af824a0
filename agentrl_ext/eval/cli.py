"""``agentrl-eval-run``: evaluate a local checkpoint or OpenAI-compatible models on tasks.

    agentrl-eval-run --controller-url http://127.0.0.1:5020/api --tasks guess_test --indices 0:100 \\
        --model .cache/agentrl/runs/main/sft_model --out eval/sft.json
    agentrl-eval-run --controller-url http://127.0.0.1:5020/api --tasks dbbench \\
        --base-url http://127.0.0.1:8000/v1 --model Qwen2.5-14B --model Llama-3.1-8B --runs 2

Prints the per-task table and writes the summary as JSON (``--out``) and every episode, with its
transcript (messages, tool calls, tool answers, status, reward, the model of each turn), as JSON
Lines beside it; ``--resume`` skips the episodes already finished there. Exits 1,
with a summary on stderr, when episodes failed for reasons outside the agent (an unreachable
model endpoint or environment, task errors): their 0 % measures nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from agentrl_ext import cli
from agentrl_ext.env.client import ControllerUnavailable, unreachable_message
from agentrl_ext.eval.report import episodes_path, render_table
from agentrl_ext.eval.runner import DEFAULT_API_KEY_ENV, EvalSettings, evaluate, parse_indices


def _success_reward(values: list[str] | None) -> float | dict[str, float]:
    """``0.5`` for every task, or ``task=0.5`` per task (a bare value is the default of the others)."""
    if not values:
        return 1.0
    per_task: dict[str, float] = {}
    for value in values:
        task, _, number = value.rpartition("=")
        try:
            per_task[task or "*"] = float(number)
        except ValueError:
            raise ValueError(
                f"--success-reward {value!r} must be a number or TASK=NUMBER, e.g. webshop=0.5"
            ) from None
    return per_task["*"] if list(per_task) == ["*"] else per_task


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("agentrl-eval-run", __doc__)
    cli.add_controller_url(p)
    cli.add_tasks(p, help="task names as registered, comma-separated (or --tasks repeated)")
    p.add_argument(
        "--indices",
        help="index values to evaluate, e.g. 0:100 or 1,5,9 (none: all the task's workers offer)",
    )
    p.add_argument("--limit", type=int, help="at most the first N selected indices per task")
    p.add_argument(
        "--model",
        action="append",
        required=True,
        help="a local HF checkpoint folder; with --base-url a model name; or name=URL,model[,weight]. "
        "Several: one model drawn per turn (cross-sampling)",
    )
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    p.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        help="environment variable holding the endpoint's API key",
    )
    p.add_argument("--runs", type=int, default=EvalSettings.runs, help="episodes per (task, index)")
    p.add_argument("--concurrency", type=int, default=EvalSettings.concurrency, help="episodes in flight")
    p.add_argument("--temperature", type=float, default=EvalSettings.temperature, help="0: greedy")
    p.add_argument("--top-p", type=float, default=EvalSettings.top_p)
    p.add_argument(
        "--max-turns",
        type=int,
        default=EvalSettings.max_turns,
        help="cap on assistant turns (tasks have their own limits)",
    )
    p.add_argument("--max-tokens", type=int, help="cap on one assistant turn's tokens")
    p.add_argument(
        "--prompt-length",
        type=int,
        default=EvalSettings.prompt_length,
        help="local models: opening prompt limit (tokens)",
    )
    p.add_argument(
        "--response-length",
        type=int,
        default=EvalSettings.response_length,
        help="local models: episode budget after the prompt",
    )
    p.add_argument("--dtype", default=EvalSettings.dtype, help="local models: float32, bfloat16 or float16")
    p.add_argument(
        "--success-reward",
        action="append",
        help="success = completed with reward >= this (none: 1); NUMBER or TASK=NUMBER, repeatable",
    )
    p.add_argument("--seed", type=int, default=EvalSettings.seed, help="seeds model draws and local sampling")
    p.add_argument("--label", default="", help="name of this evaluation in tables and plots, e.g. before_rl")
    p.add_argument(
        "--out",
        default="eval_results.json",
        help="the summary file (JSON); every episode with its transcript goes beside it, to "
        "OUT_STEM.episodes.jsonl",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="skip the episodes the episodes file already holds finished (failed ones run again)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--log-level", default="WARNING")
    return p


def main(argv: list[str] | None = None) -> int:
    """Console script ``agentrl-eval-run``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    tasks = cli.tasks_of(args.tasks)
    kwargs: dict[str, Any] = {}
    try:
        settings = EvalSettings(
            runs=args.runs,
            concurrency=args.concurrency,
            temperature=args.temperature,
            top_p=args.top_p,
            max_turns=args.max_turns,
            max_tokens=args.max_tokens,
            prompt_length=args.prompt_length,
            response_length=args.response_length,
            dtype=args.dtype,
            success_reward=_success_reward(args.success_reward),
            seed=args.seed,
        )
        if args.indices:
            kwargs["indices"] = parse_indices(args.indices)
        if args.limit is not None and args.limit < 1:
            raise ValueError(f"--limit {args.limit} must be >= 1")
        report = evaluate(
            args.controller_url,
            tasks,
            args.model,
            settings,
            limit=args.limit,
            base_url=args.base_url,
            api_key=os.environ.get(args.api_key_env) or None,
            label=args.label,
            progress=not args.no_progress,
            episodes_out=episodes_path(args.out),
            resume=args.resume,
            **kwargs,
        )
    except ValueError as exc:
        parser.error(str(exc))
    except ControllerUnavailable:
        parser.exit(1, f"agentrl-eval-run: {unreachable_message(args.controller_url)}\n")
    path = report.save(args.out)
    print(render_table(report))
    print(f"results: {path} (summary), {episodes_path(path)} (every episode)", file=sys.stderr)
    failures = report.failure_summary()
    if failures:
        # the table's 0 % of these is no measurement of the agent: fail, and say why
        print(f"agentrl-eval-run: {failures}", file=sys.stderr)
        return 1
    return 0


def eval_pool_main(argv: list[str] | None = None) -> int:
    """``agentrl-eval-pool`` (deprecated): ``agentrl-eval-run``, whose ``--model name=URL,model[,weight]``
    is the old ``--member`` (repeat it for a cross-sampled pool)."""
    args = list(sys.argv[1:] if argv is None else argv)
    print(
        "agentrl-eval-pool is deprecated and runs agentrl-eval-run: write --model name=URL,model[,weight] "
        "for each --member",
        file=sys.stderr,
    )
    return main([a.replace("--member", "--model", 1) if a.startswith("--member") else a for a in args])


if __name__ == "__main__":
    raise SystemExit(main())
