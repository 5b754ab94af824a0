"""``agentrl.assets.build_tiny_model``: the entry point builds the tiny model where it is missing,
rebuilds one it built from other settings, never touches a model it did not build, and checks
``tokenizer_expert_episodes`` before playing anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agentrl_ext.models.tiny import BUILD_RECORD
from agentrl_ext.run_spec import resolve_run_spec
from agentrl_ext.trainer.assets import prepare_assets


def _prepare(model: Path, cache_dir: Path | None = None, **assets) -> None:
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": str(model)}},
            "agentrl": {
                "cache_dir": str(cache_dir or model.parent / "cache"),
                "assets": {"build_tiny_model": True, **assets},
                "agent_loop": {},
            },
        }
    )
    prepare_assets(config, resolve_run_spec(config))


def _spec(model: Path) -> dict:
    return json.loads((model / BUILD_RECORD).read_text())["spec"]


def test_missing_model_is_built_then_reused_on_cpu(tmp_path):
    model = tmp_path / "tiny"
    _prepare(model, tiny_model_spec={"num_layers": 1})
    assert _spec(model)["num_layers"] == 1
    built = (model / "model.safetensors").stat().st_mtime_ns
    _prepare(model, tiny_model_spec={"num_layers": 1})
    assert (model / "model.safetensors").stat().st_mtime_ns == built, "an up-to-date model was rebuilt"


def test_model_built_from_other_settings_is_rebuilt_on_cpu(tmp_path):
    model = tmp_path / "tiny"
    _prepare(model, tiny_model_spec={"num_layers": 1})
    _prepare(model, tiny_model_spec={"num_layers": 2, "num_kv_heads": 4})
    assert _spec(model)["num_layers"] == 2 and _spec(model)["num_kv_heads"] == 4
    config = json.loads((model / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["num_key_value_heads"] == 4


def test_a_model_we_did_not_build_is_left_alone_on_cpu(tmp_path):
    model = tmp_path / "mine"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    _prepare(model, tiny_model_spec={"num_layers": 1})
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


def test_a_model_without_record_in_our_cache_is_rebuilt_on_cpu(tmp_path):
    """An older build in agentrl.cache_dir (before build records) is ours: brought up to date."""
    model = tmp_path / "cache" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    _prepare(model, cache_dir=tmp_path / "cache", tiny_model_spec={"num_layers": 1})
    assert _spec(model)["num_layers"] == 1


def test_tokenizer_expert_episodes_need_a_controller_and_a_valid_count_on_cpu(tmp_path):
    with pytest.raises(ValueError, match=r"tokenizer_expert_episodes needs expert episodes.*controller_url"):
        _prepare(tmp_path / "a", tokenizer_expert_episodes=8)
    with pytest.raises(ValueError, match=r"tokenizer_expert_episodes must be >= 0.*-1"):
        _prepare(tmp_path / "b", tokenizer_expert_episodes=-1)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
