"""A task whose sample index chooses a behaviour, for the controller and worker tests.

Indices: ``echo`` (echo tool until ``finish``), ``raise_on_start``, ``raise_after_action``,
``slow_step`` (the environment's second turn takes 30 s), ``forever`` (echoes without end),
``slow_start`` (the opening turn takes 30 s).
With ``marker_dir`` set, every sample writes ``<session_id>.end`` when its coroutine ends, so
tests can check that cancellation reached the task and its cleanup ran.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import SampleResult, Session, Task, function_tool

BEHAVIOURS = ["echo", "raise_on_start", "raise_after_action", "slow_step", "forever", "slow_start"]


class ProbeTask(Task):
    name = "probe"
    tools = [
        function_tool("echo", "Repeat a text.", {"text": {"type": "string"}}),
        function_tool("finish", "End the sample.", {"answer": {"type": "string"}}),
    ]
    concurrency = 8

    def __init__(self, marker_dir: str | None = None, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.marker_dir = Path(marker_dir) if marker_dir else None

    def get_indices(self) -> list[SampleIndex]:
        return list(BEHAVIOURS)

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        try:
            return await self._play(str(index), session)
        finally:
            if self.marker_dir is not None:
                (self.marker_dir / f"{session.id}.end").write_text(str(index))

    async def _play(self, behaviour: str, session: Session) -> SampleResult:
        if behaviour == "slow_start":
            await asyncio.sleep(30)
        session.inject({"role": "user", "content": f"behaviour {behaviour}"})
        if behaviour == "raise_on_start":
            raise RuntimeError("boom at start")
        turns = 0
        while True:
            action = await session.action()
            turns += 1
            if behaviour == "raise_after_action":
                raise RuntimeError("boom after action")
            if behaviour == "slow_step" and turns >= 2:
                await asyncio.sleep(30)
            for call in action.tool_calls:
                if call.name == "finish":
                    session.report(0.5, turns=turns)
                    return SampleResult(
                        SampleStatus.COMPLETED, reward=1.0, result={"answer": call.arguments.get("answer")}
                    )
                session.inject(
                    {"role": "tool", "tool_call_id": call.id, "content": str(call.arguments.get("text"))}
                )
