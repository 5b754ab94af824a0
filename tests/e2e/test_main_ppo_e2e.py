"""A verl user's own entry point: ``python -m verl.trainer.main_ppo`` (not ``agentrl-train``) runs
two multi-turn AgentRL steps on CPU with the command the documentation shows, extracted from it
and run as it stands (so the two cannot drift). The plugin's pre-Ray hook applies the CPU changes
(Ray CPUs, storage units, SDPA, FSDP2, rollout TP) that used to make this command hang silently."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_ext.testing.env_servers import REPO, env_servers

#: the file whose marked ``bash`` block is the verl user's command
SOURCE = REPO / "docs" / "verl_users.md"
MARKER = "<!-- e2e: tests/e2e/test_main_ppo_e2e.py runs the next block -->"

WORKERS = [
    ("letters", "letters", "agentrl_ext.envs.letters.task:LettersTask"),
    ("digits", "digits", "agentrl_ext.envs.letters.task:DigitsTask"),
]


def documented_command() -> str:
    """The ``bash`` block right after :data:`MARKER` in :data:`SOURCE`."""
    text = SOURCE.read_text()
    assert text.count(MARKER) == 1, f"{SOURCE} must mark the verl command once with {MARKER!r}"
    match = re.match(r"\s*```bash\n(.*?)\n```", text.split(MARKER, 1)[1], re.DOTALL)
    assert match, f"no ```bash block right after {MARKER!r} in {SOURCE}"
    return match.group(1)


def test_the_documented_command_is_self_contained_on_cpu():
    """Valid bash; every variable it reads it sets (or takes from the caller with a default); no
    wandb (verl's default logger stops without an API key)."""
    block = documented_command()
    check = subprocess.run(["bash", "-n"], input=block, text=True, capture_output=True, check=False)
    assert check.returncode == 0, check.stderr
    assigned = set(re.findall(r"^\s*([A-Z_]+)=", block, re.MULTILINE)) | {"PATH", "HOME"}
    used = set(re.findall(r"\$\{?([A-Z_]+)", block))
    assert used <= assigned, f"the block reads {sorted(used - assigned)} without setting them"
    assert "'trainer.logger=[console,file]'" in block and "verl.trainer.main_ppo" in block


@pytest.mark.slow
def test_main_ppo_runs_agentrl_on_cpu(tmp_path):
    block = documented_command()
    with env_servers(WORKERS, tmp_path / "logs") as servers:
        env = dict(
            os.environ,
            CONTROLLER=servers.controller_url,  # the block's default is agentrl-envs up's port 5020
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    # the CPU changes were applied and logged, old -> new
    assert "ray_kwargs.ray_init.num_cpus: None -> " in output
    assert "transfer_queue.backend.SimpleStorage.num_data_storage_units: 8 -> 1" in output
    metrics_file = tmp_path / "metrics.jsonl"
    steps = {r["step"]: r["data"] for r in map(json.loads, metrics_file.read_text().splitlines())}
    assert sorted(steps) == [1, 2]
    for m in steps.values():
        for task in ("letters", "digits"):
            assert m[f"agentrl/task/{task}/episodes"] > 0
            assert m[f"agentrl/task/{task}/turns_mean"] > 1  # multi-turn episodes
        assert m["actor/grad_norm"] > 0
    assert "Unclosed client session" not in output
