"""A ``gloo`` checkpoint engine for verl: weights from the trainer to standalone rollout replicas on CPU.

verl moves weights to rollout replicas that do not share the actor's process through its checkpoint
engines (``verl/checkpoint_engine/``): ``CheckpointEngineManager.update_weights`` builds a group of
the actor's workers and the replicas' ``CheckpointEngineWorker``\\ s, the actor's rank 0 sends
``get_per_tensor_param()`` and every replica's worker hands what it receives to its server adapter
(``BaseRollout.update_weights``). verl's transports (NCCL, NIXL, HCCL, Mooncake, Kimi) all need
accelerators, so on a machine without one only the ``naive`` engine exists, and it reaches replicas
colocated with the actor only.

:class:`GlooCheckpointEngine` is the same kind of transport over a torch gloo process group, built for
one sync and torn down after it: actor rank 0 (the master) and one rank per rollout worker; the other
actor ranks only walk the weight generator (producing a full tensor is collective over the actor's
FSDP group). Weights travel in buckets of ``checkpoint_engine.update_weights_bucket_megabytes``,
cut and reassembled with verl's own ``split_weight_chunks`` / ``merge_weight_chunks``; each bucket is
three broadcasts (a header, the pickled chunk table, the bytes). Buckets are allocated at the size
they carry, not at the configured maximum.

Registered as ``actor_rollout_ref.rollout.checkpoint_engine.backend=gloo`` through verl's public
``CheckpointEngineRegistry``. Knows nothing of AgentRL.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)
from verl.workers.rollout.utils import ensure_async_iterator

from agentrl_ext.platform.cpu_defaults import GLOO_CHECKPOINT_ENGINE as BACKEND

logger = logging.getLogger(__name__)

#: chunks start at multiples of this many bytes in a bucket, so that every chunk can be viewed
#: back as its dtype (a uint8 slice at an odd offset cannot be viewed as float32)
_ALIGN = 64


@dataclass(frozen=True)
class MasterEndpoint:
    """Where the ranks of one sync meet: the master's TCP store."""

    host: str
    port: int


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


