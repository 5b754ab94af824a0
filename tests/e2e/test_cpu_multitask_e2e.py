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
from dataclasses import dataclass
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
        # what each task fed the update (read back from the advantages verl wrote)
        for name in ("informative_group_share", "adv_abs_mean", "action_token_share"):
            assert f"agentrl/task/{task}/signal/{name}" in metrics
    assert sum(metrics[f"agentrl/task/{t}/signal/action_token_share"] for t in TASKS) == pytest.approx(1.0)
    # the table is printed and kept, the plots are written
    for task in TASKS:
        assert any(line.startswith(task) and "pts" in line for line in out.splitlines()), out[-3000:]
    report = (run / "report.md").read_text()
    assert "before_rl" in report and "after_rl" in report
    for name in ("success.png", "reward.png", "eval_success.png", "signal.png"):
        assert (run / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Stage:
    """How a Ctrl-C test reaches a stage of the job and sends the signal."""

    overrides: tuple[str, ...]
    #: the job's log line of the stage (its start), and of the stage after it (which must not start)
    marker: str
    next_marker: str
    #: the signal goes to the job's process group (a terminal's Ctrl-C) instead of its pid
    to_group: bool = False


STAGES = {
    # the stack waits for its workers: the test pauses the controller once a worker exists, so the
    # workers cannot register and the stage cannot end before the signal (the stack resumes it)
    "environments": Stage((), "== environments", "== RL data"),
    "sft": Stage(("agentrl.sft.steps=500",), "== SFT warm start", "== evaluation before RL"),
    "evaluation": Stage(
        ("agentrl.sft.enable=false", "agentrl.eval.num_samples=100"),
        "== evaluation before RL",
        "== RL\n",
        to_group=True,
    ),
    # during the second step: verl's console logger wrote the first one's metrics
    "rl": Stage(
        ("agentrl.sft.enable=false", "agentrl.eval.enable=false", "trainer.total_training_steps=50"),
        "step:1 ",
        "== evaluation after RL",
    ),
}


def _command_line(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ""


def _in_stage(name: str, log_text: str, processes: list[psutil.Process]) -> bool:
    """Whether the job is far enough into stage ``name`` to be interrupted there."""
    commands = [_command_line(p) for p in processes]
    if name == "environments":
        return any("agentrl_ext.env.worker" in c for c in commands)
    if name == "sft":  # torchrun and the trainer it started
        return sum("verl.trainer.sft_trainer" in c for c in commands) >= 2
    if name == "evaluation":  # episodes are being played (the progress bar is up)
        return "evaluating:" in log_text.split(STAGES[name].marker, 1)[-1]
    return True


@pytest.mark.timeout(2400)  # the wait for a stage is bounded below; a busy machine is slow to get there
@pytest.mark.parametrize("stage", list(STAGES))
def test_main_job_ctrl_c_stops_everything_on_cpu(tmp_path, stage):
    """SIGINT in each stage: the job exits 130 and every process it started is gone (the
    controllers, the workers, the SFT trainer's process group, verl's Ray cluster)."""
    spec = STAGES[stage]
    log = tmp_path / "job.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            _command(tmp_path, *spec.overrides),
            cwd=tmp_path,
            env=_env(tmp_path),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        children: dict[int, psutil.Process] = {}
        commands: dict[int, str] = {}  # read while they run
        deadline = time.monotonic() + 1800  # generous: the machine may be busy
        reached = False
        while not reached:
            assert proc.poll() is None, f"the job ended before stage {stage}: " + log.read_text()[-4000:]
            assert time.monotonic() < deadline, f"stage {stage} not reached: " + log.read_text()[-4000:]
            current = _descendants(proc.pid)
            children.update({p.pid: p for p in current})
            commands.update({p.pid: _command_line(p) for p in current if p.pid not in commands})
            text = log.read_text(errors="replace")
            reached = spec.marker in text and _in_stage(stage, text, current)
            if not reached:
                time.sleep(0.05)
        if stage == "environments":
            controller = next(p for p in current if "agentrl_ext.env.controller" in _command_line(p))
            controller.suspend()
        children.update({p.pid: p for p in _descendants(proc.pid)})
        if spec.to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        # the job's own bound: 60 s to unwind, then it ends what is left (agentrl_ext.trainer.interrupt)
        proc.wait(timeout=300)
    out = log.read_text(errors="replace")
    assert proc.returncode == 130, out[-6000:]
    assert spec.next_marker not in out, f"the signal did not stop stage {stage}: " + out[-4000:]
    started = list(commands.values())
    assert any("agentrl_ext.env.controller" in c for c in started), started
    if stage == "sft":
        assert any("verl.trainer.sft_trainer" in c for c in started), started
    if stage == "rl":
        assert any("raylet" in c for c in started), started
    _assert_all_gone(list(children.values()))
