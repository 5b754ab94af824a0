"""Groups and tasks with zero reward spread get exactly zero advantage, through verl's own
``compute_advantage`` call path (the one verl's trainers use for registered estimators).

The expected values are written out by hand: an all-equal group carries no signal, so every
one of its advantages is 0, before and after task normalization.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.trainer.ppo.ray_trainer import compute_advantage

from agentrl_ext.algos import task_context
from agentrl_ext.algos.task_context import ESTIMATOR_NAME, BatchContext

LENGTH = 6


def _batch(groups: list[tuple[str, str, list[float]]]) -> tuple[DataProto, list[str], list[str]]:
    """One row per reward: (uid, task, rewards of the group); reward on the last masked token."""
    uids, tasks, rewards = [], [], []
    for uid, task, values in groups:
        uids += [uid] * len(values)
        tasks += [task] * len(values)
        rewards += values
    n = len(rewards)
    lengths = [2 + (i % 4) for i in range(n)]  # varied response lengths
    mask = torch.zeros(n, LENGTH)
    scores = torch.zeros(n, LENGTH, dtype=torch.float32)
    for i, (length, r) in enumerate(zip(lengths, rewards, strict=True)):
        mask[i, :length] = 1
        scores[i, length - 1] = r
    data = DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )
    return data, uids, tasks


def _advantages(data: DataProto, uids: list[str], tasks: list[str]) -> torch.Tensor:
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": True})
    with task_context.estimating(BatchContext(tasks=dict(zip(uids, tasks, strict=True)))):
        out = compute_advantage(data, adv_estimator=ESTIMATOR_NAME, num_repeat=1, config=config)
    return out.batch["advantages"]


def _per_sample(adv: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The advantage of each sample (constant over its masked tokens)."""
    out = []
    for row, m in zip(adv, mask.bool(), strict=True):
        values = row[m]
        assert torch.all(values == values[0]), "an outcome advantage is the same on every token"
        assert torch.all(row[~m] == 0)
        out.append(float(values[0]))
    return out


@pytest.mark.parametrize(("reward", "size"), [(-0.2, 7), (-0.2, 8), (0.3, 6), (0.3, 8), (0.7, 16)])
def test_all_equal_group_gives_exact_zero_on_cpu(reward, size):
    data, uids, tasks = _batch([("g", "os", [reward] * size)])
    # verl's float32 GRPO leaves rounding noise here (what the task normalization used to amplify)
    noisy, _ = compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], np.array(uids, dtype=object)
    )
    if (reward, size) in {(-0.2, 7), (-0.2, 8), (0.3, 8)}:
        assert noisy.abs().max() > 1e-3
    adv = _advantages(data, uids, tasks)
    assert torch.count_nonzero(adv) == 0


def test_task_of_flat_groups_stays_zero_on_cpu():
    # all-0 and all-(-0.2) groups (n=8): before the fix these became [-1, -1, +1, +1] per sample
    data, uids, tasks = _batch(
        [("a", "os", [0.0] * 8), ("b", "os", [-0.2] * 8), ("c", "os", [0.0] * 8), ("d", "os", [-0.2] * 8)]
    )
    assert torch.count_nonzero(_advantages(data, uids, tasks)) == 0


def test_uneven_flat_groups_stay_zero_on_cpu():
    # groups of sizes [8, 8, 8, 7] all at -0.2: before the fix [0.27, 0.27, 0.27, -0.93]
    groups = [(f"g{i}", "webshop", [-0.2] * n) for i, n in enumerate([8, 8, 8, 7])]
    data, uids, tasks = _batch(groups)
    assert torch.count_nonzero(_advantages(data, uids, tasks)) == 0


