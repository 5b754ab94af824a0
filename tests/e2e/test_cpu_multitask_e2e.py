"""The main job (``make train``: ``recipes/cpu_multitask.yaml``), shortened to a few steps on the
same code path: it starts its own controllers and workers, warm-starts with verl's SFT trainer,
evaluates on held-out seeds, trains with RL, evaluates again, writes the report and the plots,
and leaves no process behind; Ctrl-C in the middle stops everything it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentrl_ext.testing.env_servers import free_port

pytestmark = pytest.mark.slow

TASKS = ("guess", "calc", "gridroom")


def _command(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", "cpu_multitask",
        f"agentrl.envs.port={free_port()}",
        "agentrl.sft.steps=2", "agentrl.sft.episodes_per_task=8", "agentrl.sft.batch_size=8",
        "agentrl.sft.micro_batch_size=8",
        "agentrl.eval.num_samples=3",
        "trainer.total_training_steps=1", "trainer.save_freq=1",
        "data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
        "actor_rollout_ref.rollout.n=2",
        # 3 prompts x 2 episodes: micro-batches that divide the 6 samples
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"trainer.default_local_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}",
        *extra,
    ]  # fmt: skip


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, AGENTRL_CACHE_DIR=str(tmp_path / "cache"))


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _assert_all_gone(processes: list[psutil.Process], timeout_s: float = 30.0) -> None:
    _gone, alive = psutil.wait_procs(processes, timeout=timeout_s)
    assert not alive, f"left running: {[(p.pid, ' '.join(p.cmdline())[:120]) for p in alive]}"


def test_main_job_shortened_on_cpu(tmp_path):
    log = tmp_path / "job.log"  # a file, not a pipe: nothing reads a pipe while the job runs
    with log.open("w") as sink:
        proc = subprocess.Popen(
            _command(tmp_path), cwd=tmp_path, env=_env(tmp_path), stdout=sink, stderr=subprocess.STDOUT
        )
        children: dict[int, psutil.Process] = {}
        deadline = time.monotonic() + 1500
        while proc.poll() is None and time.monotonic() < deadline:
            children.update({p.pid: p for p in _descendants(proc.pid)})
            time.sleep(1.0)
        proc.wait(timeout=60)
    out = log.read_text(errors="replace")
    assert proc.returncode == 0, out[-8000:]
    _assert_all_gone(list(children.values()))

    run = tmp_path / "run"
    # the tiny model was built with a tokenizer that also learned the tasks' expert episodes
    record = json.loads((tmp_path / "cache" / "tiny_model_multitask" / "agentrl_tiny_model.json").read_text())
    assert record["extra_corpus"], record
    # the warm start ran verl's SFT trainer on expert episodes of every task
    assert sorted(p.stem for p in (run / "sft" / "data").glob("*.parquet")) == sorted(TASKS)
    assert (run / "sft" / "global_step_2" / "huggingface" / "config.json").exists()
    # held-out evaluation before and after RL, of the SFT weights and of the RL checkpoint
    before = json.loads((run / "eval" / "before_rl.json").read_text())
    after = json.loads((run / "eval" / "after_rl.json").read_text())
    assert sorted(before["summary"]) == sorted(after["summary"]) == sorted(TASKS)
    # 3 held-out seeds (agentrl.eval.num_samples above) x the recipe's 4 episodes each, sampled at 0.7
    assert all(
        len([e for e in r["episodes"] if e["task"] == t]) == 12 for r in (before, after) for t in TASKS
    )
    assert before["settings"]["temperature"] == after["settings"]["temperature"] == 0.7
    assert before["settings"]["model_path"] == str(run / "sft" / "global_step_2" / "huggingface")
    assert after["settings"]["model_path"] == str(run / "global_step_1" / "actor" / "huggingface")
    # RL: one step of verl's trainer with per-task metrics in verl's file log
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    metrics = {k: v for row in steps if row["step"] == 1 for k, v in row["data"].items()}
    for task in TASKS:
        assert f"agentrl/task/{task}/success_rate" in metrics
    # the table is printed and kept, the plots are written
    for task in TASKS:
        assert any(line.startswith(task) and "pts" in line for line in out.splitlines()), out[-3000:]
    report = (run / "report.md").read_text()
    assert "before_rl" in report and "after_rl" in report
    for name in ("success.png", "reward.png", "eval_success.png"):
        assert (run / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_job_ctrl_c_stops_everything_on_cpu(tmp_path):
    """SIGINT during the warm start: the SFT trainer, both controllers and every worker stop."""
    log = tmp_path / "job.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            _command(tmp_path, "agentrl.sft.steps=500"),
            cwd=tmp_path,
            env=_env(tmp_path),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        children: dict[int, psutil.Process] = {}
        deadline = time.monotonic() + 600
        sft_running = False
        while proc.poll() is None and time.monotonic() < deadline and not sft_running:
            for child in _descendants(proc.pid):
                children[child.pid] = child
                try:
                    sft_running |= "verl.trainer.sft_trainer" in " ".join(child.cmdline())
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.5)
        assert sft_running, log.read_text(errors="replace")[-4000:]
        time.sleep(3)  # inside the SFT trainer's start-up
        children.update({p.pid: p for p in _descendants(proc.pid)})
        assert len(children) >= 8  # 2 controllers, 6 workers, torchrun and its trainer
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    assert proc.returncode != 0
    _assert_all_gone(list(children.values()))
