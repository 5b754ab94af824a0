"""The agentrl_async pipeline's decisions: group barrier, variable batch, staleness bound, per-turn
versions, failed members, feeding, idle time; and the TransferQueue buffer on an in-memory store
(sampling, eviction, refill, and what it does with a checkpoint's restored state)."""

from __future__ import annotations

import itertools

import pytest
from omegaconf import OmegaConf

from agentrl_ext.testing.env_servers import REPO
from agentrl_ext.trainer import async_trainer
from agentrl_ext.trainer.async_buffer import (
    FAILURE,
    FINISHED,
    PENDING,
    RUNNING,
    BusyTimeline,
    GroupBufferPolicy,
    GroupView,
    staleness_histogram,
    version_lag,
)
from agentrl_ext.trainer.async_trainer import AsyncGroupBuffer, current_pool_min_version


def _policy(**overrides) -> GroupBufferPolicy:
    settings = dict(n=4, batch_groups=2, batch_multiple=2, capacity_groups=6, concurrency_groups=4)
    settings.update(overrides)
    return GroupBufferPolicy(**settings)


def _group(
    uid: str, status: str = FINISHED, step: int = 1, members: int = 4, version: int | None = 0
) -> GroupView:
    return GroupView(uid=uid, status=status, dispatch_step=step, members=members, min_version=version)


def test_version_lag_counts_updates_between_generation_and_training_on_cpu():
    # step 1 trains the initial weights (version 0): lag 0; version 3 trained at step 6: 2 updates behind
    assert version_lag(1, 0) == 0
    assert version_lag(6, 3) == 2


def test_group_barrier_releases_only_settled_groups_on_cpu():
    policy = _policy()
    groups = [
        _group("a", RUNNING, members=3),  # 3 of 4 episodes back: still in flight
        _group("b", PENDING, members=0),
        _group("c", FINISHED),
    ]
    release = policy.release(groups, global_step=1)
    assert release.ready == ["c"]
    assert release.stale == release.failed == release.partial == []


def test_gpu_base_recipe_waits_for_a_whole_batch_not_a_mini_batch_on_cpu():
    # the GPU base recipe trains 64 groups a step in mini-batches of 32: one ready mini-batch is
    # half a batch, and a step must still wait (the other policies here have batch == mini-batch)
    recipe = OmegaConf.load(REPO / "recipes" / "base" / "agentrl_gpu.yaml")
    batch, mini = recipe.data.train_batch_size, recipe.actor_rollout_ref.actor.ppo_mini_batch_size
    assert (batch, mini) == (64, 32)
    policy = _policy(
        batch_groups=batch, batch_multiple=mini, capacity_groups=2 * batch, concurrency_groups=2 * batch
    )
    ready = [f"g{i}" for i in range(2 * batch)]
    assert policy.take(ready[:mini]) == [], "one mini-batch (half a batch) ready: the step must wait"
    assert policy.take(ready[: batch - 1]) == [], "one group short of a batch: the step must wait"
    assert policy.take(ready[:batch]) == ready[:batch]
    assert policy.take(ready[: batch + mini + 1]) == ready[: batch + mini]  # whole mini-batches


def test_variable_batch_takes_all_complete_groups_in_whole_mini_batches_on_cpu():
    policy = _policy(capacity_groups=8)
    assert policy.take(["g1"]) == []  # less than one batch (2 groups): wait
    assert policy.take(["g1", "g2"]) == ["g1", "g2"]
    assert policy.take(["g1", "g2", "g3"]) == ["g1", "g2"]  # rounded down to whole mini-batches of 2
    ready = [f"g{i}" for i in range(7)]
    assert policy.take(ready) == ready[:6]
    assert policy.take([f"g{i}" for i in range(11)]) == [f"g{i}" for i in range(8)]  # at most the buffer
    # oldest dispatch first, whatever order TransferQueue lists them in
    release = policy.release(
        [_group("new", step=3, version=2), _group("old", step=1), _group("mid", step=2)], 3
    )
    assert release.ready == ["old", "mid", "new"]


