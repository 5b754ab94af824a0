"""The task contract: what an environment implements to be served by a :class:`TaskWorker`.

A task is a set of OpenAI function-call tools plus a coroutine that plays one sample::

    class Echo(Task):
        name = "echo"
        tools = [function_tool("echo", "Repeat a text", {"text": {"type": "string"}})]

        def get_indices(self):
            return list(range(10))

        async def start_sample(self, index, session):
            session.inject({"role": "user", "content": f"Say {index} with the echo tool."})
            action = await session.action()          # waits for the agent's step
            call = action.tool_calls[0]
            session.inject({"role": "tool", "tool_call_id": call.id, "content": call.arguments["text"]})
            return SampleResult(reward=float(call.arguments["text"] == str(index)))

``session.action()`` sends the messages injected so far to the agent and returns its parsed
step; an unparseable step or an unknown tool raises :class:`InvalidAction`, which ends the sample
with ``agent validation failed`` / ``agent invalid action`` (catch it, or call
``session.action(validate=False)``, to give the agent another chance). Any other exception ends
the sample with ``task error`` and the worker keeps serving.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus, TaskOutput
from agentrl_ext.env.worker.actions import AgentAction, InvalidAction, parse_action


def function_tool(
    name: str, description: str, properties: dict[str, Any], required: Sequence[str] | None = None
) -> dict[str, Any]:
    """An OpenAI function tool schema; all ``properties`` are required unless ``required`` says otherwise."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties) if required is None else list(required),
            },
        },
    }


def tool_names(tools: Sequence[dict[str, Any]], owner: str) -> list[str]:
    """Names of OpenAI function ``tools``; raises ValueError naming the malformed entry."""
    names = []
    for position, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(name, str)
            or not name
        ):
            raise ValueError(
                f"{owner}: tools[{position}] = {tool!r} is not an OpenAI function tool; expected "
                "{'type': 'function', 'function': {'name': ..., 'parameters': {...}}} (see function_tool())"
            )
        names.append(name)
    return names


@dataclass
class SampleResult:
    """What :meth:`Task.start_sample` returns when the sample is over."""

    status: SampleStatus = SampleStatus.COMPLETED
    reward: float | None = None
    """Final reward; None keeps the latest one given to :meth:`Session.report`."""
    metrics: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    """Task-specific outcome, kept for ``calculate_overall``."""
    error: str | None = None
    """Why the sample ended without a normal outcome (e.g. its set-up failed): the ``error``
    the agent's last answer carries."""


@dataclass(slots=True)
class TurnOutput:
    """What the environment hands to the agent at the end of a turn (or of the sample)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    status: SampleStatus
    reward: float
    metrics: dict[str, Any]
    error: str | None = None


class Session:
    """One running sample, as seen by the task: inject messages, wait for the agent's actions."""

    def __init__(
        self, session_id: int, index: SampleIndex, tools: list[dict[str, Any]], validate_actions: bool
    ) -> None:
        self.id = session_id
        self.index = index
        self.turns = 0
        """Number of agent steps received so far."""
        self.reward = 0.0
        self.metrics: dict[str, Any] = {}
        self._tools = tools
        self._tool_names: list[str] | None = tool_names(tools, f"session {session_id}") if tools else None
        self._tools_changed = True  # the first answer carries the tool schemas
        self._validate = validate_actions
        self._history: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []
        self._turn: asyncio.Future[TurnOutput] | None = None
        self._action: asyncio.Future[list[dict[str, Any]]] | None = None

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every message so far (environment and agent), oldest first. Do not mutate."""
        return self._history

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tool schemas the agent sees in this session."""
        return self._tools

    def set_tools(self, tools: list[dict[str, Any]]) -> None:
        """Change the tools offered to the agent from the next turn on."""
        self._tool_names = tool_names(tools, f"session {self.id}") if tools else None
        self._tools = tools
        self._tools_changed = True

    def inject(self, *messages: dict[str, Any]) -> None:
        """Queue environment messages (system, user, tool) for the agent's next turn."""
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise TypeError(
                    f"session {self.id}: inject() takes OpenAI chat messages like "
                    f"{{'role': 'user', 'content': '...'}}, got {message!r}"
                )
            self._pending.append(message)
            self._history.append(message)

    def report(self, reward: float, **metrics: Any) -> None:
        """Set the session's latest reward (and metrics); sent with every later answer."""
        self.reward = float(reward)
        self.metrics.update(metrics)

    async def action(self, *, validate: bool | None = None) -> AgentAction:
        """Hand the injected messages to the agent and wait for its next step.

        Raises :class:`InvalidAction` when the step breaks the tool-call policy (unless
        ``validate=False``, or the task was built with ``validate_actions=False``).
        """
        if self._action is not None:
            raise RuntimeError(
                f"session {self.id}: action() is already waiting; await it before calling again"
            )
        self._action = asyncio.get_running_loop().create_future()
        self.hand_over(self.output(SampleStatus.RUNNING))
        try:
            messages = await self._action
        finally:
            self._action = None
        self.turns += 1
        self._history.extend(messages)
        action = parse_action(messages, self._tool_names)
        if action.problem is not None and (self._validate if validate is None else validate):
            raise action.problem
        return action

    # -- used by the worker -------------------------------------------------------------

    def output(self, status: SampleStatus, error: str | None = None) -> TurnOutput:
        """Take the pending messages as a :class:`TurnOutput` (worker use)."""
        messages, self._pending = self._pending, []
        tools = self._tools if self._tools_changed else None
        self._tools_changed = False
        return TurnOutput(messages, tools, status, self.reward, dict(self.metrics), error)

    def expect_turn(self) -> asyncio.Future[TurnOutput]:
        """A new future resolved at the end of the environment's next turn (worker use)."""
        self._turn = asyncio.get_running_loop().create_future()
        return self._turn

    def hand_over(self, output: TurnOutput) -> bool:
        """Resolve the current turn future with ``output``; False if nobody waits for it (worker use)."""
        if self._turn is not None and not self._turn.done():
            self._turn.set_result(output)
            return True
        return False

    @property
    def waiting_for_agent(self) -> bool:
        """True while the task awaits the agent's next step."""
        return self._action is not None and not self._action.done()

    def deliver(self, messages: list[dict[str, Any]]) -> None:
        """Give the agent's step to the waiting task (worker use)."""
        assert self._action is not None and not self._action.done()
        self._action.set_result(messages)


