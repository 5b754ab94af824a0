"""Task-normalized GRPO advantages against an independent reference computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl_ext.algos import task_context
from agentrl_ext.algos.task_context import ESTIMATOR_NAME, BatchContext
from agentrl_ext.algos.task_norm import compute_task_normalized_advantage


def _reference(rewards: np.ndarray, mask: np.ndarray, uids: list[str], tasks: list[str]) -> np.ndarray:
    """Plain-numpy GRPO (unbiased group std, eps 1e-6; rows without masked tokens left out)
    then per-task token normalization."""
    scores = rewards.sum(axis=1)
    adv = np.zeros(len(uids))
    signal = np.zeros(len(uids), dtype=bool)  # in a group with reward spread (or alone)
    for uid in set(uids):
        rows = [i for i, u in enumerate(uids) if u == uid and mask[i].sum() > 0]
        if not rows or (len(rows) > 1 and np.ptp(scores[rows]) == 0):
            continue
        group = scores[rows]
        mean, std = (group.mean(), group.std(ddof=1)) if len(rows) > 1 else (0.0, 1.0)
        for i in rows:
            adv[i] = (scores[i] - mean) / (std + 1e-6)
            signal[i] = True
    token_adv = adv[:, None] * mask
    out = np.zeros_like(token_adv)
    for task in set(tasks):
        sel = np.array([t == task for t in tasks])[:, None] & (mask > 0) & signal[:, None]
        vals = token_adv[sel]
        out[sel] = (vals - vals.mean()) / (vals.std() + 1e-6)
    return out


def _random_batch(seed: int, n_groups: int = 9, group_size: int = 4, length: int = 12):
    rng = np.random.default_rng(seed)
    tasks_pool = ["alfworld", "dbbench", "os", "webshop"]
    uids, tasks = [], []
    for g in range(n_groups):
        task = tasks_pool[g % len(tasks_pool)] if g < 4 else rng.choice(tasks_pool)
        uids += [f"u{g}"] * group_size
        tasks += [str(task)] * group_size
    n = len(uids)
    lengths = rng.integers(1, length + 1, size=n)  # variable response lengths
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
    mask[:, 0] = 1
    # a multi-turn mask: env tokens (0) in the middle of some responses
    mask[::3, 2:4] = 0
    rewards = np.zeros((n, length), dtype=np.float32)
    scale = {"alfworld": 1.0, "dbbench": 0.3, "os": 5.0, "webshop": 0.05}
    rewards[np.arange(n), lengths - 1] = rng.random(n) * np.array([scale[t] for t in tasks])
    # a dropped sample (environment failure): no loss-masked token, yet a reward in its row
    mask[5, :] = 0
    rewards[5, 0] = 0.9
    # a flat group (every episode ended the same way, e.g. all at the turn limit)
    flat = slice(group_size * (n_groups - 1), n)
    rewards[flat] = 0.0
    rewards[np.arange(n)[flat], lengths[flat] - 1] = -0.2
    return rewards, mask, uids, tasks


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_estimator_matches_reference_on_cpu(seed):
    rewards, mask, uids, tasks = _random_batch(seed)
    assert len(set(tasks)) >= 3
    adv, returns, metrics = compute_task_normalized_advantage(
        torch.tensor(rewards), torch.tensor(mask), np.array(uids, dtype=object), tasks
    )
    expected = _reference(rewards.astype(np.float64), mask, uids, tasks)
    np.testing.assert_allclose(adv.numpy(), expected, atol=1e-4)
    assert torch.equal(adv, returns)
    flat_rows = slice(len(uids) - 4, len(uids))
    assert torch.count_nonzero(adv[flat_rows]) == 0  # the flat group carries no signal
    signal = torch.ones(len(uids), dtype=torch.bool)
    signal[flat_rows] = False
    for task in set(tasks):
        sel = torch.tensor([t == task for t in tasks])[:, None] & torch.tensor(mask).bool() & signal[:, None]
        assert abs(adv[sel].mean().item()) < 1e-5
        assert metrics[f"agentrl/task/{task}/tokens"] == sel.sum().item()
    assert (adv[torch.tensor(mask) == 0] == 0).all()


def test_registered_estimator_reads_tasks_from_context_on_cpu():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rewards, mask, uids, tasks = _random_batch(7)
    fn = get_adv_estimator_fn(ESTIMATOR_NAME)
    index = np.array(uids, dtype=object)
    context = BatchContext(tasks=dict(zip(uids, tasks, strict=True)))
    with task_context.estimating(context):
        adv, _ = fn(
            token_level_rewards=torch.tensor(rewards),
            response_mask=torch.tensor(mask),
            index=index,
            config=None,
        )
    expected = _reference(rewards.astype(np.float64), mask, uids, tasks)
    np.testing.assert_allclose(adv.numpy(), expected, atol=1e-4)
    assert {f"agentrl/task/{t}/reward_mean" for t in tasks} <= set(context.metrics)
    assert task_context.current() is None  # nothing kept after the block


def test_estimator_without_tasks_names_the_fix_on_cpu():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rewards, mask, uids, _ = _random_batch(1)
    fn = get_adv_estimator_fn(ESTIMATOR_NAME)
    with pytest.raises(ValueError, match="trainer_mode=agentrl_sync"):
        fn(token_level_rewards=torch.tensor(rewards), response_mask=torch.tensor(mask), index=np.array(uids))


def test_unpublished_uid_is_named_on_cpu():
    with pytest.raises(KeyError, match="'b'"):
        BatchContext(tasks={"a": "os"}).tasks_for(["a", "b"])
