"""Helpers of the os tests and bench: a raw AgentRL protocol client and the example-solution policy.

The gold policy is written from the task data alone (not from the worker's code): for a
``match`` problem it answers the label; for a ``check`` problem it runs the example solution
with ``bash_action`` (a Python example through ``python3 -c``) and answers what it printed.
"""

from __future__ import annotations

import shlex
from typing import Any

from agentrl_ext.testing.raw_protocol import RawClient as ProtocolClient
from agentrl_ext.testing.raw_protocol import tool_call as call

OS_TASK = "agentrl_ext.envs.os.task:OSTask"
OUTPUT_PREFIX = "The output of the OS:\n\n"


class RawClient(ProtocolClient):
    """The raw AgentRL protocol client (``agentrl_ext.testing.raw_protocol``) with os's tools."""

    def __init__(self, api: str, task: str = "os") -> None:
        super().__init__(api, task, timeout_s=120)

    def bash(self, session_id: str, script: str) -> dict[str, Any]:
        return self.step(session_id, call("bash_action", {"script": script}))

    def answer(self, session_id: str, answer: str) -> dict[str, Any]:
        return self.step(session_id, call("answer_action", {"answer": answer}))

    def finish(self, session_id: str, thought: str = "done") -> dict[str, Any]:
        return self.step(session_id, call("finish_action", {"thought": thought}))


def shown_output(answer: dict[str, Any]) -> str:
    """The text of a bash_action's tool message (AgentBench's layout undone)."""
    content = answer["messages"][0]["content"]
    return content[len(OUTPUT_PREFIX) :] if content.startswith(OUTPUT_PREFIX) else ""


def example_script(item: dict[str, Any], scripts_dir: Any) -> tuple[str, str] | None:
    """(language, code) of a raw problem's ``evaluation.example``, or None."""
    example = item["evaluation"].get("example")
    if example is None:
        return None
    if isinstance(example, str):
        return "bash", example
    code = example["code"] if "code" in example else (scripts_dir / example["file"]).read_text()
    return example.get("language", "bash"), code


def play_gold(client: RawClient, index: int, item: dict[str, Any], scripts_dir: Any) -> dict[str, Any]:
    """Play the example solution of raw problem ``item`` (sample ``index``); the final answer."""
    session, opening = client.start(index)
    if opening["finish"]:
        return opening
    evaluation = item["evaluation"]
    match = evaluation.get("match")
    if match is not None:
        label = match if isinstance(match, str) else match["answer"]
        return client.answer(session, label)
    language, code = example_script(item, scripts_dir) or ("bash", "true")
    script = code if language == "bash" else f"python3 -c {shlex.quote(code)}"
    ran = client.bash(session, script)
    assert ran["status"] == "running", ran
    return client.answer(session, shown_output(ran).strip())
