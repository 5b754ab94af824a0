"""Play a procedural task in-process (no HTTP): the worker's session hand-over, driven directly."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.env.worker import Session, Task
from agentrl_ext.env.worker.actions import InvalidAction

Policy = Callable[[list[dict[str, Any]]], dict[str, Any]]

TASKS = {
    "guess": "agentrl_ext.envs.guess.task:GuessTask",
    "calc": "agentrl_ext.envs.calc.task:CalcTask",
    "gridroom": "agentrl_ext.envs.gridroom.task:GridRoomTask",
}


@dataclass
class Played:
    status: SampleStatus
    reward: float
    messages: list[dict[str, Any]]
    turns: int


async def play(task: Task, index: int, policy: Policy) -> Played:
    """One sample of ``task`` with ``policy`` choosing every step, as a worker would run it."""
    session = Session(1, index, list(task.tools), task.validate_actions)
    history: list[dict[str, Any]] = []
    turn = session.expect_turn()

    async def run() -> tuple[SampleStatus, float]:
        try:
            result = await task.start_sample(index, session)
        except InvalidAction as exc:
            return exc.status, session.reward
        return result.status, session.reward if result.reward is None else float(result.reward)

    runner = asyncio.create_task(run())
    while True:
        done, _ = await asyncio.wait({runner, turn}, return_when=asyncio.FIRST_COMPLETED)
        if turn in done:
            history += turn.result().messages
        if runner.done():
            history += session.output(SampleStatus.COMPLETED).messages
            status, reward = runner.result()
            return Played(status, reward, history, session.turns)
        step = policy(list(history))
        history.append(step)
        turn = session.expect_turn()
        session.deliver([step])
