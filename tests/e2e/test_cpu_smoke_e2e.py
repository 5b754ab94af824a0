"""verl's real trainer, launched through ``agentrl-train``, runs 2 GRPO steps on CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def _run_cpu_smoke(tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[dict], float]:
    env = dict(
        os.environ, AGENTRL_CACHE_DIR=str(tmp_path / "cache"), VERL_FILE_LOGGER_PATH=str(tmp_path / "m.jsonl")
    )
    cmd = [
        sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", "cpu_smoke",
        "trainer.logger=[console,file]",
        "trainer.save_freq=2",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    lines = (tmp_path / "m.jsonl").read_text().splitlines() if (tmp_path / "m.jsonl").exists() else []
    return proc, [json.loads(line) for line in lines], wall


def test_two_grpo_steps_on_cpu(tmp_path):
    proc, records, wall = _run_cpu_smoke(tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    steps = {r["step"]: r["data"] for r in records}
    assert sorted(steps) == [1, 2]

    # The policy was really updated: gradients flowed and the saved actor differs from the initial model.
    assert all(m["actor/grad_norm"] > 0 for m in steps.values())
    initial = load_file(str(tmp_path / "cache" / "tiny_model" / "model.safetensors"))
    trained = load_file(
        str(tmp_path / "ckpt" / "global_step_2" / "actor" / "huggingface" / "model.safetensors")
    )
    changed = max((trained[k].float() - initial[k].float()).abs().max().item() for k in initial)
    assert changed > 0, "actor parameters did not change after 2 GRPO steps"

    # The HF server served the synced weights: its log-probs match the actor's recomputation.
    prob_diff = max(m["training/rollout_probs_diff_max"] for m in steps.values())
    logppl_diff = max(abs(m["rollout_corr/log_ppl_diff_max"]) for m in steps.values())
    staleness = max(m["training/off_policy/trajectory_staleness/max"] for m in steps.values())
    assert prob_diff < 1e-3 and logppl_diff < 1e-3, (prob_diff, logppl_diff)
    assert staleness == 0, "rollouts were generated with weights older than the current step"

    step_s = [steps[s]["timing_s/step"] for s in sorted(steps)]
    print(
        f"\ncpu_smoke: wall {wall:.1f}s, step times {[round(s, 2) for s in step_s]}, "
        f"max |param change| {changed:.3g}, max token prob diff {prob_diff:.3g}, "
        f"max seq log-ppl diff {logppl_diff:.3g}"
    )
    shutil.rmtree(tmp_path / "ckpt", ignore_errors=True)
    assert torch.isfinite(torch.tensor(step_s)).all()
