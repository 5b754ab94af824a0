"""Wire models of the AgentRL / AgentBench-FC environment protocol (controller and task workers).

The protocol is the one spoken by AgentRL's published packages ``agentrl-worker`` 0.4.0 (task
workers) and ``agentrl-eval`` 0.1.2 (evaluation client); our controller, worker and client speak
it too, so either side can be swapped for theirs. All paths live under an ``/api`` prefix.

Controller API (used by trainers and evaluators)::

    POST start_sample    {name, index, custom_task?}      -> header session_id; InteractResponse
    POST interact        header session_id; {messages}    -> InteractResponse
    POST cancel          header session_id                -> CancelResponse
    GET  get_indices?name=                                -> [index, ...]
    GET  list_workers / list_sessions                     -> overviews
    POST calculate_overall {name, results}                -> the task's own summary (JSON)
    POST receive_heartbeat {name, address, concurrency, indices}   (from task workers)

Task worker API (used by the controller)::

    POST start_sample    {index, custom_task?, session_id}  -> header session_id; EnvOutput
    POST interact        {session_id, messages}             -> {session_id, env_out: EnvOutput}
    POST cancel          {session_id}                       -> {session_id}
    POST cancel_all; GET get_indices; GET get_sessions; GET worker_status;
    POST sample_status   {session_id}; POST calculate_overall {name, results}

The one difference between the two answer shapes is historical: a worker names the metrics
field ``metric`` and wraps interact answers in ``env_out``; the controller answers with
``metrics`` at the top level (what ``agentrl-eval`` reads).

Message and tool objects are OpenAI chat-completion dictionaries; they are validated for shape
(a list of JSON objects with a ``role``) and otherwise passed through untouched.
"""

from __future__ import annotations

import itertools
import json
from enum import Enum
from typing import Annotated, Any

import pydantic_core
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator


def _not_a_bool(value: Any) -> Any:
    # JSON true/false would otherwise pass as the ints 1/0 and silently name another sample.
    if isinstance(value, bool):
        raise ValueError(f"a sample index is an integer or a string, not the boolean {value!r}")
    return value


SampleIndex = Annotated[int | str, BeforeValidator(_not_a_bool)]


def encode_sample_index(index: int | str) -> str:
    """A sample index as a dataset row carries it (``extra_info.sample_index``): JSON, so that the
    int 1 and the string "1" stay apart through parquet."""
    return json.dumps(index)


