"""Per-task, cross-policy and policy-version metrics of the agentrl_sync trainer."""

from __future__ import annotations

import pytest

from agentrl_ext.trainer.agentrl_trainer import episode_metrics


def _extra(success, status="completed", policies=("current",), versions=(3,), reward=1.0, failed=False):
    return {"agentrl": {"success": success, "status": status, "turn_policies": list(policies),
                        "turn_versions": list(versions), "reward": reward, "failed": failed}}  # fmt: skip


def test_episode_metrics_on_cpu():
    tasks = ["os", "os", "db", "db"]
    rewards = [1.0, -0.2, 0.0, 1.0]
    extras = [
        _extra(True, policies=("current", "stale"), versions=(3, 1)),
        _extra(False, status="task limit reached", reward=-0.2, versions=(3,)),
        _extra(False, status="task error", failed=True, policies=(), versions=(), reward=0.0),
        _extra(True, policies=("stale",), versions=(1,)),
    ]
    m = episode_metrics(tasks, rewards, extras, global_step=4)
    assert m["agentrl/task/os/success_rate"] == 0.5
    assert m["agentrl/task/os/status/task limit reached"] == 1
    assert (
        m["agentrl/task/db/failed"] == 1 and m["agentrl/task/db/success_rate"] == 1.0
    )  # failed ones excluded
    assert m["agentrl/env/failed_episodes"] == 1
    assert m["agentrl/cross_policy/turn_share/stale"] == pytest.approx(2 / 4)
    assert m["agentrl/cross_policy/reward_mean/stale"] == pytest.approx((1.0 + 1.0) / 2)
    assert m["agentrl/policy/turn_version_lag_max"] == 2  # weights of step 1 used at step 4
    assert m["agentrl/env/reward_overwritten"] == 0


def test_turn_share_counts_turns_and_reward_mean_leaves_failed_episodes_out_on_cpu():
    # episode A: 4 turns, 3 of them by the stale pool; episode B: 1 turn by the current pool; C failed.
    tasks = ["os", "os", "os"]
    rewards = [1.0, 0.5, 0.0]
    extras = [
        _extra(True, policies=("stale", "stale", "stale", "current"), versions=(1, 1, 1, 3)),
        _extra(False, reward=0.5),
        _extra(False, status="task error", failed=True, policies=(), versions=(), reward=0.0),
    ]
    m = episode_metrics(tasks, rewards, extras)
    # per turn: 3 stale of 5 turns (per episode it would be 1 of 3 pool-episodes)
    assert m["agentrl/cross_policy/turn_share/stale"] == pytest.approx(3 / 5)
    assert m["agentrl/cross_policy/turn_share/current"] == pytest.approx(2 / 5)
    # each turn weighs its episode's reward: current turns are A's (1.0) and B's (0.5)
    assert m["agentrl/cross_policy/reward_mean/current"] == pytest.approx((1.0 + 0.5) / 2)
    # the failed episode (reward 0.0) is not an outcome of the policy: left out of the mean
    assert m["agentrl/task/os/episode_reward_mean"] == pytest.approx((1.0 + 0.5) / 2)
    assert m["agentrl/task/os/turns_mean"] == pytest.approx((4 + 1) / 2)
    assert m["agentrl/task/os/episodes"] == 3 and m["agentrl/task/os/failed"] == 1


def test_overwritten_reward_is_counted_on_cpu():
    m = episode_metrics(["os"], [0.3], [_extra(True, reward=1.0)])
    assert m["agentrl/env/reward_overwritten"] == 1


def test_failure_kinds_aborts_and_unknown_versions_on_cpu():
    extras = [
        _extra(False, status="cancelled", failed=True, policies=(), versions=(), reward=0.0),
        _extra(False, status="cancelled", failed=True, policies=(), versions=(), reward=0.0),
        _extra(True, policies=("current", "current"), versions=(None, 2)),
    ]
    extras[0]["agentrl"]["failure_kind"] = "generation_aborted"
    extras[0]["agentrl"]["aborted_generations"] = 3
    extras[1]["agentrl"]["failure_kind"] = "template_not_prefix_stable"
    extras[2]["agentrl"]["aborted_generations"] = 1
    m = episode_metrics(["os"] * 3, [0.0, 0.0, 1.0], extras, global_step=3)
    assert m["agentrl/env/failure_kind/generation_aborted"] == 1
    assert m["agentrl/env/failure_kind/template_not_prefix_stable"] == 1
    assert m["agentrl/rollout/aborted_generations"] == 4
    assert m["agentrl/policy/turn_version_lag_max"] == 0  # the turn without a version is left out


