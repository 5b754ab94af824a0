"""AgentRL multi-task mixing and the dataset rows our agent loop reads."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from agentrl_ext.data.multitask import build_multitask_dataset, mix_tasks
from agentrl_ext.env.protocol import decode_sample_index


def test_smaller_tasks_are_repeated_to_the_largest_on_cpu():
    mixed = mix_tasks({"big": list(range(10)), "small": [0, 1, 2], "mid": list(range(5))}, seed=0)
    counts = Counter(t for t, _ in mixed)
    assert counts == {"big": 10, "small": 10, "mid": 10}
    assert Counter(i for t, i in mixed if t == "big") == Counter(range(10))
    small = Counter(i for t, i in mixed if t == "small")
    assert max(small.values()) - min(small.values()) <= 1  # repeated evenly


def test_streams_are_interleaved_round_robin_on_cpu():
    mixed = mix_tasks({"a": [1, 2, 3], "b": ["x", "y", "z"]}, seed=1)
    assert [t for t, _ in mixed] == ["a", "b"] * 3


def test_task_weights_scale_a_task_and_spread_it_evenly_on_cpu():
    mixed = mix_tasks(
        {"a": list(range(6)), "b": list(range(3)), "c": list(range(6))}, seed=0, weights={"a": 2.0}
    )
    order = [t for t, _ in mixed]
    assert Counter(order) == {"a": 12, "b": 6, "c": 6}
    # every window of 4 holds a twice and b and c once each
    for start in range(0, len(order), 4):
        assert Counter(order[start : start + 4]) == {"a": 2, "b": 1, "c": 1}
    assert Counter(i for t, i in mixed if t == "a") == Counter({i: 2 for i in range(6)})
    # a weight below 1 thins a task out; weights of 1 are the plain round-robin
    half = mix_tasks({"a": list(range(8)), "b": list(range(8))}, seed=0, weights={"b": 0.5})
    assert Counter(t for t, _ in half) == {"a": 8, "b": 4}
    assert mix_tasks({"a": [1, 2], "b": [3, 4]}, seed=2, weights={"a": 1.0}) == mix_tasks(
        {"a": [1, 2], "b": [3, 4]}, seed=2
    )


@pytest.mark.parametrize(
    ("weights", "match"),
    [({"zz": 2.0}, r"\['zz'\].*not among the run's tasks"), ({"a": 0.0}, r"must be > 0.*'a': 0.0")],
)
def test_bad_task_weights_are_named_on_cpu(weights, match):
    with pytest.raises(ValueError, match=match):
        mix_tasks({"a": [1], "b": [2]}, weights=weights)


def test_task_weights_config_must_be_positive_on_cpu():
    from agentrl_ext.config import AssetsConfig

    with pytest.raises(ValueError, match=r"agentrl.assets.task_weights must be > 0.*guess"):
        AssetsConfig(task_weights={"guess": -1.0})


def test_mixing_is_seeded_on_cpu():
    spec = {"a": list(range(20)), "b": list(range(7))}
    assert mix_tasks(spec, seed=3) == mix_tasks(spec, seed=3)
    assert mix_tasks(spec, seed=3) != mix_tasks(spec, seed=4)


def test_empty_task_is_named_on_cpu():
    with pytest.raises(ValueError, match=r"\['b'\]"):
        mix_tasks({"a": [1], "b": []})


def test_dataset_rows_carry_task_and_index_on_cpu(tmp_path):
    path = build_multitask_dataset({"os": [1, 2], "db": ["q1"]}, tmp_path / "train.parquet", seed=0)
    frame = pd.read_parquet(path)
    assert len(frame) == 4
    assert set(frame["agent_name"]) == {"agentrl"}
    assert sorted(frame["data_source"]) == ["db", "db", "os", "os"]
    first = frame.iloc[0]
    assert decode_sample_index(first["extra_info"]["sample_index"]) in (1, 2, "q1")
    assert {decode_sample_index(e["sample_index"]) for e in frame["extra_info"]} == {1, 2, "q1"}
    assert first["extra_info"]["task"] == first["data_source"]
    assert list(frame["extra_info"].map(lambda e: e["index"])) == [0, 1, 2, 3]


def test_val_split_is_not_repeated_on_cpu(tmp_path):
    frame = pd.read_parquet(
        build_multitask_dataset({"a": [1, 2, 3], "b": [9]}, tmp_path / "v.parquet", split="val")
    )
    assert Counter(frame["data_source"]) == {"a": 3, "b": 1}


def test_run_data_stage_applies_the_task_weights_on_cpu(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from agentrl_ext.config import AgentRLConfig
    from agentrl_ext.data import multitask
    from agentrl_ext.trainer.job import build_env_data

    async def indices(url, tasks):
        return {t: list(range(4)) for t in tasks}

    async def splits(url, tasks):
        return {t: ["train"] for t in tasks}

    monkeypatch.setattr(multitask, "fetch_indices", indices)
    monkeypatch.setattr(multitask, "fetch_splits", splits)
    agentrl = OmegaConf.structured(AgentRLConfig)
    agentrl.assets.task_weights = {"guess": 2.0}
    config = OmegaConf.create(
        {
            "agentrl": agentrl,
            "data": {
                "train_files": str(tmp_path / "train.parquet"),
                "val_files": str(tmp_path / "val.parquet"),
            },
        }
    )
    build_env_data(
        config, "http://127.0.0.1:1/api", ["guess", "calc"], seed=0, weights=agentrl.assets.task_weights
    )
    assert Counter(pd.read_parquet(tmp_path / "train.parquet")["data_source"]) == {"guess": 8, "calc": 4}
    assert Counter(pd.read_parquet(tmp_path / "val.parquet")["data_source"]) == {"guess": 4, "calc": 4}


def test_run_data_stage_refuses_a_held_out_split_on_cpu(tmp_path, monkeypatch):
    """agentrl.envs.split=test would make the RL data of the held-out samples: refused, with the fix."""
    from omegaconf import OmegaConf

    from agentrl_ext.config import AgentRLConfig
    from agentrl_ext.data import multitask
    from agentrl_ext.trainer.job import build_env_data

    async def splits(url, tasks):
        return {"guess": ["test"], "calc": ["train"]}

    monkeypatch.setattr(multitask, "fetch_splits", splits)
    config = OmegaConf.create(
        {
            "agentrl": OmegaConf.structured(AgentRLConfig),
            "data": {"train_files": str(tmp_path / "t.parquet"), "val_files": str(tmp_path / "v.parquet")},
        }
    )
    with pytest.raises(ValueError, match=r"held-out split\(s\) \(guess: test\).*agentrl.envs.split=train"):
        build_env_data(config, "http://127.0.0.1:1/api", ["guess", "calc"], seed=0)
    assert not (tmp_path / "t.parquet").exists()


def test_the_job_writes_env_data_below_the_resolved_cache_dir_on_cpu(tmp_path, monkeypatch):
    """With agentrl.cache_dir unset (resolved from $AGENTRL_CACHE_DIR), the RL data goes to
    <cache>/agentrl_data, never to ./None/agentrl_data in the working directory."""
    from hydra import compose, initialize_config_dir

    from agentrl_ext.data import multitask
    from agentrl_ext.trainer.job import run_job
    from agentrl_ext.trainer.main import recipes_dir

    async def indices(url, tasks):
        return {t: list(range(3)) for t in tasks}

    async def splits(url, tasks):
        return {t: ["train"] for t in tasks}

    class Stop(Exception):
        pass

    def stop(*_args, **_kwargs):
        raise Stop

    monkeypatch.setattr(multitask, "fetch_indices", indices)
    monkeypatch.setattr(multitask, "fetch_splits", splits)
    monkeypatch.setattr("agentrl_ext.trainer.assets.prepare_assets", stop)  # the stage after the RL data
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(cache))
    monkeypatch.chdir(work)
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(
            config_name="cpu_agentrl",
            overrides=[
                "agentrl.assets.build_env_data=true",
                "agentrl.envs.tasks=[letters,digits]",
                f"trainer.default_local_dir={tmp_path / 'run'}",
            ],
        )
    assert config.agentrl.cache_dir is None
    with pytest.raises(Stop):
        run_job(config, lambda c: None)
    assert sorted(p.name for p in (cache / "agentrl_data").iterdir()) == ["train.parquet", "val.parquet"]
    assert list(work.iterdir()) == []