def decode_sample_index(value: Any) -> Any:
    """The sample index of a row's ``extra_info.sample_index`` (:func:`encode_sample_index`; a
    plain value is taken as it is)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


"""A task sample index: AgentRL tasks use ints or strings (never booleans); ``-1`` means a custom task."""

API_PREFIX = "/api"
"""Every endpoint of the controller and of a task worker lives under this path."""
CUSTOM_TASK_INDEX = -1
SESSION_ID_HEADER = "session_id"
#: on a 503 of start_sample: "full" when every healthy worker of the task is at capacity (a slot
#: frees as sessions end: worth waiting for), absent when the task has no healthy worker
CAPACITY_HEADER = "x-agentrl-capacity"
HEARTBEAT_INTERVAL_S = 8.0
"""How often task workers send ``receive_heartbeat`` (AgentRL's workers and ours, by default)."""


def error_detail(body: bytes, limit: int = 300) -> str:
    """The reason in an error answer: ``detail`` of a ``{"detail": ...}`` body (ours, FastAPI's,
    agentrl-worker's), else the start of the body as text."""
    try:
        parsed = pydantic_core.from_json(body)
    except ValueError:
        return body[:limit].decode("utf-8", "replace")
    if isinstance(parsed, dict) and "detail" in parsed:
        return str(parsed["detail"])
    return str(parsed)[:limit]


class SampleStatus(str, Enum):
    """Status of a session, as AgentRL reports it (the values are the wire strings)."""

    RUNNING = "running"
    COMPLETED = "completed"
    AGENT_CONTEXT_LIMIT = "agent context limit"
    AGENT_VALIDATION_FAILED = "agent validation failed"
    AGENT_INVALID_ACTION = "agent invalid action"
    TASK_LIMIT_REACHED = "task limit reached"
    UNKNOWN = "unknown"
    TASK_ERROR = "task error"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """Every status except ``running`` ends the session."""
        return self is not SampleStatus.RUNNING


def _check_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for position, message in enumerate(messages):
        if not isinstance(message.get("role"), str):
            raise ValueError(
                f"messages[{position}] has no string 'role' (got keys {sorted(key[:40] for key in itertools.islice(message, 8))}); "
                "messages must be OpenAI chat messages such as {'role': 'assistant', 'tool_calls': [...]}"
            )
    return messages


class _Model(BaseModel):
    # Unknown fields are accepted and ignored: other versions of the protocol add fields.
    model_config = ConfigDict(extra="ignore")


# --------------------------------------------------------------------------- controller side


class StartSampleRequest(_Model):
    """Body of the controller's ``start_sample``."""

    name: str = Field(min_length=1, description="task name, as its workers register it")
    index: SampleIndex
    custom_task: dict[str, Any] | None = None


class InteractRequest(_Model):
    """Body of the controller's ``interact`` (the session id travels in the header)."""

    messages: list[dict[str, Any]] = Field(min_length=1, fail_fast=True)

    _check = field_validator("messages")(_check_messages)


class InteractResponse(_Model):
    """What the controller answers to ``start_sample`` and ``interact``.

    ``messages`` are the new environment messages (the opening history at ``start_sample``);
    ``tools`` are the OpenAI tool schemas (sent at least at ``start_sample``); ``finish`` is true
    once the session has ended with ``status``; ``reward`` is the latest reward the task reported;
    ``error`` names why a session ended abnormally (task exception, worker lost, idle expiry).
    """

    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    finish: bool = False
    reward: float = 0.0
    status: SampleStatus = SampleStatus.RUNNING
    metrics: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


class CancelResponse(_Model):
    """Answer to ``cancel``: the session and the status it ended with."""

    session_id: int
    status: SampleStatus = SampleStatus.CANCELLED


class HeartbeatRequest(_Model):
    """A task worker announcing itself; sent every few seconds (AgentRL: every 8 s)."""

    name: str = Field(min_length=1)
    address: str | None = Field(
        default=None, description="worker API base URL, e.g. http://127.0.0.1:5021/api"
    )
    concurrency: int = Field(ge=1)
    indices: list[SampleIndex] = Field(default_factory=list, fail_fast=True)
    split: str | None = Field(
        default=None, description="the data split the task serves (train, test, ...), when it has one"
    )


class TaskOutput(_Model):
    """One finished sample, as passed to ``calculate_overall``."""

    index: SampleIndex | None = None
    status: SampleStatus = SampleStatus.RUNNING
    result: Any = None
    history: list[Any] = Field(default_factory=list)


class CalculateOverallRequest(_Model):
    """Body of ``calculate_overall`` (controller and worker)."""

    name: str = ""
    results: list[TaskOutput] = Field(fail_fast=True)


class WorkerInfo(_Model):
    """One worker as the controller sees it (``list_workers``)."""

    name: str
    address: str
    concurrency: int
    open_sessions: int
    healthy: bool
    routable: bool
    last_heartbeat_age_s: float
    num_indices: int
    split: str | None = None


class SessionInfo(_Model):
    """One open session as the controller sees it (``list_sessions``)."""

    session_id: int
    name: str
    index: SampleIndex
    worker: str
    age_s: float
    idle_s: float
    busy: bool


# --------------------------------------------------------------------------- worker side


class WorkerStartSampleRequest(_Model):
    """Body of a worker's ``start_sample`` (the controller chose the session id)."""

    index: SampleIndex
    custom_task: dict[str, Any] | None = None
    session_id: int


class WorkerInteractRequest(_Model):
    """Body of a worker's ``interact``."""

    session_id: int
    messages: list[dict[str, Any]] = Field(min_length=1, fail_fast=True)

    _check = field_validator("messages")(_check_messages)


class SessionRef(_Model):
    """Body of a worker's ``cancel`` and ``sample_status``."""

    session_id: int


class EnvOutput(_Model):
    """A worker's answer to ``start_sample`` (and the ``env_out`` of ``interact``)."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    status: SampleStatus = SampleStatus.RUNNING
    finish: bool = False
    reward: float = 0.0
    metric: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None

    def to_interact_response(self) -> InteractResponse:
        """The controller-side shape of the same answer (``metric`` becomes ``metrics``).

        Built without validating again: every field was validated as part of this model (the
        controller relays every agent step, and re-checking the messages is its costliest part).
        """
        return InteractResponse.model_construct(
            messages=self.messages,
            tools=self.tools,
            finish=self.finish,
            reward=self.reward,
            status=self.status,
            metrics=self.metric,
            error=self.error,
        )


class WorkerInteractResponse(_Model):
    """A worker's answer to ``interact``."""

    session_id: int
    env_out: EnvOutput


class WorkerStatus(_Model):
    """A worker's ``worker_status``: its capacity and how much of it is used."""

    concurrency: int
    current: int


class ErrorResponse(_Model):
    """Body of every 4xx/5xx answer of our controller and worker."""

    detail: str
