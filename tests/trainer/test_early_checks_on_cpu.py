"""Config mistakes fail before Ray starts, under both entry points: ``agentrl-train`` and verl's
own ``python -m verl.trainer.main_ppo`` (through the plugin's pre-Ray hook). Each case prints
its time to the error; verl prints ``ray init kwargs`` right before ``ray.init``, so its absence
shows that Ray never started."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agentrl_ext.testing.tiny_model import tiny_model_path

MAIN_PPO = [sys.executable, "-m", "verl.trainer.main_ppo"]
AGENTRL_TRAIN = [sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", "cpu_agentrl"]

CASES = {
    "task_norm_grpo without our trainer mode": (
        ["algorithm.adv_estimator=task_norm_grpo", "trainer.v1.trainer_mode=sync"],
        "trainer.v1.trainer_mode=agentrl_sync",
    ),
    "unknown agentrl key": (["+agentrl.agent_loop.max_turn=3"], "did you mean agentrl.agent_loop.max_turns"),
    "unknown rollout name": (
        ["actor_rollout_ref.rollout.name=vlm"],
        "rollout.name=vlm is not a rollout verl knows",
    ),
    "agentrl agent loop without a controller": (
        [
            "actor_rollout_ref.rollout.agent.default_agent_loop=agentrl",
            "agentrl.agent_loop.controller_url=null",
        ],
        "agentrl.agent_loop.controller_url is not set",
    ),
}


def _run(argv: list[str], tmp_path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = dict(os.environ, AGENTRL_CACHE_DIR=str(tmp_path / "cache"))
    start = time.monotonic()
    proc = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    return proc, time.monotonic() - start


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("entry", ["main_ppo", "agentrl-train"])
def test_mistake_fails_before_ray_on_cpu(case, entry, tmp_path):
    overrides, message = CASES[case]
    model = f"actor_rollout_ref.model.path={tiny_model_path()}"
    if entry == "main_ppo":
        # verl's config has no agentrl node: users add keys with "+"
        overrides = [
            o.replace("agentrl.agent_loop.controller_url=null", "+agentrl.agent_loop.max_turns=3")
            for o in overrides
        ]
        argv = [
            *MAIN_PPO,
            model,
            "actor_rollout_ref.rollout.name=hf",
            f"hydra.run.dir={tmp_path / 'hydra'}",
            *overrides,
        ]
    else:
        overrides = [o.lstrip("+") for o in overrides]
        argv = [*AGENTRL_TRAIN, model, f"hydra.run.dir={tmp_path / 'hydra'}", *overrides]
    proc, seconds = _run(argv, tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert message in output, output[-3000:]
    assert "ray init kwargs" not in output, "Ray started before the mistake was reported"
    print(f"\n{entry}: {case}: error after {seconds:.1f} s")
