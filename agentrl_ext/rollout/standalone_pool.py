"""Standalone rollout replicas refreshed through verl's weight sync: the stale pool of cross-policy
sampling, and the current pool of ``agentrl_async`` when the rollout has devices of its own.

AgentRL samples each turn from a pool of policies; in training the pool is {the current policy, a
*stale* copy whose weights are refreshed only every ``stale_step`` steps} (DESIGN §2,
:mod:`agentrl_ext.rollout.cross_policy`). The stale copy is a set of standalone rollout replicas of
the configured backend (``hf`` on CPU, vLLM / SGLang / TensorRT-LLM on GPUs), launched by verl's
``LLMServerManager`` after the current pool's replicas (replica ranks continue theirs). The
asynchronous trainer mode with ``actor_rollout_ref.hybrid_engine=false``
(:mod:`agentrl_ext.trainer.async_trainer`) serves its *current* pool the same way, refreshed after
every step: generation then never shares the actor's devices and never sleeps for an update,
which is what vLLM and SGLang need to generate while the trainer trains.

How the replicas get their weights
----------------------------------
Exactly as verl's own standalone replicas do (the standalone pool of its ``separate_async``
trainer, the rollouter of its fully-async policy): a ``CheckpointEngineManager``
(``verl/checkpoint_engine/``) over the pool's replicas and the actor worker group, with the
transport configured in ``actor_rollout_ref.rollout.checkpoint_engine.backend``. A refresh is one
``CheckpointEngineManager.update_weights(global_steps)``: the replicas pause their requests, the
actor's rank 0 sends ``get_per_tensor_param()`` (the weights the current pool receives after the
same step) through the checkpoint engine, each replica's ``CheckpointEngineWorker`` hands them to
its backend's server adapter (vLLM / SGLang / HF ``update_weights``), and the requests resume. No
backend has a path of its own:

- GPU: ``nccl`` (or ``nixl``, ``mooncake``, ...): the engines verl ships.
- CPU: ``gloo`` (:mod:`agentrl_ext.platform.gloo_checkpoint_engine`), which the CPU platform's
  defaults set; the ``hf`` server adapter receives as vLLM's does.

Why a manager of its own rather than adding the stale replicas to the trainer's: verl's trainer
builds its manager with the ``naive`` backend (the current pool is colocated with the actor and
takes the weights in-process, between sleep and wake-up), which reaches colocated replicas only,
and it updates that pool after every step; the stale pool must sit out K-1 steps of K. verl's
actor worker keeps one checkpoint engine of the configured backend next to the in-process path, so
both managers share the actor group: ``naive`` for the current pool every step, the transport for
the stale pool at steps 0, K, 2K, ... (``backend=naive`` cannot reach standalone replicas:
:meth:`StandalonePool.create` refuses it, naming the fix).

Between refreshes nothing writes to the stale replicas: they are in no other manager, so verl's
per-step ``update_weights`` / ``sleep_replicas`` never reach them.

With a standalone current pool (``agentrl_async``, ``hybrid_engine=false``) verl's trainer builds
no colocated replicas (its actor workers train only) and its ``naive`` manager has nothing to
reach; the current pool's own manager replaces it, so the trainer's per-step
``update_weights`` is a transport sync to that pool. A sync pauses the pool: a turn caught
mid-generation comes back aborted and the agent loop retries it
(``agentrl.agent_loop.abort_retries``).
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, open_dict
from verl.checkpoint_engine import CheckpointEngineManager
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.llm_server import LLMServerManager

from agentrl_ext.platform.cpu_defaults import GLOO_CHECKPOINT_ENGINE

logger = logging.getLogger(__name__)


def refresh_due(global_step: int, stale_step: int) -> bool:
    """AgentRL's schedule: the stale pool takes the current weights at steps K, 2K, 3K, ..."""
    return global_step > 0 and global_step % stale_step == 0


def standalone_rollout(config: DictConfig) -> bool:
    """Whether the current pool is standalone (``actor_rollout_ref.hybrid_engine=false``, verl's
    switch for a rollout with devices of its own) rather than colocated with the actor."""
    return not bool(config.actor_rollout_ref.get("hybrid_engine", True))


