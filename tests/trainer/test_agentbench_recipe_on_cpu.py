"""``recipes/agentbench.yaml`` composed and validated without starting anything.

The recipe trains on the five AgentBench-FC tasks through one command: it must start their stack
itself, build the RL data with AgentRL's mixing, carry AgentRL's settings, name only tasks the
launcher knows, leave room for each task's turn limit and opening prompt, and pass our pre-Ray
checks and verl's batch arithmetic on CPU.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from agentrl_ext.config import AgentRLConfig
from agentrl_ext.data.store import install_from
from agentrl_ext.env.data_files import DataError
from agentrl_ext.env.launcher import EnvStack, wants_mariadb
from agentrl_ext.env.tasks import task_spec, task_specs
from agentrl_ext.models.tiny import TinyModelSpec
from agentrl_ext.platform.cpu_defaults import apply_cpu_defaults
from agentrl_ext.run_spec import resolve_run_spec
from agentrl_ext.testing.vendored_data import vendored_data_dir
from agentrl_ext.trainer.checks import check_config
from agentrl_ext.trainer.main import recipes_dir
from envs.dbbench.task import DBBenchTask

RECIPE = "agentbench"

#: AgentBench-FC's turn limits (THUDM/AgentBench configs/tasks/*.yaml: dbbench and kg 15 rounds,
#: os 8, alfworld 20 steps; WebShop 20 rounds in AgentRL's setting)
TURN_LIMITS = {"dbbench": 15, "os": 8, "alfworld": 20, "kg": 15, "webshop": 20}

#: the task classes' own names for those limits (their constructors' defaults must agree)
LIMIT_ARGUMENT = {
    "dbbench": "max_round",
    "os": "round_limit",
    "alfworld": "max_step",
    "kg": "max_round",
    "webshop": "max_round",
}

#: the longest opening prompt (system + first user message + tool schemas, rendered with the tiny
#: model's tokenizer and chat template) of each task's train split as agentrl-train serves it,
#: measured through the controller (dbbench: its dev split offline; kg: no one-shot example on
#: train); max over all samples for dbbench, os, kg, over 24 evenly spaced ones for alfworld, webshop
LONGEST_OPENING_PROMPT = {"dbbench": 1237, "os": 1250, "alfworld": 2002, "kg": 2302, "webshop": 885}


def _compose(overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        return compose(config_name=RECIPE, overrides=overrides or [])


def _filled(tmp_path: Path, overrides: list[str] | None = None) -> DictConfig:
    """The recipe after what agentrl-train does before its checks: the tiny model built (here: its
    folder), the RL data written, the controller URL of the started stack."""
    config = _compose(
        [f"agentrl.cache_dir={tmp_path / 'cache'}", f"trainer.default_local_dir={tmp_path / 'run'}"]
        + (overrides or [])
    )
    Path(str(config.actor_rollout_ref.model.path)).mkdir(parents=True)
    for path in (Path(str(config.data.train_files)), Path(str(config.data.val_files))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return config


def test_agentbench_recipe_starts_the_five_tasks_and_builds_their_data_on_cpu():
    config = _compose()
    agentrl = AgentRLConfig.from_config(config.agentrl)
    assert agentrl.envs.launch and agentrl.assets.build_env_data
    assert sorted(agentrl.envs.tasks or []) == sorted(TURN_LIMITS)
    assert agentrl.envs.split == "train"
    # AgentRL's round-robin mixing survives verl's data loader, and a batch holds every task once
    assert config.data.shuffle is False
    assert config.data.train_batch_size % len(TURN_LIMITS) == 0
    assert agentrl.assets.build_tiny_model
    assert not agentrl.sft.enable and not agentrl.eval.enable  # no expert / held-out stack for these


def test_every_task_of_the_agentbench_recipe_is_known_to_the_launcher_on_cpu():
    agentrl = AgentRLConfig.from_config(_compose().agentrl)
    tasks = list(agentrl.envs.tasks or [])
    assert set(tasks) <= set(task_specs())
    # the stack the job would start (built, not started): train split of every task
    stack = EnvStack(
        tasks=tasks,
        port=agentrl.envs.port,
        split=agentrl.envs.split,
        kwargs={k: dict(v) for k, v in (agentrl.envs.task_kwargs or {}).items()},
    )
    assert stack.task_kwargs["dbbench"]["split"] == "train"
    assert stack.task_kwargs["alfworld"]["split"] == "train"
    assert stack.api == f"http://127.0.0.1:{agentrl.envs.port}/api"
    # the agent loop's URL follows the stack's port (the run spec derives it)
    assert resolve_run_spec(_compose()).controller_url == stack.api
    moved = resolve_run_spec(_compose(["agentrl.envs.port=5123"]))
    assert moved.controller_url == moved.agentrl.agent_loop.controller_url == "http://127.0.0.1:5123/api"
    # os is the task that needs the Docker engine
    assert [t for t in tasks if "docker" in task_spec(t).needs] == ["os"]


def test_dbbench_runs_on_mariadb_unless_sqlite_is_asked_for_on_cpu():
    agentrl = AgentRLConfig.from_config(_compose().agentrl)
    kwargs = dict((agentrl.envs.task_kwargs or {}).get("dbbench", {}))
    assert kwargs.get("backend") in (None, "mariadb")
    assert wants_mariadb("dbbench", kwargs)  # the stack starts the MariaDB server
    switched = AgentRLConfig.from_config(
        _compose(["+agentrl.envs.task_kwargs.dbbench.backend=sqlite"]).agentrl
    )
    assert not wants_mariadb("dbbench", dict((switched.envs.task_kwargs or {})["dbbench"]))


def test_dbbench_trains_on_its_train_split_or_fails_naming_the_fix_on_cpu(tmp_path):
    agentrl = AgentRLConfig.from_config(_compose().agentrl)
    stack = EnvStack(
        tasks=list(agentrl.envs.tasks or []),
        port=agentrl.envs.port,
        split=agentrl.envs.split,
        kwargs={k: dict(v) for k, v in (agentrl.envs.task_kwargs or {}).items()},
    )
    assert stack.task_kwargs["dbbench"]["split"] == "train"  # never dev unasked
    shared = vendored_data_dir()
    if not (shared / "SHA256SUMS").is_file():
        pytest.skip(f"no vendored data copy at {shared}")
    install_from(shared, tmp_path)  # the vendored data has no db_out_new.jsonl
    with pytest.raises(DataError, match=r"agentrl-data fetch --only agentbench-large.*dbbench\.split=dev"):
        DBBenchTask(split=stack.task_kwargs["dbbench"]["split"], data_dir=tmp_path)
    asked = AgentRLConfig.from_config(_compose(["+agentrl.envs.task_kwargs.dbbench.split=dev"]).agentrl)
    dev = EnvStack(
        tasks=["dbbench"],
        port=asked.envs.port,
        split=asked.envs.split,
        kwargs={k: dict(v) for k, v in (asked.envs.task_kwargs or {}).items()},
    )
    assert DBBenchTask(split=dev.task_kwargs["dbbench"]["split"], data_dir=tmp_path).split == "dev"


def test_agentbench_recipe_has_agentrl_settings_on_cpu():
    config = _compose()
    agentrl = AgentRLConfig.from_config(config.agentrl)
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == "agentrl"
    assert config.algorithm.adv_estimator == "task_norm_grpo"
    assert config.trainer.v1.trainer_mode == "agentrl_sync"
    assert rollout.n > 1
    assert agentrl.agent_loop.incomplete_punishment == pytest.approx(-0.2)
    assert (actor.clip_ratio, actor.clip_ratio_c) == (0.2, 3.0)
    assert agentrl.cross_policy.enable
    assert (agentrl.cross_policy.stale_ratio, agentrl.cross_policy.stale_step) == (0.25, 25)
    assert rollout.name == "hf" and rollout.calculate_log_probs
    assert config.algorithm.rollout_correction.bypass_mode
    assert config.trainer.total_training_steps == 2


@pytest.mark.parametrize("task", sorted(TURN_LIMITS))
def test_agentbench_recipe_leaves_each_task_its_turn_limit_on_cpu(task):
    import importlib

    module_name, class_name = task_spec(task).task_class.split(":")
    task_class = getattr(importlib.import_module(module_name), class_name)
    default = inspect.signature(task_class.__init__).parameters[LIMIT_ARGUMENT[task]].default
    assert default == TURN_LIMITS[task]
    assert AgentRLConfig.from_config(_compose().agentrl).agent_loop.max_turns >= TURN_LIMITS[task]


def test_agentbench_recipe_fits_every_opening_prompt_on_cpu():
    config = _compose()
    prompt = int(config.actor_rollout_ref.rollout.prompt_length)
    response = int(config.actor_rollout_ref.rollout.response_length)
    assert prompt == config.data.max_prompt_length and response == config.data.max_response_length
    for task, tokens in LONGEST_OPENING_PROMPT.items():
        assert tokens <= prompt, f"{task}'s opening prompt ({tokens} tokens) would end as prompt_too_long"
    # the tiny model's positions cover a whole episode (its default of 4096 would not)
    spec = TinyModelSpec(**AgentRLConfig.from_config(config.agentrl).assets.tiny_model_spec)
    assert spec.max_position_embeddings >= prompt + response
    # a turn's tokens fit the response budget
    turn = AgentRLConfig.from_config(config.agentrl).agent_loop.max_tokens_per_turn
    assert turn is not None and turn < response


def test_agentbench_recipe_passes_our_checks_and_verl_arithmetic_on_cpu(tmp_path):
    from verl.utils import config as verl_config

    # our plugin may have wrapped it with the pre-Ray hook: take verl's own
    validate = inspect.unwrap(verl_config.validate_config)

    def checked(overrides: list[str]) -> DictConfig:
        config = _filled(tmp_path / str(len(overrides)), overrides)
        assert check_config(config, cuda=False) is None
        apply_cpu_defaults(config)
        return config

    config = checked([])
    # the arithmetic verl needs, from the recipe's numbers: whole mini-batches per step, and a
    # step's episodes split evenly over the data-parallel ranks
    batch, mini = config.data.train_batch_size, config.actor_rollout_ref.actor.ppo_mini_batch_size
    ranks = config.trainer.n_gpus_per_node * config.trainer.nnodes
    assert batch % mini == 0 and (batch * config.actor_rollout_ref.rollout.n) % ranks == 0
    assert validate(config, use_reference_policy=True, use_critic=False) is None
    # and verl's check does run on this config: one prompt fewer than a mini-batch is refused there
    short = checked([f"data.train_batch_size={mini - 1}"])
    with pytest.raises(
        ValueError, match=rf"train_batch_size \({mini - 1}\) must be >= actor.ppo_mini_batch_size \({mini}\)"
    ):
        validate(short, use_reference_policy=True, use_critic=False)


def test_agentbench_recipe_without_os_still_validates_on_cpu(tmp_path):
    config = _filled(tmp_path, ["agentrl.envs.tasks=[dbbench,alfworld,kg,webshop]"])
    check_config(config, cuda=False)
    assert AgentRLConfig.from_config(config.agentrl).envs.tasks == ["dbbench", "alfworld", "kg", "webshop"]


def test_unknown_task_in_the_agentbench_recipe_is_named_on_cpu():
    config = _compose(["agentrl.envs.tasks=[dbbench,webshopp]"])
    with pytest.raises(ValueError, match="unknown task 'webshopp'; known tasks: .*webshop"):
        AgentRLConfig.from_config(config.agentrl)