def test_flat_task_next_to_a_learning_task_on_cpu():
    # task "os" has no signal (every group flat); task "kg" has one informative group and one flat one.
    data, uids, tasks = _batch(
        [
            ("o1", "os", [-0.2] * 4),
            ("o2", "os", [1.0] * 4),
            ("k1", "kg", [1.0, 0.0, 0.0, 0.0]),
            ("k2", "kg", [0.3] * 4),
        ]
    )
    mask = data.batch["response_mask"]
    adv = _advantages(data, uids, tasks)
    per_sample = _per_sample(adv, mask)
    assert per_sample[:8] == [0.0] * 8
    # kg by hand: group k1 has mean 0.25 and sample std 0.5 -> [1.5, -0.5, -0.5, -0.5]; k2 is flat.
    # Then per task over the masked tokens of kg's informative samples (k1 only): mean mu and
    # population std sigma of those token values. k2 carries no signal and stays exactly 0
    # (centring it by mu would give all four of its episodes the same nonzero push).
    k1 = np.array([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-6)
    token_values = np.concatenate([np.full(int(mask[8 + i].sum()), v) for i, v in enumerate(k1)])
    mu, sigma = token_values.mean(), token_values.std()
    expected = [(v - mu) / (sigma + 1e-6) for v in k1] + [0.0] * 4
    np.testing.assert_allclose(per_sample[8:], expected, atol=1e-5)
    assert mu != 0.0  # the lengths differ, so a literal centring would have moved k2


def test_rounding_noise_counts_as_equal_on_cpu():
    # float32 rewards that differ only by rounding noise (e.g. sums computed in another order)
    base = np.float32(0.3)
    noisy = [float(np.nextafter(base, np.float32(1), dtype=np.float32)), float(base)] * 4
    data, uids, tasks = _batch([("g", "alfworld", noisy)])
    assert torch.count_nonzero(_advantages(data, uids, tasks)) == 0


def test_single_sample_groups_on_cpu():
    # A group of one has no baseline: as in verl its advantage is its reward (mean 0, std 1), and the
    # task normalization then centres the task. Equal lone rewards are a flat task: 0.
    data, uids, tasks = _batch(
        [("a", "os", [1.0]), ("b", "os", [0.0]), ("c", "kg", [-0.2]), ("d", "kg", [-0.2])]
    )
    mask = data.batch["response_mask"]
    per_sample = _per_sample(_advantages(data, uids, tasks), mask)
    assert per_sample[2:] == [0.0, 0.0]
    n_a, n_b = int(mask[0].sum()), int(mask[1].sum())
    values = np.array([1.0 / (1 + 1e-6)] * n_a + [0.0] * n_b)
    mu, sigma = values.mean(), values.std()
    np.testing.assert_allclose(
        per_sample[:2], [(1.0 / (1 + 1e-6) - mu) / (sigma + 1e-6), (0.0 - mu) / (sigma + 1e-6)], atol=1e-5
    )


def test_empty_masks_on_cpu():
    # every sample of the batch was dropped (no loss-masked token): all advantages 0, no NaN
    data, uids, tasks = _batch([("g", "os", [1.0, 0.0, 0.5])])
    data.batch["response_mask"].zero_()
    adv = _advantages(data, uids, tasks)
    assert not torch.isnan(adv).any()
    assert torch.count_nonzero(adv) == 0


def test_a_task_without_signal_still_reports_its_metrics_on_cpu():
    # dashboards keep one curve per task: a step where every group of "os" is flat logs zeros
    from agentrl_ext.algos.task_norm import compute_task_normalized_advantage

    data, uids, tasks = _batch([("o1", "os", [-0.2] * 4), ("k1", "kg", [1.0, 0.0, 0.0, 0.0])])
    _, _, metrics = compute_task_normalized_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], np.array(uids, dtype=object), tasks
    )
    assert metrics["agentrl/task/os/adv_std_after"] == 0.0
    assert metrics["agentrl/task/os/tokens"] == 0.0
    assert metrics["agentrl/task/os/informative_samples"] == 0.0
    assert metrics["agentrl/task/os/samples"] == 4.0
    assert metrics["agentrl/task/kg/informative_samples"] == 4.0
    assert metrics["agentrl/task/kg/adv_std_after"] > 0.9
