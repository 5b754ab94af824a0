"""trainer.v1.trainer_mode=agentrl_async end to end on CPU: verl's trainer, the HF rollout, the
agentrl agent loop against a real controller and the letters/digits task workers on 127.0.0.1;
then a resume from its checkpoint, during which a task worker is SIGKILLed."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from test_cpu_agentrl_e2e import WORKERS, _train

from agentrl_ext.testing.env_servers import env_servers

pytestmark = pytest.mark.slow

MAX_STALENESS = 1
#: the current pool as one standalone replica (docs/training.md, "Where the rollout runs")
STANDALONE = [
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
]


def _async(*extra: str) -> list[str]:
    return [
        "trainer.v1.trainer_mode=agentrl_async",
        f"agentrl.async_pipeline.max_staleness={MAX_STALENESS}",
        "agentrl.cross_policy.stale_ratio=0.25",
        *extra,
    ]


def test_async_pipeline_trains_resumes_and_survives_a_killed_worker_on_cpu(tmp_path):
    ckpt = tmp_path / "ckpt"
    with env_servers(WORKERS, tmp_path / "logs") as servers:
        first, steps = _train(
            tmp_path / "a",
            servers.controller_url,
            _async(
                "trainer.total_training_steps=2", "trainer.save_freq=2", f"trainer.default_local_dir={ckpt}"
            ),
        )
        assert first.returncode == 0, first.stdout[-6000:]
        assert sorted(steps) == [1, 2]
        for m in steps.values():
            # a step trains the groups that finished first (in dispatch order among them), so one
            # step may hold a single task; across the run both are trained (checked after resume)
            present = [t for t in ("letters", "digits") if m.get(f"agentrl/task/{t}/episodes", 0) > 0]
            assert present, sorted(k for k in m if k.startswith("agentrl/task/"))
            for task in present:
                assert f"agentrl/task/{task}/adv_std_after" in m
            # variable batch: at least one batch of 4 groups, whole mini-batches of 4, at most the buffer (8)
            assert m["agentrl/async/batch_groups"] in (4, 8)
            assert m["agentrl/async/batch_trajectories"] == 4 * m["agentrl/async/batch_groups"]
            assert 0 < m["agentrl/async/buffer/occupancy"] <= 1
            assert 0 <= m["agentrl/async/rollout_idle_frac"] <= 1
            assert 0 <= m["agentrl/async/trainer_idle_frac"] <= 1
            # the staleness bound holds for every trained current-pool turn
            lags = [
                int(k.rsplit("_", 1)[1]) for k in m if k.startswith("agentrl/async/staleness/current/lag_")
            ]
            assert lags and max(lags) <= MAX_STALENESS
            assert m["actor/grad_norm"] > 0
        # step 2 trains turns generated while step 1 trained: the pipeline overlapped them
        assert any(k.startswith("agentrl/async/staleness/current/lag_1") for k in steps[2]) or (
            steps[2]["agentrl/async/dropped/stale_groups"] > 0
        )
        assert (ckpt / "global_step_2" / "transfer_queue").exists()

        killed: list[int] = []  # the listed digits sessions at the moment of the kill

        def kill_digits_once_resumed(metrics_file: Path) -> None:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    sessions = httpx.get(
                        f"{servers.controller_url}/list_sessions", params={"name": "digits"}
                    ).json()
                except httpx.HTTPError:
                    sessions = []
                if sessions:
                    servers.kill("digits")  # SIGKILL
                    killed.append(len(sessions))
                    return
                time.sleep(0.05)

        second, resumed = _train(
            tmp_path / "b",
            servers.controller_url,
            _async(
                "trainer.total_training_steps=4",
                "trainer.resume_mode=auto",
                f"trainer.default_local_dir={ckpt}",
                # without retries a digits episode started after the kill fails at once (the
                # controller's 503 "no healthy worker" asks for 5 s between attempts), so the failed
                # groups settle before step 4 samples even when the kill caught no episode mid-way
                "agentrl.agent_loop.env_attempts=1",
            ),
            on_start=kill_digits_once_resumed,
        )
    assert second.returncode == 0, second.stdout[-6000:]
    assert sorted(resumed) == [3, 4]  # continues after the checkpoint of step 2
    for task in ("letters", "digits"):  # per-task metrics for both tasks over the four steps
        assert any(m.get(f"agentrl/task/{task}/episodes", 0) > 0 for m in {**steps, **resumed}.values()), task
    assert "Restored" in second.stdout and "training prompt groups from TransferQueue" in second.stdout
    assert killed, "the digits worker was never killed: no digits session was listed"
    # the killed worker's episodes are trained as failed (masked, counted) episodes
    failures = {
        s: {k: v for k, v in m.items() if "failed" in k or "dropped" in k or k.endswith("/episodes")}
        for s, m in resumed.items()
    }
    assert sum(m["agentrl/env/failed_episodes"] for m in resumed.values()) > 0, failures
    print(
        "\nasync metrics:",
        {
            s: {k: round(v, 3) for k, v in m.items() if k.startswith("agentrl/async/")}
            for s, m in {**steps, **resumed}.items()
        },
    )


def test_async_pipeline_with_a_standalone_rollout_pool_on_cpu(tmp_path):
    """``actor_rollout_ref.hybrid_engine=false``: verl's workers only train, the current pool is a
    standalone ``hf`` replica refreshed after every step through the gloo checkpoint engine, the
    path vLLM and SGLang take over NCCL on GPUs."""
    with env_servers(WORKERS, tmp_path / "logs") as servers:
        proc, steps = _train(
            tmp_path,
            servers.controller_url,
            _async("trainer.total_training_steps=3", *STANDALONE),
        )
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert sorted(steps) == [1, 2, 3]
    # verl's workers only train (no rollout role): generation is the standalone pools' alone
    assert "create worker group dict_keys(['actor', 'ref'])" in proc.stdout
    for step, m in steps.items():
        assert m["agentrl/async/batch_trajectories"] == 4 * m["agentrl/async/batch_groups"]
        lags = [int(k.rsplit("_", 1)[1]) for k in m if k.startswith("agentrl/async/staleness/current/lag_")]
        assert lags and max(lags) <= MAX_STALENESS, (step, lags)
        assert "timing_s/update_weights" in m
        assert m["actor/grad_norm"] > 0
    # Step 3 trains current-pool turns of weights version 1 or 2 only (lag <= 1): turns of the
    # initial weights (lag 2) are dropped, so had no sync reached the standalone pool after steps 1
    # and 2, nothing could have been trained at step 3
    # (stale-pool turns are stale by design: version 0 until the stale pool's refresh at step 25)
    assert steps[3]["agentrl/async/staleness/stale/lag_2"] > 0
