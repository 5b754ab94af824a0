"""The GPU recipes (``recipes/gpu_*.yaml``) composed and validated without a GPU.

Each recipe must resolve once the user fills its mandatory model path, carry AgentRL's settings
(DESIGN §2), name an engine and a rollout that verl 0.9.1 registers, lay its parallel sizes out so
that they divide the real Qwen2.5 model and its batch, and pass both our pre-Ray check (as on a
CUDA machine) and verl's own ``validate_config`` arithmetic.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from agentrl_ext.config import AgentRLConfig
from agentrl_ext.trainer.main import check_config, recipes_dir


@dataclass(frozen=True)
class Arch:
    """The numbers of a model's ``config.json`` that parallel sizes must divide."""

    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    hidden: int  # hidden_size
    intermediate: int  # intermediate_size
    vocab: int  # vocab_size


# config.json of Qwen/Qwen2.5-{7B,14B,32B}-Instruct on the Hugging Face hub (same for the base models)
QWEN2_5_7B = Arch(layers=28, heads=28, kv_heads=4, hidden=3584, intermediate=18944, vocab=152064)
QWEN2_5_14B = Arch(layers=48, heads=40, kv_heads=8, hidden=5120, intermediate=13824, vocab=152064)
QWEN2_5_32B = Arch(layers=64, heads=40, kv_heads=8, hidden=5120, intermediate=27648, vocab=152064)


@dataclass(frozen=True)
class Layout:
    """What a recipe promises (also written in its header comment)."""

    arch: Arch
    strategy: str  # actor / ref engine backend
    rollout: str
    gpus: int
    tp: int  # training tensor parallel
    pp: int  # training pipeline parallel
    dp: int  # training data parallel
    rollout_tp: int
    rollout_replicas: int
    trajectories_per_dp_rank: int  # per step
    micro_batches_per_mini_batch: int  # gradient accumulation per optimizer update and DP rank


RECIPES = {
    "gpu_qwen2.5_7b_fsdp_vllm": Layout(QWEN2_5_7B, "fsdp2", "vllm", 8, 1, 1, 8, 2, 4, 64, 8),
    "gpu_qwen2.5_14b_fsdp_sglang": Layout(QWEN2_5_14B, "fsdp2", "sglang", 16, 1, 1, 16, 2, 8, 32, 8),
    "gpu_qwen2.5_32b_megatron": Layout(QWEN2_5_32B, "megatron", "vllm", 32, 4, 2, 4, 4, 8, 128, 64),
}


def test_every_gpu_recipe_is_listed_here_on_cpu():
    assert sorted(p.stem for p in Path(recipes_dir()).glob("gpu_*.yaml")) == sorted(RECIPES)


