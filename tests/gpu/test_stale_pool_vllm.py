"""The cross-policy stale pool on vLLM: standalone vLLM replicas refreshed through verl's NCCL
checkpoint engine, the same ``StandalonePool`` code as the CPU test (``tests/rollout/test_standalone_pool_on_cpu.py``).

Marked ``gpu``: skipped without two CUDA GPUs (NCCL puts the sender and the vLLM replica on
different devices), ``vllm`` or ``cupy`` (verl's NCCL engine). No checkpoint is needed: the test
builds a tiny Qwen2 model (head size 64, which vLLM's attention backends take), or uses the local
checkpoint named by ``AGENTRL_GPU_TEST_MODEL``.

The sender is :class:`~agentrl_ext.testing.weight_sender.WeightSenderWorker` on GPU 0 (verl's
actor worker's sending half). Whether the stale replica serves the weights of a refresh is read
from its own log-probs: after the sender's weights are scaled to zero, every logit is 0 and every
sampled token's log-prob is exactly -log(vocabulary size), which no other weights give.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs two CUDA GPUs (the NCCL sender and the vLLM replica on different devices)",
    ),
]

RECIPE = "gpu_qwen2.5_7b_fsdp_vllm"
PROMPT = [11, 42, 7, 99, 5, 23]


def _model(tmp_path: Path) -> str:
    given = os.environ.get("AGENTRL_GPU_TEST_MODEL")
    if given:
        return given
    from agentrl_ext.models.tiny import build_tiny_model

    return str(
        build_tiny_model(
            tmp_path / "model", hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512
        )
    )


def _config(model: str):
    from agentrl_ext.trainer.main import recipes_dir

    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        return compose(
            config_name=RECIPE,
            overrides=[
                f"actor_rollout_ref.model.path={model}",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                "actor_rollout_ref.rollout.enforce_eager=true",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64",
                "data.max_prompt_length=64",
                "data.max_response_length=16",
            ],
        )


def test_vllm_stale_pool_takes_the_actors_weights_through_nccl_only_when_refreshed(tmp_path):
    missing = [m for m in ("vllm", "cupy") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {missing} installed (GPU-only packages)")
    import ray
    from transformers import AutoConfig
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.workers.rollout.llm_server import LLMServerClient

    from agentrl_ext.rollout.standalone_pool import StandalonePool
    from agentrl_ext.testing.weight_sender import sender_group

    model = _model(tmp_path)
    vocab = AutoConfig.from_pretrained(model).vocab_size
    config = _config(model)
    ray.init(include_dashboard=False, log_to_driver=True)
    try:
        actor = sender_group(model, backend="nccl", device="cuda", bucket_megabytes=64)
        pool = StandalonePool.create(config, num_replicas=1, start_rank=0, actor_wg=actor)
        assert isinstance(pool.sync, CheckpointEngineManager) and pool.sync.backend == "nccl"
        client = LLMServerClient(config=config, load_balancer_handle=pool.load_balancer)

        def uniform_gap(request: str) -> float:
            """Largest distance of a sampled token's log-prob from -log(vocab)."""
            params = {"temperature": 1.0, "logprobs": True, "max_tokens": 8, "ignore_eos": True}
            out = asyncio.run(client.generate(request, prompt_ids=PROMPT, sampling_params=params))
            assert out.log_probs and len(out.log_probs) == 8
            return max(abs(lp + math.log(vocab)) for lp in out.log_probs)

        actor.scale(0.0)  # the "trained" weights: all zero
        pool.refresh(1)
        assert uniform_gap("after-refresh-1") < 1e-3, "the refresh did not land in the vLLM replica"
        actor.perturb(seed=1, std=0.5)  # the actor moves on: no refresh, the stale replica stays put
        assert uniform_gap("between-refreshes") < 1e-3, "the stale replica changed without a refresh"
        pool.refresh(2)
        assert uniform_gap("after-refresh-2") > 1e-2, "the second refresh did not land in the vLLM replica"
        assert pool.version == 2 and actor.send_count() == [2]
    finally:
        ray.shutdown()
