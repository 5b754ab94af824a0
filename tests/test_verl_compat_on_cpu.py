"""Fails loudly when verl changes a name or default the CPU backend relies on."""

from __future__ import annotations

import importlib
import time

import pytest

from agentrl_ext import verl_compat


def test_verl_version_is_pinned_on_cpu(monkeypatch):
    import re
    from pathlib import Path

    import verl

    # the pin the package installs (setup.cfg), the one the code checks, and the one installed agree
    setup_cfg = (Path(__file__).resolve().parents[1] / "setup.cfg").read_text()
    pins = set(re.findall(r"verl\[[a-z,-]+\]==([0-9.]+)", setup_cfg))
    assert pins == {verl_compat.VERL_VERSION} == {verl.__version__}
    assert verl_compat.check_verl_version() is None
    # another verl is refused, naming both versions and the fix
    monkeypatch.setattr(verl, "__version__", "0.9.2")
    with pytest.raises(
        RuntimeError, match=r"verl==0\.9\.1 but verl 0\.9\.2 is installed; install verl\[verl-core\]==0\.9\.1"
    ):
        verl_compat.check_verl_version()


@pytest.mark.parametrize(("module", "attr"), verl_compat.PRIVATE_NAMES)
def test_private_verl_names_exist_on_cpu(module, attr):
    obj = importlib.import_module(module)
    for part in attr.split("."):
        assert hasattr(obj, part), f"verl {module}.{attr} is gone: update agentrl_ext.verl_compat"
        obj = getattr(obj, part)


def test_plugin_activates_cpu_backend_on_cpu():
    import verl  # noqa: F401  (loads the verl.plugins entry point)
    from verl.plugin.platform import get_platform
    from verl.utils.distributed import initialize_global_process_group_ray
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from agentrl_ext.platform.hf_rollout import HFReplica, HFServerAdapter

    platform = get_platform()
    assert platform.device_name == "cpu"
    assert platform.communication_backend_name() == "gloo"
    assert platform.ray_resource_options(0.5) == {"num_cpus": 0.5}
    assert get_rollout_replica_class("hf") is HFReplica
    assert get_rollout_class("hf", "async") is HFServerAdapter
    assert initialize_global_process_group_ray.__defaults__ == (None, "gloo")
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__ == "FSDPEngineWithLMHead"


def test_torchrun_process_group_uses_gloo_on_cpu():
    """verl's torchrun entry points (the SFT trainer) initialise a gloo group on the CPU platform."""
    import os
    import subprocess
    import sys

    from agentrl_ext.testing.env_servers import free_port

    script = (
        "import torch.distributed as dist, verl\n"
        "from verl.utils import distributed\n"
        "print(distributed.initialize_global_process_group(60), dist.get_backend())\n"
        "dist.destroy_process_group()\n"
    )
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "(0, 0, 1) gloo"


def test_cpu_device_module_covers_verl_calls_on_cpu():
    from agentrl_ext.platform.cpu_platform import cpu_device_module as dev

    dev.empty_cache()
    dev.synchronize()
    free, total = dev.mem_get_info()
    assert 0 < free <= total
    assert dev.memory_allocated() > 0
    state = dev.get_rng_state()
    dev.set_rng_state(state)
    assert dev.current_device() == "cpu"
    with pytest.raises(AttributeError, match="does not emulate"):
        dev.no_such_cuda_call  # noqa: B018


def test_trainer_step_methods_keep_their_signature_and_call_order_on_cpu():
    import inspect

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    for name in ("_compute_old_log_prob", "_compute_advantage"):
        params = list(inspect.signature(getattr(PPOTrainer, name)).parameters)
        assert params == ["self", "batch", "metrics"], f"PPOTrainer.{name}{params}: update TrainerStepHooks"
    # verl's step calls them on the batch, old log-probs before advantages
    step = inspect.getsource(PPOTrainer._step_once)
    old, adv = step.find("self._compute_old_log_prob(batch"), step.find("self._compute_advantage(batch")
    assert 0 <= old < adv, "verl's PPOTrainer._step_once no longer calls the hooked methods in this order"


