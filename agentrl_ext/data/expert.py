"""Expert trajectories of the procedural tasks, played through a controller (for SFT and tests).

Each procedural task (``guess``, ``calc``, ``gridroom``) has a stateless expert policy in
``agentrl_ext.envs.<task>.expert``: ``expert_action(messages) -> assistant message`` reads the
conversation so far (the opening messages, its own earlier steps and every environment answer)
and returns the next tool call. :func:`play_expert_episode` plays one sample with it over the
real controller -> worker path (:func:`~agentrl_ext.rollout.episode.drive_episode` with a
scripted actor, as training and evaluation drive theirs) and returns the whole conversation, so
the trajectory is exactly what an agent loop would have seen, and its episode record.

    async with ControllerClient("http://127.0.0.1:5020/api") as client:
        episode = await play_expert_episode(client, "guess", 3)
        episode.messages, episode.tools, episode.reward, episode.status

A careless demonstrator (:func:`noisy_policy`) plays the expert's move except, with probability
``epsilon`` per turn, a careless one: ``<move>_action(messages, rng)`` next to the expert in its
module, ``random_action`` (a random move) by default, or another the module defines (guess's
``habit_action``: always the same number). Imperfect demonstrations for a warm start that RL
should improve on.
"""

from __future__ import annotations

import asyncio
import importlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl_ext.env.client import ControllerClient
from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.tasks import task_specs
from agentrl_ext.rollout.episode import Episode, FailureKind, ScriptedActor, drive_episode

ExpertPolicy = Callable[[list[dict[str, Any]]], dict[str, Any]]


def experts() -> dict[str, str]:
    """Task name -> ``module:function`` of its expert policy, from the task catalogue."""
    return {name: spec.expert for name, spec in task_specs().items() if spec.expert}


def _from_expert_module(task: str, name: str | None = None) -> Any:
    """The expert of ``task`` (``name`` None) or attribute ``name`` of its module (None if absent)."""
    spec = experts().get(task, task)
    if ":" not in spec:
        raise ValueError(
            f"no expert policy for task {task!r}; known: {', '.join(sorted(experts()))} "
            "(or pass 'module:function')"
        )
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), name or function, None)


def expert_function(task: str, name: str) -> Callable[..., Any] | None:
    """Function ``name`` of ``task``'s expert module (e.g. ``feasible_action``, ``is_feasible``), or
    None if the module has none."""
    found = _from_expert_module(task, name)
    return found if callable(found) else None


def expert_policy(task: str) -> ExpertPolicy:
    """The expert policy of ``task`` (a task whose spec names an expert, or a ``module:function`` spec)."""
    policy: ExpertPolicy = _from_expert_module(task)
    return policy


#: the careless move a task plays unless ``agentrl.sft.careless_move`` names another
DEFAULT_CARELESS_MOVE = "random"


def has_careless_action(task: str, move: str = DEFAULT_CARELESS_MOVE) -> bool:
    """Whether ``task``'s expert module defines ``<move>_action`` (needed by :func:`noisy_policy`)."""
    return expert_function(task, f"{move}_action") is not None


def noisy_policy(
    task: str, epsilon: float, rng: random.Random, move: str = DEFAULT_CARELESS_MOVE
) -> ExpertPolicy:
    """``task``'s expert, except that each turn with probability ``epsilon`` it plays
    ``<move>_action(messages, rng)`` from the expert's module (drawn with ``rng``)."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"noisy_policy: epsilon must be in [0, 1], got {epsilon!r}")
    expert = expert_policy(task)
    careless = _from_expert_module(task, f"{move}_action")
    if epsilon > 0 and not callable(careless):
        raise ValueError(f"task {task!r}: its expert module has no {move}_action(messages, rng)")

    def policy(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if rng.random() < epsilon:
            return dict(careless(messages, rng))
        return expert(messages)

    return policy


@dataclass
class ExpertEpisode:
    """One played sample: the whole conversation (OpenAI messages), the tools, and how it ended."""

    task: str
    index: SampleIndex
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    status: SampleStatus = SampleStatus.RUNNING
    turns: int = 0
    error: str | None = None
    #: the episode's record (``agentrl-replay`` re-drives it)
    record: Episode | None = None

    @property
    def won(self) -> bool:
        """Ended ``completed`` with a positive reward."""
        return self.status == SampleStatus.COMPLETED and self.reward > 0


async def play_expert_episode(
    client: ControllerClient,
    task: str,
    index: SampleIndex,
    policy: ExpertPolicy | None = None,
    max_steps: int = 64,
) -> ExpertEpisode:
    """Play sample ``index`` of ``task`` with ``policy`` (default: the task's expert).

    The session is cancelled if it is still running after ``max_steps`` agent steps (then a
    RuntimeError: an expert that does not finish is a bug) or when the policy raises (raised on).
    A controller that cannot be reached raises its error.
    """
    actor = ScriptedActor(policy or expert_policy(task), policy="expert")
    episode = await drive_episode(client, task, index, actor, max_turns=max_steps)
    if episode.failure_kind is FailureKind.ENV_TRANSPORT and episode.exception is not None:
        raise episode.exception.__cause__ or episode.exception
    last = episode.turns[-1] if episode.turns else None
    if episode.status is SampleStatus.TASK_LIMIT_REACHED and last is not None and not last.finish:
        # the driver's cap, not the task's own turn limit (which the task reports, ending the session)
        raise RuntimeError(f"{task} #{index}: still running after {max_steps} steps")
    messages = list(episode.messages)
    if last is not None and last.finish:
        messages += last.observation  # the environment's closing words belong to the demonstration
    return ExpertEpisode(
        task,
        index,
        messages,
        list(episode.tools or []),
        reward=episode.reward,
        status=episode.status,
        turns=len(episode.turns),
        # the environment's own words where it ended the session (the driver's reason otherwise)
        error=last.error if last is not None and last.finish else episode.error,
        record=episode,
    )


async def play_expert_episodes(
    controller_url: str,
    task: str,
    indices: Sequence[SampleIndex],
    concurrency: int = 8,
    policy: ExpertPolicy | None = None,
    epsilon: float = 0.0,
    seed: int = 0,
    move: str = DEFAULT_CARELESS_MOVE,
) -> list[ExpertEpisode]:
    """Play every index of ``indices`` (in that order), ``concurrency`` sessions at a time.

    ``epsilon`` > 0 plays :func:`noisy_policy` (careless ``move``) instead of the expert, with a
    random stream per index seeded by ``seed``, ``task`` and the index (the same episodes at any
    ``concurrency``).
    """
    if policy is not None and epsilon > 0:
        raise ValueError("play_expert_episodes: pass a policy or an epsilon, not both")
    policy = policy or expert_policy(task)
    gate = asyncio.Semaphore(concurrency)
    async with ControllerClient(controller_url) as client:

        async def one(index: SampleIndex) -> ExpertEpisode:
            chosen = policy
            if epsilon > 0:
                chosen = noisy_policy(task, epsilon, random.Random(f"{seed}:{task}:{index}"), move)
            async with gate:
                return await play_expert_episode(client, task, index, chosen)

        return list(await asyncio.gather(*(one(index) for index in indices)))
