"""Helpers of the dbbench tests: a private MariaDB server and a raw AgentRL protocol client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl_ext.testing.env_servers import REPO
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


def call(name: str, arguments: Any, call_id: str = "call-0") -> dict[str, Any]:
    """An OpenAI tool call; ``arguments`` as a dict (JSON-encoded here) or a raw string."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


class RawClient:
    """Speaks only the raw AgentRL HTTP protocol to a controller (``start_sample``, ``interact``)."""

    def __init__(self, api: str, task: str = "dbbench") -> None:
        self.api = api
        self.task = task
        self.http = httpx.Client(timeout=60)

    def start(self, index: int) -> tuple[str, dict[str, Any]]:
        response = self.http.post(f"{self.api}/start_sample", json={"name": self.task, "index": index})
        assert response.status_code == 200, response.text
        return response.headers["session_id"], response.json()

    def step(self, session_id: str, *calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = list(calls)
        response = self.http.post(
            f"{self.api}/interact", headers={"session_id": session_id}, json={"messages": [message]}
        )
        assert response.status_code == 200, response.text
        return response.json()

    def sql(self, session_id: str, query: str) -> dict[str, Any]:
        return self.step(session_id, call("execute_sql", {"query": query}))

    def commit(self, session_id: str, answers: list[str]) -> dict[str, Any]:
        return self.step(session_id, call("commit_final_answer", {"answers": answers}))
