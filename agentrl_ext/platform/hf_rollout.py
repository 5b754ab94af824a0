"""verl glue for the HF rollout: the replica (launches servers) and the trainer-side adapter.

Registered under the rollout name ``hf``: ``actor_rollout_ref.rollout.name=hf``.

- :class:`HFReplica` is verl's ``RolloutReplica`` for ``hf``: it starts one
  :class:`~agentrl_ext.platform.hf_server.HFRolloutServer` actor per replica.
- :class:`HFServerAdapter` is verl's ``BaseRollout`` (the server adapter) of the ``hf`` rollout,
  the receiving end of verl's weight sync, wherever verl puts it: inside each trainer worker for
  replicas colocated with the actor (``naive`` checkpoint engine, after every optimizer step), or
  inside the ``CheckpointEngineWorker`` of a standalone replica, fed by a transport checkpoint
  engine (``gloo`` on CPU, :mod:`agentrl_ext.platform.gloo_checkpoint_engine`). Either way the
  replica leader pushes the full weights to its server through Ray's object store.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica
from verl.workers.rollout.utils import ensure_async_iterator

from agentrl_ext.platform.hf_server import HFRolloutServer
from agentrl_ext.verl_compat import set_replica_server

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "hf"


def server_actor_name(replica_rank: int) -> str:
    """Ray actor name of the HF server of ``replica_rank`` (shared by replica and adapter)."""
    return f"agentrl_hf_rollout_server_{replica_rank}"


def _rollout_world_size(config: Any) -> int:
    return int(
        config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size
    )


class HFReplica(RolloutReplica):
    """One HF rollout server per replica; weights arrive from the trainer after each step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.world_size != 1:
            raise ValueError(
                f"the HF rollout runs one process per replica, but rollout tensor/data/pipeline parallel "
                f"sizes give world size {self.world_size}; set actor_rollout_ref.rollout."
                f"tensor_model_parallel_size=1 (and data/pipeline_model_parallel_size=1)"
            )

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        name = server_actor_name(self.replica_rank) + self.name_suffix
        if self.is_reward_model:
            name += "_reward"
        elif self.is_teacher_model:
            name += "_teacher"
        server_cls: Any = ray.remote(HFRolloutServer)
        server: Any = server_cls.options(name=name, num_cpus=0, max_concurrency=self.max_concurrency).remote(
            config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
        )
        # Fail here, with the server's own error, if the model cannot load.
        await server.get_global_steps.remote()
        self.servers = [server]
        set_replica_server(self, server, f"hf-rollout://{name}")


class HFServerAdapter(BaseRollout):
    """Trainer-side half of the HF rollout: forwards weight updates to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh, *args, **kwargs)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        world = _rollout_world_size(self.config)
        # standalone replicas (CheckpointEngineWorker) pass their replica rank explicitly
        self.replica_rank = int(kwargs.get("replica_rank", rank // world))
        self.is_leader = rank % world == 0
        self.is_leader_rank = self.is_leader
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]] | AsyncIterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise ValueError(
                f"the HF rollout accepts full named tensors only, got wire_format={wire_format!r}"
            )
        if kwargs.get("peft_config") is not None:
            raise ValueError(
                "the HF rollout does not load LoRA adapters; set actor_rollout_ref.model.lora.merge=True"
            )
        # Every rank must drain the weights: FSDP gathers full tensors collectively. A checkpoint
        # engine's receive_weights is an async generator whose tensors may view its buffers: copy.
        state = {
            name: tensor.detach().to("cpu").clone() async for name, tensor in ensure_async_iterator(weights)
        }
        if self.is_leader:
            await self._server_handle().update_weights.remote(state, kwargs.get("global_steps"))
