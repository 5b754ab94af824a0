"""A small task written against AgentRL's own ``agentrl-worker`` 0.4.0 SDK (not ours).

Loaded only inside the interop venv (see ``interop_venv.py``) by ``python -m agentrl.worker``:
it must register with our controller and be playable by our client. The agent adds two numbers
with ``add`` and submits the sum with ``answer``.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.worker.task import Session, Task
from agentrl.worker.typings import (
    AgentCancelledException,
    RewardHistoryItem,
    SampleIndex,
    SampleStatus,
    TaskOutput,
    TaskSampleExecutionResult,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "answer",
            "description": "Submit the result.",
            "parameters": {
                "type": "object",
                "properties": {"value": {"type": "number"}},
                "required": ["value"],
            },
        },
    },
]


class AddTask(Task):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(tools=TOOLS, **kwargs)

    def get_indices(self) -> list[SampleIndex]:
        return [0, 1, 2]

    async def start_sample(self, index: SampleIndex, session: Session) -> TaskSampleExecutionResult:
        session.inject({"role": "user", "content": f"What is {index} + 10?"})
        try:
            while True:
                response = await session.action()
                calls = response.messages[0].get("tool_calls") or []
                if not calls:
                    return TaskSampleExecutionResult(status=SampleStatus.AGENT_VALIDATION_FAILED)
                call = calls[0]
                args = json.loads(call["function"]["arguments"])
                if call["function"]["name"] == "add":
                    session.inject(
                        {"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])}
                    )
                elif call["function"]["name"] == "answer":
                    session.inject(RewardHistoryItem(reward=float(args["value"] == int(index) + 10)))
                    return TaskSampleExecutionResult(status=SampleStatus.COMPLETED, result=args["value"])
                else:
                    return TaskSampleExecutionResult(status=SampleStatus.AGENT_INVALID_ACTION)
        except AgentCancelledException:
            return TaskSampleExecutionResult(status=SampleStatus.CANCELLED)

    def calculate_overall(self, results: list[TaskOutput]) -> dict[str, Any]:
        return {"samples": len(results)}