def test_staleness_bound_drops_groups_with_old_current_pool_turns_on_cpu():
    policy = _policy(max_staleness=1)
    groups = [
        _group("fresh", step=5, version=4),  # trained at step 5: lag 0
        _group("edge", step=4, version=3),  # lag 1: kept
        _group("old", step=3, version=2),  # lag 2 > 1: dropped
        _group("no_versions", step=3, version=None),  # dispatched under version 2: lag 2
        _group("running_old", RUNNING, step=1, version=None),  # in flight: never touched
    ]
    release = policy.release(groups, global_step=5)
    assert sorted(release.stale) == ["no_versions", "old"]
    assert release.ready == ["edge", "fresh"]
    assert _policy().release(groups, 5).stale == []  # no bound: nothing dropped for staleness


def test_per_turn_versions_stale_pool_turns_do_not_count_toward_the_bound_on_cpu():
    extras = [
        {"agentrl": {"turn_versions": [5, 6, 6], "turn_policies": ["current", "stale", "current"]}},
        {"agentrl": {"turn_versions": [1, 7], "turn_policies": ["stale", "current"]}},
        {"agentrl": {"turn_versions": [None, 4], "turn_policies": ["current", "stale"]}},
        {"agentrl": {}},  # dropped episode: no turns
    ]
    assert current_pool_min_version(extras) == 5  # the stale turns of versions 1 and 4 are ignored
    assert current_pool_min_version([{"agentrl": {"turn_versions": [2], "turn_policies": ["stale"]}}]) is None


def test_staleness_histogram_counts_trained_turns_by_lag_and_pool_on_cpu():
    versions = [[5, 6, 6], [1, None, 7]]
    policies = [["current", "stale", "current"], ["stale", "current", "current"]]
    # trained at step 8 (weights of version 7): lags 2,1,1 and 6,(none),0
    out = staleness_histogram(8, versions, policies)
    assert out["agentrl/async/staleness/lag_0"] == 1
    assert out["agentrl/async/staleness/lag_1"] == 2
    assert out["agentrl/async/staleness/lag_2"] == 1
    assert out["agentrl/async/staleness/lag_6"] == 1
    assert out["agentrl/async/staleness/current/lag_1"] == 1
    assert out["agentrl/async/staleness/stale/lag_1"] == 1
    assert out["agentrl/async/staleness/stale/lag_6"] == 1
    assert out["agentrl/async/staleness/max"] == 6
    assert sum(v for k, v in out.items() if k.count("/") == 3 and "/lag_" in k) == 5  # 5 versioned turns


def test_failed_members_keep_survivors_or_drop_the_group_on_cpu():
    policy = _policy(min_group_size=2)
    groups = [_group("three_back", FAILURE, members=3), _group("one_back", FAILURE, members=1), _group("ok")]
    release = policy.release(groups, global_step=1)
    assert release.partial == ["three_back"]
    assert release.failed == ["one_back"]
    assert sorted(release.ready) == ["ok", "three_back"]


def test_top_up_bounds_buffer_and_episodes_in_flight_on_cpu():
    policy = _policy(capacity_groups=6, concurrency_groups=4)
    assert policy.top_up(in_flight=0, buffered=0) == 4  # concurrency first
    assert policy.top_up(in_flight=2, buffered=3) == 1  # the buffer: 6 - 2 - 3
    assert policy.top_up(in_flight=1, buffered=1) == 3
    assert policy.top_up(in_flight=0, buffered=6) == 0  # full: the rollout waits for the trainer


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"capacity_groups": 1}, "buffer_size to at least 8"),
        ({"batch_groups": 3}, "multiple of actor_rollout_ref.actor.ppo_mini_batch_size=2"),
        ({"concurrency_groups": 0}, "concurrency to at least 4"),
        ({"min_group_size": 5}, "min_group_size=5"),
        ({"max_staleness": -1}, "max_staleness=-1"),
    ],
)
def test_policy_rejects_sizes_that_cannot_work_on_cpu(overrides, message):
    with pytest.raises(ValueError, match=message):
        _policy(**overrides)


