"""A trivial tool-calling task for tests and the controller benchmark.

Tools: ``echo(text)`` answers with the same text as a tool message; ``finish(answer)`` ends the
sample with reward 1.0 when ``answer`` equals the sample's target ``"done-<index>"`` (else 0.0).
The sample ends with ``task limit reached`` after ``max_turns`` agent steps.
"""

from __future__ import annotations

from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import SampleResult, Session, Task, function_tool


class EchoTask(Task):
    """Echoes the agent's text back; costs the environment nothing, so it measures the plumbing."""

    name = "echo"
    tools = [
        function_tool(
            "echo", "Repeat a text back.", {"text": {"type": "string", "description": "text to repeat"}}
        ),
        function_tool("finish", "End the sample with an answer.", {"answer": {"type": "string"}}),
    ]
    concurrency = 256

    def __init__(self, num_indices: int = 100, max_turns: int = 64, **overrides: Any) -> None:
        super().__init__(**overrides)
        if num_indices < 1 or max_turns < 1:
            raise ValueError(
                f"EchoTask needs num_indices >= 1 and max_turns >= 1, got {num_indices}, {max_turns}"
            )
        self.num_indices = num_indices
        self.max_turns = max_turns

    def get_indices(self) -> list[SampleIndex]:
        return list(range(self.num_indices))

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        target = f"done-{index}"
        session.inject(
            {"role": "system", "content": "Use the echo tool, then call finish with the target."},
            {"role": "user", "content": f"The target is {target!r}."},
        )
        for _ in range(self.max_turns):
            action = await session.action()
            for call in action.tool_calls:
                if call.name == "finish":
                    reward = float(call.arguments.get("answer") == target)
                    return SampleResult(
                        SampleStatus.COMPLETED, reward=reward, result={"answer": call.arguments.get("answer")}
                    )
                session.inject(
                    {"role": "tool", "tool_call_id": call.id, "content": str(call.arguments.get("text", ""))}
                )
        return SampleResult(SampleStatus.TASK_LIMIT_REACHED, reward=0.0)
