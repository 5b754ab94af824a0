"""The stale policy pool of cross-policy sampling: its own rollout replicas, refreshed every K steps."""

from __future__ import annotations

import logging
from typing import Any

import ray
from omegaconf import DictConfig, open_dict
from verl.workers.rollout.llm_server import LLMServerManager

logger = logging.getLogger(__name__)


def refresh_due(global_step: int, stale_step: int) -> bool:
    """AgentRL's schedule: the stale pool takes the current weights at steps K, 2K, 3K, ..."""
    return global_step > 0 and global_step % stale_step == 0


class StalePool:
    """Standalone rollout replicas serving a snapshot of the policy.

    On CPU (rollout ``hf``) a refresh copies the weights of a current-pool server into
    each stale server through Ray's object store.
    """

    def __init__(self, manager: LLMServerManager, rollout_name: str) -> None:
        self.manager = manager
        self.rollout_name = rollout_name
        self.version: int | None = None

    @classmethod
    def create(cls, config: DictConfig, num_replicas: int, start_rank: int) -> StalePool:
        """Launch ``num_replicas`` standalone replicas of the configured rollout."""
        name = str(config.actor_rollout_ref.rollout.name)
        if name != "hf":
            raise NotImplementedError(
                f"cross-policy sampling's stale pool is implemented for actor_rollout_ref.rollout.name=hf; "
                f"{name} needs a checkpoint-engine refresh of standalone replicas (not built yet). "
                f"Set agentrl.cross_policy.enable=false to train without it."
            )
        stale_config = config.copy()
        with open_dict(stale_config):
            rollout = stale_config.actor_rollout_ref.rollout
            rollout.nnodes = 1
            rollout.n_gpus_per_node = num_replicas * int(
                rollout.tensor_model_parallel_size
                * rollout.data_parallel_size
                * rollout.pipeline_model_parallel_size
            )
        manager = LLMServerManager.create(config=stale_config, worker_group=None, start_rank=start_rank)
        logger.info("stale pool: %d %s replica(s) from rank %d", num_replicas, name, start_rank)
        return cls(manager, name)

    @property
    def load_balancer(self) -> Any:
        return self.manager.global_load_balancer

    def refresh(self, current_servers: list[Any], global_step: int) -> None:
        """Give every stale server the weights of the current pool (blocking)."""
        source = current_servers[0]
        state_ref = source.export_state.remote()
        targets = [s for replica in self.manager.get_replicas() for s in replica.servers]
        ray.get([t.update_weights.remote(state_ref, global_step) for t in targets])
        self.version = global_step
        logger.info("stale pool refreshed to the weights of step %d", global_step)
