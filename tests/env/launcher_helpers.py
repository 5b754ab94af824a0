"""The ``agentrl-envs`` launcher as a real subprocess, for the launcher tests: start it, read its
output up to a marker, and find the processes it started (from /proc)."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl_ext.testing.env_servers import REPO, subprocess_env


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (killed children may wait to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def read_until(proc: subprocess.Popen[bytes], marker: str, timeout_s: float, log_dir: Path) -> str:
    """The launcher's output up to ``marker``; fails with its output and logs otherwise.

    Reads the pipe's file descriptor directly: a buffered readline could hold the marker in its
    buffer while select() waits for more bytes that never come.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    output = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if selector.select(timeout=1):
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # the launcher exited
            output += chunk
            if marker.encode() in output:
                return output.decode(errors="replace")
    logs = "".join(
        f"\n--- {log.name}\n" + log.read_text(errors="replace")[-3000:]
        for log in sorted(log_dir.glob("*.log"))
    )
    pytest.fail(
        f"no {marker!r} from agentrl-envs (exit {proc.poll()}):\n{output.decode(errors='replace')}{logs}"
    )


def launcher(*args: str, log_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "agentrl_ext.env.launcher", "up", *args, "--log-dir", str(log_dir)]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env or subprocess_env(), cwd=REPO
    )
