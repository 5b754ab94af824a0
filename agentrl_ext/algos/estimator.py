"""``task_norm_grpo``: task-normalized GRPO plus per-turn credit, as one estimator.

:func:`estimate` is the math with every input explicit: GRPO advantages normalized per task
(:mod:`agentrl_ext.algos.task_norm`), plus ``agentrl.turn_credit``'s per-turn advantages when turn
records with a positive weight are given (:mod:`agentrl_ext.algos.turn_credit`); it returns the
metrics. :func:`task_norm_grpo_estimator` is verl's entry point (registered by
:mod:`agentrl_ext.plugin` as ``algorithm.adv_estimator=task_norm_grpo``): verl passes it no tasks,
so it takes them from the :class:`~agentrl_ext.algos.task_context.BatchContext` the trainer hands
over (or from ``tasks=``), and adds its metrics to that context's metrics dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from agentrl_ext.algos.task_context import ESTIMATOR_NAME, BatchTurns, current
from agentrl_ext.algos.task_norm import compute_task_normalized_advantage
from agentrl_ext.algos.turn_credit import add_turn_credit


def estimate(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    tasks: Sequence[str],
    turns: BatchTurns | None = None,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(advantages, returns, metrics) of one batch; ``turns`` adds per-turn credit when its weight
    is positive."""
    advantages, returns, metrics = compute_task_normalized_advantage(
        token_level_rewards,
        response_mask,
        np.asarray(index, dtype=object),
        tasks,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    )
    if turns is not None and turns.weight > 0:
        advantages, turn_metrics = add_turn_credit(
            advantages, token_level_rewards, response_mask, tasks, turns
        )
        metrics.update(turn_metrics)
        returns = advantages
    return advantages, returns, metrics


def task_norm_grpo_estimator(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's entry point: tasks from ``kwargs["tasks"]`` or from the handed-over context."""
    if index is None:
        raise ValueError(f"{ESTIMATOR_NAME} needs the GRPO group ids (uid); verl passes them as `index`")
    context = current()
    tasks = kwargs.get("tasks")
    if tasks is None and context is not None:
        tasks = context.tasks_for(index)
    if tasks is None:
        raise ValueError(
            f"algorithm.adv_estimator={ESTIMATOR_NAME} needs each sample's task, which verl does not pass to "
            f"advantage estimators. Use trainer.v1.trainer_mode=agentrl_sync (it hands the batch's tasks over), "
            f"or wrap the call in `with agentrl_ext.algos.task_context.estimating(BatchContext(tasks={{uid: task}}))`."
        )
    norm_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    turns = context.turns_for(index) if context is not None else None
    advantages, returns, metrics = estimate(
        token_level_rewards, response_mask, list(index), tasks, turns, norm_adv_by_std_in_grpo=norm_by_std
    )
    if context is not None:
        context.metrics.update(metrics)
    return advantages, returns
