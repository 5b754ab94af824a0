"""Start a controller and task workers as real processes on 127.0.0.1 (tests and demos)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EnvServers:
    """Handles of a running controller and its workers."""

    controller_url: str
    procs: dict[str, subprocess.Popen[bytes]]

    def kill(self, name: str) -> None:
        """Kill one process at once (SIGKILL): a crash, not a shutdown."""
        self.procs[name].kill()
        self.procs[name].wait(timeout=10)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)


def _wait_for_tasks(url: str, tasks: set[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            workers = httpx.get(f"{url}/list_workers", timeout=2).json()
            if tasks <= set(workers):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"tasks {sorted(tasks)} did not register with the controller at {url} in {timeout_s}s")


@contextmanager
def env_servers(
    workers: Sequence[tuple[str, str, str]], log_dir: Path, heartbeat_s: float = 1.0, timeout_s: float = 60.0
) -> Iterator[EnvServers]:
    """Run a controller plus one worker per ``(process name, task name, "module:Class")``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    procs = {
        "controller": _spawn(
            [sys.executable, "-m", "agentrl_ext.env.controller", "--port", str(port)],
            log_dir / "controller.log",
        )
    }
    try:
        for name, _task, spec in workers:
            argv = [sys.executable, "-m", "agentrl_ext.env.worker", spec, "--controller", url,
                    "--port", str(free_port()), "--heartbeat-interval", str(heartbeat_s)]  # fmt: skip
            procs[name] = _spawn(argv, log_dir / f"{name}.log")
        _wait_for_tasks(url, {task for _, task, _ in workers}, timeout_s)
        yield EnvServers(url, procs)
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
