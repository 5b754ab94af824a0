"""verl v1 trainer mode ``agentrl_async``: AgentRL's fully asynchronous generation–training pipeline.

``trainer.v1.trainer_mode=agentrl_async`` selects it (recipe ``cpu_agentrl_async``). Settings:
``agentrl.async_pipeline.*`` (:class:`~agentrl_ext.config.AsyncPipelineConfig`).

What it does
------------
Generation never waits for training and training never waits for the slowest trajectory:

- **Continuous rollout.** The trainer keeps prompts in flight on the agent-loop workers at all
  times, also while it updates: up to ``concurrency`` episodes (whole GRPO groups), and at most
  ``buffer_size`` trajectories untrained in all (finished plus in flight; default 2 × batch ×
  n, AgentRL's). It tops the rollout up before a step, while it waits for a batch, and right
  after it took one (so the freed room fills before the long update starts).
- **Bounded buffer with a GRPO group barrier.** A prompt's n episodes are released together
  once all n have settled. An episode the environment could not run is already a masked,
  counted trajectory (:mod:`agentrl_ext.rollout.agent_loop`), so it never stalls its group. An
  episode that *raised* leaves its group ``failure``: the survivors are trained when at least
  ``min_group_size`` came back, else the group is dropped and a fresh prompt takes its place
  (both counted; nothing is retried forever).
- **Variable batch.** A step takes *all* complete groups available, at least one batch
  (``data.train_batch_size`` groups), rounded down to whole PPO mini-batches so that verl pads
  nothing; then verl's pipeline runs as usual (task-normalized advantages included) and the
  weights go to the current rollout pool after every step (verl's ``CheckpointEngineManager``).
- **Per-turn policy versions and staleness.** Every turn records the weights version that
  generated it (``extra_fields["agentrl"]["turn_versions"]``, the server's ``global_steps``). A
  group whose oldest *current-pool* turn lags more than ``max_staleness`` versions behind the
  step that would train it is dropped and replaced (stale-pool turns are stale by design and
  bounded by ``agentrl.cross_policy.stale_step``). Turns keep their own behaviour log-probs, so
  with bypass mode each turn enters the PPO ratio π_θ / π_behaviour of the weights that made it,
  whichever version that was. A turn whose generation spans a weight update (the HF server loads
  weights between two forwards, as vLLM does) has each token's log-prob from the weights that
  sampled it, and is attributed the version it finished with.
- **Metrics** (``agentrl/async/...``): ``staleness/lag_<k>`` (trained turns per lag, also per
  pool), ``staleness/max``, ``buffer/{occupancy, ready_groups, left_groups, in_flight_groups}``,
  ``batch_groups``, ``batch_trajectories``, ``submitted_groups``, ``dropped/{stale_groups,
  failed_groups}``, ``partial_groups``, ``failed_members``, ``trainer_wait_s`` (this step's
  wait for a batch), ``trainer_idle_frac`` and ``rollout_idle_frac`` (since training began; the
  rollout is idle when no episode runs, measured from the episodes' own start and end times).

Checkpoint and resume (``trainer.save_freq``, ``trainer.resume_mode``): verl's v1 trainer saves,
with the weights and the dataloader position, a TransferQueue snapshot of every prompt fetched
and not yet trained. A resumed run therefore loses no prompt: finished groups are restored and
trained once, groups in flight are started again from their prompt (their partial episodes are
discarded; the environment sessions restart). No trajectory is trained twice: the trajectories
of the step being checkpointed are still in the snapshot, without their prompt, and are cleared
at the first sampling after the resume. Prompts dropped as stale or failed before the
checkpoint stay dropped (they were counted).

How it composes verl 0.9.1
--------------------------
verl ships two asynchronous designs; this mode takes the pieces that fit AgentRL and writes the
rest:

- ``verl/experimental/fully_async_policy/`` (v0 fully async): a ``FullyAsyncRollouter`` Ray
  actor drives generation on its own resource pool and pushes *samples* to a ``MessageQueue``
  actor; a ``FullyAsyncTrainer`` pulls ``require_batches × ppo_mini_batch_size`` samples,
  trains, and triggers a parameter sync every ``trigger_parameter_sync_step`` steps through a
  checkpoint engine (NCCL); staleness is bounded by ``staleness_threshold`` (a share of the
  samples a sync window may hold); partial rollouts abort and resume in-flight requests around a
  sync. It has its own entry point, its own single-turn-oriented rollouter loop and a
  fixed-size batch: no group barrier over multi-turn episodes, no per-turn versions, no room
  for our agent loop's trainer hooks (task context, cross-policy client, stale pool).
- verl's **v1 trainer** (``verl/trainer/ppo/v1/``), which ``agentrl_sync`` already runs on,
  has the same idea inside the main trainer: agent-loop workers run episodes fire-and-forget
  (``AgentLoopWorkerTQ``) and write each trajectory to TransferQueue, tagging a prompt
  ``finished``/``failure`` only when all n sessions settled — that is the GRPO group barrier;
  ``ReplayBufferAsync`` samples fixed-size batches of terminal groups, evicts failed groups and
  groups dispatched too long ago (``max_off_policy_threshold``, by dispatch step); the trainer
  saves and restores the TransferQueue state for async modes; ``CheckpointEngineManager``
  (``verl/checkpoint_engine/``) pushes weights to rollout replicas, ``naive`` in-process for
  replicas colocated with the actor, NCCL/NIXL/Mooncake for standalone ones.

We reuse the v1 trainer (its step pipeline, TransferQueue, the agent-loop workers' group
barrier, checkpoint/restore and re-issue of in-flight prompts, ``CheckpointEngineManager``)
and replace its sampler and its feeding policy: verl's async sampler takes exactly one batch
and refills only what it evicted (plus one batch per step), and its staleness bound counts
steps since dispatch; AgentRL's semantics are a bounded buffer kept full by continuous
rollout, all complete groups per step, survivors of a broken group kept, and the bound on the
version of every turn (an episode dispatched long ago may have been generated mostly by recent
weights). The decisions are plain Python in :mod:`agentrl_ext.trainer.async_buffer`;
:class:`AsyncGroupBuffer` applies them to TransferQueue. The only verl private name used,
``PPOTrainer._add_prompts_to_generate`` (start n prompts), goes through
:func:`agentrl_ext.verl_compat.submit_prompts`.

Differences from verl's fully async, and why: one trainer process and verl's own entry point
(``main_ppo`` with a trainer mode) instead of a separate ``fully_async_main``, so every
AgentRL hook of ``agentrl_sync`` applies unchanged; groups, not samples, are the unit of the
buffer (GRPO needs whole groups); batch size varies (AgentRL); staleness is per turn, not per
sample or per sync window; weights go to the current pool after *every* step (AgentRL), on a
colocated ``hf`` pool without aborting requests (generation goes on with the new weights from
the next forward).

Where the rollout runs: colocated with the actor (verl's default), the ``hf`` rollout, whose
servers are their own Ray actors and take weights between two forwards while they generate.
vLLM/SGLang would sleep through every update there, so they run this mode from a standalone
current pool: ``actor_rollout_ref.hybrid_engine=false`` (verl's switch; its ``separate_async``
mode reads it too) leaves verl's workers training only, and :meth:`AgentRLTrainerAsync.on_init_end`
launches a :class:`~agentrl_ext.rollout.standalone_pool.StandalonePool` on
``rollout.nnodes x n_gpus_per_node`` devices whose checkpoint engine (``nccl``; ``gloo`` on CPU)
takes the place of the trainer's ``naive`` one, so the per-step update is a transport sync. It
pauses the pool: a turn caught by it comes back aborted and is retried. The config check refuses
vLLM/SGLang colocated, naming the fix. The cross-policy stale pool is the
one of ``agentrl_sync`` (:class:`~agentrl_ext.rollout.standalone_pool.StandalonePool`), refreshed every
``stale_step`` steps through verl's ``CheckpointEngineManager`` (``gloo`` on CPU). Unlike a
colocated current pool's update, that sync pauses the stale replicas (verl's manager aborts their requests
and resumes them after the transfer): a stale-pool turn caught by it comes back aborted and the
agent loop retries it (``agentrl.agent_loop.abort_retries``), so keep the retries' span
(``abort_retries`` x ``abort_retry_delay_s``) longer than a refresh.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.utils.debug import marked_timer

from agentrl_ext.algos.task_context import ASYNC_TRAINER_MODE
from agentrl_ext.rollout.cross_policy import CURRENT
from agentrl_ext.rollout.standalone_pool import CURRENT_POOL, StandalonePool, standalone_rollout
from agentrl_ext.trainer.agentrl_trainer import AgentRLTrainerHooks
from agentrl_ext.trainer.async_buffer import (
    FAILURE,
    FINISHED,
    PENDING,
    RUNNING,
    BusyTimeline,
    GroupBufferPolicy,
    GroupView,
    policy_from_config,
    staleness_histogram,
)
from agentrl_ext.verl_compat import submit_prompts, without_colocated_rollout

logger = logging.getLogger(__name__)

TRAIN = "train"


def _plain(values: Any) -> list[Any]:
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    return [getattr(item, "data", item) for item in items]


def _uid(key: str) -> str:
    return key.split("_", 1)[0]


def current_pool_min_version(extras: list[dict[str, Any]]) -> int | None:
    """Oldest weights version among the current-pool turns of a group's trajectories."""
    versions = [
        int(v)
        for extra in extras
        for v, pool in zip(
            extra.get("agentrl", {}).get("turn_versions", []),
            extra.get("agentrl", {}).get("turn_policies", []),
            strict=False,
        )
        if v is not None and pool == CURRENT
    ]
    return min(versions) if versions else None