def test_trainer_step_hooks_wrap_verl_methods_on_cpu():
    from contextlib import contextmanager

    calls = []

    class Base:
        def _compute_old_log_prob(self, batch, metrics):
            calls.append("verl old_log_prob")
            return batch + 1

        def _compute_advantage(self, batch, metrics):
            calls.append("verl advantage")
            return batch + 10

    class Trainer(verl_compat.TrainerStepHooks, Base):
        def after_old_log_prob(self, batch, metrics):
            calls.append(f"after old_log_prob {batch}")

        @contextmanager
        def around_advantage(self, batch, metrics):
            calls.append("before advantage")
            yield
            calls.append("after advantage")

    trainer = Trainer()
    assert trainer._compute_advantage(trainer._compute_old_log_prob(0, {}), {}) == 11
    assert calls == [
        "verl old_log_prob",
        "after old_log_prob 1",
        "before advantage",
        "verl advantage",
        "after advantage",
    ]


def test_bypass_mode_makes_rollout_log_probs_the_old_log_probs_on_cpu(monkeypatch):
    """The effect cross-policy sampling relies on: with rollout_correction.bypass_mode=true verl's
    trainer takes the rollout engine's log-probs as old_log_probs (no actor recompute)."""
    from types import SimpleNamespace

    import torch
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import trainer_base

    rollout = torch.tensor([[-0.5, -1.25, -2.0]])
    stored = {"rollout_log_probs": rollout}

    def kv_batch_get(keys, partition_id, select_fields):
        return {f: stored[f] for f in select_fields}

    def kv_batch_put(keys, partition_id, fields):
        stored.update(fields)

    monkeypatch.setattr(trainer_base.tq, "kv_batch_get", kv_batch_get)
    monkeypatch.setattr(trainer_base.tq, "kv_batch_put", kv_batch_put)

    class NoActor:
        def compute_log_prob(self, batch):
            raise AssertionError("bypass mode must not recompute old log-probs with the actor")

    stub = SimpleNamespace(
        config=OmegaConf.create({"algorithm": {"rollout_correction": {"bypass_mode": True}}}),
        actor_rollout_wg=NoActor(),
    )
    batch = SimpleNamespace(keys=["k0"], partition_id="train", extra_info={})
    trainer_base.PPOTrainer._compute_old_log_prob(stub, batch, {})
    assert torch.equal(stored["old_log_probs"], rollout)


def test_batch_advantages_reads_what_verls_compute_advantage_writes_on_cpu(monkeypatch):
    """verl's ``_compute_advantage`` puts ``response_to_nested(advantages, response_mask)`` (its own
    writer, used here) into TransferQueue; ``batch_advantages`` gives each sample its row back."""
    from types import SimpleNamespace

    import torch
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import trainer_base
    from verl.workers.utils.padding import response_to_nested

    assert trainer_base.response_to_nested is response_to_nested  # the writer verl's trainer uses
    masks = [torch.tensor([1, 1, 0]), torch.tensor([0, 1])]
    mask = torch.nested.as_nested_tensor(masks, layout=torch.jagged)
    padded = torch.tensor([[0.5, -0.5, 0.0], [0.0, 2.0, 9.0]])  # 9.0 lies beyond the 2nd response
    stored = {
        "uid": ["u0", "u1"],
        "data_source": ["guess", "calc"],
        "advantages": response_to_nested(padded, mask),
        "response_mask": mask,
    }
    monkeypatch.setattr(
        tq, "kv_batch_get", lambda keys, partition_id, select_fields: {f: stored[f] for f in select_fields}
    )
    out = verl_compat.batch_advantages(SimpleNamespace(keys=["k0", "k1"], partition_id="train"))
    assert (out["uid"], out["data_source"]) == (["u0", "u1"], ["guess", "calc"])
    assert [a.tolist() for a in out["advantages"]] == [[0.5, -0.5, 0.0], [0.0, 2.0]]
    assert [m.tolist() for m in out["response_mask"]] == [[1, 1, 0], [0, 1]]


def test_engine_registry_layout_on_cpu():
    from verl.workers.engine.base import EngineRegistry

    verl_compat.register_fsdp_engine_for_cpu()
    engines = EngineRegistry._engines
    assert engines["language_model"]["fsdp2"]["cpu"].__name__ == "FSDPEngineWithLMHead"
    assert engines["value_model"]["fsdp"]["cpu"].__name__ == "FSDPEngineWithValueHead"