def test_busy_timeline_idle_time_is_the_gaps_between_episodes_on_cpu():
    timeline = BusyTimeline()
    timeline.add(0.0, 1.0)
    timeline.add(3.0, 4.0)
    timeline.add(0.5, 2.0)  # overlaps the first
    assert timeline.span == (0.0, 4.0)
    assert timeline.busy_s() == pytest.approx(3.0)  # [0, 2] and [3, 4]
    assert timeline.idle_fraction() == pytest.approx(0.25)
    assert timeline.idle_s(1.0, 3.5) == pytest.approx(1.0)
    timeline.add(1.5, 3.5)  # fills the gap
    assert timeline.idle_fraction() == 0.0
    with pytest.raises(ValueError, match="ends"):
        timeline.add(2.0, 1.0)


# ---------------------------------------------------------------------------------------------
# AsyncGroupBuffer on an in-memory TransferQueue (same key and tag layout as verl's v1 trainer)


class FakeTQ:
    """The part of transfer_queue's KV API the buffer uses, in memory."""

    def __init__(self) -> None:
        self.tags: dict[str, dict] = {}
        self.extras: dict[str, dict] = {}
        self._uids = itertools.count()

    # the API
    def kv_list(self, partition_id=None):
        return {"train": {k: dict(v) for k, v in self.tags.items()}}

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.tags.pop(key, None)
            self.extras.pop(key, None)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        return {"extra_fields": [self.extras[k] for k in keys]}

    # test helpers, as verl's trainer and agent-loop workers write them
    def submit(self, k: int, step: int = 1) -> int:
        for _ in range(k):
            self.tags[f"u{next(self._uids)}"] = {"is_prompt": True, "status": PENDING, "global_steps": step}
        return k

    def finish(self, uid: str, versions: list[list[int]], status: str = FINISHED) -> None:
        for session, turn_versions in enumerate(versions):
            key = f"{uid}_{session}_0"
            self.tags[key] = {"status": "success", "global_steps": self.tags[uid]["global_steps"]}
            self.extras[key] = {
                "agentrl": {"turn_versions": turn_versions, "turn_policies": ["current"] * len(turn_versions)}
            }
        self.tags[uid]["status"] = status

    def prompts(self, status: str | None = None) -> list[str]:
        return sorted(
            k
            for k, t in self.tags.items()
            if t.get("is_prompt") and (status is None or t["status"] == status)
        )


@pytest.fixture()
def fake_tq(monkeypatch):
    fake = FakeTQ()
    monkeypatch.setattr(async_trainer, "tq", fake)
    polls = itertools.count()

    def sleep(_seconds: float) -> None:  # a test that would wait forever fails instead
        if next(polls) > 100:
            raise AssertionError("the buffer waited for a batch that this test never completes")

    monkeypatch.setattr(async_trainer.time, "sleep", sleep)
    return fake


def _buffer(fake: FakeTQ, **overrides) -> AsyncGroupBuffer:
    return AsyncGroupBuffer(_policy(**overrides), submit=fake.submit, val_buffer=None, poll_interval_s=0.001)


