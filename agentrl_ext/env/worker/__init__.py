"""Task-worker SDK: write a :class:`Task`, serve it with :class:`TaskWorker`."""

from __future__ import annotations

from agentrl_ext.env.worker.actions import AgentAction, InvalidAction, ToolCall, parse_action
from agentrl_ext.env.worker.server import TaskWorker
from agentrl_ext.env.worker.task import SampleResult, Session, Task, function_tool

__all__ = [
    "AgentAction",
    "InvalidAction",
    "SampleResult",
    "Session",
    "Task",
    "TaskWorker",
    "ToolCall",
    "function_tool",
    "parse_action",
]
