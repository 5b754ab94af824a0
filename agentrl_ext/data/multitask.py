"""verl datasets of environment samples, with AgentRL's multi-task mixing.

One row per (task, index): ``data_source`` = task, ``agent_name`` = ``agentrl``, the
sample index JSON-encoded in ``extra_info.sample_index`` (AgentRL indices are ints or
strings, and one parquet column holds one type), and a placeholder prompt (the real opening
messages come from the environment at ``start_sample``).

Mixing (AgentRL): smaller tasks are repeated so that every task appears about as often
as the largest one, and the task streams are interleaved round-robin, each shuffled
with a seed. A task weight (``agentrl.assets.task_weights``, default 1) scales how often a task
appears: weight 2 puts it in the stream twice as often as the largest task, spread evenly.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl_ext import cli
from agentrl_ext.env.protocol import encode_sample_index

logger = logging.getLogger(__name__)

AGENT_NAME = "agentrl"


def sample_row(task: str, index: Any, split: str = "train") -> dict[str, Any]:
    """One dataset row for an environment sample."""
    return {
        "data_source": task,
        "agent_name": AGENT_NAME,
        # RLHFDataset needs a chat prompt; the episode's real one comes from the environment.
        "prompt": [{"role": "user", "content": f"{task} #{index}"}],
        "ability": "agent",
        "reward_model": {"style": "env", "ground_truth": ""},
        "extra_info": {"sample_index": encode_sample_index(index), "task": task, "split": split},
    }


def mix_tasks(
    indices_by_task: Mapping[str, Sequence[Any]],
    seed: int = 0,
    balance: bool = True,
    weights: Mapping[str, float] | None = None,
) -> list[tuple[str, Any]]:
    """AgentRL's mixing: (task, index) pairs, smaller tasks repeated to the largest, round-robin.

    Each task's list is shuffled with ``seed``; a task repeated ``k`` times gets a fresh
    shuffle per repetition. With ``balance``, a task's stream holds ``weight`` × the largest
    task's size (weights default to 1), and the streams are interleaved in proportion, each spread
    evenly (equal weights: plain round-robin). Empty tasks, and weights that are not positive or
    name no task, are errors that name them.
    """
    empty = sorted(t for t, idx in indices_by_task.items() if len(idx) == 0)
    if empty:
        raise ValueError(f"task(s) {empty} have no sample indices; check their workers' get_indices")
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(indices_by_task))
    if unknown:
        raise ValueError(
            f"task weight(s) for {unknown}, which are not among the run's tasks {sorted(indices_by_task)}"
        )
    bad = {t: w for t, w in weights.items() if not w > 0}
    if bad:
        raise ValueError(
            f"task weights must be > 0, got {bad}; leave a task out of the run instead of weight 0"
        )
    rng = random.Random(seed)
    target = max(len(idx) for idx in indices_by_task.values()) if indices_by_task else 0
    streams: dict[str, list[Any]] = {}
    for task in sorted(indices_by_task):
        pool = list(indices_by_task[task])
        stream: list[Any] = []
        want = max(1, round(target * weights.get(task, 1.0))) if balance else len(pool)
        while len(stream) < want:
            chunk = pool[:]
            rng.shuffle(chunk)
            stream += chunk[: want - len(stream)]
        streams[task] = stream
    # balanced: item k of a stream of length L sits at (k + 0.5) / L of the mixed stream; without
    # balance (each index once): position by position. Ties keep the task order.
    keyed = [
        ((k + 0.5) / len(stream) if balance else k, order, task, index)
        for order, (task, stream) in enumerate(streams.items())
        for k, index in enumerate(stream)
    ]
    return [(task, index) for _, _, task, index in sorted(keyed, key=lambda item: item[:2])]


def bounded_sample(
    indices_by_task: Mapping[str, Sequence[Any]], max_per_task: int | None, seed: int = 0
) -> dict[str, list[Any]]:
    """At most ``max_per_task`` indices of each task, drawn without replacement with ``seed`` and
    kept in the task's order (None: all of them)."""
    if max_per_task is None:
        return {task: list(idx) for task, idx in indices_by_task.items()}
    if max_per_task < 1:
        raise ValueError(f"max_per_task={max_per_task} must be >= 1")
    out = {}
    for task, idx in indices_by_task.items():
        chosen = set(random.Random(f"{seed}:{task}").sample(range(len(idx)), min(max_per_task, len(idx))))
        out[task] = [index for i, index in enumerate(idx) if i in chosen]
    return out


