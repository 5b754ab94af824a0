"""The ``gloo`` checkpoint engine: verl's engine protocol (prepare, build_topology,
init_process_group, send/receive, finalize) between ranks run as threads of this process (no Ray)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from verl.checkpoint_engine import CheckpointEngineRegistry

from agentrl_ext.platform.cpu_defaults import GLOO_CHECKPOINT_ENGINE
from agentrl_ext.platform.gloo_checkpoint_engine import BACKEND, GlooCheckpointEngine


def _in_threads(calls: list[Callable[[], Any]]) -> list[Any]:
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001  (re-raised in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def _sync(
    actor: list[GlooCheckpointEngine], rollout: list[GlooCheckpointEngine], weights: dict[str, torch.Tensor]
):
    """One sync as verl's CheckpointEngineManager runs it; returns what each rollout rank received."""
    metadata = [e.prepare() for e in actor + rollout]
    actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(len(actor), len(rollout), metadata)
    per_rank = [{k: v[i] for k, v in actor_kwargs.items()} for i in range(len(actor))]
    per_rank += [{k: v[i] for k, v in rollout_kwargs.items()} for i in range(len(rollout))]
    engines = actor + rollout
    _in_threads(
        [lambda e=e, kw=kw: e.init_process_group(**kw) for e, kw in zip(engines, per_rank, strict=True)]
    )

    async def receive(engine: GlooCheckpointEngine) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() async for name, tensor in engine.receive_weights(global_steps=3)}

    sends = [lambda e=e: asyncio.run(e.send_weights(iter(weights.items()), global_steps=3)) for e in actor]
    receives = [lambda e=e: asyncio.run(receive(e)) for e in rollout]
    received = _in_threads(sends + receives)[len(actor) :]
    for engine in engines:
        engine.finalize()
    return received


def test_registered_in_verls_registry_on_cpu():
    assert BACKEND == GLOO_CHECKPOINT_ENGINE == "gloo"
    assert CheckpointEngineRegistry.get("gloo") is GlooCheckpointEngine


def test_every_tensor_arrives_exactly_at_every_rollout_rank_on_cpu():
    weights = {
        "small": torch.randn(3, 5),
        "odd_bf16": torch.randn(7).to(torch.bfloat16),  # 14 bytes: the next chunk must stay aligned
        "larger_than_a_bucket": torch.randn(1000),  # 4000 bytes in 1024-byte buckets: split and merged
        "ints": torch.arange(11, dtype=torch.int64),
        "transposed": torch.randn(4, 6).t(),  # not contiguous
    }
    actor = [GlooCheckpointEngine(bucket_size=1024, is_master=True), GlooCheckpointEngine(bucket_size=1024)]
    rollout = [GlooCheckpointEngine(bucket_size=1024) for _ in range(2)]
    for got in _sync(actor, rollout, weights):
        assert list(got) == list(weights)
        for name, tensor in weights.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_the_group_is_rebuilt_for_each_sync_on_cpu():
    actor, rollout = (
        [GlooCheckpointEngine(bucket_size=256, is_master=True)],
        [GlooCheckpointEngine(bucket_size=256)],
    )
    first = _sync(actor, rollout, {"w": torch.zeros(10)})[0]
    second = _sync(actor, rollout, {"w": torch.ones(10)})[0]
    assert torch.equal(first["w"], torch.zeros(10)) and torch.equal(second["w"], torch.ones(10))


def test_misuse_is_named_on_cpu():
    with pytest.raises(RuntimeError, match="actor rank 0 must be the master"):
        GlooCheckpointEngine.build_topology(1, 1, [None, None])
    with pytest.raises(RuntimeError, match="before init_process_group"):
        asyncio.run(GlooCheckpointEngine(bucket_size=64).send_weights(iter([])))
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes"):
        GlooCheckpointEngine(bucket_size=0)