def test_batches_whose_every_episode_failed_stop_training_after_the_limit_on_cpu():
    from agentrl_ext.trainer.agentrl_trainer import FailedBatches

    def batch(failed: int, total: int = 4) -> dict:
        extras = [
            {"agentrl": {"failed": True, "status": "task error", "failure_kind": "env_transport"}}
            if i < failed
            else _extra(True)
            for i in range(total)
        ]
        return episode_metrics(["guess"] * total, [0.0] * total, extras)

    guard = FailedBatches(limit=3, controller_url="http://127.0.0.1:5020/api")
    guard.observe(batch(4), 4)
    guard.observe(batch(4), 4)
    guard.observe(batch(3), 4)  # one episode served: the count starts again
    guard.observe(batch(4), 4)
    guard.observe(batch(4), 4)
    with pytest.raises(
        RuntimeError, match=r"last 3 batches failed \(env_transport: 4\).*127.0.0.1:5020.*max_failed_batches"
    ):
        guard.observe(batch(4), 4)
    FailedBatches(limit=1).observe(batch(0, total=0), 0)  # an empty batch is no failure


def test_a_batch_whose_share_of_transport_failures_passes_the_threshold_stops_at_once_on_cpu():
    """One node of two cannot reach the controller: half the episodes fail as env_transport while
    the other half trains; above agentrl.agent_loop.max_transport_failure_share the run stops."""
    from agentrl_ext.trainer.agentrl_trainer import FailedBatches

    def batch(transport: int, status_failures: int = 0, total: int = 10, worker_gone: int = 0) -> dict:
        unreachable = {
            "failed": True,
            "status": "task error",
            "failure_kind": "env_transport",
            "unreachable": True,
        }
        # the controller answered (502: its worker died): the environment failing, not the node's reach
        gone = {"failed": True, "status": "task error", "failure_kind": "env_transport", "unreachable": False}
        status = {"failed": True, "status": "task error", "failure_kind": "env_status"}
        extras = [
            {"agentrl": unreachable}
            if i < transport
            else {"agentrl": status}
            if i < transport + status_failures
            else {"agentrl": gone}
            if i < transport + status_failures + worker_gone
            else _extra(True)
            for i in range(total)
        ]
        return episode_metrics(["guess"] * total, [0.0] * total, extras)

    guard = FailedBatches(limit=3, controller_url="http://127.0.0.1:5020/api", max_transport_share=0.2)
    guard.observe(batch(2), 10)  # 20%: at the threshold, not above
    guard.observe(batch(1, status_failures=5), 10)  # environment statuses are not transport failures
    guard.observe(batch(1, worker_gone=5), 10)  # nor a worker that died behind a reachable controller
    with pytest.raises(
        RuntimeError,
        match=r"5 of 10 episodes .* \(env_transport: 50% > agentrl.agent_loop.max_transport_failure_share=0.2\).*routable",
    ):
        guard.observe(batch(5), 10)
    FailedBatches(limit=3, max_transport_share=1.0).observe(batch(9), 10)  # 1.0: off


def test_starts_that_waited_for_a_free_worker_are_counted_on_cpu():
    waited = [{"agentrl": {**_extra(True)["agentrl"], "start_wait_s": w}} for w in (0.0, 2.0, 6.0, 0.0)]
    metrics = episode_metrics(["guess"] * 4, [1.0] * 4, waited)
    assert metrics["agentrl/env/start_waited"] == 2.0
    assert metrics["agentrl/env/start_wait_s_mean"] == pytest.approx(2.0)
    assert metrics["agentrl/env/start_wait_s_max"] == pytest.approx(6.0)


def test_max_failed_batches_must_be_positive_on_cpu():
    from agentrl_ext.config import AgentRLConfig

    with pytest.raises(ValueError, match="max_failed_batches=0 must be >= 1"):
        AgentRLConfig.from_config({"agent_loop": {"max_failed_batches": 0}})


def test_batch_turns_take_each_rows_turn_records_in_row_order_on_cpu():
    from agentrl_ext.config import TurnCreditConfig
    from agentrl_ext.trainer.agentrl_trainer import batch_turns

    extras = [
        {"agentrl": {"turn_states": ["a", "b"], "turn_offsets": [0, 7], "turn_tokens": [3, 2]}},
        {"agentrl": {"turn_states": [], "turn_offsets": [], "turn_tokens": [], "failed": True}},
        {},  # a row without the agent loop's fields: no turns
    ]
    samples = {"uid": ["u1", "u1", "u2"], "extra_fields": extras}
    turns = batch_turns(samples, TurnCreditConfig(weight=0.5, gamma=0.9))
    assert turns.uids == ["u1", "u1", "u2"]
    assert turns.states == [["a", "b"], [], []]
    assert turns.offsets == [[0, 7], [], []] and turns.lengths == [[3, 2], [], []]
    assert (turns.weight, turns.gamma) == (0.5, 0.9)
