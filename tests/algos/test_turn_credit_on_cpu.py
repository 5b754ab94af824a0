"""Per-turn credit (``agentrl.turn_credit``): turn advantages within state groups, written out
by hand, their place on the response tokens, and the estimator adding them to task_norm_grpo."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl_ext.algos import task_context
from agentrl_ext.algos.estimator import task_norm_grpo_estimator
from agentrl_ext.algos.task_context import BatchContext, BatchTurns
from agentrl_ext.algos.task_norm import compute_task_normalized_advantage
from agentrl_ext.algos.turn_credit import spread_over_tokens, turn_advantages, turn_returns
from agentrl_ext.config import AgentRLConfig

ROOT3 = math.sqrt(3.0)


def test_turn_returns_discount_the_final_reward_per_later_turn_on_cpu():
    assert turn_returns(3, 1.0, 0.5) == [0.25, 0.5, 1.0]
    assert turn_returns(1, -0.2, 0.9) == [-0.2]
    assert turn_returns(0, 1.0, 0.9) == []


def test_turns_in_the_same_state_are_compared_with_each_other_on_cpu():
    # A and C open the same way and win in 2 turns; B opens from the same state and loses in 3.
    # gamma 0.5: returns A [0.5, 1], B [0, 0, 0], C [0.5, 1].
    # Opening state s0: returns 0.5, 0, 0.5: mean 1/3, sample std sqrt(1/12), so A and C get
    # (1/6) / sqrt(1/12) = 1/sqrt(3) and B -2/sqrt(3). State a1 (A's and C's second turn): returns
    # 1 and 1, all equal: 0. B's later states are its own alone: 0.
    states = [["s0", "a1"], ["s0", "b1", "b2"], ["s0", "a1"]]
    values, metrics = turn_advantages(states, [1.0, 0.0, 1.0], ["guess"] * 3, gamma=0.5)
    expected = [[1 / ROOT3, 0.0], [-2 / ROOT3, 0.0, 0.0], [1 / ROOT3, 0.0]]
    for got, want in zip(values, expected, strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    # 7 turns: 5 share a state with another turn (s0 x3, a1 x2), 3 are in a group whose returns differ
    assert metrics["agentrl/task/guess/turn_credit/shared_turns"] == pytest.approx(5 / 7)
    assert metrics["agentrl/task/guess/turn_credit/informative_turns"] == pytest.approx(3 / 7)


def test_equal_states_of_different_tasks_are_not_one_group_on_cpu():
    values, _ = turn_advantages([["s"], ["s"]], [1.0, 0.0], ["guess", "calc"], gamma=1.0)
    assert values == [[0.0], [0.0]]


def test_a_state_group_with_float32_noise_in_its_returns_gets_zero_on_cpu():
    noisy = float(torch.tensor(0.1, dtype=torch.float32)) + 1e-9
    values, _ = turn_advantages([["s"], ["s"]], [noisy, 0.1], ["guess"] * 2, gamma=1.0)
    assert values == [[0.0], [0.0]]


def test_turn_values_land_on_their_model_tokens_only_on_cpu():
    # turn 0 at 0..1, two tool tokens at 2..4, turn 1 at 5..7, padding; a second row whose last
    # turn runs past the response width keeps its head
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]], dtype=torch.float32)
    out = spread_over_tokens([[0.7, -0.3], [2.0]], [[0, 5], [8]], [[2, 3], [5]], mask)
    assert out.tolist() == [
        [0.7, 0.7, 0.0, 0.0, 0.0, -0.3, -0.3, -0.3, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0],
    ]
    # a token the mask dropped (e.g. rejection sampling) stays 0
    dropped = mask.clone()
    dropped[0, 6] = 0
    assert spread_over_tokens([[0.7, -0.3], [2.0]], [[0, 5], [8]], [[2, 3], [5]], dropped)[0, 6] == 0.0
    # a loss-mask token outside every recorded turn: the records are not these rows
    stray = mask.clone()
    stray[0, 9] = 1
    with pytest.raises(ValueError, match="row 0: 1 loss-mask token"):
        spread_over_tokens([[0.7, -0.3], [2.0]], [[0, 5], [8]], [[2, 3], [5]], stray)


def _batch():
    """Two prompts of guess, two episodes each (uids p, q), 2 turns of 2 tokens with a tool token
    between them; p's episodes open in the same state, q's do not."""
    mask = torch.tensor([[1, 1, 0, 1, 1]] * 4, dtype=torch.float32)
    rewards = torch.zeros(4, 5)
    rewards[:, 4] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    uids = ["p", "p", "q", "q"]
    turns = BatchTurns(
        uids=uids,
        states=[["s0", "x"], ["s0", "y"], ["t0", "z"], ["t1", "w"]],
        offsets=[[0, 3]] * 4,
        lengths=[[2, 2]] * 4,
        weight=0.5,
        gamma=1.0,
    )
    return rewards, mask, uids, turns


def test_the_estimator_adds_weight_times_the_turn_advantage_on_cpu():
    rewards, mask, uids, turns = _batch()
    tasks = ["guess"] * 4
    episode, _, _ = compute_task_normalized_advantage(rewards, mask, uids, tasks)
    context = BatchContext(tasks=dict(zip(uids, tasks, strict=True)), turns=turns)
    with task_context.estimating(context):
        advantages, returns = task_norm_grpo_estimator(rewards, mask, index=uids)
    metrics = context.metrics
    # s0: returns 1 and 0, mean 0.5, sample std sqrt(0.5): +-0.5 / sqrt(0.5) = +-1/sqrt(2) on the
    # first turn of p's two episodes; every other state is alone
    r = 1 / math.sqrt(2.0)
    step = torch.tensor([[r, r, 0, 0, 0], [-r, -r, 0, 0, 0], [0] * 5, [0] * 5], dtype=torch.float32)
    assert torch.allclose(advantages - episode, 0.5 * step, atol=1e-5)
    assert torch.equal(returns, advantages)
    assert metrics["agentrl/task/guess/turn_credit/informative_turns"] == pytest.approx(2 / 8)


def test_weight_zero_or_no_records_leave_task_norm_grpo_as_it_was_on_cpu():
    rewards, mask, uids, turns = _batch()
    tasks = {"p": "guess", "q": "guess"}
    with task_context.estimating(BatchContext(tasks=tasks)):
        plain, _ = task_norm_grpo_estimator(rewards, mask, index=uids)
    off = BatchTurns(**{**turns.__dict__, "weight": 0.0})
    with task_context.estimating(BatchContext(tasks=tasks, turns=off)):
        zero, _ = task_norm_grpo_estimator(rewards, mask, index=uids)
    assert torch.equal(plain, zero)


def test_records_for_other_rows_are_refused_on_cpu():
    rewards, mask, uids, turns = _batch()
    with task_context.estimating(BatchContext(tasks={"p": "guess", "q": "guess"}, turns=turns)):
        with pytest.raises(ValueError, match="uids differ"):
            task_norm_grpo_estimator(rewards, mask, index=["q", "q", "p", "p"])


@pytest.mark.parametrize(("key", "value"), [("weight", -0.1), ("gamma", 0.0), ("gamma", 1.5)])
def test_bad_turn_credit_settings_are_named_on_cpu(key, value):
    with pytest.raises(ValueError, match=f"agentrl.turn_credit.{key}"):
        AgentRLConfig.from_config({"turn_credit": {key: value}})
