"""Validation plays on a held-out split's controller, on a bounded sample.

Two real environment stacks on 127.0.0.1 (the launcher's guess task): one serving the train split,
one the test split. The validation rows (``agentrl-build-dataset --kind val``) go to
``agentrl.agent_loop.val_controller_url``; the pre-run check refuses a validation controller that
serves the train split, and the agent loop sends validation rows to that controller.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from omegaconf import OmegaConf

from agentrl_ext.config import AgentRLConfig
from agentrl_ext.data.multitask import bounded_sample, build_multitask_dataset, fetch_indices
from agentrl_ext.data.multitask import main as build_dataset
from agentrl_ext.env.launcher import EnvStack, free_port
from agentrl_ext.rollout.agent_loop import close_controller_clients, controller_client, validation_settings
from agentrl_ext.run_spec import resolve_run_spec
from agentrl_ext.trainer.checks import check_environment


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    with (
        EnvStack(
            ["guess"], port=free_port(), split="train", log_dir=logs / "train", ready_timeout_s=120
        ) as train,
        EnvStack(
            ["guess"], port=free_port(), split="test", log_dir=logs / "test", ready_timeout_s=120
        ) as test,
    ):
        yield train.api, test.api


def _config(tmp_path, train_api: str, val_api: str | None):
    train = build_multitask_dataset(
        asyncio.run(fetch_indices(train_api, ["guess"])), tmp_path / "train.parquet"
    )
    out = tmp_path / "val.parquet"
    assert build_dataset(["--controller-url", val_api or train_api, "--tasks", "guess", "--kind", "val",
                          "--max-per-task", "5", "--out", str(out)]) == 0  # fmt: skip
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"agent": {"default_agent_loop": "agentrl"}}},
            "data": {"train_files": str(train), "val_files": str(out)},
            "agentrl": {"agent_loop": {"controller_url": train_api, "val_controller_url": val_api}},
        }
    )
    return config, resolve_run_spec(config)


def test_validation_rows_are_a_bounded_sample_of_the_test_split_on_cpu(stacks, tmp_path):
    import pandas as pd

    train_api, test_api = stacks
    config, agentrl = _config(tmp_path, train_api, test_api)
    check_environment(config, agentrl)  # the test-split controller serves the validation rows
    rows = pd.read_parquet(config.data.val_files)
    assert len(rows) == 5 and set(rows["data_source"]) == {"guess"}
    test_indices = set(asyncio.run(fetch_indices(test_api, ["guess"]))["guess"])
    indices = [json.loads(e["sample_index"]) for e in rows["extra_info"]]
    assert set(indices) <= test_indices and len(set(indices)) == 5
    assert {e["split"] for e in rows["extra_info"]} == {"val"}


def test_a_validation_controller_on_the_train_split_is_refused_on_cpu(stacks, tmp_path):
    train_api, _test_api = stacks
    config, agentrl = _config(tmp_path, train_api, train_api)
    with pytest.raises(
        ValueError, match=r"val_controller_url=.* serves the train split of \['guess'\].*--split test"
    ):
        check_environment(config, agentrl)


def test_the_agent_loop_sends_validation_rows_to_the_validation_controller_on_cpu():
    loop = AgentRLConfig.from_config(
        {
            "agent_loop": {
                "controller_url": "http://127.0.0.1:5020/api",
                "val_controller_url": "http://127.0.0.1:5021/api",
            }
        }
    ).agent_loop
    plain = AgentRLConfig.from_config(
        {"agent_loop": {"controller_url": "http://127.0.0.1:5020/api"}}
    ).agent_loop

    async def urls() -> tuple[str, str, str]:
        try:
            return (
                controller_client(loop).base_url,
                controller_client(validation_settings(loop)).base_url,
                controller_client(validation_settings(plain)).base_url,
            )
        finally:
            await asyncio.sleep(0)

    try:
        assert asyncio.run(urls()) == (
            "http://127.0.0.1:5020/api",
            "http://127.0.0.1:5021/api",
            "http://127.0.0.1:5020/api",  # none set: the training controller
        )
    finally:
        close_controller_clients()


def test_bounded_sample_keeps_order_and_is_seeded_on_cpu():
    indices = {"a": list(range(10)), "b": ["x", "y"]}
    first = bounded_sample(indices, 3, seed=1)
    assert len(first["a"]) == 3 and first["a"] == sorted(first["a"]) and set(first["a"]) <= set(range(10))
    assert first["b"] == ["x", "y"]  # fewer than the bound: all of them
    assert bounded_sample(indices, 3, seed=1) == first
    assert bounded_sample(indices, None) == indices
    with pytest.raises(ValueError, match="max_per_task=0 must be >= 1"):
        bounded_sample(indices, 0)
