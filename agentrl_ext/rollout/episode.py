"""One controller episode, driven by a pluggable actor, and the record it leaves.

Every place that plays an episode through the controller goes through :func:`drive_episode`:

- training: verl's agent loop (:mod:`agentrl_ext.rollout.agent_loop`), whose actor is a token
  server (:class:`~agentrl_ext.rollout.agent_loop.TokenActor`: token-in/token-out, chat template,
  tool-call parsing, token budgets);
- evaluation: the same token actor on local checkpoints, or a chat endpoint
  (:class:`~agentrl_ext.rollout.openai_pool.ChatActor`: OpenAI ``/v1/chat/completions``);
- expert data and replay: a scripted actor (:class:`ScriptedActor`: a function of the
  conversation, or the recorded actions of an episode).

The driver owns the session: ``start_sample``, one ``interact`` per action, the turn cap, the
statuses and when to ``cancel``. An actor only says what the agent does next (:meth:`Actor.act`)
and takes in what the environment answered (:meth:`Actor.observe`).

The rules, the same for every actor:

- **turn cap**: after ``max_turns`` actions of a session still running, the episode ends
  ``task limit reached`` and the session is cancelled;
- **context**: an actor that has no room for another action (``act`` returns None) or for the
  environment's answer (``observe`` returns False) ends the episode ``agent context limit``, and
  the session is cancelled;
- **environment failure**: a session the environment ends ``task error`` or ``unknown`` (at
  ``start_sample`` or later) is a failed episode (:attr:`FailureKind.ENV_STATUS`), not cancelled
  (it is over); a controller that cannot be reached is :attr:`FailureKind.ENV_TRANSPORT` with
  status ``task error``, and the session (if one was opened) is cancelled;
- **actor failure**: an actor raises :class:`EpisodeFailed` to end the episode as failed (prompt
  too long, generation aborted, a model endpoint that failed, a script run out); the session is cancelled. Any
  other exception of an actor cancels the session and is raised to the caller.

The record (:class:`Episode`, one JSON object by :meth:`Episode.to_dict`) holds the opening
messages and tools, every turn (the action, who took it with which weights version, the
environment's answer with its status and reward, timings), the outcome, and the token ids and
loss mask where a token server acted. ``agentrl-replay`` re-drives a task with its actions.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from agentrl_ext.env.client import ControllerClient, ControllerError, ControllerUnavailable
from agentrl_ext.env.protocol import InteractResponse, SampleStatus

logger = logging.getLogger(__name__)

#: format of :meth:`Episode.to_dict`; bumped when a field changes meaning
RECORD_VERSION = 1

#: statuses that end an episode as "the environment could not run it" (not the agent's fault)
ENV_FAILURE_STATUSES = frozenset({SampleStatus.TASK_ERROR, SampleStatus.UNKNOWN})


class FailureKind(str, Enum):
    """Why an episode could not be run to an end (training drops it from the loss)."""

    #: ``start_sample`` or ``interact`` failed after the controller client's retries
    ENV_TRANSPORT = "env_transport"
    #: the environment ended the session with ``task error`` or ``unknown``
    ENV_STATUS = "env_status"
    #: the opening prompt is longer than ``rollout.prompt_length``
    PROMPT_TOO_LONG = "prompt_too_long"
    #: the chat template renders earlier turns differently once env messages are appended
    TEMPLATE_NOT_PREFIX_STABLE = "template_not_prefix_stable"
    #: every attempt of one generation came back with ``stop_reason`` aborted
    GENERATION_ABORTED = "generation_aborted"
    #: the actor could not act: a model endpoint failed, a scripted actor ran out of actions
    ACTOR_FAILED = "actor_failed"


class EpisodeFailed(Exception):
    """The episode could not be run to an end; raised by the driver's steps and by actors."""

    def __init__(self, kind: FailureKind, reason: str, status: SampleStatus = SampleStatus.CANCELLED) -> None:
        super().__init__(reason)
        self.kind = kind
        #: the status the episode reports: the environment's, ``task error`` when it could not be
        #: reached, ``cancelled`` when the episode ended the session itself
        self.status = status


