"""The run spec: the ``agentrl`` node resolved once (derived values included), frozen, written into
verl's config in one step before the first stage, and read back as is by verl's processes."""

from __future__ import annotations

import contextlib
import pickle
from dataclasses import FrozenInstanceError
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from agentrl_ext.eval.cli import build_parser
from agentrl_ext.eval.runner import EvalSettings
from agentrl_ext.run_spec import pin_run_spec, resolve_run_spec, run_spec


def _config(tmp_path: Path, **agentrl) -> OmegaConf:
    return OmegaConf.create(
        {
            "agentrl": {"cache_dir": str(tmp_path / "cache"), **agentrl},
            "actor_rollout_ref": {"model": {"path": "${agentrl.cache_dir}/tiny"}},
            "trainer": {"default_local_dir": str(tmp_path / "run")},
            "data": {},
        }
    )


def test_the_controller_url_is_derived_from_the_launched_stack_on_cpu(tmp_path):
    launched = resolve_run_spec(_config(tmp_path, envs={"launch": True, "tasks": ["guess"], "port": 5123}))
    assert launched.controller_url == "http://127.0.0.1:5123/api"
    assert launched.agentrl.agent_loop.controller_url == "http://127.0.0.1:5123/api"
    assert launched.eval_controller_url == "http://127.0.0.1:5123/api"
    own = resolve_run_spec(_config(tmp_path, agent_loop={"controller_url": "http://127.0.0.1:9/api"}))
    assert own.controller_url == "http://127.0.0.1:9/api"
    assert resolve_run_spec(_config(tmp_path)).controller_url is None


def test_a_controller_url_beside_a_launched_stack_is_refused_with_the_fix_on_cpu(tmp_path):
    config = _config(
        tmp_path,
        envs={"launch": True, "tasks": ["guess"], "port": 5123},
        agent_loop={"controller_url": "http://127.0.0.1:9/api"},
    )
    with pytest.raises(ValueError, match=r"controller_url=http://127.0.0.1:9/api.*5123.*leave .* unset"):
        resolve_run_spec(config)


def test_the_evaluation_values_follow_the_agent_loop_unless_set_on_cpu(tmp_path):
    spec = resolve_run_spec(
        _config(tmp_path, agent_loop={"max_turns": 7, "controller_url": "http://a:1/api"})
    )
    assert (spec.eval_max_turns, spec.eval_controller_url) == (7, "http://a:1/api")
    spec = resolve_run_spec(
        _config(
            tmp_path, agent_loop={"max_turns": 7}, eval={"max_turns": 3, "controller_url": "http://b:2/api"}
        )
    )
    assert (spec.eval_max_turns, spec.eval_controller_url) == (3, "http://b:2/api")


def test_the_run_spec_is_frozen_on_cpu(tmp_path):
    spec = resolve_run_spec(_config(tmp_path))
    with pytest.raises(FrozenInstanceError):
        spec.controller_url = "http://x/api"  # type: ignore[misc]
    with pytest.raises(
        FrozenInstanceError, match=r"AgentLoopConfig.max_turns is part of the resolved run spec"
    ):
        spec.agentrl.agent_loop.max_turns = 3
    with pytest.raises(FrozenInstanceError):
        spec.agentrl.cache_dir = "/elsewhere"


def test_pinning_writes_the_resolved_node_that_verl_processes_read_back_on_cpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, envs={"launch": True, "tasks": ["guess"], "port": 5123})
    config.agentrl.cache_dir = "relative/cache"
    spec = pin_run_spec(config)
    assert pin_run_spec(config) is spec  # once per config object
    # what a Ray process receives: a copy of verl's config, nothing else
    shipped = pickle.loads(pickle.dumps(config))
    assert shipped.agentrl.agent_loop.controller_url == "http://127.0.0.1:5123/api"
    assert shipped.agentrl.cache_dir == str(tmp_path / "relative" / "cache")
    assert shipped.actor_rollout_ref.model.path == str(tmp_path / "relative" / "cache" / "tiny")
    monkeypatch.chdir(tmp_path / "..")  # another working directory: the same values
    assert run_spec(shipped) == spec
    assert run_spec(shipped) is run_spec(shipped)  # once per process and config object


def test_the_job_writes_no_controller_url_into_verl_s_config_mid_run_on_cpu(tmp_path, monkeypatch):
    """The launched stack must serve the URL the spec resolved; it is not written back after the
    launch (a stack elsewhere is an error naming both URLs)."""
    from agentrl_ext.env import launcher
    from agentrl_ext.trainer import assets, checks, prepare
    from agentrl_ext.trainer.job import run_job

    config = _config(tmp_path, envs={"launch": True, "tasks": ["guess"], "port": 5123})
    pinned = OmegaConf.to_container(OmegaConf.create(OmegaConf.to_container(config)))
    seen = {}

    @contextlib.contextmanager
    def fake_stack(_agentrl, register_stop=None):  # launch_from_config's signature
        yield SimpleNamespace(api=stack_api)

    def record(rl_config):
        seen["agentrl"] = OmegaConf.to_container(rl_config.agentrl)

    monkeypatch.setattr(launcher, "launch_from_config", fake_stack)
    # the assets, platform and check steps are not what this test is about
    monkeypatch.setattr(assets, "prepare_assets", lambda *_args: None)
    monkeypatch.setattr(prepare, "platform_changes", lambda _config: None)
    monkeypatch.setattr(checks, "check_run", lambda *_args: None)
    stack_api = "http://127.0.0.1:5123/api"
    run_job(config, record)
    assert seen["agentrl"]["agent_loop"]["controller_url"] == stack_api
    assert "agent_loop" not in pinned["agentrl"]  # the recipe set no URL: the spec derived it
    elsewhere = _config(tmp_path, envs={"launch": True, "tasks": ["guess"], "port": 5123})
    stack_api = "http://127.0.0.1:6000/api"
    with pytest.raises(
        RuntimeError, match=r"serves http://127.0.0.1:6000/api.*resolved http://127.0.0.1:5123/api"
    ):
        run_job(elsewhere, record)


def test_evaluation_defaults_are_the_config_s_on_cpu():
    """agentrl-eval-run, EvalSettings and agentrl.eval / agentrl.agent_loop share one default each."""
    from agentrl_ext.config import AgentRLConfig

    config = AgentRLConfig()
    settings = EvalSettings()
    args = build_parser().parse_args(["--controller-url", "http://x/api", "--tasks", "t", "--model", "m"])
    assert settings.concurrency == config.eval.concurrency == args.concurrency
    assert settings.temperature == config.eval.temperature == args.temperature
    assert settings.runs == config.eval.runs_per_sample == args.runs
    assert settings.max_turns == config.agent_loop.max_turns == args.max_turns
    assert settings.success_reward == config.agent_loop.success_reward
    assert settings.env_timeout_s == config.agent_loop.env_timeout_s
