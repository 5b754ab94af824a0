"""``trainer.v1.trainer_mode=agentrl_async`` on vLLM: the actor trains on GPU 0 while a standalone
vLLM replica on GPU 1 generates, refreshed after every step through verl's NCCL checkpoint engine.
The same code as the CPU test with a standalone ``hf`` replica and the gloo engine
(``tests/e2e/test_cpu_async_e2e.py::test_async_pipeline_with_a_standalone_rollout_pool_on_cpu``).

Marked ``gpu``: skipped without two CUDA GPUs, ``vllm`` or ``cupy`` (verl's NCCL engine). No
checkpoint is needed: the recipe builds the tiny model with a head size vLLM's attention backends
take (256 wide, 4 heads). Environments: the letters and digits workers behind a real controller on
127.0.0.1.
"""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs two CUDA GPUs (the actor and the standalone vLLM replica on different devices)",
    ),
]

MAX_STALENESS = 1


def test_async_pipeline_on_a_standalone_vllm_pool(tmp_path):
    missing = [m for m in ("vllm", "cupy") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {missing} installed (GPU-only packages)")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from test_cpu_agentrl_e2e import WORKERS, _train
    from test_cpu_async_e2e import STANDALONE

    from agentrl_ext.testing.env_servers import env_servers

    with env_servers(WORKERS, tmp_path / "logs") as servers:
        proc, steps = _train(
            tmp_path,
            servers.controller_url,
            [
                "trainer.device=cuda",
                "trainer.n_gpus_per_node=1",
                "trainer.total_training_steps=3",
                "trainer.v1.trainer_mode=agentrl_async",
                f"agentrl.async_pipeline.max_staleness={MAX_STALENESS}",
                "agentrl.cross_policy.enable=false",
                "agentrl.assets.tiny_model_spec={hidden_size: 256, num_heads: 4, num_kv_heads: 2, intermediate_size: 512}",
                *STANDALONE,
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.dtype=bfloat16",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                "actor_rollout_ref.rollout.enforce_eager=true",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            ],
        )
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert sorted(steps) == [1, 2, 3]
    assert "create worker group dict_keys(['actor', 'ref'])" in proc.stdout
    for step, m in steps.items():
        lags = [int(k.rsplit("_", 1)[1]) for k in m if k.startswith("agentrl/async/staleness/current/lag_")]
        assert lags and max(lags) <= MAX_STALENESS, (step, lags)
        assert m["actor/grad_norm"] > 0
