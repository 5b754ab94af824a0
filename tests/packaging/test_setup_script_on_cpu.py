"""``scripts/setup.sh``'s profiles: ``train`` (what ``make train`` runs) and the full set-up
(``make test``), and the stamps that make a re-run a no-op.

The venv here is a stand-in folder whose ``bin/python`` runs the interpreter running the tests (it
imports agentrl_ext, verl and torch) and refuses ``-m pip``, so nothing is ever installed: a
script that wrongly decides to install fails with pip's exit code 7 instead."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _stand_in_venv(root: Path) -> Path:
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    # a script, not a symlink: Python run through a symlink in a folder without pyvenv.cfg is the
    # base interpreter (no agentrl_ext, verl or torch), and the script would then install into it
    python = venv / "bin" / "python"
    python.write_text(
        f'#!/bin/sh\nif [ "$2" = pip ]; then echo "pip $*"; exit 7; fi\nexec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv / "bin"}:$PATH"\n')
    return venv


def _setup(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh"), *args],
        env=dict(os.environ, AGENTRL_VENV=str(venv)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _hash() -> str:
    # what the script stamps: the first 16 hex digits of sha256(setup.cfg + setup.py + vLLM's list)
    data = b"".join(
        (REPO / name).read_bytes() for name in ("setup.cfg", "setup.py", "scripts/vllm-cpu-requirements.txt")
    )
    return hashlib.sha256(data).hexdigest()[:16]


def test_unknown_profile_is_named_and_nothing_is_created(tmp_path):
    venv = tmp_path / "not-created"
    done = _setup(venv, "gpu")
    assert done.returncode == 2
    assert "'gpu'" in done.stderr and "train" in done.stderr
    assert not venv.exists()


def test_a_full_set_up_covers_the_train_profile(tmp_path):
    venv = _stand_in_venv(tmp_path)
    (venv / f".agentrl-setup-{_hash()}-full").touch()
    for args in ((), ("train",), ("vllm",)):
        done = _setup(venv, *args)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "venv up to date" in done.stdout, done.stdout + done.stderr


def test_a_train_set_up_does_not_cover_the_full_one(tmp_path):
    venv = _stand_in_venv(tmp_path)
    (venv / f".agentrl-setup-{_hash()}-train").touch()
    done = _setup(venv, "train")
    assert "venv up to date" in done.stdout, done.stdout + done.stderr
    # the full profile would install: the stand-in stops it at its first pip call
    done = _setup(venv)
    assert "venv up to date" not in done.stdout
    assert done.returncode == 7, done.stdout + done.stderr


def test_a_vllm_set_up_covers_train_but_not_the_full_one(tmp_path):
    venv = _stand_in_venv(tmp_path)
    (venv / f".agentrl-setup-{_hash()}-vllm").touch()
    for args in (("vllm",), ("train",)):
        done = _setup(venv, *args)
        assert "venv up to date" in done.stdout, done.stdout + done.stderr
    done = _setup(venv)
    assert "venv up to date" not in done.stdout
    assert done.returncode == 7, done.stdout + done.stderr
