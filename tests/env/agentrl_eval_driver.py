"""Drives one echo sample through a controller with AgentRL's ``agentrl-eval`` 0.1.2 client.

Runs inside the interop venv: ``python agentrl_eval_driver.py <controller api url>``. The model
is scripted: it echoes once, then calls ``finish`` with the target named in the user message.
Prints one JSON line with what agentrl-eval saw.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any

from agentrl.eval.client._base import BaseClient
from agentrl.eval.convert import MessageRecord, OpenAIChatCompletionInputMessageRecord
from agentrl.eval.session.controller import ControllerClient
from agentrl.eval.session.types import RunSpec
from agentrl.eval.session.workflow import SampleWorkflow


class ScriptedModel(BaseClient):
    def __init__(self) -> None:
        self.turns = 0
        self.tools_seen: list[str] = []

    async def get_model_name(self) -> str:
        return "scripted"

    async def query(
        self, messages: list[MessageRecord], tools: Any = None, cache_key: Any = None
    ) -> list[MessageRecord]:
        self.turns += 1
        self.tools_seen = [tool.native()["function"]["name"] for tool in tools or []]
        history = MessageRecord.dump_all(messages)
        target = next(
            re.search(r"'(done-\d+)'", m["content"]).group(1) for m in history if m["role"] == "user"
        )
        name, arguments = ("echo", {"text": "hello"}) if self.turns == 1 else ("finish", {"answer": target})
        call = {
            "id": f"call_{self.turns}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return [
            OpenAIChatCompletionInputMessageRecord(
                [{"role": "assistant", "content": None, "tool_calls": [call]}]
            )
        ]


async def main(url: str) -> None:
    controller = ControllerClient(url.rstrip("/") + "/", proxy_url=None)
    indices = await controller.get_indices("echo")
    model = ScriptedModel()
    spec = RunSpec(model="scripted", run=0, task="echo", index=indices[3], custom_params=None)
    result = await SampleWorkflow(controller=controller, models=[model], spec=spec)()
    await controller.close()
    print(
        json.dumps(
            {
                "indices": indices[:5],
                "status": str(result.status),
                "reward": result.reward,
                "session_id": result.session_id,
                "turns": model.turns,
                "tools": model.tools_seen,
                "trace_roles": [m["role"] for m in result.raw_trace or []],
                "result": result.result,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
