"""verl v1 trainer mode ``agentrl_sync``: verl's synchronous PPO trainer plus AgentRL's glue.

``trainer.v1.trainer_mode=agentrl_sync`` selects it. It subclasses verl's ``PPOTrainerSync``
through :class:`~agentrl_ext.verl_compat.TrainerStepHooks` (the one place that touches
verl's private per-step methods) and adds:

- ``around_advantage``: hands each sample's task (``data_source``) to the ``task_norm_grpo``
  estimator (verl passes estimators only the uid), and with ``agentrl.turn_credit.weight`` > 0
  each sample's turn records (:mod:`agentrl_ext.algos.task_context`), the estimator adding its
  metrics to the step's; then logs per-task episode metrics, each task's training signal in the
  advantages the estimator wrote (:mod:`agentrl_ext.algos.signal`) and cross-policy metrics;
- ``after_old_log_prob``: with cross-policy sampling on, logs each pool's importance ratio
  π_θ / π_behaviour at the start of the update (``agentrl/cross_policy/ratio_*``);
- ``get_llm_client``: with cross-policy sampling on, the agent loops get a client that routes
  every generation call to the current or the stale pool;
- ``init``: before verl builds its workers, every Ray node where verl places agent-loop workers
  must reach the controller(s) (:mod:`agentrl_ext.trainer.reachability`);
- ``on_init_end`` / ``on_step_end``: the stale pool is launched and takes the actor's weights at
  start, then again every ``stale_step`` steps, through verl's checkpoint engine
  (:mod:`agentrl_ext.rollout.standalone_pool`). It is refreshed before verl's own hook wakes the current
  pool, so on GPUs the transfer runs while the colocated replicas still sleep.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug import marked_timer

from agentrl_ext.algos import task_context
from agentrl_ext.algos.off_policy import pool_ratio_metrics
from agentrl_ext.algos.signal import signal_metrics
from agentrl_ext.algos.task_context import BatchTurns
from agentrl_ext.config import CrossPolicyConfig, TurnCreditConfig
from agentrl_ext.rollout.cross_policy import CURRENT, STALE, CrossPolicyLLMServerClient
from agentrl_ext.rollout.standalone_pool import StandalonePool, refresh_due
from agentrl_ext.run_spec import RunSpec, run_spec
from agentrl_ext.trainer.checks import AGENT_LOOP_NAME
from agentrl_ext.trainer.reachability import check_controller_from_every_node
from agentrl_ext.verl_compat import (
    TrainerStepHooks,
    actor_and_rollout_log_probs,
    batch_advantages,
    batch_samples,
)

logger = logging.getLogger(__name__)

TRAINER_MODE = task_context.TRAINER_MODE


def episode_metrics(
    tasks: list[str], rewards: list[float], extras: list[dict[str, Any]], global_step: int | None = None
) -> dict[str, float]:
    """Per-task, policy-version and cross-policy metrics of one batch of episodes (``agentrl/...`` keys)."""
    metrics: dict[str, float] = {}
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, task in enumerate(tasks):
        by_task[task].append(i)
    failed_total = 0
    for task, rows in by_task.items():
        info = [extras[i].get("agentrl", {}) for i in rows]
        failed = [bool(x.get("failed")) for x in info]
        failed_total += sum(failed)
        ok = [i for i, f in zip(rows, failed, strict=True) if not f]
        prefix = f"agentrl/task/{task}/"
        metrics[prefix + "episodes"] = float(len(rows))
        metrics[prefix + "failed"] = float(sum(failed))
        if ok:
            metrics[prefix + "success_rate"] = float(
                np.mean([bool(extras[i]["agentrl"].get("success")) for i in ok])
            )
            metrics[prefix + "episode_reward_mean"] = float(np.mean([rewards[i] for i in ok]))
            metrics[prefix + "turns_mean"] = float(
                np.mean([len(extras[i]["agentrl"].get("turn_policies", [])) for i in ok])
            )
        for status in {x.get("status") for x in info if x.get("status")}:
            metrics[prefix + f"status/{status}"] = float(sum(x.get("status") == status for x in info))
    metrics["agentrl/env/failed_episodes"] = float(failed_total)
    # why episodes were dropped (agent loop FailureKind), and generations that came back aborted
    infos = [x.get("agentrl", {}) for x in extras]
    # session starts that waited for a free worker slot (a fleet smaller than the batch)
    waits = [float(x.get("start_wait_s", 0.0)) for x in infos]
    if waits:
        metrics["agentrl/env/start_waited"] = float(sum(w > 0 for w in waits))
        metrics["agentrl/env/start_wait_s_mean"] = float(np.mean(waits))
        metrics["agentrl/env/start_wait_s_max"] = float(np.max(waits))
    # episodes that could not use the controller at all (no answer, credentials refused)
    metrics["agentrl/env/unreachable_episodes"] = float(sum(bool(x.get("unreachable")) for x in infos))
    for kind in sorted({str(x["failure_kind"]) for x in infos if x.get("failure_kind")}):
        metrics[f"agentrl/env/failure_kind/{kind}"] = float(sum(x.get("failure_kind") == kind for x in infos))
    metrics["agentrl/rollout/aborted_generations"] = float(
        sum(int(x.get("aborted_generations", 0)) for x in infos)
    )
    # The environment's reward is the reward: count episodes whose trained reward differs from it.
    metrics["agentrl/env/reward_overwritten"] = float(
        sum(
            abs(r - x["agentrl"]["reward"]) > 1e-6
            for r, x in zip(rewards, extras, strict=True)
            if "reward" in x.get("agentrl", {})
        )
    )
    metrics.update(_cross_policy_metrics(rewards, extras))
    if global_step is not None:
        # How many optimizer steps behind the trained policy each turn's generating weights were.
        # (None: the server reported no weights version for that turn)
        lags = [
            global_step - 1 - v
            for x in extras
            for v in x.get("agentrl", {}).get("turn_versions", [])
            if v is not None
        ]
        if lags:
            metrics["agentrl/policy/turn_version_lag_mean"] = float(np.mean(lags))
            metrics["agentrl/policy/turn_version_lag_max"] = float(np.max(lags))
    return metrics


class FailedBatches:
    """Counts batches in a row in which every episode failed; raises at ``limit`` with the reasons.
    Also raises at once when more than ``max_transport_share`` of a batch's episodes could not
    reach the environment service (``env_transport`` with no answer from the controller or its
    credentials refused; a worker that died behind a reachable controller is the environment
    failing, which the rest of the batch trains through).

    verl would go on training such batches (every sample masked: a NaN loss and no update), so a
    run whose controller or workers are gone would otherwise "finish" its steps without learning;
    and a run where one node of several cannot reach the controller would train on the others'
    episodes only, as long as one episode per batch succeeds.
    """

    def __init__(
        self, limit: int, controller_url: str | None = None, max_transport_share: float = 1.0
    ) -> None:
        self.limit = limit
        self.controller_url = controller_url
        self.max_transport_share = max_transport_share
        self.in_a_row = 0

    def observe(self, metrics: dict[str, float], episodes: int) -> None:
        """``metrics``: :func:`episode_metrics` of a batch of ``episodes`` episodes."""
        transport = metrics.get("agentrl/env/unreachable_episodes", 0.0)
        if episodes and self.max_transport_share < 1.0 and transport / episodes > self.max_transport_share:
            raise RuntimeError(
                f"{int(transport)} of {episodes} episodes of this batch could not reach the environment service "
                f"at {self.controller_url or 'agentrl.agent_loop.controller_url'}: no answer, or credentials "
                f"refused (env_transport: {transport / episodes:.0%} > agentrl.agent_loop.max_transport_failure_share="
                f"{self.max_transport_share:g}). Check that every node reaches the controller (a routable "
                "address, not 127.0.0.1, with the client secret) and that it is up; the agent-loop workers' "
                "logs name each failure"
            )
        if episodes == 0 or metrics.get("agentrl/env/failed_episodes", 0.0) < episodes:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        if self.in_a_row < self.limit:
            logger.warning("every episode of this batch failed (%d batch(es) in a row)", self.in_a_row)
            return
        prefix = "agentrl/env/failure_kind/"
        kinds = ", ".join(f"{k[len(prefix) :]}: {int(v)}" for k, v in metrics.items() if k.startswith(prefix))
        raise RuntimeError(
            f"every episode of the last {self.in_a_row} batches failed ({kinds or 'no reason recorded'}); "
            f"the environment service at {self.controller_url or 'agentrl.agent_loop.controller_url'} "
            "is not serving episodes. Check the controller and its workers (their logs), or raise "
            "agentrl.agent_loop.max_failed_batches to wait out a longer outage"
        )


def batch_turns(samples: dict[str, list[Any]], credit: TurnCreditConfig) -> BatchTurns:
    """The per-turn records of a batch (:func:`batch_samples`) for ``agentrl.turn_credit``."""
    info = [extra.get("agentrl", {}) for extra in samples["extra_fields"]]
    return BatchTurns(
        uids=list(samples["uid"]),
        states=[list(i.get("turn_states", [])) for i in info],
        offsets=[[int(o) for o in i.get("turn_offsets", [])] for i in info],
        lengths=[[int(n) for n in i.get("turn_tokens", [])] for i in info],
        weight=credit.weight,
        gamma=credit.gamma,
    )


def _cross_policy_metrics(rewards: list[float], extras: list[dict[str, Any]]) -> dict[str, float]:
    turns = {CURRENT: 0, STALE: 0}
    weighted = {CURRENT: 0.0, STALE: 0.0}
    for reward, extra in zip(rewards, extras, strict=True):
        policies = extra.get("agentrl", {}).get("turn_policies", [])
        for pool in turns:
            share = policies.count(pool)
            turns[pool] += share
            weighted[pool] += reward * share
    total = sum(turns.values())
    if not total:
        return {}
    out = {f"agentrl/cross_policy/turn_share/{pool}": n / total for pool, n in turns.items()}
    for pool, n in turns.items():
        if n:
            out[f"agentrl/cross_policy/reward_mean/{pool}"] = weighted[pool] / n
    return out


class AgentRLTrainerHooks(TrainerStepHooks):
    """AgentRL's glue for a verl v1 trainer (mixed in before verl's trainer class): task-aware
    advantages, per-task metrics, cross-policy sampling and its stale pool. Shared by the
    ``agentrl_sync`` and ``agentrl_async`` trainer modes."""

    # set by verl's PPOTrainer
    config: Any
    global_steps: int
    llm_server_manager: Any
    actor_rollout_wg: Any
    timing_raw: dict

    stale_pool: StandalonePool | None = None

    @functools.cached_property
    def run_spec(self) -> RunSpec:
        """The run spec the entry point resolved and wrote into verl's config (read once here)."""
        return run_spec(self.config)

    @functools.cached_property
    def _cross_policy(self) -> CrossPolicyConfig:
        return self.run_spec.agentrl.cross_policy

    @functools.cached_property
    def _failed_batches(self) -> FailedBatches:
        spec = self.run_spec
        loop = spec.agentrl.agent_loop
        return FailedBatches(loop.max_failed_batches, spec.controller_url, loop.max_transport_failure_share)

    def replay_buffer_poll_interval_s(self) -> float | None:
        return self.run_spec.agentrl.replay_poll_interval_s

    def get_llm_client(self) -> Any:
        cross = self._cross_policy
        if self.stale_pool is None:
            return super().get_llm_client()  # type: ignore[misc]  # verl's trainer, after this mixin
        return CrossPolicyLLMServerClient(
            config=self.config,
            load_balancer_handle=self.llm_server_manager.global_load_balancer,
            stale_load_balancer_handle=self.stale_pool.load_balancer,
            stale_ratio=cross.stale_ratio,
            seed=cross.seed,
        )

    def init(self) -> None:
        # before verl builds anything (minutes for a large model): every node where verl will run
        # agent-loop workers must reach the environment service
        spec = self.run_spec
        agent = self.config.actor_rollout_ref.rollout.get("agent", {}).get("default_agent_loop")
        if spec.controller_url and agent == AGENT_LOOP_NAME:
            val_url = spec.agentrl.agent_loop.val_controller_url or ""
            check_controller_from_every_node([spec.controller_url, val_url])
        super().init()  # type: ignore[misc]  # verl's trainer, after this mixin

    def on_init_end(self) -> None:
        # verl calls this at the end of init(), with the actor's weights loaded (or resumed).
        cross = self._cross_policy
        if cross.enable and self.stale_pool is None:
            start_rank = len(self.llm_server_manager.get_replicas())
            self.stale_pool = StandalonePool.create(
                self.config, cross.stale_replicas, start_rank, self.actor_rollout_wg
            )
            self.stale_pool.refresh(self.global_steps)
        super().on_init_end()  # type: ignore[misc]  # verl's trainer, after this mixin

    def on_step_end(self) -> None:
        cross = self._cross_policy
        if self.stale_pool is not None and refresh_due(self.global_steps, cross.stale_step):
            with marked_timer("update_weights_stale_pool", self.timing_raw, color="red"):
                self.stale_pool.refresh(self.global_steps)
        super().on_step_end()  # type: ignore[misc]  # verl's trainer, after this mixin

    def stale_pool_metrics(self) -> dict[str, float]:
        """The weights version the stale pool serves (``agentrl/cross_policy/stale_version``)."""
        if self.stale_pool is None or self.stale_pool.version is None:
            return {}
        return {"agentrl/cross_policy/stale_version": float(self.stale_pool.version)}

    @contextmanager
    def around_advantage(self, batch: Any, metrics: dict) -> Iterator[None]:
        samples = batch_samples(batch)
        tasks = samples["data_source"]
        credit = self.run_spec.agentrl.turn_credit
        context = task_context.BatchContext(
            tasks={str(u): str(t) for u, t in zip(samples["uid"], tasks, strict=True)},
            turns=batch_turns(samples, credit) if credit.weight > 0 else None,
            metrics=metrics,
        )
        with task_context.estimating(context):
            yield
        written = batch_advantages(batch)  # whatever estimator ran: what each task feeds the update
        metrics.update(
            signal_metrics(
                written["data_source"], written["uid"], written["advantages"], written["response_mask"]
            )
        )
        metrics.update(self.stale_pool_metrics())
        batch_metrics = episode_metrics(
            tasks, samples["reward"], samples["extra_fields"], global_step=self.global_steps
        )
        metrics.update(batch_metrics)
        self._failed_batches.observe(batch_metrics, len(tasks))

    def after_old_log_prob(self, batch: Any, metrics: dict) -> None:
        cross = self._cross_policy
        if not (cross.enable and cross.ratio_metrics):
            return
        data = actor_and_rollout_log_probs(self, batch)
        info = [extra.get("agentrl", {}) for extra in data["extra_fields"]]
        actor = self.config.actor_rollout_ref.actor
        clip_low = actor.get("clip_ratio_low") or actor.clip_ratio
        clip_high = actor.get("clip_ratio_high") or actor.clip_ratio
        metrics.update(
            pool_ratio_metrics(
                data["current"],
                data["rollout"],
                data["response_mask"],
                [x.get("turn_policies", []) for x in info],
                [x.get("turn_tokens", [0] * len(x.get("turn_policies", []))) for x in info],
                clip_low=float(clip_low),
                clip_high=float(clip_high),
            )
        )


@register_trainer(TRAINER_MODE)
class AgentRLTrainerSync(AgentRLTrainerHooks, PPOTrainerSync):
    """verl's sync trainer with task-aware advantages, per-task metrics and cross-policy sampling."""
