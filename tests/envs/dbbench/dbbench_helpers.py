"""Helpers of the dbbench tests: a private MariaDB server and a raw AgentRL protocol client."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrl_ext.testing.env_servers import REPO
from agentrl_ext.testing.raw_protocol import RawClient as ProtocolClient
from agentrl_ext.testing.raw_protocol import tool_call as call
from agentrl_ext.testing.vendored_data import vendored_data_dir

SHARED_DATA = vendored_data_dir()
MARIADB_SCRIPT = REPO / "scripts" / "mariadb.sh"
DBBENCH_TASK = "agentrl_ext.envs.dbbench.task:DBBenchTask"


@dataclass
class MariaDBServer:
    """A private server started by ``scripts/mariadb.sh`` in its own folders."""

    data_dir: Path
    run_dir: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "AGENTRL_MARIADB_DIR": str(self.data_dir),
            "AGENTRL_MARIADB_RUN": str(self.run_dir),
        }

    @property
    def url(self) -> str:
        return f"unix://{self.run_dir / 'mysqld.sock'}"

    @property
    def pid(self) -> int:
        return int((self.run_dir / "mariadbd.pid").read_text())

    def script(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(MARIADB_SCRIPT), command], env=self.env, capture_output=True, text=True, timeout=120
        )

    def start(self) -> None:
        result = self.script("start")
        if result.returncode != 0:
            raise RuntimeError(f"scripts/mariadb.sh start failed:\n{result.stdout}{result.stderr}")

    def stop(self) -> None:
        self.script("stop")


def start_private_mariadb(root: Path) -> MariaDBServer:
    """Start a private server under ``root``; pytest.skip with the reason when that is impossible."""
    if shutil.which("mariadbd") is None:
        pytest.skip("mariadbd not installed (apt-get install mariadb-server; scripts/test.sh does)")
    try:
        import pymysql  # noqa: F401
    except ImportError:
        pytest.skip("pymysql not installed (pip install 'agentrl_ext[dbbench]')")
    server = MariaDBServer(root / "data", root / "run")
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(f"MariaDB could not start: {exc}")
    return server


# ---------------------------------------------------------------------------- raw AgentRL protocol


class RawClient(ProtocolClient):
    """The raw AgentRL protocol client (``agentrl_ext.testing.raw_protocol``) with dbbench's tools."""

    def __init__(self, api: str, task: str = "dbbench") -> None:
        super().__init__(api, task, timeout_s=60)

    def sql(self, session_id: str, query: str) -> dict[str, Any]:
        return self.step(session_id, call("execute_sql", {"query": query}))

    def commit(self, session_id: str, answers: list[str]) -> dict[str, Any]:
        return self.step(session_id, call("commit_final_answer", {"answers": answers}))
