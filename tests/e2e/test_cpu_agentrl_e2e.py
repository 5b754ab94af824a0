"""verl's trainer with the agentrl agent loop, task-normalized advantages and cross-policy
sampling, against a real controller and real task workers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from agentrl_ext.data.multitask import build_multitask_dataset, fetch_indices
from agentrl_ext.testing.env_servers import env_servers

pytestmark = pytest.mark.slow

WORKERS = [
    ("letters", "letters", "agentrl_ext.envs.letters.task:LettersTask"),
    ("digits", "digits", "agentrl_ext.envs.letters.task:DigitsTask"),
]


def _train(
    tmp_path: Path, controller_url: str, extra: list[str], on_start=None
) -> tuple[subprocess.CompletedProcess, dict]:
    indices = asyncio.run(fetch_indices(controller_url, ["letters", "digits"]))
    train = build_multitask_dataset(indices, tmp_path / "data" / "train.parquet", seed=0)
    val = build_multitask_dataset(
        {t: i[:2] for t, i in indices.items()}, tmp_path / "data" / "val.parquet", split="val"
    )
    metrics_file = tmp_path / "metrics.jsonl"
    env = dict(os.environ, AGENTRL_CACHE_DIR=str(tmp_path / "cache"), VERL_FILE_LOGGER_PATH=str(metrics_file))
    cmd = [
        sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", "cpu_agentrl",
        f"agentrl.agent_loop.controller_url={controller_url}",
        f"data.train_files={train}", f"data.val_files={val}",
        "trainer.logger=[console,file]", f"hydra.run.dir={tmp_path / 'hydra'}", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if on_start is not None:
        threading.Thread(target=on_start, args=(metrics_file,), daemon=True).start()
    out, _ = proc.communicate(timeout=900)
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    lines = metrics_file.read_text().splitlines() if metrics_file.exists() else []
    return result, {r["step"]: r["data"] for r in map(json.loads, lines)}


def test_agentrl_two_steps_on_cpu(tmp_path):
    records = tmp_path / "records"
    extra = [
        "agentrl.cross_policy.stale_ratio=0.5",
        "agentrl.records.rate=1.0",
        f"agentrl.records.dir={records}",
    ]
    with env_servers(WORKERS, tmp_path / "logs") as servers:
        proc, steps = _train(tmp_path, servers.controller_url, extra)
        assert proc.returncode == 0, proc.stdout[-6000:]
        # agentrl.records: every episode of the agent-loop workers written as a record (rate 1) ...
        lines = [
            json.loads(line)
            for path in records.glob("records-*.jsonl")
            for line in path.read_text().splitlines()
        ]
        trained = [r for r in lines if not r["failed"]]
        assert trained and {r["task"] for r in trained} == {"letters", "digits"}
        for r in trained:
            assert {t["policy"] for t in r["turns"]} <= {"current", "stale"}
            assert sum(t["tokens"] for t in r["turns"]) == sum(r["tokens"]["response_mask"])
        # the weights versions that took the turns: step 0's and step 1's (the stale pool lags)
        assert {t["version"] for r in trained for t in r["turns"]} >= {0, 1}
        # ... which replay the same through the task workers
        sample = tmp_path / "sample.jsonl"
        sample.write_text("".join(json.dumps(r) + "\n" for r in trained[:4]))
        from agentrl_ext.rollout.replay import main as replay_main

        assert replay_main([str(sample), "--controller-url", servers.controller_url]) == 0
    assert sorted(steps) == [1, 2]
    for m in steps.values():
        for task in ("letters", "digits"):  # the recipe keeps the round-robin mix: both tasks in every batch
            assert m[f"agentrl/task/{task}/episodes"] > 0
            assert f"agentrl/task/{task}/adv_std_after" in m
            assert f"agentrl/task/{task}/success_rate" in m
            assert m[f"agentrl/task/{task}/turns_mean"] > 1  # multi-turn episodes
        assert m["agentrl/env/failed_episodes"] == 0
        assert m["agentrl/env/reward_overwritten"] == 0  # verl's reward loop kept the environment's reward
        assert 0.0 < m["agentrl/cross_policy/turn_share/stale"] < 1.0
        assert m["actor/grad_norm"] > 0
    # the stale pool serves the weights of step 0, so at step 2 its turns lag one version behind
    assert steps[2]["agentrl/policy/turn_version_lag_max"] == 1
    # per-pool importance ratios pi_theta / pi_behaviour at the start of each update (bypass mode:
    # the behaviour log-probs drive the PPO ratio). Step 1: both pools hold the actor's weights.
    # Step 2: the current pool holds them (ratio 1 up to float noise), the stale pool is a step behind.
    for step in (1, 2):
        for pool in ("current", "stale"):
            assert steps[step][f"agentrl/cross_policy/tokens/{pool}"] > 0
    assert steps[1]["agentrl/cross_policy/log_ratio_abs_mean/stale"] < 1e-3
    assert steps[2]["agentrl/cross_policy/log_ratio_abs_mean/current"] < 1e-3
    assert (
        steps[2]["agentrl/cross_policy/log_ratio_abs_mean/stale"]
        > 10 * steps[2]["agentrl/cross_policy/log_ratio_abs_mean/current"]
    )
    print(
        "\nper-step metrics:",
        {s: {k: round(v, 4) for k, v in m.items() if k.startswith("agentrl/")} for s, m in steps.items()},
    )


def test_worker_killed_during_a_step_on_cpu(tmp_path):
    with env_servers(WORKERS, tmp_path / "logs") as servers:

        def kill_digits_when_training_starts(metrics_file: Path) -> None:
            # Kill (SIGKILL) the digits worker as soon as it holds sessions of the first step.
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    sessions = httpx.get(
                        f"{servers.controller_url}/list_sessions", params={"name": "digits"}
                    ).json()
                except httpx.HTTPError:
                    sessions = []
                if sessions:
                    servers.kill("digits")
                    return
                time.sleep(0.05)

        proc, steps = _train(
            tmp_path,
            servers.controller_url,
            ["agentrl.agent_loop.env_attempts=2"],
            on_start=kill_digits_when_training_starts,
        )
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert sorted(steps) == [1, 2]
    failed = sum(m["agentrl/env/failed_episodes"] for m in steps.values())
    assert failed > 0, "killing the digits worker should have dropped some episodes"
    print(f"\nfailed (dropped) episodes over 2 steps: {failed}")