@pytest.mark.parametrize(("module", "attr"), verl_compat.RAY_PRIVATE_NAMES)
def test_ray_private_names_on_cpu(module, attr):
    import ray

    fn = getattr(importlib.import_module(module), attr)
    ray.init(num_cpus=3, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    try:
        per_node = fn()
    finally:
        ray.shutdown()
    assert isinstance(per_node, dict) and per_node
    assert sum(node.get("CPU", 0) for node in per_node.values()) == 3


def test_replica_server_fields_feed_verls_public_properties_on_cpu():
    from verl.workers.rollout.replica import RolloutReplica

    from agentrl_ext.platform.hf_rollout import HFReplica

    assert [a for _, a in verl_compat.PRIVATE_ATTRIBUTES][:2] == ["_server_handle", "_server_address"]
    replica = RolloutReplica.__new__(HFReplica)
    handle = object()
    verl_compat.set_replica_server(replica, handle, "hf-rollout://x")
    assert replica.server_handle is handle
    assert replica.server_address == "hf-rollout://x"


def test_replay_buffer_poll_interval_reaches_verls_wait_on_cpu(monkeypatch):
    """verl's ``PPOTrainer._build_replay_buffer()`` returns the buffer, whose
    ``_wait_for_next_poll`` sleeps ``poll_interval``: the hook's value is what it sleeps."""
    import inspect

    from verl.trainer.ppo.v1 import replay_buffer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    assert list(inspect.signature(PPOTrainer._build_replay_buffer).parameters) == ["self"]
    assert "self.replay_buffer = self._build_replay_buffer()" in inspect.getsource(PPOTrainer.__init__)

    class Buffer:  # verl's own wait on a stand-in for the buffer's state
        _wait_for_next_poll = replay_buffer.ReplayBuffer._wait_for_next_poll

        def __init__(self) -> None:
            self.poll_interval = 2.0
            self.pending_keys = self.running_keys = self.finished_keys = {"p": []}

    class Base:
        def _build_replay_buffer(self):
            return Buffer()

    class Trainer(verl_compat.TrainerStepHooks, Base):
        def replay_buffer_poll_interval_s(self):
            return 0.05

    slept: list[float] = []
    monkeypatch.setattr(replay_buffer.time, "sleep", slept.append)
    Trainer()._build_replay_buffer()._wait_for_next_poll("p", time.time())
    assert slept == [0.05]

    class Untouched(verl_compat.TrainerStepHooks, Base):
        pass

    assert Untouched()._build_replay_buffer().poll_interval == 2.0


def test_submit_prompts_starts_prompts_through_verls_trainer_on_cpu():
    """verl's ``PPOTrainer._add_prompts_to_generate(num_prompts)`` takes that many prompts from the
    dataloader and hands them to the rollout; the async pipeline's feeder relies on both."""
    import inspect

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    assert list(inspect.signature(PPOTrainer._add_prompts_to_generate).parameters) == ["self", "num_prompts"]

    class Trainer:  # verl's own method on a stand-in for the trainer's dataloader and rollout
        _add_prompts_to_generate = PPOTrainer._add_prompts_to_generate

        def __init__(self) -> None:
            self.calls: list[tuple[str, object]] = []

        def _next_train_batch(self, num_prompts):
            self.calls.append(("fetch", num_prompts))
            return ["prompt"] * num_prompts

        def _submit_batch_to_rollout(self, batch):
            self.calls.append(("submit", len(batch)))
            return len(batch)

    trainer = Trainer()
    assert verl_compat.submit_prompts(trainer, 3) == 3
    assert trainer.calls == [("fetch", 3), ("submit", 3)]
    assert verl_compat.submit_prompts(trainer, 0) == 0 and len(trainer.calls) == 2


def test_sft_dataset_takes_tools_from_the_json_column_on_cpu(tmp_path):
    import inspect
    import json

    import pandas as pd
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    from agentrl_ext.testing.tiny_model import tiny_model_path

    assert list(inspect.signature(MultiTurnSFTDataset._read_files_and_process).parameters) == ["self"]
    tools = [
        {
            "type": "function",
            "function": {"name": "a", "parameters": {"properties": {"x": {"type": "string"}}}},
        },
        {
            "type": "function",
            "function": {"name": "b", "parameters": {"properties": {"y": {"type": "integer"}}}},
        },
    ]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    path = tmp_path / "rows.parquet"
    pd.DataFrame([{"messages": messages, "tools": tools, "tools_json": json.dumps(tools)}]).to_parquet(path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = OmegaConf.create({"max_length": 256, "truncation": "error", "pad_mode": "no_padding"})
    cls = verl_compat.sft_dataset_with_tools_from("tools_json", "Exact", __name__)
    assert (cls.__name__, cls.__module__) == ("Exact", __name__)
    exact = cls(str(path), tokenizer, config)
    assert exact.tools == [tools]
    assert '"y": {"type": "integer"}' in tokenizer.decode(exact[0]["input_ids"].tolist())
    # verl reads the struct column back merged: tool "a" gains "y": null
    plain = MultiTurnSFTDataset(str(path), tokenizer, config)
    assert plain.tools[0][0]["function"]["parameters"]["properties"] == {"x": {"type": "string"}, "y": None}


def test_without_colocated_rollout_leaves_verls_trainer_only_training_workers_on_cpu():
    """verl's ``PPOTrainer._init_resource_pool_mgr`` and ``_setup`` read ``_enable_hybrid_replicas``:
    without colocated replicas the actor workers take role ``actor`` (no rollout) and the reference
    policy gets a group of its own; by default the role is ``actor_rollout_ref``."""
    import inspect

    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from agentrl_ext.trainer.main import recipes_dir

    assert (
        "verl.trainer.ppo.v1.trainer_base.PPOTrainer",
        "_enable_hybrid_replicas",
    ) in verl_compat.PRIVATE_ATTRIBUTES
    assert 'getattr(self, "_enable_hybrid_replicas", True)' in inspect.getsource(PPOTrainer._setup)
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(config_name="cpu_agentrl")  # a KL loss: a reference policy is needed

    class Trainer(PPOTrainer):  # verl's own method on an uninitialised trainer (no Ray, no workers)
        def on_sample_end(self) -> None: ...

        def on_step_end(self) -> None: ...

    def roles(trainer) -> set:
        trainer.config = config
        PPOTrainer._init_resource_pool_mgr(trainer)
        return set(trainer.role_worker_mapping)

    assert roles(Trainer.__new__(Trainer)) == {Role.ActorRolloutRef}
    trainer = Trainer.__new__(Trainer)
    verl_compat.without_colocated_rollout(trainer)
    assert roles(trainer) == {Role.Actor, Role.RefPolicy}


def test_sft_train_sampler_replaces_the_one_verls_sft_trainer_builds_on_cpu(monkeypatch, tmp_path):
    """``SFTTrainer._build_dataloader`` builds its samplers from the module's ``DistributedSampler``
    (checked in its source by the hook); the hook swaps that name. The dataset keeps each row's task
    and the data config's global batch, which the sampler reads."""
    import json

    import pandas as pd
    import verl.trainer.sft_trainer as sft_trainer
    from omegaconf import OmegaConf
    from torch.utils.data import DistributedSampler
    from transformers import AutoTokenizer

    from agentrl_ext.testing.tiny_model import tiny_model_path

    class Sampler(DistributedSampler):
        pass

    monkeypatch.setattr(sft_trainer, "DistributedSampler", sft_trainer.DistributedSampler)
    assert sft_trainer.DistributedSampler is DistributedSampler
    verl_compat.use_sft_train_sampler(Sampler)
    assert sft_trainer.DistributedSampler is Sampler

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    path = tmp_path / "rows.parquet"
    pd.DataFrame(
        [{"messages": messages, "tools_json": json.dumps([]), "task": t} for t in ("guess", "calc", "guess")]
    ).to_parquet(path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = OmegaConf.create(
        {"max_length": 256, "truncation": "error", "pad_mode": "no_padding", "train_batch_size": 8}
    )
    dataset = verl_compat.sft_dataset_with_tools_from("tools_json", "Grouped", __name__)(
        str(path), tokenizer, config
    )
    assert (dataset.batch_groups, dataset.global_batch_size) == (["guess", "calc", "guess"], 8)
