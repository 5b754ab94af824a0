"""Task advantage normalization (AgentRL, arXiv 2510.04206, Sec. 3.3).

After GRPO's group-relative advantages Â (Eq. for GRPO: Â = (r − mean_group) / (std_group + ε)),
AgentRL normalizes per task i over all of task i's loss-masked tokens in the batch:

    Ã = (Â − μ_i) / (σ_i + 1e-6),   μ_i, σ_i = mean, std of {Â_t : t in task i, mask_t = 1}

so that tasks with different reward scales and lengths contribute comparably to one
multi-task batch.

Zero spread means zero advantage, at both stages. verl's float32 GRPO turns a group whose
rewards are all equal into rounding noise (rewards −0.2 in a group of 8 give +0.015), and the
per-task division by σ_i + 1e-6 would blow that noise up to unit size. Here the group and task
statistics are taken in float64, and a group (or a task) whose values spread by no more than
``FLAT_TOL`` (relative to their magnitude, at least 1) gets exactly 0.

A flat group stays 0 through the task stage too: μ_i and σ_i are taken over the tokens of the
task's *informative* samples (groups with spread, and groups of one), and only those tokens are
normalized. Taken literally over all of the task's tokens, the centring gives every token of a
flat group the advantage −μ_i/σ_i, and μ_i is rarely 0 in multi-turn tasks because μ_i is
token-weighted and failed episodes are longer or shorter than successful ones (running to the
turn limit, or ending at a malformed first turn). In two CPU main-job runs μ_i ran from −0.14
to +0.17 (σ_i 0.3–0.9): every episode of an all-failed group was pushed up or down by up to
0.35 for no reason but the length statistics of other groups. A group with no reward spread
carries no signal, so here it gets none; the informative groups are normalized exactly as the
paper's formula says.

The verl entry point (``algorithm.adv_estimator=task_norm_grpo``, with per-turn credit) is
:mod:`agentrl_ext.algos.estimator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

TASK_NORM_EPS = 1e-6
#: values spread by at most this much (times max(1, |largest value|)) count as all equal
FLAT_TOL = 1e-6


def _is_flat(values: torch.Tensor) -> bool:
    """Whether ``values`` (non-empty) are all equal up to rounding noise."""
    spread = float(values.max() - values.min())
    return spread <= FLAT_TOL * max(1.0, float(values.abs().max()))


def grpo_outcome_advantage(
    scores: torch.Tensor, index: Sequence[Any], epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True
) -> torch.Tensor:
    """GRPO's per-sample advantage (r − mean_group) / (std_group + ε), in float64.

    As verl's ``compute_grpo_outcome_advantage``: the group std is the sample std (n − 1), and a
    group of one sample has mean 0 and std 1 (its advantage is its reward; task normalization then
    centres it). Unlike verl, a group of two or more whose rewards are all equal gets exactly 0.
    """
    return group_advantages(scores, index, epsilon, norm_adv_by_std_in_grpo)[0]


def group_advantages(
    scores: torch.Tensor, index: Sequence[Any], epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(GRPO advantages as :func:`grpo_outcome_advantage`, which values are informative: not in a
    flat group of two or more). Also the per-turn credit's rule within a state group."""
    values = scores.detach().to(torch.float64)
    out = torch.zeros_like(values)
    informative = torch.zeros(values.shape[0], dtype=torch.bool)
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(index):
        groups.setdefault(uid, []).append(row)
    for rows in groups.values():
        group = values[rows]
        if len(rows) == 1:
            out[rows] = group / (1.0 + epsilon) if norm_adv_by_std_in_grpo else group
            informative[rows] = True
            continue
        if _is_flat(group):
            continue  # zero spread: no signal, exactly 0
        centred = group - group.mean()
        out[rows] = centred / (group.std(correction=1) + epsilon) if norm_adv_by_std_in_grpo else centred
        informative[rows] = True
    return out, informative


def normalize_per_task(
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tasks: Sequence[str],
    eps: float = TASK_NORM_EPS,
    informative: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, dict[str, float]]]:
    """Apply Ã = (Â − μ_i)/(σ_i + eps) per task over masked tokens; returns (Ã, stats per task).

    ``σ_i`` is the population standard deviation of the task's masked token advantages
    (a task with one masked token gets σ=0). Unmasked tokens stay 0, and so does a task whose
    masked advantages are all equal. ``informative`` (one bool per sample; None: all) limits
    both the statistics and the normalization to those samples' tokens; the others stay 0.
    """
    if len(tasks) != advantages.shape[0]:
        raise ValueError(f"got {len(tasks)} task labels for a batch of {advantages.shape[0]} samples")
    mask = response_mask.bool()
    if informative is not None:
        mask = mask & informative.to(mask.device)[:, None]
    out = torch.zeros_like(advantages)
    stats: dict[str, dict[str, float]] = {}
    task_arr = np.asarray([str(t) for t in tasks], dtype=object)
    for task in sorted(set(task_arr.tolist())):
        rows = torch.as_tensor(task_arr == task)
        sel = mask & rows[:, None]
        values = advantages[sel]
        if values.numel() == 0:  # no informative sample (or no masked token): nothing to normalize
            zero = {k: 0.0 for k in ("adv_mean_before", "adv_std_before", "adv_mean_after", "adv_std_after")}
            stats[task] = {**zero, "tokens": 0.0, "samples": float(rows.sum())}
            continue
        values64 = values.to(torch.float64)
        mu, sigma = values64.mean(), values64.std(correction=0)
        if not _is_flat(values64):  # a task with zero spread (e.g. all groups flat) stays exactly 0
            out[sel] = ((values64 - mu) / (sigma + eps)).to(out.dtype)
        after = out[sel]
        stats[task] = {
            "adv_mean_before": float(mu),
            "adv_std_before": float(sigma),
            "adv_mean_after": float(after.mean()),
            "adv_std_after": float(after.std(correction=0)),
            "tokens": float(values.numel()),
            "samples": float(rows.sum()),
        }
    return out, stats


def compute_task_normalized_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    tasks: Sequence[str],
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """GRPO advantages, then per-task normalization; returns (advantages, returns, metrics).

    Samples without any loss-masked token (episodes the environment could not run, dropped
    by the agent loop) take no part in their group's statistics and get advantage 0.
    """
    alive = response_mask.sum(dim=-1) > 0
    grpo = torch.zeros_like(token_level_rewards)
    informative = torch.zeros(token_level_rewards.shape[0], dtype=torch.bool)
    if bool(alive.any()):
        rows = torch.nonzero(alive).flatten()
        per_sample, informative[rows] = group_advantages(
            token_level_rewards[rows].sum(dim=-1),
            np.asarray(index, dtype=object)[rows.numpy()].tolist(),
            epsilon,
            norm_adv_by_std_in_grpo,
        )
        grpo[rows] = per_sample.to(grpo.dtype)[:, None] * response_mask[rows].to(grpo.dtype)
    advantages, stats = normalize_per_task(grpo, response_mask, tasks, informative=informative)
    scores = token_level_rewards.sum(dim=-1)
    task_arr = np.asarray([str(t) for t in tasks], dtype=object)
    metrics: dict[str, float] = {}
    for task in sorted(set(task_arr.tolist())):
        prefix = f"agentrl/task/{task}/"
        rows = torch.as_tensor(task_arr == task)
        metrics.update({prefix + k: v for k, v in stats.get(task, {}).items()})
        metrics[prefix + "reward_mean"] = float(scores[rows].mean())
        # samples that carry a learning signal (their group has reward spread)
        metrics[prefix + "informative_samples"] = float((informative & rows).sum())
    return advantages, advantages, metrics
