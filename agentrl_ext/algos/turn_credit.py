"""Per-turn credit: an advantage for each turn from the turns taken in the same state.

``task_norm_grpo`` gives every token of an episode the same advantage, so a multi-turn episode's
right and wrong turns are pushed together. Here turns taken in the same state (the same token
context: the same prompt, the same turns and answers before them) anywhere in the batch form a
group, as GiGPO's anchor-state groups (arXiv 2505.10978, "step-level advantage"). A turn's
return is its episode's reward discounted by ``gamma`` for each later turn of the episode,

    G_t = gamma ** (T - 1 - t) * R     (turn t of T, reward R at the end)

and its advantage within its group of two or more is (G_t - mean) / (std + eps), the group's
sample std, as GRPO's. A group of one, or whose returns are all equal, gives 0. Each token of the
turn gets the episode advantage plus ``weight`` times the turn's (:mod:`agentrl_ext.algos.task_norm`).

The agent loop records per turn the digest of its context and the offset of its first token in
the response (``extra_fields["agentrl"]["turn_states"]``, ``["turn_offsets"]``, with
``["turn_tokens"]``); the trainer hands them to the estimator as
:class:`~agentrl_ext.algos.task_context.BatchTurns`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from agentrl_ext.algos.task_context import BatchTurns
from agentrl_ext.algos.task_norm import group_advantages

EPS = 1e-6


def turn_returns(num_turns: int, reward: float, gamma: float) -> list[float]:
    """Each turn's return: ``reward`` discounted by ``gamma`` per later turn."""
    return [reward * gamma ** (num_turns - 1 - t) for t in range(num_turns)]


def turn_advantages(
    states: Sequence[Sequence[str]],
    rewards: Sequence[float],
    tasks: Sequence[str],
    gamma: float,
    eps: float = EPS,
) -> tuple[list[list[float]], dict[str, float]]:
    """Per row, per turn: the turn's advantage within its state group; and per-task metrics."""
    if not len(states) == len(rewards) == len(tasks):
        raise ValueError(
            f"turn states for {len(states)} rows, rewards for {len(rewards)}, tasks for {len(tasks)}"
        )
    # every turn, flattened: its (task, state) group and its return
    where = [(row, turn) for row, row_states in enumerate(states) for turn in range(len(row_states))]
    keys = [(str(tasks[row]), str(states[row][turn])) for row, turn in where]
    returns = [turn_returns(len(row), float(r), gamma) for row, r in zip(states, rewards, strict=True)]
    values, signal = group_advantages(
        torch.tensor([returns[row][turn] for row, turn in where], dtype=torch.float64), keys, eps
    )
    sizes = Counter(keys)
    out = [[0.0] * len(row) for row in states]
    shared: Counter[str] = Counter()
    informative: Counter[str] = Counter()
    for (row, turn), key, value, has_signal in zip(
        where, keys, values.tolist(), signal.tolist(), strict=True
    ):
        if sizes[key] < 2:  # a state no other turn was taken in: nothing to compare with
            continue
        shared[key[0]] += 1
        if has_signal:
            out[row][turn] = float(value)
            informative[key[0]] += 1
    metrics: dict[str, float] = {}
    for task in sorted({str(t) for t in tasks}):
        turns = sum(len(s) for s, t in zip(states, tasks, strict=True) if str(t) == task)
        prefix = f"agentrl/task/{task}/turn_credit/"
        # turns whose state another turn of the batch shared, and those whose group's returns differ
        metrics[prefix + "shared_turns"] = shared.get(task, 0) / turns if turns else 0.0
        metrics[prefix + "informative_turns"] = informative.get(task, 0) / turns if turns else 0.0
    return out, metrics


def spread_over_tokens(
    per_turn: Sequence[Sequence[float]],
    offsets: Sequence[Sequence[int]],
    lengths: Sequence[Sequence[int]],
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """A ``response_mask``-shaped tensor: each turn's value on its tokens (``offsets``, ``lengths``
    in the response), 0 elsewhere and wherever the mask is 0.

    Raises ``ValueError`` when a token of the mask lies in no turn: the records do not describe
    these rows (the mask may lose tokens, e.g. to rejection sampling, but never gains any).
    """
    out = torch.zeros(response_mask.shape, dtype=torch.float64)
    covered = torch.zeros(response_mask.shape, dtype=torch.bool)
    width = response_mask.shape[1]
    for row, (values, starts, counts) in enumerate(zip(per_turn, offsets, lengths, strict=True)):
        if not len(values) == len(starts) == len(counts):
            raise ValueError(
                f"row {row}: {len(values)} turn values, {len(starts)} offsets, {len(counts)} lengths"
            )
        for value, start, count in zip(values, starts, counts, strict=True):
            end = min(start + count, width)  # a turn cut off by the response length keeps its head
            out[row, start:end] = value
            covered[row, start:end] = True
    stray = response_mask.bool() & ~covered
    if bool(stray.any()):
        row = int(torch.nonzero(stray)[0, 0])
        raise ValueError(
            f"row {row}: {int(stray[row].sum())} loss-mask token(s) lie in none of its recorded turns; "
            "the turn records are not this batch's rows"
        )
    return out * response_mask.to(torch.float64)


def add_turn_credit(
    advantages: torch.Tensor,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    tasks: Sequence[str],
    turns: BatchTurns,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``advantages`` plus ``turns.weight`` times each turn's advantage in its state group on the
    turn's tokens; and the per-task metrics."""
    rewards = token_level_rewards.sum(dim=-1).tolist()
    per_turn, metrics = turn_advantages(turns.states, rewards, tasks, turns.gamma)
    step = spread_over_tokens(per_turn, turns.offsets, turns.lengths, response_mask)
    return (advantages.to(torch.float64) + turns.weight * step).to(advantages.dtype), metrics