async def _contiguous_on_cpu(weights: Iterable[Any] | AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    async for name, tensor in ensure_async_iterator(weights):
        yield name, tensor.detach().to("cpu").contiguous()


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """Broadcast of the actor's weights to rollout workers over a per-sync gloo process group.

    Args:
        bucket_size: the most bytes broadcast at once (verl passes
            ``update_weights_bucket_megabytes << 20``).
        is_master: whether this is the actor's rank 0, the one that sends.
        timeout_s: how long a rank waits for the others (rendezvous and every broadcast).
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0) -> None:
        if bucket_size <= 0:
            raise ValueError(
                f"checkpoint_engine.update_weights_bucket_megabytes gives a bucket of {bucket_size} bytes; "
                f"it must be positive"
            )
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.timeout = timedelta(seconds=float(timeout_s))
        self.rank: int | None = None
        self.world_size: int | None = None
        self._store: Any = None
        self._group: Any = None

    # -- the group: verl's manager calls prepare, build_topology, init_process_group, then finalize --
    def prepare(self) -> dict[str, Any]:
        """The master opens the TCP store of this sync (on a free port) and reports where it is."""
        if not self.is_master:
            return {}
        import ray

        host = ray.util.get_node_ip_address().strip("[]") if ray.is_initialized() else "127.0.0.1"
        self._store = dist.TCPStore(host, 0, is_master=True, timeout=self.timeout, wait_for_workers=False)
        return {"master": MasterEndpoint(host=host, port=int(self._store.port))}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[Any]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Actor rank 0 is rank 0 (the sender); the other actor ranks stay out (-1); rollout
        workers are ranks 1..n."""
        master = (metadata[0] or {}).get("master")
        if not isinstance(master, MasterEndpoint):
            raise RuntimeError(
                f"gloo checkpoint engine: actor rank 0 must be the master (is_master=True), but it reported "
                f"{master!r}"
            )
        world_size = 1 + rollout_world_size
        actor: dict[str, list[Any]] = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "master": [master] * actor_wg_world_size,
        }
        rollout: dict[str, list[Any]] = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "master": [master] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master: MasterEndpoint) -> None:  # type: ignore[override]
        """Join this sync's group (blocks until every rank has joined)."""
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        if self._store is None:
            self._store = dist.TCPStore(
                master.host, master.port, is_master=False, timeout=self.timeout, wait_for_workers=False
            )
        self._group = dist.ProcessGroupGloo(self._store, rank, world_size, self.timeout)
        logger.debug("gloo checkpoint engine: rank %d of %d joined %s", rank, world_size, master)

    def finalize(self) -> None:
        """Tear the group down: the next sync builds a new one."""
        self._group = None
        self._store = None
        self.rank = self.world_size = None

    # -- transfer ---------------------------------------------------------------------------------
    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = self.timeout
        self._group.broadcast([tensor], options).wait()

    def _send_bucket(
        self, metas: list[TensorMeta], chunks: list[torch.Tensor], size: int, last: bool
    ) -> None:
        table = torch.frombuffer(bytearray(pickle.dumps(metas)), dtype=torch.uint8)
        bucket = torch.empty(size, dtype=torch.uint8)
        for meta, chunk in zip(metas, chunks, strict=True):
            bucket[meta.offset : meta.offset + meta.chunk_size] = chunk
        self._broadcast(torch.tensor([table.numel(), size, int(last)], dtype=torch.int64))
        self._broadcast(table)
        self._broadcast(bucket)

    def _receive_bucket(self) -> tuple[list[TensorMeta], torch.Tensor, bool]:
        header = torch.zeros(3, dtype=torch.int64)
        self._broadcast(header)
        table_size, size, last = (int(x) for x in header)
        table = torch.empty(table_size, dtype=torch.uint8)
        self._broadcast(table)
        bucket = torch.empty(size, dtype=torch.uint8)  # a new one each time: consumers may hold views
        self._broadcast(bucket)
        return pickle.loads(table.numpy().tobytes()), bucket, bool(last)

    def _require_group(self, what: str) -> None:
        if self.rank is None:
            raise RuntimeError(f"gloo checkpoint engine: {what} before init_process_group")

    @torch.no_grad()
    async def send_weights(self, weights: Any, global_steps: int | None = None) -> dict[str, float]:
        """Broadcast every ``(name, tensor)`` of ``weights`` (rank 0); other actor ranks drain it."""
        self._require_group("send_weights")
        if self.rank != 0:
            if self.rank is not None and self.rank > 0:
                raise RuntimeError(f"gloo checkpoint engine: rollout rank {self.rank} cannot send weights")
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        metas: list[TensorMeta] = []
        chunks: list[torch.Tensor] = []
        size = 0
        # (verl hints Generator; split/merge_weight_chunks take async iterators, as its engines pass)
        async for meta, chunk in split_weight_chunks(_contiguous_on_cpu(weights), self.bucket_size):  # type: ignore[arg-type]
            assert chunk is not None  # meta_only=False
            offset = _aligned(size)
            if metas and offset + meta.chunk_size > self.bucket_size:
                await asyncio.to_thread(self._send_bucket, metas, chunks, size, False)
                metas, chunks, offset = [], [], 0
            meta.offset = offset
            metas.append(meta)
            chunks.append(chunk)
            size = offset + meta.chunk_size
        await asyncio.to_thread(self._send_bucket, metas, chunks, size, True)
        logger.info("gloo checkpoint engine: sent weights of step %s", global_steps)
        return {}

    @torch.no_grad()
    async def receive_weights(  # type: ignore[override]  # an async generator, as verl's own engines
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Yield ``(name, tensor)`` as the master's buckets arrive (each bucket is a new buffer, so the
        tensors stay valid after the next one is asked for)."""
        self._require_group("receive_weights")
        async for name, tensor in merge_weight_chunks(self._receive_chunks(), self.bucket_size):  # type: ignore[arg-type]
            yield name, tensor

    async def _receive_chunks(self) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        if self.rank is None or self.rank < 1:
            raise RuntimeError(f"gloo checkpoint engine: rank {self.rank} does not receive weights")
        last = False
        while not last:
            metas, bucket, last = await asyncio.to_thread(self._receive_bucket)
            for meta in metas:
                yield meta, bucket[meta.offset : meta.offset + meta.chunk_size]
