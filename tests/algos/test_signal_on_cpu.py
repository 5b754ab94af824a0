"""Per-task signal metrics, against values worked out by hand for a small batch."""

from __future__ import annotations

import pytest
import torch

from agentrl_ext.algos.signal import signal_metrics


def _t(values):
    return torch.tensor(values, dtype=torch.float32)


def test_signal_metrics_of_a_mixed_batch_on_cpu():
    # guess: group g1 has spread (advantages ±1 on its action tokens), group g2 is flat (zeros);
    # calc: one group, one informative sample; its environment tokens (mask 0) carry junk that
    # must not count
    tasks = ["guess", "guess", "guess", "guess", "calc", "calc"]
    uids = ["g1", "g1", "g2", "g2", "c1", "c1"]
    advantages = [
        _t([1.0, 1.0, 0.0]),
        _t([-1.0, -1.0, 0.0]),
        _t([0.0, 0.0, 0.0]),
        _t([0.0, 0.0, 0.0]),
        _t([0.5, 9.0, 0.5, 0.5]),
        _t([0.0, 9.0, 0.0, 0.0]),
    ]
    masks = [
        torch.tensor([1, 1, 0]),
        torch.tensor([1, 1, 0]),
        torch.tensor([1, 1, 0]),
        torch.tensor([1, 0, 0]),
        torch.tensor([1, 0, 1, 1]),
        torch.tensor([1, 0, 1, 1]),
    ]
    m = signal_metrics(tasks, uids, advantages, masks)
    # guess: 7 action tokens, |adv| sum 4; calc: 6 action tokens, |adv| sum 1.5; 13 in all
    assert m["agentrl/task/guess/signal/informative_group_share"] == 0.5
    assert m["agentrl/task/guess/signal/adv_abs_mean"] == pytest.approx(4 / 7)
    assert m["agentrl/task/guess/signal/action_token_share"] == pytest.approx(7 / 13)
    assert m["agentrl/task/calc/signal/informative_group_share"] == 1.0
    assert m["agentrl/task/calc/signal/adv_abs_mean"] == pytest.approx(1.5 / 6)
    assert m["agentrl/task/calc/signal/action_token_share"] == pytest.approx(6 / 13)


def test_signal_metrics_edge_cases_on_cpu():
    # all-equal rewards: every group flat, nothing informative; an empty mask: no action tokens
    flat = signal_metrics(
        ["a", "a"], ["u", "u"], [_t([0.0, 0.0]), _t([0.0, 0.0])], [torch.ones(2), torch.ones(2)]
    )
    assert flat["agentrl/task/a/signal/informative_group_share"] == 0.0
    assert flat["agentrl/task/a/signal/adv_abs_mean"] == 0.0
    empty = signal_metrics(["a"], ["u"], [_t([3.0])], [torch.zeros(1)])
    assert empty["agentrl/task/a/signal/adv_abs_mean"] == 0.0
    assert empty["agentrl/task/a/signal/action_token_share"] == 0.0
    # float32 noise is still a signal (a nonzero advantage), and a single-sample group counts
    tiny = signal_metrics(["a"], ["u"], [_t([1e-7])], [torch.ones(1)])
    assert tiny["agentrl/task/a/signal/informative_group_share"] == 1.0
    with pytest.raises(ValueError, match="one of each per sample"):
        signal_metrics(["a"], [], [], [])
    with pytest.raises(ValueError, match="advantages"):
        signal_metrics(["a"], ["u"], [_t([1.0, 2.0])], [torch.ones(3)])