#: the two standalone pools (their names in logs and errors)
STALE_POOL = "stale pool"
CURRENT_POOL = "current pool"

#: the setting that puts each pool on standalone replicas (for the error message)
_WHY = {
    STALE_POOL: "agentrl.cross_policy.enable=true refreshes the stale pool's",
    CURRENT_POOL: "trainer.v1.trainer_mode=agentrl_async with actor_rollout_ref.hybrid_engine=false refreshes the current pool's",
}


def check_transport(backend: str, pool: str = STALE_POOL) -> None:
    """Raise, naming the fix, when ``backend`` cannot send weights to the standalone replicas of
    ``pool`` (:data:`STALE_POOL` or :data:`CURRENT_POOL`)."""
    if backend == "naive":
        raise ValueError(
            f"{_WHY[pool]} standalone replicas through verl's "
            "checkpoint engine, but actor_rollout_ref.rollout.checkpoint_engine.backend=naive reaches only "
            "replicas colocated with the actor. Set actor_rollout_ref.rollout.checkpoint_engine.backend="
            f"nccl on GPUs (or nixl, mooncake, ...), {GLOO_CHECKPOINT_ENGINE} on CPU "
            "(agentrl-train sets it there unless naive is given explicitly)"
        )


class StandalonePool:
    """Standalone rollout replicas serving a snapshot of the policy, refreshed through a
    ``CheckpointEngineManager`` of their own (see the module docstring)."""

    def __init__(
        self, manager: LLMServerManager, sync: CheckpointEngineManager, name: str = STALE_POOL
    ) -> None:
        self.manager = manager
        self.sync = sync
        self.name = name
        #: the training step whose weights the replicas serve (None before the first refresh)
        self.version: int | None = None

    @classmethod
    def create(
        cls,
        config: DictConfig,
        num_replicas: int | None,
        start_rank: int,
        actor_wg: Any,
        name: str = STALE_POOL,
    ) -> StandalonePool:
        """Launch standalone replicas of the configured rollout, with replica ranks from
        ``start_rank``, and a weight sync from ``actor_wg`` (verl's actor worker group) to them.

        ``num_replicas`` replicas on one node; ``None``: the layout the config gives
        (``actor_rollout_ref.rollout.nnodes`` x ``n_gpus_per_node`` devices, as verl's own
        standalone rollout)."""
        rollout = config.actor_rollout_ref.rollout
        sync_config = omega_conf_to_dataclass(rollout.checkpoint_engine)
        check_transport(str(sync_config.backend), name)
        pool_config = config.copy()
        if num_replicas is not None:
            with open_dict(pool_config):
                pool_rollout = pool_config.actor_rollout_ref.rollout
                pool_rollout.nnodes = 1
                pool_rollout.n_gpus_per_node = num_replicas * int(
                    pool_rollout.tensor_model_parallel_size
                    * pool_rollout.data_parallel_size
                    * pool_rollout.pipeline_model_parallel_size
                )
        manager = LLMServerManager.create(config=pool_config, worker_group=None, start_rank=start_rank)
        sync = CheckpointEngineManager(config=sync_config, actor_wg=actor_wg, replicas=manager.get_replicas())
        logger.info(
            "%s: %d %s replica(s) from rank %d, refreshed through checkpoint engine %s",
            name,
            len(manager.get_replicas()),
            rollout.name,
            start_rank,
            sync_config.backend,
        )
        return cls(manager, sync, name)

    @property
    def load_balancer(self) -> Any:
        return self.manager.global_load_balancer

    @property
    def replicas(self) -> list[Any]:
        return self.manager.get_replicas()

    def refresh(self, global_steps: int) -> dict[str, Any]:
        """Send the actor's current weights to every replica of the pool (blocking); returns the
        checkpoint engine's sync metrics."""
        metrics = self.sync.update_weights(global_steps) or {}
        self.version = global_steps
        logger.info("%s refreshed to the weights of step %d", self.name, global_steps)
        return dict(metrics)
