"""AgentRL multi-task mixing and the dataset rows our agent loop reads."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from agentrl_ext.data.multitask import build_multitask_dataset, decode_sample_index, mix_tasks


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
