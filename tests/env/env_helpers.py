"""Agent steps (assistant messages), names and small stacks used across the environment tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl_ext.testing.env_servers import ECHO_TASK, EnvServers, ServerProcess, wait_routable

TESTS_ENV = Path(__file__).resolve().parent
"""This folder: the test tasks (``probe_tasks``, ``agentrl_worker_task``) import from here."""
PROBE_TASK = "probe_tasks:ProbeTask"


def tool_step(
    name: str, arguments: dict[str, Any] | None = None, call_id: str = "call_1"
) -> list[dict[str, Any]]:
    """One assistant message calling ``name`` with JSON ``arguments``."""
    return raw_tool_step(name, json.dumps(arguments or {}), call_id)


def raw_tool_step(name: str, raw_arguments: str, call_id: str = "call_1") -> list[dict[str, Any]]:
    """One assistant message calling ``name`` with ``raw_arguments`` as given (maybe malformed)."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw_arguments}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]}]


def text_step(content: str) -> list[dict[str, Any]]:
    """One assistant message with text and no tool call."""
    return [{"role": "assistant", "content": content}]


def echo_controller(servers: EnvServers, **options: Any) -> ServerProcess:
    """A controller (``options``: :meth:`EnvServers.controller`'s) with one routable echo worker."""
    controller = servers.controller(**options)
    servers.worker(controller, ECHO_TASK)
    wait_routable(controller, "echo")
    return controller
