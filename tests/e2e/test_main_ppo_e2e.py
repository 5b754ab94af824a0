"""A verl user's own entry point: ``python -m verl.trainer.main_ppo`` (not ``agentrl-train``) runs
two multi-turn AgentRL steps on CPU with only the overrides the README documents for it. The
plugin's pre-Ray hook applies the CPU changes (Ray CPUs, storage units, SDPA, FSDP2, rollout TP)
that used to make this command hang silently."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from agentrl_ext.data.multitask import build_multitask_dataset, fetch_indices
from agentrl_ext.testing.env_servers import env_servers
from agentrl_ext.testing.tiny_model import tiny_model_path

pytestmark = pytest.mark.slow

WORKERS = [
    ("letters", "letters", "agentrl_ext.envs.letters.task:LettersTask"),
    ("digits", "digits", "agentrl_ext.envs.letters.task:DigitsTask"),
]

# The README's "For verl users" command, with the paths filled in.
OVERRIDES = """
algorithm.adv_estimator=task_norm_grpo
trainer.v1.trainer_mode=agentrl_sync
actor_rollout_ref.rollout.name=hf
actor_rollout_ref.rollout.agent.default_agent_loop=agentrl
+agentrl.agent_loop.controller_url={controller}
+agentrl.agent_loop.max_turns=8
+agentrl.agent_loop.max_tokens_per_turn=24
actor_rollout_ref.model.path={model}
data.train_files={train}
data.val_files={val}
data.train_batch_size=4
data.max_prompt_length=384
data.max_response_length=192
data.shuffle=false
actor_rollout_ref.rollout.n=4
actor_rollout_ref.rollout.dtype=float32
actor_rollout_ref.rollout.calculate_log_probs=true
actor_rollout_ref.model.use_remove_padding=false
actor_rollout_ref.actor.ppo_mini_batch_size=4
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
actor_rollout_ref.actor.use_kl_loss=true
actor_rollout_ref.actor.kl_loss_coef=0.0001
actor_rollout_ref.actor.optim.lr=1e-3
+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32
+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32
+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
+actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32
+actor_rollout_ref.ref.fsdp_config.mixed_precision.reduce_dtype=fp32
+actor_rollout_ref.ref.fsdp_config.mixed_precision.buffer_dtype=fp32
trainer.n_gpus_per_node=1
trainer.total_training_steps=2
trainer.val_before_train=false
trainer.test_freq=-1
trainer.save_freq=-1
trainer.logger=[console,file]
"""


def test_main_ppo_runs_agentrl_on_cpu(tmp_path):
    with env_servers(WORKERS, tmp_path / "logs") as servers:
        indices = asyncio.run(fetch_indices(servers.controller_url, ["letters", "digits"]))
        train = build_multitask_dataset(indices, tmp_path / "data" / "train.parquet", seed=0)
        val = build_multitask_dataset(
            {t: i[:2] for t, i in indices.items()}, tmp_path / "data" / "val.parquet", split="val"
        )
        overrides = OVERRIDES.format(
            controller=servers.controller_url, model=tiny_model_path(), train=train, val=val
        ).split()
        metrics_file = tmp_path / "metrics.jsonl"
        env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(metrics_file))
        cmd = [
            sys.executable,
            "-m",
            "verl.trainer.main_ppo",
            f"hydra.run.dir={tmp_path / 'hydra'}",
            *overrides,
        ]
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    # the CPU changes were applied and logged, old -> new
    assert "ray_kwargs.ray_init.num_cpus: None -> " in output
    assert "transfer_queue.backend.SimpleStorage.num_data_storage_units: 8 -> 1" in output
    steps = {r["step"]: r["data"] for r in map(json.loads, metrics_file.read_text().splitlines())}
    assert sorted(steps) == [1, 2]
    for m in steps.values():
        for task in ("letters", "digits"):
            assert m[f"agentrl/task/{task}/episodes"] > 0
            assert m[f"agentrl/task/{task}/turns_mean"] > 1  # multi-turn episodes
        assert m["actor/grad_norm"] > 0
    assert "Unclosed client session" not in output
