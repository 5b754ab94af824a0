"""What each task contributes to a step's policy gradient, read from the advantages the estimator
wrote (any estimator: ``task_norm_grpo``, verl's ``grpo``, ...): what task normalization is meant
to balance.

Per task (``agentrl/task/<task>/signal/...``):

- ``informative_group_share``: of the task's prompt groups (samples sharing a ``uid``), the share
  with a nonzero advantage on some action token (a group whose rewards are all equal has none:
  GRPO gives it exactly 0, and so does task normalization);
- ``adv_abs_mean``: the mean |advantage| over the task's action tokens (loss-masked tokens);
- ``action_token_share``: the task's share of the step's action tokens, i.e. of the loss's tokens
  (verl's token-mean loss weighs every action token alike).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PREFIX = "agentrl/task/{task}/signal/"


def signal_metrics(
    tasks: Sequence[str],
    uids: Sequence[str],
    advantages: Sequence[torch.Tensor],
    response_mask: Sequence[torch.Tensor],
) -> dict[str, float]:
    """Per-task signal metrics of one step (see the module); one 1-D tensor per sample for
    ``advantages`` and ``response_mask`` (the same length per sample)."""
    if not (len(tasks) == len(uids) == len(advantages) == len(response_mask)):
        raise ValueError(
            f"signal_metrics: {len(tasks)} tasks, {len(uids)} uids, {len(advantages)} advantages and "
            f"{len(response_mask)} masks: one of each per sample"
        )
    tokens: dict[str, float] = {}
    abs_sum: dict[str, float] = {}
    groups: dict[str, dict[str, bool]] = {}
    for task, uid, adv, mask in zip(tasks, uids, advantages, response_mask, strict=True):
        action = mask.to(torch.bool)
        if adv.shape != mask.shape:
            raise ValueError(
                f"signal_metrics: advantages {tuple(adv.shape)} vs response mask {tuple(mask.shape)}"
            )
        values = adv.detach().to(torch.float64)[action].abs()
        tokens[task] = tokens.get(task, 0.0) + float(values.numel())
        abs_sum[task] = abs_sum.get(task, 0.0) + float(values.sum())
        task_groups = groups.setdefault(task, {})
        task_groups[uid] = task_groups.get(uid, False) or bool((values > 0).any())
    total = sum(tokens.values())
    out: dict[str, float] = {}
    for task in sorted(groups):
        prefix = PREFIX.format(task=task)
        out[prefix + "informative_group_share"] = sum(groups[task].values()) / len(groups[task])
        out[prefix + "adv_abs_mean"] = abs_sum[task] / tokens[task] if tokens[task] else 0.0
        out[prefix + "action_token_share"] = tokens[task] / total if total else 0.0
    return out