class Task(ABC):
    """Base class of every environment served by a :class:`~agentrl_ext.env.worker.TaskWorker`.

    Set the class attributes (or pass them to ``__init__``):

    - ``name``: the task name clients use in ``start_sample``;
    - ``tools``: OpenAI function tool schemas (empty list: a plain-text task, no action checks);
    - ``concurrency``: sessions one worker runs at once (406 beyond that);
    - ``session_time_limit_s``: wall-clock limit of a sample -> ``task limit reached``;
    - ``step_time_limit_s``: limit on one environment turn -> ``task error``;
    - ``validate_actions``: apply the invalid-action policy in ``session.action()``.
    """

    name: str = ""
    tools: list[dict[str, Any]] = []
    concurrency: int = 16
    session_time_limit_s: float | None = None
    step_time_limit_s: float | None = None
    validate_actions: bool = True

    def __init__(self, **overrides: Any) -> None:
        for key, value in overrides.items():
            if key not in (
                "name",
                "tools",
                "concurrency",
                "session_time_limit_s",
                "step_time_limit_s",
                "validate_actions",
            ):
                raise TypeError(f"{type(self).__name__}() got an unknown setting {key!r}")
            setattr(self, key, value)
        if not self.name:
            raise ValueError(f"{type(self).__name__} has no name; set the class attribute `name = 'my_task'`")
        if self.concurrency < 1:
            raise ValueError(f"{type(self).__name__}.concurrency must be >= 1, got {self.concurrency}")
        for limit in ("session_time_limit_s", "step_time_limit_s"):
            value = getattr(self, limit)
            if value is not None and value <= 0:
                raise ValueError(f"{type(self).__name__}.{limit} must be positive or None, got {value!r}")
        tool_names(self.tools, f"task {self.name!r}")

    async def setup(self) -> None:
        """Called once when the worker starts (open databases, providers...)."""
        return None

    async def teardown(self) -> None:
        """Called once when the worker stops."""
        return None

    @abstractmethod
    def get_indices(self) -> Sequence[SampleIndex]:
        """All sample indices of the task (ints or strings)."""

    @abstractmethod
    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        """Play sample ``index`` through ``session``; return its result."""

    async def start_custom_sample(self, custom_task: dict[str, Any], session: Session) -> SampleResult:
        """Play a sample described by the client (index -1). Override to support custom tasks."""
        raise NotImplementedError

    @property
    def supports_custom_samples(self) -> bool:
        """True when the subclass overrides :meth:`start_custom_sample`."""
        return type(self).start_custom_sample is not Task.start_custom_sample

    def calculate_overall(self, results: list[TaskOutput]) -> dict[str, Any]:
        """Summarize finished samples; the default counts statuses and the share completed."""
        statuses = Counter(result.status.value for result in results)
        total = len(results)
        return {
            "total": total,
            "status": dict(statuses),
            "completion_rate": statuses.get(SampleStatus.COMPLETED.value, 0) / total if total else 0.0,
        }


__all__ = ["AgentAction", "InvalidAction", "SampleResult", "Session", "Task", "TurnOutput", "function_tool"]