def test_buffer_trains_all_ready_groups_evicts_and_refills_on_cpu(fake_tq):
    buffer = _buffer(fake_tq, max_staleness=1)
    assert buffer.top_up() == 4  # concurrency 4 groups
    assert fake_tq.prompts(PENDING) == ["u0", "u1", "u2", "u3"]
    fake_tq.finish("u0", [[0, 0]] * 4)
    fake_tq.finish("u1", [[0]] * 4)
    fake_tq.finish("u2", [[0]] * 3, status=FAILURE)  # one member raised: 3 survivors are kept
    fake_tq.tags["u3"]["status"] = RUNNING
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    # 3 ready groups, whole mini-batches of 2: the two oldest
    assert {k.split("_")[0] for k in batch.keys} == {"u0", "u1"}
    assert len(batch.keys) == 8 and all(t["status"] == "success" for t in batch.tags)
    assert metrics["agentrl/async/batch_groups"] == 2
    assert metrics["agentrl/async/buffer/ready_groups"] == 3
    assert metrics["agentrl/async/buffer/left_groups"] == 1
    # the taken prompts are gone (their trajectories go to the step), the rest stays
    assert "u0" not in fake_tq.tags and "u0_0_0" in fake_tq.tags
    # after the step (verl clears the batch), u2 is two versions behind at step 4: dropped and replaced
    fake_tq.kv_clear(batch.keys, "train")
    fake_tq.finish("u3", [[3]] * 4)
    fake_tq.submit(1, step=4)
    fake_tq.finish(fake_tq.prompts(PENDING)[-1], [[3]] * 4)
    batch, metrics = buffer.sample(global_steps=4, partition_id="train", batch_size=2)
    assert metrics["agentrl/async/dropped/stale_groups"] == 1
    assert "u2" not in fake_tq.tags and not any(k.startswith("u2_") for k in fake_tq.tags)


def test_buffer_waits_for_a_whole_batch_and_tops_up_meanwhile_on_cpu(fake_tq, monkeypatch):
    buffer = _buffer(fake_tq)
    buffer.top_up()
    fake_tq.finish("u0", [[0]] * 4)
    polls = []

    def sleep(_s):  # the rollout finishes another group while the trainer waits
        polls.append(1)
        if len(polls) == 2:
            fake_tq.finish("u1", [[0]] * 4)

    monkeypatch.setattr(async_trainer.time, "sleep", sleep)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert len(polls) == 2
    assert {k.split("_")[0] for k in batch.keys} == {"u0", "u1"}
    # a group with a single survivor is dropped and counted; its room is refilled at once
    fake_tq.finish("u2", [[0]], status=FAILURE)
    fake_tq.finish("u3", [[0]] * 4)
    fake_tq.submit(1)
    fake_tq.finish("u4", [[0]] * 4)
    before = set(fake_tq.prompts())
    _, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=2)
    assert metrics["agentrl/async/dropped/failed_groups"] == 1
    assert metrics["agentrl/async/submitted_groups"] >= 1
    assert set(fake_tq.prompts()) - before  # new prompts started


def test_buffer_after_resume_clears_the_checkpointed_batch_and_trains_restored_groups_once_on_cpu(fake_tq):
    """verl's checkpoint of an async run holds the batch being trained (trajectories without their
    prompt), finished groups and groups in flight (re-issued by verl as pending)."""
    fake_tq.submit(3, step=2)  # u0, u1, u2
    fake_tq.finish("u0", [[1]] * 4)
    fake_tq.finish("u1", [[1]] * 4)
    fake_tq.tags["old_0_0"] = {"status": "success", "global_steps": 1}  # the checkpointed step's batch
    fake_tq.extras["old_0_0"] = {"agentrl": {}}
    buffer = _buffer(fake_tq, capacity_groups=4, concurrency_groups=4)
    batch, metrics = buffer.sample(global_steps=3, partition_id="train", batch_size=2)
    assert "old_0_0" not in fake_tq.tags and "old_0_0" not in batch.keys
    assert {k.split("_")[0] for k in batch.keys} == {"u0", "u1"}
    # room: 4 groups - u2 in flight - (u0, u1 still listed while sampling) = 1 new prompt, no more
    assert metrics["agentrl/async/submitted_groups"] == 1
    fake_tq.kv_clear(batch.keys, "train")
    assert not any(k.startswith(("u0", "u1")) for k in fake_tq.tags)  # trained once, gone
    assert "u2" in fake_tq.tags  # the re-issued group is still waited for
