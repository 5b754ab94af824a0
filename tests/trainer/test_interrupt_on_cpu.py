"""Ctrl-C handling of the main job (``agentrl_ext.trainer.interrupt.JobInterrupt``), in a child
process: a stage that unwinds exits 130; one whose clean-up hangs is ended after the grace period,
or at once by a second Ctrl-C, with every process it started and its registered clean-ups."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

# a job that starts a child process (its own session, as the SFT trainer's) and a clean-up that
# only JobInterrupt.force runs; {hang} makes the stage's own clean-up block, as a stuck one would
JOB = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from agentrl_ext.trainer.interrupt import INTERRUPTED_EXIT_CODE, JobInterrupt

    out = Path(sys.argv[1])
    try:
        with JobInterrupt(grace_s={grace}, kill_after_s=2) as interrupt:
            interrupt.on_force(lambda: (out / "forced").write_text("yes"))
            child = subprocess.Popen(["sleep", "600"], start_new_session=True)
            (out / "child").write_text(str(child.pid))
            try:
                time.sleep(600)
            finally:
                if {hang}:
                    (out / "hanging").write_text("yes")
                    time.sleep(600)
                child.terminate()
                child.wait()
    except KeyboardInterrupt:
        raise SystemExit(INTERRUPTED_EXIT_CODE)
    """
)


def _start(tmp_path: Path, grace: float, hang: bool) -> tuple[subprocess.Popen[bytes], psutil.Process]:
    script = tmp_path / "job.py"
    script.write_text(JOB.format(grace=grace, hang=hang))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], start_new_session=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "child").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the job did not start its child"
        time.sleep(0.1)
    return proc, psutil.Process(int((tmp_path / "child").read_text()))


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.1)


def test_a_stage_that_unwinds_exits_130_on_cpu(tmp_path):
    proc, child = _start(tmp_path, grace=60, hang=False)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert not child.is_running()
    assert not (tmp_path / "forced").exists()  # it unwound: no force needed


@pytest.mark.parametrize("how", ["deadline", "second_signal"])
def test_a_stage_stuck_in_its_clean_up_is_ended_on_cpu(tmp_path, how):
    # the deadline case: 3 s of grace; the second-signal case: 600 s, so only the signal ends it
    proc, child = _start(tmp_path, grace=3 if how == "deadline" else 600, hang=True)
    proc.send_signal(signal.SIGTERM if how == "deadline" else signal.SIGINT)
    _wait_for(tmp_path / "hanging", proc)
    if how == "second_signal":
        proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    psutil.wait_procs([child], timeout=10)
    assert not child.is_running()  # a descendant in its own session, ended by force
    assert (tmp_path / "forced").read_text() == "yes"
