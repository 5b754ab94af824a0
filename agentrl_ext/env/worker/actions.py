"""Parsing the agent's assistant messages into tool calls, and the invalid-action policy.

AgentRL (and AgentBench before it) ends a sample when the agent's output cannot be acted on:

- no tool call at all, or tool arguments that are not a JSON object -> ``agent validation failed``
  (the output could not be parsed into an action);
- a call to a tool the task does not have -> ``agent invalid action`` (parsed, but not allowed).

:func:`parse_action` applies that policy and records the first problem; ``Session.action()``
raises it as :class:`InvalidAction`, which the worker turns into the session's final status.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentrl_ext.env.protocol import SampleStatus


class InvalidAction(Exception):
    """The agent's step cannot be executed; ends the session with ``status`` and ``reason``."""

    def __init__(self, status: SampleStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call of the agent, arguments decoded."""

    id: str | None
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AgentAction:
    """The agent's step: its raw messages, the parsed tool calls and its text content.

    ``problem`` is the first policy violation found (None when the step is valid); it is only
    returned, not raised, when the task asked for ``session.action(validate=False)``.
    """

    messages: list[dict[str, Any]]
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None
    problem: InvalidAction | None = None


def _text_of(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        texts = [
            part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        ]
        return "".join(texts)
    return str(content)


def _decode_arguments(name: str, raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    if not isinstance(raw, str):
        return None, f"arguments of tool call {name!r} must be a JSON object string, got {type(raw).__name__}"
    try:
        decoded = json.loads(raw)
    except json.JSONDecodeError as exc:
        shown = raw if len(raw) <= 120 else raw[:117] + "..."
        return (
            None,
            f"arguments of tool call {name!r} are not valid JSON ({exc.msg} at char {exc.pos}): {shown!r}",
        )
    if not isinstance(decoded, dict):
        return None, f"arguments of tool call {name!r} must be a JSON object, got {type(decoded).__name__}"
    return decoded, None


def parse_action(messages: list[dict[str, Any]], tool_names: Iterable[str] | None) -> AgentAction:
    """Parse assistant ``messages``; ``tool_names`` None means the task takes plain text (no checks)."""
    calls: list[ToolCall] = []
    texts: list[str] = []
    problem: InvalidAction | None = None
    allowed = set(tool_names) if tool_names is not None else None
    for message in messages:
        if message.get("role") != "assistant":
            continue
        text = _text_of(message.get("content"))
        if text:
            texts.append(text)
        for raw_call in message.get("tool_calls") or []:
            function = raw_call.get("function") if isinstance(raw_call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str) or not name:
                problem = problem or InvalidAction(
                    SampleStatus.AGENT_VALIDATION_FAILED, f"tool call {raw_call!r} has no function name"
                )
                continue
            arguments, error = _decode_arguments(name, function.get("arguments"))  # type: ignore[union-attr]
            if allowed is not None and name not in allowed:
                problem = problem or InvalidAction(
                    SampleStatus.AGENT_INVALID_ACTION,
                    f"unknown tool {name!r}; this task's tools are: {', '.join(sorted(allowed)) or 'none'}",
                )
            elif error is not None:
                problem = problem or InvalidAction(SampleStatus.AGENT_VALIDATION_FAILED, error)
            calls.append(ToolCall(raw_call.get("id"), name, arguments or {}))
    if allowed and not calls and problem is None:
        problem = InvalidAction(
            SampleStatus.AGENT_VALIDATION_FAILED,
            f"the agent's step has no tool call; it must call one of: {', '.join(sorted(allowed))}",
        )
    return AgentAction(list(messages), calls, "".join(texts) if texts else None, problem)
