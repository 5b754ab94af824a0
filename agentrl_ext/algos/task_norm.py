"""Task advantage normalization (AgentRL, arXiv 2510.04206, Sec. 3.3).

After GRPO's group-relative advantages Â (Eq. for GRPO: Â = (r − mean_group) / (std_group + ε)),
AgentRL normalizes per task i over all of task i's loss-masked tokens in the batch:

    Ã = (Â − μ_i) / (σ_i + 1e-6),   μ_i, σ_i = mean, std of {Â_t : t in task i, mask_t = 1}

so that tasks with different reward scales and lengths contribute comparably to one
multi-task batch. Registered in verl as ``algorithm.adv_estimator=task_norm_grpo``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est

from agentrl_ext.algos import task_context

ESTIMATOR_NAME = "task_norm_grpo"
TASK_NORM_EPS = 1e-6


def normalize_per_task(
    advantages: torch.Tensor, response_mask: torch.Tensor, tasks: Sequence[str], eps: float = TASK_NORM_EPS
) -> tuple[torch.Tensor, dict[str, dict[str, float]]]:
    """Apply Ã = (Â − μ_i)/(σ_i + eps) per task over masked tokens; returns (Ã, stats per task).

    ``σ_i`` is the population standard deviation of the task's masked token advantages
    (a task with one masked token gets σ=0). Unmasked tokens stay 0.
    """
    if len(tasks) != advantages.shape[0]:
        raise ValueError(f"got {len(tasks)} task labels for a batch of {advantages.shape[0]} samples")
    mask = response_mask.bool()
    out = torch.zeros_like(advantages)
    stats: dict[str, dict[str, float]] = {}
    task_arr = np.asarray([str(t) for t in tasks], dtype=object)
    for task in sorted(set(task_arr.tolist())):
        rows = torch.as_tensor(task_arr == task)
        sel = mask & rows[:, None]
        values = advantages[sel]
        if values.numel() == 0:
            continue
        mu, sigma = values.mean(), values.std(correction=0)
        out[sel] = (values - mu) / (sigma + eps)
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
    if bool(alive.any()):
        rows = torch.nonzero(alive).flatten()
        grpo[rows], _ = compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards[rows],
            response_mask=response_mask[rows],
            index=np.asarray(index, dtype=object)[rows.numpy()],
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        )
    advantages, stats = normalize_per_task(grpo, response_mask, tasks)
    scores = token_level_rewards.sum(dim=-1)
    task_arr = np.asarray([str(t) for t in tasks], dtype=object)
    metrics: dict[str, float] = {}
    for task, values in stats.items():
        prefix = f"agentrl/task/{task}/"
        metrics.update({prefix + k: v for k, v in values.items()})
        metrics[prefix + "reward_mean"] = float(scores[torch.as_tensor(task_arr == task)].mean())
    return advantages, advantages, metrics


@register_adv_est(ESTIMATOR_NAME)
def task_norm_grpo_estimator(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl entry point (``algorithm.adv_estimator=task_norm_grpo``).

    The tasks come from ``kwargs["tasks"]`` when a caller passes them, else from
    :mod:`agentrl_ext.algos.task_context`, which our ``agentrl_sync`` trainer fills.
    """
    if index is None:
        raise ValueError(f"{ESTIMATOR_NAME} needs the GRPO group ids (uid); verl passes them as `index`")
    tasks = kwargs.get("tasks")
    if tasks is None:
        tasks = task_context.tasks_for(index)
    if tasks is None:
        raise ValueError(
            f"algorithm.adv_estimator={ESTIMATOR_NAME} needs each sample's task, which verl does not pass to "
            f"advantage estimators. Use trainer.v1.trainer_mode=agentrl_sync (it publishes the batch's tasks), "
            f"or wrap the call in agentrl_ext.algos.task_context.batch_tasks({{uid: task}})."
        )
    norm_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    advantages, returns, metrics = compute_task_normalized_advantage(
        token_level_rewards, response_mask, index, tasks, norm_adv_by_std_in_grpo=norm_by_std
    )
    task_context.record_metrics(metrics)
    return advantages, returns
