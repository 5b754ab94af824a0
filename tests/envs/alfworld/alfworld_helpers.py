"""Helpers of the alfworld tests: the engine check, expert plans and a raw AgentRL protocol client."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from agentrl_ext.testing.raw_protocol import RawClient as ProtocolClient
from agentrl_ext.testing.raw_protocol import tool_call
from agentrl_ext.testing.vendored_data import vendored_data_dir
from envs.alfworld.engine import GameProcess, engine_missing, shutdown

SHARED_DATA = vendored_data_dir()
ALFWORLD_TASK = "agentrl_ext.envs.alfworld.task:ALFWorldTask"


def require_engine() -> None:
    """pytest.skip with the reason when the ALFWorld engine is not installed."""
    missing = engine_missing()
    if missing is not None:
        pytest.skip(missing)


def expert_plans(game_files: list[Path]) -> list[list[str]]:
    """The engine's expert plan of each game (its walkthrough, else the PDDL planner's plan)."""

    async def plans() -> list[list[str]]:
        found = []
        for game_file in game_files:
            game, _ = await GameProcess.open(game_file)
            try:
                found.append(await game.plan())
            finally:
                game.close()
        return found

    try:
        return asyncio.run(plans())
    finally:
        shutdown()


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


# ---------------------------------------------------------------------------- raw AgentRL protocol


def call(arguments: Any, name: str = "take_action", call_id: str = "call-0") -> dict[str, Any]:
    """An OpenAI tool call (``take_action`` unless named); ``arguments`` as a dict or a raw string."""
    return tool_call(name, arguments, call_id)


class RawClient(ProtocolClient):
    """The raw AgentRL protocol client (``agentrl_ext.testing.raw_protocol``) with alfworld's tools."""

    def __init__(self, api: str, task: str = "alfworld") -> None:
        super().__init__(api, task, timeout_s=120)

    def act(self, session_id: str, action: str, number: int = 0) -> dict[str, Any]:
        return self.step(session_id, call({"action": action}, call_id=f"call-{number}"))

    def play(self, session_id: str, actions: list[str]) -> dict[str, Any]:
        """Play ``actions`` until the episode ends; the last answer."""
        answer: dict[str, Any] = {}
        for number, action in enumerate(actions):
            answer = self.act(session_id, action, number)
            if answer["finish"]:
                break
        return answer
