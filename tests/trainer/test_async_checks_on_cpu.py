"""The pre-Ray checks accept trainer.v1.trainer_mode=agentrl_async and name the fix for combinations
it cannot run."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from agentrl_ext.rollout.standalone_pool import standalone_rollout
from agentrl_ext.run_spec import resolve_run_spec
from agentrl_ext.trainer.checks import check_algorithm, check_async_pipeline
from agentrl_ext.trainer.main import recipes_dir


def _check_algorithm(config):
    check_algorithm(config, resolve_run_spec(config))


def _check_async_pipeline(config, cuda=False):
    return check_async_pipeline(config, resolve_run_spec(config), cuda=cuda)


@pytest.fixture(scope="module")
def async_config():
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        return compose(config_name="cpu_agentrl", overrides=["trainer.v1.trainer_mode=agentrl_async"])


def _with(config, **values):
    config = OmegaConf.create(OmegaConf.to_container(config))
    with open_dict(config):
        for key, value in values.items():
            OmegaConf.update(config, key, value, force_add=True)
    return config


def test_async_mode_passes_the_checks_with_task_normalized_grpo_on_cpu(async_config):
    assert async_config.algorithm.adv_estimator == "task_norm_grpo"
    _check_algorithm(async_config)
    _check_async_pipeline(async_config)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"trainer.use_v1": False}, "trainer.use_v1=true"),
        ({"actor_rollout_ref.rollout.name": "vllm"}, "set actor_rollout_ref.hybrid_engine=false"),
        # a standalone pool needs devices of its own
        ({"actor_rollout_ref.hybrid_engine": False}, "nnodes=0 x n_gpus_per_node=1 gives them no device"),
        ({"trainer.v1.sampler.custom_sampler": {"path": "x.py", "name": "S"}}, "unset it"),
        ({"algorithm.filter_groups": {"enable": True}}, "algorithm.filter_groups.enable=false"),
        # 4 prompts x 4 episodes per batch: 12 trajectories can never make a batch
        ({"agentrl.async_pipeline.buffer_size": 12}, "buffer_size to at least 16"),
        ({"agentrl.async_pipeline.buffer_size": 18}, "multiples of actor_rollout_ref.rollout.n=4"),
        ({"agentrl.async_pipeline.concurrency": 2}, "multiples of actor_rollout_ref.rollout.n=4"),
        ({"agentrl.async_pipeline.min_group_size": 5}, "min_group_size=5 must be within"),
        ({"data.train_batch_size": 6}, "train_batch_size=6 must be a multiple"),
    ],
)
def test_async_mode_rejects_what_it_cannot_run_naming_the_fix_on_cpu(async_config, values, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        _check_async_pipeline(_with(async_config, **values))


STANDALONE = {
    "actor_rollout_ref.hybrid_engine": False,
    "actor_rollout_ref.rollout.nnodes": 1,
    "actor_rollout_ref.rollout.n_gpus_per_node": 4,
}


@pytest.mark.parametrize("rollout", ["hf", "vllm", "sglang"])
def test_async_mode_runs_any_rollout_from_a_standalone_pool_on_cpu(async_config, rollout):
    config = _with(
        async_config,
        **STANDALONE,
        **{
            "actor_rollout_ref.rollout.name": rollout,
            "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
        },
    )
    assert standalone_rollout(config)  # replicas of their own, refreshed through the checkpoint engine
    assert _check_async_pipeline(config, cuda=True) is None  # accepted
    # what makes vLLM/SGLang acceptable is the standalone pool: colocated, they would sleep through updates
    colocated = _with(config, **{"actor_rollout_ref.hybrid_engine": True})
    assert not standalone_rollout(colocated)
    if rollout == "hf":
        assert _check_async_pipeline(colocated, cuda=True) is None
    else:
        with pytest.raises(ValueError, match=f"with {rollout} replicas colocated.*hybrid_engine=false"):
            _check_async_pipeline(colocated, cuda=True)


def test_async_standalone_pool_refuses_the_naive_engine_naming_the_fix_on_cpu(async_config):
    config = _with(
        async_config,
        **STANDALONE,
        **{
            "actor_rollout_ref.rollout.name": "vllm",
            "actor_rollout_ref.rollout.checkpoint_engine.backend": "naive",
        },
    )
    with pytest.raises(
        ValueError, match=r"current pool's standalone replicas.*backend=naive reaches only.*nccl"
    ):
        _check_async_pipeline(config, cuda=True)


def test_task_norm_grpo_still_refuses_verls_own_trainer_modes_on_cpu(async_config):
    with pytest.raises(ValueError, match="agentrl_sync \\(or agentrl_async\\)"):
        _check_algorithm(_with(async_config, **{"trainer.v1.trainer_mode": "colocate_async"}))


def test_turn_credit_names_the_estimator_it_needs_on_cpu(async_config):
    credit = {"agentrl.turn_credit.weight": 1.0}
    _check_algorithm(_with(async_config, **credit))  # task_norm_grpo: fine
    with pytest.raises(
        ValueError, match="agentrl.turn_credit.weight=1.0 .* set algorithm.adv_estimator=task_norm_grpo"
    ):
        _check_algorithm(_with(async_config, **credit, **{"algorithm.adv_estimator": "grpo"}))
    _check_algorithm(_with(async_config, **{"algorithm.adv_estimator": "grpo"}))  # off: grpo stays allowed


def test_the_readme_command_for_async_on_vllm_passes_the_checks_on_cpu():
    """docs/training.md, "Where the rollout runs": the 7B vLLM recipe in agentrl_async with a standalone pool."""
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(
            config_name="gpu_qwen2.5_7b_fsdp_vllm",
            overrides=[
                "trainer.v1.trainer_mode=agentrl_async",
                "actor_rollout_ref.hybrid_engine=false",
                "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=4",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                "trainer.n_gpus_per_node=4",
            ],
        )
    _check_algorithm(config)
    _check_async_pipeline(config, cuda=True)
    # colocated, the same recipe is refused with the fix
    colocated = _with(config, **{"actor_rollout_ref.hybrid_engine": True})
    with pytest.raises(ValueError, match="set actor_rollout_ref.hybrid_engine=false"):
        _check_async_pipeline(colocated, cuda=True)
