"""One training step of each GPU recipe (``recipes/gpu_*.yaml``) on this machine's GPUs.

Marked ``gpu``: skipped without CUDA, and skipped with the reason named where something else is
missing. Beyond CUDA GPUs it needs:

- the recipe's engines, all GPU-only: ``vllm`` or ``sglang`` for the rollout; for the 32B recipe's
  training engine every module verl 0.9.1's Megatron engine imports (megatron-core, NVIDIA
  Megatron-Bridge, TransformerEngine: ``pip install -e ".[megatron]"`` or verl's Megatron image).
  Without megatron at all the 32B case skips; with a partial stack it fails naming the module;
- the model weights on disk (nothing is downloaded): ``AGENTRL_QWEN2_5_7B``, ``AGENTRL_QWEN2_5_14B``,
  ``AGENTRL_QWEN2_5_32B`` name local Hugging Face checkpoints of Qwen2.5-{7B,14B,32B}-Instruct;
- one node with enough GPUs for the recipe's model parallelism (training TP x PP, rollout TP).

What it shrinks, so that one step fits one node in minutes: the recipe's nodes become this node
(``trainer.nnodes=1``, up to 8 GPUs: DP shrinks, TP/PP stay as written), the batch becomes one
prompt group per DP rank, episodes are short. The environments are the repository's letters and
digits tasks behind a real controller on 127.0.0.1 (AgentBench workers need Docker and their
data): the step covers recipe -> verl's engine -> rollout engine -> agentrl agent loop -> update.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from agentrl_ext.trainer.main import recipes_dir

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

WORKERS = [
    ("letters", "letters", "agentrl_ext.envs.letters.task:LettersTask"),
    ("digits", "digits", "agentrl_ext.envs.letters.task:DigitsTask"),
]
# recipe -> (environment variable with the checkpoint, modules its engines import)
RECIPES = {
    "gpu_qwen2.5_7b_fsdp_vllm": ("AGENTRL_QWEN2_5_7B", ["vllm"]),
    "gpu_qwen2.5_14b_fsdp_sglang": ("AGENTRL_QWEN2_5_14B", ["sglang"]),
    "gpu_qwen2.5_32b_megatron": ("AGENTRL_QWEN2_5_32B", ["vllm", "megatron.core"]),
}
#: what verl 0.9.1's Megatron engine imports beyond megatron.core (tests/packaging/test_gpu_extras_on_cpu.py
#: finds them in verl's source), and verl's own engine modules, which import the rest
MEGATRON_ENGINE_MODULES = [
    "megatron.core",
    "megatron.bridge",
    "transformer_engine.pytorch",
    "verl.models.mcore.bridge",
    "verl.workers.engine.megatron.transformer_impl",
]


def _check_megatron_stack() -> None:
    """Import every module of the Megatron engine; a partial stack fails naming the module and the fix."""
    import importlib

    for module in MEGATRON_ENGINE_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            pytest.fail(
                f"megatron is installed but {module} does not import ({exc}); verl 0.9.1's Megatron engine needs "
                'megatron-core, Megatron-Bridge and TransformerEngine: pip install -e ".[megatron]" or verl\'s image'
            )


def _one_node(recipe: str) -> tuple[int, int]:
    """``(GPUs to use on this node, DP size)`` with the recipe's TP/PP, or skip."""
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(config_name=recipe)
    actor = config.actor_rollout_ref.actor
    model_parallel = 1
    if actor.strategy == "megatron":
        model_parallel = (
            actor.megatron.tensor_model_parallel_size * actor.megatron.pipeline_model_parallel_size
        )
    rollout_tp = config.actor_rollout_ref.rollout.tensor_model_parallel_size
    gpus = min(torch.cuda.device_count(), config.trainer.n_gpus_per_node)
    if gpus % model_parallel or gpus % rollout_tp:
        pytest.skip(f"{recipe} needs a multiple of {model_parallel} (TP x PP) and {rollout_tp} (rollout TP) GPUs; "
                    f"this node has {torch.cuda.device_count()}")  # fmt: skip
    return gpus, gpus // model_parallel


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_runs_one_step(recipe, tmp_path):
    from agentrl_ext.data.multitask import build_multitask_dataset, fetch_indices
    from agentrl_ext.testing.env_servers import env_servers

    env_var, modules = RECIPES[recipe]
    missing = [m for m in modules if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        pytest.skip(f"{recipe} needs {missing} installed (GPU-only packages)")
    if "megatron.core" in modules:
        _check_megatron_stack()
    model = os.environ.get(env_var)
    if not model or not (Path(model) / "config.json").exists():
        pytest.skip(f"set {env_var} to a local Hugging Face checkpoint for {recipe}")
    gpus, dp = _one_node(recipe)
    prompts = max(dp, 2)  # one GRPO group (n=8) per DP rank: 8 trajectories each
    with env_servers(WORKERS, tmp_path / "logs") as servers:
        indices = asyncio.run(fetch_indices(servers.controller_url, ["letters", "digits"]))
        train = build_multitask_dataset(indices, tmp_path / "data" / "train.parquet", seed=0)
        metrics_file = tmp_path / "metrics.jsonl"
        cmd = [
            sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", recipe,
            f"actor_rollout_ref.model.path={model}",
            f"agentrl.agent_loop.controller_url={servers.controller_url}",
            "agentrl.agent_loop.val_controller_url=null",  # no validation here (test_freq -1)
            "agentrl.agent_loop.max_turns=4", "agentrl.agent_loop.max_tokens_per_turn=64",
            f"data.train_files={train}", f"data.val_files={train}",
            f"data.train_batch_size={prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            "data.max_prompt_length=1024", "data.max_response_length=1024",
            "trainer.nnodes=1", f"trainer.n_gpus_per_node={gpus}",
            "trainer.total_training_steps=1", "trainer.val_before_train=false",
            "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console,file]",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ]  # fmt: skip
        env = dict(
            os.environ, AGENTRL_CACHE_DIR=str(tmp_path / "cache"), VERL_FILE_LOGGER_PATH=str(metrics_file)
        )
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    steps = {r["step"]: r["data"] for r in map(json.loads, metrics_file.read_text().splitlines())}
    assert sorted(steps) == [1]
    metrics = steps[1]
    assert metrics["actor/grad_norm"] > 0
    for task in ("letters", "digits"):
        assert metrics[f"agentrl/task/{task}/episodes"] > 0
    assert metrics["agentrl/env/failed_episodes"] == 0
