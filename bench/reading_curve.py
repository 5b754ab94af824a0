"""How many warm-start steps until the tiny model reads what the environment said: a learning curve.

The main job's warm start must teach the model to read (a number inside guess's range, the
calculator's result copied into the next call, a legal gridroom move) before RL can teach the
choice; ``agentrl-train``'s warm-start probe says whether it did, once, after the whole SFT stage
(20 minutes of verl's SFT trainer for the main job). This bench answers the question before that:
it trains the tiny model on one task's *feasible* demonstrations (the warm start's, lost episodes
kept) with a plain PyTorch loop (loss on the assistant's tokens, AdamW, a constant LR, batches of
16 episodes), and every ``--probe-every`` steps samples the model's move (T 0.7) in the contexts
of 100 held-out demonstrator episodes and scores it with the task's own ``is_feasible``, as the
warm-start probe does. It prints one row per probe and writes ``bench/results/reading_curve_<task>_<model>.json``.

Not verl's SFT trainer (no FSDP, no padding to the batch's longest episode): a curve here costs
minutes, and the step at which reading appears is what carries over (docs/learning_runs.md,
session 15, compares the two on the main job's data).

    .venv/bin/python bench/reading_curve.py --task guess --steps 1500 \\
        --task-kwargs '{"high": 3, "starts": 7, "show_range": true, "max_turns": 2}'
    .venv/bin/python bench/reading_curve.py --task calc --hidden 64 --layers 2
    .venv/bin/python bench/reading_curve.py --task guess,calc,gridroom --lr 1e-3 --steps 3000 \\
        --task-kwargs '{"guess": {"high": 3, "starts": 7, "show_range": true, "max_turns": 2}, "gridroom": {"show_moves": true}}'
    .venv/bin/python bench/reading_curve.py --task guess,calc --number-tokens 0 --expert-noise '{"calc": 0.25}'

With several tasks, each step's batch is one task's, round robin (what a warm start without
padding across tasks would do), and every probe scores each task.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "envs" / "procedural"))

from procedural_helpers import TASKS, play  # noqa: E402

from agentrl_ext.data.expert import noisy_policy  # noqa: E402
from agentrl_ext.models.tiny import TinyModelSpec, build_model, build_tokenizer  # noqa: E402

CALL = re.compile(r"<tool_call>\s*(\{.*\})\s*</tool_call>", re.S)


def task_and_expert(task: str, split: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    module, _, name = TASKS[task].partition(":")
    return getattr(importlib.import_module(module), name)(split=split, **kwargs), importlib.import_module(
        f"agentrl_ext.envs.{task}.expert"
    )


async def demonstrations(
    task: Any, expert: Any, count: int, rng: random.Random, noise: float = 1.0
) -> list[list[dict[str, Any]]]:
    """``count`` episodes of the task's demonstrator, won and lost: each turn its feasible move with
    probability ``noise``, else the expert's (the main job's ``agentrl.sft.expert_noise``)."""
    if noise == 1.0:  # the feasible demonstrator alone, drawn as before --expert-noise existed
        policy = lambda m: expert.feasible_action(m, rng)  # noqa: E731
    else:
        policy = noisy_policy(task.name, noise, rng, move="feasible")
    return [(await play(task, index, policy)).messages for index in task.get_indices()[:count]]


def encode(
    tokenizer: Any, tools: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """Token ids of the whole episode and a mask of the assistant's tokens (the SFT loss's)."""
    ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        context = tokenizer.encode(
            tokenizer.apply_chat_template(
                messages[:i], tools=tools, add_generation_prompt=True, tokenize=False
            )
        )
        turn = tokenizer.encode(tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False))
        ids += context[len(ids) :]
        mask += [0] * (len(context) - len(mask))
        ids += turn[len(context) :]
        mask += [1] * (len(turn) - len(context))
    return ids, mask


def probe(
    model: Any,
    tokenizer: Any,
    tools: list[dict[str, Any]],
    expert: Any,
    episodes: list[Any],
    limit: int = 200,
) -> dict[str, float]:
    """The share of sampled moves consistent with what the environment said: at the opening of
    every episode, and in at most ``limit`` contexts after an answer."""
    counts = {"opening": [0, 0], "after": [0, 0]}
    model.eval()
    for messages in episodes:
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or (i > 1 and counts["after"][1] >= limit):
                continue
            ids = torch.tensor(
                [
                    tokenizer.encode(
                        tokenizer.apply_chat_template(
                            messages[:i], tools=tools, add_generation_prompt=True, tokenize=False
                        )
                    )
                ]
            )
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=40,
                    do_sample=True,
                    temperature=0.7,
                    pad_token_id=tokenizer.pad_token_id,
                )
            text = tokenizer.decode(out[0, ids.shape[1] :])
            try:
                call = json.loads(CALL.search(text).group(1))  # type: ignore[union-attr]
                arguments = (
                    call["arguments"]
                    if isinstance(call["arguments"], dict)
                    else json.loads(call["arguments"])
                )
                ok = bool(expert.is_feasible(messages[:i], call["name"], arguments))
            except (AttributeError, KeyError, TypeError, ValueError):
                ok = False
            where = "opening" if i == 1 else "after"
            counts[where][0] += ok
            counts[where][1] += 1
    model.train()
    return {where: (ok / n if n else float("nan")) for where, (ok, n) in counts.items()}


def expert_noise_of(text: str, names: list[str]) -> dict[str, float]:
    """``--expert-noise``: one probability for every task, or a JSON object per task (others 1.0)."""
    given = json.loads(text)
    if isinstance(given, dict):
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ValueError(f"names tasks not trained here: {unknown}")
        noise = {t: float(given.get(t, 1.0)) for t in names}
    elif isinstance(given, int | float):
        noise = dict.fromkeys(names, float(given))
    else:
        raise ValueError("give a number or a JSON object {task: number}")
    if not all(0.0 <= p <= 1.0 for p in noise.values()):
        raise ValueError("each value must be a probability in [0, 1]")
    return noise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--task",
        default="guess",
        help=f"one task of {','.join(sorted(TASKS))}, or several comma-separated: each step's batch is "
        "one task's, round robin (the warm start without padding across tasks)",
    )
    parser.add_argument(
        "--task-kwargs",
        default="{}",
        help="JSON: the task's kwargs (as agentrl.envs.task_kwargs); with several tasks {task: kwargs}",
    )
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--number-tokens", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--probe-every", type=int, default=250)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--episodes", type=int, default=1000, help="demonstrations to train on, per task")
    parser.add_argument(
        "--expert-noise",
        default="1.0",
        help="each demonstrated turn is the feasible move with this probability, else the expert's "
        "(agentrl.sft.expert_noise; default 1.0, the feasible demonstrator alone); one number for "
        'every task, or JSON per task such as \'{"calc": 0.25, "gridroom": 0.75}\' (others 1.0)',
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    names = [t for t in args.task.split(",") if t]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        parser.error(f"--task {args.task}: choose from {','.join(sorted(TASKS))}")
    try:
        noise = expert_noise_of(args.expert_noise, names)
    except ValueError as exc:
        parser.error(f"--expert-noise {args.expert_noise}: {exc}")
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    given = json.loads(args.task_kwargs)
    kwargs = {t: given.get(t, {}) for t in names} if len(names) > 1 else {names[0]: given}
    tasks = {}
    for name in names:
        train, expert = task_and_expert(name, "train", kwargs[name])
        test, _ = task_and_expert(name, "test", kwargs[name])
        tasks[name] = (
            train,
            expert,
            asyncio.run(demonstrations(train, expert, args.episodes, rng, noise[name])),
            asyncio.run(demonstrations(test, expert, 100, rng, noise[name])),
        )
    # the main job's tokenizer: the compact template, 32 expert episodes of each task in its corpus
    template = build_tokenizer(chat_template="compact")
    corpus = [
        template.apply_chat_template(m, tools=train.tools, tokenize=False)
        for train, _, episodes, _ in tasks.values()
        for m in episodes[:32]
    ]
    tokenizer = build_tokenizer(
        extra_corpus=corpus, chat_template="compact", number_tokens=args.number_tokens
    )
    spec = TinyModelSpec(
        hidden_size=args.hidden,
        num_layers=args.layers,
        intermediate_size=3 * args.hidden,
        num_kv_heads=4,
        number_tokens=args.number_tokens,
    )
    model = build_model(tokenizer, spec, seed=args.seed)
    model.train()
    data = {
        name: [encode(tokenizer, train.tools, m) for m in episodes]
        for name, (train, _, episodes, _) in tasks.items()
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    name = f"h{args.hidden}l{args.layers}"
    print(
        f"{args.task} {given} model {name} ({model.num_parameters()} parameters), {args.steps} steps at LR {args.lr}"
    )
    print("| step | task | loss (EMA) | opening consistent | after an answer consistent | wall s |")
    print("|---|---|---|---|---|---|")
    rows = []
    started = time.perf_counter()
    ema: dict[str, float] = {}
    for step in range(1, args.steps + 1):
        task = names[(step - 1) % len(names)]
        batch = rng.sample(data[task], 16)
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((16, width), tokenizer.pad_token_id)
        mask = torch.zeros(16, width)
        for row, (tokens, loss_mask) in enumerate(batch):
            ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(loss_mask)] = torch.tensor(loss_mask, dtype=torch.float)
        logits = model(input_ids=ids).logits[:, :-1]
        losses = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        loss = (losses.view(16, -1) * mask[:, 1:]).sum() / mask[:, 1:].sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        ema[task] = loss.item() if task not in ema else 0.98 * ema[task] + 0.02 * loss.item()
        if step % args.probe_every == 0 or step == args.steps:
            wall = time.perf_counter() - started
            for task, (train, expert, _, test_episodes) in tasks.items():
                shares = probe(model, tokenizer, train.tools, expert, test_episodes)
                rows.append({"step": step, "task": task, "loss_ema": ema.get(task), **shares, "wall_s": wall})
                print(
                    f"| {step} | {task} | {ema.get(task, float('nan')):.4f} | {shares['opening']:.2f} "
                    f"| {shares['after']:.2f} | {wall:.0f} |",
                    flush=True,
                )
    label = "+".join(names)
    out = args.out or ROOT / "bench" / "results" / f"reading_curve_{label}_{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "tasks": names,
                "task_kwargs": kwargs,
                "model": name,
                "lr": args.lr,
                "expert_noise": noise if len(set(noise.values())) > 1 else noise[names[0]],
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