class AsyncGroupBuffer:
    """verl replay buffer (duck-typed: ``sample``) for ``agentrl_async``, over verl's TransferQueue.

    Training batches come from :meth:`sample`; validation is handed to verl's own buffer.
    ``submit(k)`` starts k new prompts on the rollout.
    """

    def __init__(
        self,
        policy: GroupBufferPolicy,
        submit: Callable[[int], int],
        val_buffer: Any,
        poll_interval_s: float,
    ) -> None:
        self.policy = policy
        self.submit = submit
        self.val_buffer = val_buffer
        self.poll_interval = poll_interval_s
        #: uid -> (members, current-pool min version) of terminal groups (immutable once terminal)
        self._terminal: dict[str, tuple[int, int | None]] = {}
        self.submitted = 0

    # -- TransferQueue -----------------------------------------------------------------------
    def _snapshot(self) -> tuple[dict[str, GroupView], dict[str, list[str]], dict[str, dict], list[str]]:
        """Groups, trajectory keys per uid, tags per trajectory key, and orphan trajectory keys."""
        listing = (tq.kv_list(TRAIN) or {}).get(TRAIN, {})
        prompts: dict[str, dict] = {}
        keys_of: dict[str, list[str]] = {}
        tags: dict[str, dict] = {}
        for key, tag in listing.items():
            if tag.get("is_prompt", False):
                prompts[key] = tag
            else:
                keys_of.setdefault(_uid(key), []).append(key)
                tags[key] = tag
        orphans = [k for uid, ks in keys_of.items() if uid not in prompts for k in ks]
        uncached = [
            uid
            for uid, tag in prompts.items()
            if tag.get("status") in (FINISHED, FAILURE) and uid not in self._terminal
        ]
        self._read_terminal(uncached, keys_of)
        for uid in [u for u in self._terminal if u not in prompts]:
            del self._terminal[uid]
        groups = {}
        for uid, tag in prompts.items():
            members, version = self._terminal.get(uid, (len(keys_of.get(uid, [])), None))
            groups[uid] = GroupView(
                uid=uid,
                status=str(tag.get("status")),
                dispatch_step=int(tag.get("global_steps", 0)),
                members=members,
                min_version=version,
            )
        return groups, keys_of, tags, orphans

    def _read_terminal(self, uids: list[str], keys_of: dict[str, list[str]]) -> None:
        keys = [k for uid in uids for k in keys_of.get(uid, [])]
        extras: dict[str, list[dict]] = {uid: [] for uid in uids}
        if keys:
            data = tq.kv_batch_get(keys=keys, partition_id=TRAIN, select_fields=["extra_fields"])
            for key, extra in zip(keys, _plain(data["extra_fields"]), strict=True):
                extras[_uid(key)].append(extra if isinstance(extra, dict) else {})
        for uid in uids:
            self._terminal[uid] = (len(extras[uid]), current_pool_min_version(extras[uid]))

    def _clear(self, uids: list[str], keys_of: dict[str, list[str]], extra_keys: list[str] = ()) -> None:  # type: ignore[assignment]
        keys = [*uids, *(k for uid in uids for k in keys_of.get(uid, [])), *extra_keys]
        if keys:
            tq.kv_clear(keys=keys, partition_id=TRAIN)
        for uid in uids:
            self._terminal.pop(uid, None)

    # -- feeding -------------------------------------------------------------------------------
    def top_up(self, groups: dict[str, GroupView] | None = None) -> int:
        """Start as many new prompts as the buffer and the concurrency allow."""
        if groups is None:
            groups = self._snapshot()[0]
        in_flight = sum(g.status in (PENDING, RUNNING) for g in groups.values())
        buffered = len(groups) - in_flight
        room = self.policy.top_up(in_flight, buffered)
        started = self.submit(room) if room else 0
        self.submitted += started
        return started

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        if partition_id != TRAIN:
            return self.val_buffer.sample(
                global_steps=global_steps, partition_id=partition_id, batch_size=batch_size
            )
        t0 = time.perf_counter()
        counts = {"stale": 0, "failed": 0}
        submitted_before = self.submitted
        while True:
            groups, keys_of, tags, orphans = self._snapshot()
            release = self.policy.release(groups.values(), global_steps)
            dropped = release.stale + release.failed
            if dropped or orphans:
                self._clear(dropped, keys_of, orphans)
                counts["stale"] += len(release.stale)
                counts["failed"] += len(release.failed)
                for uid in dropped:
                    groups.pop(uid)
                if orphans:
                    logger.info(
                        "cleared %d trajectories left without their prompt (a resumed checkpoint)",
                        len(orphans),
                    )
            self.top_up(groups)
            take = self.policy.take(release.ready)
            if take:
                break
            time.sleep(self.poll_interval)
        wait_s = time.perf_counter() - t0
        in_flight = sum(g.status in (PENDING, RUNNING) for g in groups.values())
        occupancy = len(groups) / self.policy.capacity_groups
        taken = set(take)
        keys = [k for uid in take for k in sorted(keys_of.get(uid, []))]
        tq.kv_clear(keys=list(take), partition_id=TRAIN)  # the prompts: their trajectories go to the step
        for uid in take:
            self._terminal.pop(uid, None)
        partial = [uid for uid in release.partial if uid in taken]
        metrics = {
            "agentrl/async/batch_groups": float(len(take)),
            "agentrl/async/batch_trajectories": float(len(keys)),
            "agentrl/async/buffer/ready_groups": float(len(release.ready)),
            "agentrl/async/buffer/left_groups": float(len(release.ready) - len(take)),
            "agentrl/async/buffer/in_flight_groups": float(in_flight),
            "agentrl/async/buffer/occupancy": float(occupancy),
            "agentrl/async/dropped/stale_groups": float(counts["stale"]),
            "agentrl/async/dropped/failed_groups": float(counts["failed"]),
            "agentrl/async/partial_groups": float(len(partial)),
            "agentrl/async/failed_members": float(sum(self.policy.n - groups[u].members for u in partial)),
            "agentrl/async/submitted_groups": float(self.submitted - submitted_before),
            "agentrl/async/trainer_wait_s": wait_s,
        }
        batch = KVBatchMeta(partition_id=TRAIN, keys=keys, tags=[tags[k] for k in keys])
        return batch, metrics