def write_dataset(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as a verl parquet file (atomically)."""
    import pandas as pd

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    frame = pd.DataFrame(rows)
    frame["extra_info"] = [{**r["extra_info"], "index": i} for i, r in enumerate(rows)]
    frame.to_parquet(tmp)
    tmp.replace(out)
    return out


def build_multitask_dataset(
    indices_by_task: Mapping[str, Sequence[Any]],
    path: str | Path,
    seed: int = 0,
    split: str = "train",
    weights: Mapping[str, float] | None = None,
) -> Path:
    """Mix and write; returns the parquet path (``weights`` apply to the train split only)."""
    train = split == "train"
    mixed = mix_tasks(indices_by_task, seed=seed, balance=train, weights=weights if train else None)
    return write_dataset([sample_row(t, i, split) for t, i in mixed], path)


async def fetch_indices(controller_url: str, tasks: Sequence[str]) -> dict[str, list[Any]]:
    """Ask the controller for each task's sample indices."""
    from agentrl_ext.env.client import ControllerClient

    async with ControllerClient(controller_url) as client:
        return {task: list(await client.get_indices(task)) for task in tasks}


async def fetch_splits(controller_url: str, tasks: Sequence[str]) -> dict[str, list[str]]:
    """The data splits the workers of each task report serving (none for a task without splits)."""
    from agentrl_ext.env.client import ControllerClient

    async with ControllerClient(controller_url) as client:
        workers = await client.list_workers()
    return {task: sorted({w.split for w in workers.get(task, []) if w.split}) for task in tasks}


def held_out_splits(splits: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """The tasks whose workers serve a split other than ``train`` (a held-out split), with those splits."""
    return {
        task: [s for s in names if s != "train"] for task, names in splits.items() if set(names) - {"train"}
    }


def check_training_splits(
    splits: Mapping[str, Sequence[str]], controller_url: str, fix: str, allowed: bool = False
) -> str | None:
    """Refuse (ValueError) a training set built from a held-out split, unless ``allowed``; then
    return the warning to print. ``fix`` says how to serve the train split instead."""
    held_out = held_out_splits(splits)
    if not held_out:
        return None
    what = ", ".join(f"{task}: {'/'.join(names)}" for task, names in held_out.items())
    if not allowed:
        raise ValueError(
            f"the workers at {controller_url} serve held-out split(s) ({what}); a training set built from them "
            f"trains on the evaluation samples. {fix}"
        )
    return f"warning: this training set is built from held-out split(s) ({what}), as asked"


def build_parser() -> argparse.ArgumentParser:
    """``agentrl-build-dataset``'s arguments."""
    parser = cli.parser("agentrl-build-dataset", __doc__)
    cli.add_controller_url(parser)
    cli.add_tasks(parser)
    parser.add_argument("--out", required=True, help="the parquet file to write")
    parser.add_argument(
        "--kind",
        "--split",  # the old name of this option (it never chose the environment's split)
        dest="kind",
        default="train",
        choices=["train", "val"],
        help="train: AgentRL's mixing (smaller tasks repeated to the largest); val: every index once",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the shuffles")
    parser.add_argument(
        "--max-per-task",
        type=int,
        default=None,
        help="at most this many samples of each task, drawn with --seed (a bounded validation set)",
    )
    parser.add_argument(
        "--allow-held-out",
        action="store_true",
        help="build a training set even though the workers serve a held-out (test) split",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``agentrl-build-dataset --tasks a,b --out train.parquet``."""
    from agentrl_ext.env.client import ControllerError, ControllerUnavailable, unreachable_message

    parser = build_parser()
    args = parser.parse_args(argv)
    missing = [name for name in ("pandas", "pyarrow") if importlib.util.find_spec(name) is None]
    if missing:
        # the base install is the environment side only; the parquet writer comes with an extra
        parser.error(f"writing parquet needs {' and '.join(missing)}: pip install 'agentrl_ext[data]'")
    tasks = cli.tasks_of(args.tasks)
    try:
        indices = asyncio.run(fetch_indices(args.controller_url, tasks))
        warning = None
        if args.kind == "train":
            splits = asyncio.run(fetch_splits(args.controller_url, tasks))
            fix = (
                "Serve the train split (agentrl-envs up --split train, the default), build an evaluation "
                "set with --kind val, or pass --allow-held-out if you mean it."
            )
            warning = check_training_splits(splits, args.controller_url, fix, allowed=args.allow_held_out)
    except ControllerUnavailable:
        parser.exit(1, f"agentrl-build-dataset: {unreachable_message(args.controller_url)}\n")
    except (ControllerError, ValueError) as exc:  # the message alone, no traceback
        parser.exit(1, f"agentrl-build-dataset: {exc}\n")
    if warning:
        print(warning, file=sys.stderr)
    try:
        indices = bounded_sample(indices, args.max_per_task, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    path = build_multitask_dataset(indices, args.out, seed=args.seed, split=args.kind)
    counts = ", ".join(f"{t}: {len(i)}" for t, i in indices.items())
    print(f"wrote {path} ({counts})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
