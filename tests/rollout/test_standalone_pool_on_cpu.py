"""The stale pool takes its weights through verl's weight sync, on the CPU platform.

Real parts: verl's ``LLMServerManager`` launches the stale pool as standalone ``hf`` replicas (an
``HFRolloutServer`` and verl's ``CheckpointEngineWorker`` with our server adapter), verl's
``CheckpointEngineManager`` runs each refresh over the ``gloo`` checkpoint engine that the CPU
platform's defaults select, and our trainer hooks decide when. The one stand-in is the actor group:
:class:`~agentrl_ext.testing.weight_sender.WeightSenderWorker` holds a tiny model and sends it as
verl's actor worker does (no FSDP engine, optimizer or data); ``perturb`` is its optimizer step.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import ray
import torch
from hydra import compose, initialize_config_dir
from verl.checkpoint_engine import CheckpointEngineManager

from agentrl_ext.platform.cpu_defaults import apply_cpu_defaults
from agentrl_ext.rollout.standalone_pool import StandalonePool
from agentrl_ext.testing.tiny_model import tiny_model_path
from agentrl_ext.testing.weight_sender import sender_group
from agentrl_ext.trainer.agentrl_trainer import AgentRLTrainerHooks
from agentrl_ext.trainer.main import recipes_dir

STALE_STEP = 2


def _config(overrides: list[str], explicit: frozenset[str] = frozenset()) -> Any:
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(
            config_name="cpu_agentrl",
            overrides=[
                f"actor_rollout_ref.model.path={tiny_model_path()}",
                f"agentrl.cross_policy.stale_step={STALE_STEP}",
                "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
                *overrides,
            ],
        )
    apply_cpu_defaults(config, explicit)  # what agentrl-train / main_ppo do before Ray starts
    return config


class _VerlTrainer:
    """Stands in for verl's ``PPOTrainerSync`` below the hooks: its ``on_init_end`` /
    ``on_step_end`` would update the current pool (colocated, ``naive``); here they log the order."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def on_init_end(self) -> None:
        self.calls.append("current pool updated")

    def on_step_end(self) -> None:
        self.calls.append("current pool updated")


class _Trainer(AgentRLTrainerHooks, _VerlTrainer):
    def __init__(self, config: Any, actor_wg: Any) -> None:
        self.calls: list[str] = []
        super().__init__(self.calls)
        self.config, self.actor_rollout_wg, self.global_steps, self.timing_raw = config, actor_wg, 0, {}
        self.llm_server_manager = SimpleNamespace(get_replicas=lambda: [object()])  # one current replica


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _served(pool: StandalonePool) -> list[dict[str, torch.Tensor]]:
    servers = [server for replica in pool.replicas for server in replica.servers]
    return ray.get([server.export_state.remote() for server in servers])


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_stale_pool_takes_the_actors_weights_through_verls_sync_every_stale_step_on_cpu(
    local_ray, monkeypatch
):
    config = _config([])
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "gloo"
    actor = sender_group(str(tiny_model_path()), backend="gloo", bucket_megabytes=1)
    syncs: list[int] = []  # every refresh must be one of verl's CheckpointEngineManager syncs
    update_weights = CheckpointEngineManager.update_weights
    monkeypatch.setattr(
        CheckpointEngineManager,
        "update_weights",
        lambda self, global_steps=None: syncs.append(global_steps) or update_weights(self, global_steps),
    )
    trainer = _Trainer(config, actor)
    trainer.on_init_end()
    pool = trainer.stale_pool
    assert pool is not None
    assert isinstance(pool.sync, CheckpointEngineManager) and pool.sync.backend == "gloo"
    assert pool.sync.actor_wg is actor and pool.sync.replicas == pool.replicas
    assert [r.replica_rank for r in pool.replicas] == [1]  # after the current pool's replica 0
    # the stale pool is refreshed before verl's hook wakes the current pool
    assert trainer.calls == ["current pool updated"] and syncs == [0]

    served = {0: actor.state()[0]}
    assert all(_equal(s, served[0]) for s in _served(pool))
    for step in range(1, 2 * STALE_STEP + 2):
        actor.perturb(seed=step)  # the optimizer step of `step`
        trainer.global_steps = step
        trainer.on_step_end()
        weights = actor.state()[0]
        version = step - step % STALE_STEP
        served.setdefault(version, weights)
        for state in _served(pool):
            assert _equal(state, served[version]), f"step {step}: stale replica should serve step {version}"
            assert _equal(state, weights) == (version == step)
        assert pool.version == version
        assert trainer.stale_pool_metrics()["agentrl/cross_policy/stale_version"] == version
    refreshes = [0, *range(STALE_STEP, 2 * STALE_STEP + 2, STALE_STEP)]
    assert syncs == refreshes
    assert actor.send_count() == [len(refreshes)]  # the actor sent exactly once per refresh
    assert ray.get([s.get_global_steps.remote() for r in pool.replicas for s in r.servers]) == [refreshes[-1]]
    assert "update_weights_stale_pool" in trainer.timing_raw


def test_naive_backend_cannot_reach_the_stale_pool_and_says_so_on_cpu():
    key = "actor_rollout_ref.rollout.checkpoint_engine.backend"
    config = _config(
        [f"{key}=naive"], explicit=frozenset({key})
    )  # given explicitly: the CPU defaults keep it
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "naive"
    with pytest.raises(
        ValueError, match=r"checkpoint_engine.backend=naive reaches only.*backend=nccl.*gloo on CPU"
    ):
        StandalonePool.create(config, 1, start_rank=1, actor_wg=None)