@register_trainer(ASYNC_TRAINER_MODE)
class AgentRLTrainerAsync(AgentRLTrainerHooks, PPOTrainer):
    """verl's v1 trainer with AgentRL's asynchronous pipeline (see the module docstring)."""

    #: the current pool: verl's colocated replicas (None) or standalone ones (hybrid_engine=false)
    current_pool: StandalonePool | None = None

    def __init__(self, config: Any) -> None:
        self.standalone_rollout = standalone_rollout(config)
        if self.standalone_rollout:
            without_colocated_rollout(self)
        super().__init__(config)
        settings = self.run_spec.agentrl.async_pipeline
        self.buffer_policy = policy_from_config(config, settings)
        # verl built its async sampler: it keeps serving validation batches
        self.replay_buffer = AsyncGroupBuffer(  # type: ignore[assignment]
            self.buffer_policy,
            submit=functools.partial(submit_prompts, self),
            val_buffer=self.replay_buffer,
            poll_interval_s=settings.poll_interval_s,
        )
        self.busy = BusyTimeline()
        self._train_begin: float | None = None
        self._wait_total = 0.0

    @property
    def group_buffer(self) -> AsyncGroupBuffer:
        return self.replay_buffer  # type: ignore[return-value]

    # -- verl's hooks ----------------------------------------------------------------------------
    def on_init_end(self) -> None:
        if self.standalone_rollout and self.current_pool is None:
            # verl built no replicas; the current pool is standalone, and its sync is the trainer's
            self.current_pool = StandalonePool.create(
                self.config, None, 0, self.actor_rollout_wg, name=CURRENT_POOL
            )
            self.llm_server_manager = self.current_pool.manager
            self.checkpoint_manager = self.current_pool.sync
        # the current pool gets the weights of the (possibly resumed) actor, then the stale pool
        self.checkpoint_manager.update_weights(self.global_steps)
        super().on_init_end()

    def on_train_begin(self) -> None:
        self._train_begin = time.time()
        started = self.group_buffer.top_up()
        logger.info("async pipeline: %d prompt groups started (%s)", started, self.buffer_policy)

    def prepare_step(self) -> dict:
        self.group_buffer.top_up()
        return {}

    def on_sample_end(self) -> None:
        # refill the room the batch just freed, so the rollout works through the update
        self.group_buffer.top_up()

    def on_step_end(self) -> None:
        # weights to the current pool after every step. Colocated (hf): requests in flight go on
        # (no abort, no sleep); standalone: a transport sync, in-flight turns are aborted and retried
        with marked_timer("update_weights", self.timing_raw, color="red"):
            self.checkpoint_manager.update_weights(self.global_steps)
        super().on_step_end()

    @contextmanager
    def around_advantage(self, batch: Any, metrics: dict) -> Iterator[None]:
        with super().around_advantage(batch, metrics):
            yield
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        infos = [e.get("agentrl", {}) if isinstance(e, dict) else {} for e in _plain(data["extra_fields"])]
        metrics.update(
            staleness_histogram(
                self.global_steps,
                [x.get("turn_versions", []) for x in infos],
                [x.get("turn_policies", []) for x in infos],
            )
        )
        begin = self._train_begin if self._train_begin is not None else float("-inf")
        for info in infos:
            # groups restored from a checkpoint ran before this run: not this run's rollout time
            if "t_start" in info and "t_end" in info and float(info["t_end"]) > begin:
                self.busy.add(max(begin, float(info["t_start"])), float(info["t_end"]))
        idle = self.busy.idle_fraction()
        if idle is not None:
            metrics["agentrl/async/rollout_idle_frac"] = idle
        wait = float(metrics.get("agentrl/async/trainer_wait_s", 0.0))
        self._wait_total += wait
        if self._train_begin is not None:
            elapsed = time.time() - self._train_begin
            if elapsed > 0:
                metrics["agentrl/async/trainer_idle_frac"] = min(1.0, self._wait_total / elapsed)