@dataclass
class Action:
    """What an actor does in one turn: the assistant message it sends, and who produced it."""

    message: dict[str, Any]
    #: the policy (pool member, model name, "expert", "replay") that produced it
    policy: str | None = None
    #: the weights version that produced it (None where the actor reports none)
    version: int | None = None
    #: model tokens of the turn (token actors), and their offset in the episode's response
    tokens: int | None = None
    offset: int | None = None
    #: seconds the actor took to produce it
    generate_s: float = 0.0


@dataclass
class Turn:
    """One turn of the record: the action and the environment's answer to it."""

    action: dict[str, Any]
    policy: str | None = None
    version: int | None = None
    tokens: int | None = None
    offset: int | None = None
    #: the answer: new environment messages, and the session's status, reward and end
    observation: list[dict[str, Any]] = field(default_factory=list)
    status: str = SampleStatus.RUNNING.value
    reward: float = 0.0
    finish: bool = False
    error: str | None = None
    generate_s: float = 0.0
    env_s: float = 0.0


@dataclass
class Episode:
    """The record of one episode (:meth:`to_dict` is its JSON form)."""

    task: str
    index: Any
    session_id: int | None = None
    #: the opening messages and tool schemas of ``start_sample``
    opening: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    turns: list[Turn] = field(default_factory=list)
    #: the final status and the environment's latest reward (before any success or punishment rule)
    status: SampleStatus = SampleStatus.RUNNING
    reward: float = 0.0
    env_metrics: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    failure_kind: FailureKind | None = None
    error: str | None = None
    #: where a token server acted: the prompt ids, the response ids and their loss mask (1: model)
    tokens: dict[str, list[int]] | None = None
    #: wall-clock start (``time.time()``) and the episode's seconds
    started: float = 0.0
    seconds: float = 0.0
    #: seconds ``start_sample`` waited for a free worker slot (the client's capacity wait)
    start_wait_s: float = 0.0
    #: what the caller adds: the training step (``global_steps``), the evaluation run and seed
    meta: dict[str, Any] = field(default_factory=dict)
    #: the conversation as the agent saw it: the opening, each action and each answer the episode
    #: went on after (not in :meth:`to_dict`: the opening and the turns hold it)
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: the tool schemas now: the opening's, or the latest an answer sent (not in the record)
    latest_tools: list[dict[str, Any]] | None = None
    #: the exception behind a failure (not in the record)
    exception: BaseException | None = field(default=None, repr=False)

    @property
    def generate_s(self) -> float:
        return sum(t.generate_s for t in self.turns)

    @property
    def env_s(self) -> float:
        return sum(t.env_s for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data (one line of a records file)."""
        return {
            "record_version": RECORD_VERSION,
            "task": self.task,
            "index": self.index,
            "session_id": self.session_id,
            "opening": self.opening,
            "tools": self.tools,
            "turns": [vars(t).copy() for t in self.turns],
            "status": self.status.value,
            "reward": self.reward,
            "env_metrics": self.env_metrics,
            "failed": self.failed,
            "failure_kind": self.failure_kind.value if self.failure_kind else None,
            "error": self.error,
            "tokens": self.tokens,
            "started": self.started,
            "seconds": self.seconds,
            "start_wait_s": self.start_wait_s,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        """A record read back (its conversation rebuilt from the opening and the turns)."""
        version = data.get("record_version")
        if version != RECORD_VERSION:
            raise ValueError(
                f"episode record version {version!r} is not {RECORD_VERSION}; it was written by another "
                "agentrl_ext version: replay it with that version"
            )
        turns = [Turn(**t) for t in data["turns"]]
        episode = cls(
            task=data["task"],
            index=data["index"],
            session_id=data.get("session_id"),
            opening=list(data["opening"]),
            tools=data.get("tools"),
            turns=turns,
            status=SampleStatus(data["status"]),
            reward=float(data["reward"]),
            env_metrics=dict(data.get("env_metrics") or {}),
            failed=bool(data.get("failed")),
            failure_kind=FailureKind(data["failure_kind"]) if data.get("failure_kind") else None,
            error=data.get("error"),
            tokens=data.get("tokens"),
            started=float(data.get("started", 0.0)),
            seconds=float(data.get("seconds", 0.0)),
            start_wait_s=float(data.get("start_wait_s", 0.0)),
            meta=dict(data.get("meta") or {}),
        )
        episode.messages = list(episode.opening)
        for turn in turns:
            episode.messages.append(turn.action)
            if not turn.finish:
                episode.messages += turn.observation
        return episode


class Actor(Protocol):
    """Who plays the agent's side of an episode."""

    async def begin(self, episode: Episode) -> None:
        """The session started: ``episode.opening``/``tools``/``messages`` hold its opening. May
        raise :class:`EpisodeFailed` (e.g. the prompt does not fit)."""

    async def act(self, episode: Episode) -> Action | None:
        """The next action, given ``episode.messages``; None: no room for one (context limit)."""

    async def observe(self, episode: Episode, messages: list[dict[str, Any]]) -> bool:
        """The environment answered ``messages`` to the last action and the session goes on;
        False: they do not fit (context limit). Called before they join ``episode.messages``."""


class ScriptedActor:
    """An actor that is a function of the conversation (an expert), or a list of actions (replay)."""

    def __init__(self, script: Any, policy: str = "scripted") -> None:
        #: a callable ``messages -> assistant message``, or a sequence of assistant messages
        self.script = script
        self.policy = policy
        self._next = 0

    async def begin(self, episode: Episode) -> None:
        self._next = 0

    async def act(self, episode: Episode) -> Action | None:
        t0 = time.perf_counter()
        if callable(self.script):
            message = self.script(list(episode.messages))
        else:
            if self._next >= len(self.script):
                raise EpisodeFailed(
                    FailureKind.ACTOR_FAILED,
                    f"the script has {len(self.script)} action(s) and the session still runs after them",
                )
            message = self.script[self._next]
        self._next += 1
        return Action(dict(message), policy=self.policy, generate_s=time.perf_counter() - t0)

    async def observe(self, episode: Episode, messages: list[dict[str, Any]]) -> bool:
        return True


async def drive_episode(
    client: ControllerClient, task: str, index: Any, actor: Actor, *, max_turns: int
) -> Episode:
    """Play one session of ``(task, index)`` with ``actor``; the record of it (see the module)."""
    if max_turns < 1:
        raise ValueError(f"max_turns={max_turns} must be >= 1")
    episode = Episode(task=task, index=index, started=time.time())
    t0 = time.perf_counter()
    try:
        await _run(client, episode, actor, max_turns)
    except EpisodeFailed as exc:
        episode.failed, episode.failure_kind, episode.error = True, exc.kind, str(exc)
        episode.status, episode.exception = exc.status, exc
        if exc.kind is not FailureKind.ENV_STATUS:
            await _cancel(client, episode.session_id)
    except BaseException:
        await _cancel(client, episode.session_id)
        raise
    finally:
        episode.seconds = time.perf_counter() - t0
    return episode


async def _run(client: ControllerClient, episode: Episode, actor: Actor, max_turns: int) -> None:
    try:
        started = await client.start_sample(episode.task, episode.index)
    except (ControllerError, ControllerUnavailable) as exc:
        raise EpisodeFailed(
            FailureKind.ENV_TRANSPORT, f"start_sample failed: {exc}", SampleStatus.TASK_ERROR
        ) from exc
    episode.session_id = started.session_id
    episode.start_wait_s = started.waited_s
    opening = started.response
    episode.opening, episode.tools = list(opening.messages), opening.tools
    if opening.finish or opening.status.finished:
        # the controller ended the session at once (e.g. its worker hung or was lost while starting)
        status = opening.status
        raise EpisodeFailed(
            FailureKind.ENV_STATUS,
            f"start_sample ended the session with {status.value!r}: {opening.error}",
            status if status in ENV_FAILURE_STATUSES else SampleStatus.TASK_ERROR,
        )
    episode.messages, episode.latest_tools = list(episode.opening), episode.tools
    await actor.begin(episode)
    for _turn in range(max_turns):
        action = await actor.act(episode)
        if action is None:
            episode.status = SampleStatus.AGENT_CONTEXT_LIMIT
            break
        episode.messages.append(action.message)
        turn = Turn(
            action=action.message,
            policy=action.policy,
            version=action.version,
            tokens=action.tokens,
            offset=action.offset,
            generate_s=action.generate_s,
        )
        episode.turns.append(turn)
        answer = await _interact(client, episode, turn)
        if answer.finish or answer.status.finished:
            break
        if not await actor.observe(episode, answer.messages):
            episode.status = SampleStatus.AGENT_CONTEXT_LIMIT
            break
        episode.messages += answer.messages
        episode.latest_tools = answer.tools or episode.latest_tools
    else:
        episode.status = SampleStatus.TASK_LIMIT_REACHED
    if episode.status in (SampleStatus.AGENT_CONTEXT_LIMIT, SampleStatus.TASK_LIMIT_REACHED) or (
        not episode.status.finished
    ):
        await _cancel(client, episode.session_id)


async def _interact(client: ControllerClient, episode: Episode, turn: Turn) -> InteractResponse:
    assert episode.session_id is not None, "interact before start_sample"
    t0 = time.perf_counter()
    try:
        answer = await client.interact(episode.session_id, [turn.action])
    except (ControllerError, ControllerUnavailable) as exc:
        raise EpisodeFailed(
            FailureKind.ENV_TRANSPORT, f"interact failed: {exc}", SampleStatus.TASK_ERROR
        ) from exc
    finally:
        turn.env_s = time.perf_counter() - t0
    turn.observation, turn.status, turn.reward = (
        list(answer.messages),
        answer.status.value,
        float(answer.reward),
    )
    turn.finish, turn.error = bool(answer.finish), answer.error
    episode.status, episode.reward, episode.env_metrics = (
        answer.status,
        float(answer.reward),
        dict(answer.metrics),
    )
    if answer.status in ENV_FAILURE_STATUSES:
        raise EpisodeFailed(
            FailureKind.ENV_STATUS,
            f"environment ended the session with {answer.status.value!r}: {answer.error}",
            answer.status,
        )
    return answer


async def _cancel(client: ControllerClient, session_id: int | None) -> None:
    if session_id is None:
        return
    try:
        await client.cancel(session_id)
    except (ControllerError, ControllerUnavailable) as exc:
        logger.info("cancel of session %s failed (it may already be gone): %s", session_id, exc)


def write_record(folder: str | os.PathLike[str] | None, episode: Episode) -> Path:
    """Append ``episode``'s record to this process's records file in ``folder`` (one JSON line)."""
    if not folder:
        raise ValueError("agentrl.records.dir is not set; name a folder for the episode records")
    path = Path(folder) / f"records-{socket.gethostname()}-{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:
        out.write(json.dumps(episode.to_dict(), default=str) + "\n")
    return path


def read_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, Episode]]:
    """``(line number, record)`` of every record in a JSON Lines file: records of the driver
    (:meth:`Episode.to_dict`), or the lines of an ``agentrl-eval-run`` episodes file (under ``record``)."""
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number} is not a JSON line ({exc})") from None
            if isinstance(data, dict) and isinstance(data.get("record"), dict):
                data = data["record"]
            if not isinstance(data, dict) or "turns" not in data:
                raise ValueError(
                    f"{path}:{number} is not an episode record (no 'turns'); give a records file of "
                    "agentrl.records.dir or an agentrl-eval-run episodes file (OUT.episodes.jsonl)"
                )
            yield number, Episode.from_dict(data)