def _compose(name: str, overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        return compose(config_name=name, overrides=overrides or [])


def _filled(name: str, tmp_path: Path, overrides: list[str] | None = None, model: bool = True) -> DictConfig:
    """The recipe with what a user provides: the model downloaded and the datasets built under the cache."""
    config = _compose(name, [f"agentrl.cache_dir={tmp_path}", *(overrides or [])])
    paths = [Path(str(config.data.train_files)), Path(str(config.data.val_files))]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    if model:
        Path(str(config.actor_rollout_ref.model.path)).mkdir(parents=True, exist_ok=True)
    return config


def _missing_keys(node: DictConfig, prefix: str = "") -> set[str]:
    """Full keys of the mandatory (``???``) values still unset."""
    out = set()
    for key in node:
        full = f"{prefix}{key}"
        if OmegaConf.is_missing(node, key):
            out.add(full)
        elif isinstance(node[key], DictConfig):
            out |= _missing_keys(node[key], f"{full}.")
    return out


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_resolves_with_model_and_data_under_the_cache_on_cpu(recipe, tmp_path):
    # verl's own placeholder of the (disabled) reward model's rollout stays unset, as in verl's configs
    config = _filled(recipe, tmp_path)
    assert not config.reward.reward_model.enable
    assert _missing_keys(config) == {"reward.reward_model.rollout.name"}
    resolved = OmegaConf.to_container(config, resolve=True)
    model = "Qwen2.5-" + recipe.split("_")[2].upper() + "-Instruct"
    assert resolved["actor_rollout_ref"]["model"]["path"] == f"{tmp_path}/models/{model}"
    assert resolved["data"]["train_files"] == f"{tmp_path}/agentbench_data/train.parquet"
    assert resolved["data"]["val_files"] == f"{tmp_path}/agentbench_data/val.parquet"
    AgentRLConfig.from_config(config.agentrl)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_has_agentrl_settings_on_cpu(recipe, tmp_path):
    config = _filled(recipe, tmp_path)
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    agentrl = AgentRLConfig.from_config(config.agentrl)
    assert config.algorithm.adv_estimator == "task_norm_grpo"
    assert config.trainer.v1.trainer_mode == "agentrl_sync"
    assert (rollout.n, rollout.temperature) == (8, 0.8)
    assert (actor.clip_ratio, actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (
        0.2,
        0.2,
        0.2,
        3.0,
    )
    assert actor.loss_agg_mode == "token-mean"
    assert actor.use_kl_loss and actor.kl_loss_coef == pytest.approx(1e-4)
    assert not config.algorithm.use_kl_in_reward
    assert actor.optim.lr == pytest.approx(1e-6)
    # the behaviour log-probs of the rollout engine drive the PPO ratio
    assert rollout.calculate_log_probs
    assert config.algorithm.rollout_correction.bypass_mode
    assert config.algorithm.rollout_correction.loss_type == "ppo_clip"
    assert rollout.agent.default_agent_loop == "agentrl"
    assert agentrl.agent_loop.controller_url
    assert agentrl.agent_loop.incomplete_punishment == pytest.approx(-0.2)
    assert agentrl.agent_loop.max_turns >= 20  # ALFWorld and WebShop allow 20 turns
    # no stale pool on vLLM/SGLang yet; the paper's values stay for when it comes
    assert not agentrl.cross_policy.enable
    assert (agentrl.cross_policy.stale_ratio, agentrl.cross_policy.stale_step) == (0.25, 25)


def _engine_registrations() -> set[tuple[str, str, str]]:
    """``(model_type, backend, device)`` of every ``@EngineRegistry.register`` in verl's source.

    Read from the files, because verl registers an engine only when its optional dependency
    imports (megatron-core is GPU-only and not installed on CPU machines).
    """
    import verl.workers.engine.base as base

    out = set()
    for path in Path(base.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "EngineRegistry.register"):
                continue
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            backends, devices = kw["backend"], kw.get("device", "cuda")  # verl's default device
            for backend in [backends] if isinstance(backends, str) else backends:
                for device in [devices] if isinstance(devices, str) else devices:
                    out.add((kw["model_type"], backend, device))
    return out


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_names_exist_in_verl_registries_on_cpu(recipe, tmp_path):
    from verl.workers.engine import EngineRegistry
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    layout = RECIPES[recipe]
    config = _filled(recipe, tmp_path)
    declared = _engine_registrations()
    for role in ("actor", "ref"):
        backend = config.actor_rollout_ref[role].strategy
        assert backend == layout.strategy
        assert ("language_model", backend, "cuda") in declared, f"verl registers no CUDA engine {backend!r}"
        live = EngineRegistry._engines["language_model"].get(backend)
        if live is not None:
            assert "cuda" in live
        else:  # registered lazily: only its GPU-only dependency is missing here
            assert backend == "megatron" and importlib.util.find_spec("megatron") is None
    name = config.actor_rollout_ref.rollout.name
    assert name == layout.rollout
    assert name in RolloutReplicaRegistry._registry
    # the replica class the registry would load is in verl's source (imported only with vLLM/SGLang)
    loader_source = inspect.getsource(RolloutReplicaRegistry._registry[name])
    module = next(
        n.module
        for n in ast.walk(ast.parse(loader_source))
        if isinstance(n, ast.ImportFrom) and "rollout" in n.module
    )
    site = Path(importlib.util.find_spec("verl").origin).parents[1]
    assert (site / (module.replace(".", "/") + ".py")).exists(), module


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_parallel_sizes_divide_model_and_batch_on_cpu(recipe, tmp_path):
    layout = RECIPES[recipe]
    arch = layout.arch
    config = _filled(recipe, tmp_path)
    actor, rollout, trainer = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, config.trainer
    gpus = trainer.nnodes * trainer.n_gpus_per_node
    if actor.strategy == "megatron":
        mc = actor.megatron
        tp, pp, cp = mc.tensor_model_parallel_size, mc.pipeline_model_parallel_size, mc.context_parallel_size
        ref = config.actor_rollout_ref.ref.megatron  # the reference model runs with the same layout
        assert (ref.tensor_model_parallel_size, ref.pipeline_model_parallel_size) == (tp, pp)
    else:
        tp, pp, cp = 1, 1, actor.fsdp_config.ulysses_sequence_parallel_size
        assert actor.fsdp_config.fsdp_size == -1  # shard over every GPU
    assert gpus % (tp * pp * cp) == 0
    dp = gpus // (tp * pp * cp)
    assert (gpus, tp, pp, dp) == (layout.gpus, layout.tp, layout.pp, layout.dp)
    # training: TP splits attention heads, KV heads, the MLP and the vocabulary; PP splits layers
    for size in (arch.heads, arch.kv_heads, arch.hidden, arch.intermediate, arch.vocab):
        assert size % tp == 0, f"TP {tp} does not divide {size}"
    assert arch.layers % pp == 0, f"PP {pp} does not divide {arch.layers} layers"
    assert tp <= trainer.n_gpus_per_node  # TP stays inside a node (NVLink)
    # rollout: each replica shards heads and KV heads over its TP ranks, within one node
    rtp = (
        rollout.tensor_model_parallel_size * rollout.pipeline_model_parallel_size * rollout.data_parallel_size
    )
    assert rtp == layout.rollout_tp
    assert arch.heads % rollout.tensor_model_parallel_size == 0
    assert arch.kv_heads % rollout.tensor_model_parallel_size == 0
    assert trainer.n_gpus_per_node % rtp == 0 and gpus // rtp == layout.rollout_replicas
    # batch: trajectories split evenly over DP ranks, mini-batches into whole micro-batches
    n, micro = rollout.n, actor.ppo_micro_batch_size_per_gpu
    assert not actor.use_dynamic_bsz
    trajectories, mini = config.data.train_batch_size * n, actor.ppo_mini_batch_size * n
    assert config.data.train_batch_size % actor.ppo_mini_batch_size == 0
    assert trajectories % dp == 0 and trajectories // dp == layout.trajectories_per_dp_rank
    assert mini % dp == 0 and (mini // dp) % micro == 0
    assert mini // dp // micro == layout.micro_batches_per_mini_batch
    if pp > 1:  # enough micro-batches to fill the pipeline
        assert layout.micro_batches_per_mini_batch >= pp
    # a whole GRPO group (n rollouts of one prompt) per mini-batch
    assert actor.ppo_mini_batch_size >= 1


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_passes_our_check_with_cuda_on_cpu(recipe, tmp_path):
    config = _filled(recipe, tmp_path)
    check_config(config, cuda=True)
    rollout = config.actor_rollout_ref.rollout.name
    with pytest.raises(ValueError, match=f"rollout.name={rollout} needs a CUDA GPU"):
        check_config(config, cuda=False)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_without_its_model_stops_before_ray_on_cpu(recipe, tmp_path):
    config = _filled(recipe, tmp_path, model=False)
    with pytest.raises(
        FileNotFoundError, match=f"model.path={tmp_path}/models/Qwen2.5-.*-Instruct does not exist"
    ):
        check_config(config, cuda=True)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_cross_policy_on_gpu_recipe_needs_a_checkpoint_engine_for_the_stale_pool_on_cpu(recipe, tmp_path):
    """Turned on, cross-policy sampling needs a checkpoint engine that reaches standalone replicas."""
    config = _filled(recipe, tmp_path, ["agentrl.cross_policy.enable=true"])
    with pytest.raises(ValueError, match=r"checkpoint_engine.backend=naive reaches only.*backend=nccl"):
        check_config(config, cuda=True)
    nccl = "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"
    check_config(_filled(recipe, tmp_path, ["agentrl.cross_policy.enable=true", nccl]), cuda=True)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_passes_verl_validate_config_on_cpu(recipe, tmp_path, capsys):
    from verl.utils import config as verl_config

    # our plugin may have wrapped it with the pre-Ray hook (files, controller): take verl's own
    validate = inspect.unwrap(verl_config.validate_config)
    config = _filled(recipe, tmp_path)
    validate(config, use_reference_policy=True, use_critic=False)
    assert "All configuration checks passed" in capsys.readouterr().out
    # and it checks the arithmetic: 3 prompts x 3 samples split over no DP size of these recipes
    bad = _filled(
        recipe,
        tmp_path,
        [
            "data.train_batch_size=3",
            "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            "actor_rollout_ref.rollout.n=3",
        ],
    )
    with pytest.raises(AssertionError, match=r"real_train_batch_size \(9\) must be divisible"):
        validate(bad, use_reference_policy=True, use_critic=False)
