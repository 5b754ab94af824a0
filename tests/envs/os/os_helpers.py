"""Helpers of the os tests and bench: a raw AgentRL protocol client and the example-solution policy.

The gold policy is written from the task data alone (not from the worker's code): for a
``match`` problem it answers the label; for a ``check`` problem it runs the example solution
with ``bash_action`` (a Python example through ``python3 -c``) and answers what it printed.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import httpx

OS_TASK = "agentrl_ext.envs.os.task:OSTask"
OUTPUT_PREFIX = "The output of the OS:\n\n"


def call(name: str, arguments: Any, call_id: str = "call-0") -> dict[str, Any]:
    """An OpenAI tool call; ``arguments`` as a dict (JSON-encoded here) or a raw string."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


class RawClient:
    """Speaks only the raw AgentRL HTTP protocol to a controller (``start_sample``, ``interact``)."""

    def __init__(self, api: str, task: str = "os") -> None:
        self.api = api
        self.task = task
        self.http = httpx.Client(timeout=120)

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

    def bash(self, session_id: str, script: str) -> dict[str, Any]:
        return self.step(session_id, call("bash_action", {"script": script}))

    def answer(self, session_id: str, answer: str) -> dict[str, Any]:
        return self.step(session_id, call("answer_action", {"answer": answer}))

    def finish(self, session_id: str, thought: str = "done") -> dict[str, Any]:
        return self.step(session_id, call("finish_action", {"thought": thought}))

    def cancel(self, session_id: str) -> None:
        self.http.post(f"{self.api}/cancel", headers={"session_id": session_id})


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
