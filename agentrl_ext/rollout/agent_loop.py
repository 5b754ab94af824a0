"""AgentRL's multi-turn function-call agent loop, registered in verl as ``agentrl``.

One episode = one controller session of (task, index) taken from the dataset row, driven by
:func:`~agentrl_ext.rollout.episode.drive_episode` (turn cap, statuses, cancel rules) with a
:class:`TokenActor` as the agent:

1. ``start_sample`` on the controller → opening messages and tool schemas;
2. render the chat template with the tools, generate through verl's server manager
   (every call may go to another policy pool under cross-policy sampling);
3. parse the model's tool calls, send the assistant message to ``interact``;
4. append the environment's messages (their tokens found by diffing two renderings,
   masked out of the loss) until ``finish``, the turn limit or the context budget.

The environment's reward is the reward: it is set as ``reward_score`` so verl's
reward loop leaves it alone. A trajectory that does not end ``completed`` gets
``incomplete_punishment``.

One episode never fails the training step. An episode that cannot be run to an end
(:class:`FailureKind`: environment transport or status failure, an opening prompt over
``rollout.prompt_length``, a chat template that is not prefix-stable, a generation that
stays aborted after ``agentrl.agent_loop.abort_retries`` retries) is dropped from the
loss (one masked token) and counted: ``extra_fields["agentrl"]`` has ``failed=True``,
``failure_kind`` and the reason in ``error``.

With ``agentrl.records.rate`` > 0, that share of episodes is written to ``agentrl.records.dir``
as episode records (:class:`~agentrl_ext.rollout.episode.Episode`), which ``agentrl-replay`` reads.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import hashlib
import logging
import random
import time
from typing import Any
from uuid import uuid4

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from agentrl_ext.config import AgentLoopConfig
from agentrl_ext.env.client import ControllerClient, ControllerError, ControllerUnavailable, RetryPolicy
from agentrl_ext.env.protocol import SampleStatus, decode_sample_index
from agentrl_ext.rollout.episode import (
    ENV_FAILURE_STATUSES,
    Action,
    Episode,
    EpisodeFailed,
    FailureKind,
    drive_episode,
    write_record,
)
from agentrl_ext.rollout.transcript import (
    TemplateNotPrefixStable,
    Transcript,
    env_token_ids,
    parse_hermes_tool_calls,
    render,
)
from agentrl_ext.run_spec import run_spec

logger = logging.getLogger(__name__)

AGENT_NAME = "agentrl"

__all__ = ["ENV_FAILURE_STATUSES", "AgentRLAgentLoop", "EpisodeFailed", "FailureKind", "TokenActor"]

#: ``TokenOutput.stop_reason`` of a generation the server aborted (vLLM/HF/TRT-LLM: "aborted", SGLang: "abort")
ABORTED_STOP_REASONS = frozenset({"aborted", "abort"})

_clients: dict[tuple[str, int], tuple[asyncio.AbstractEventLoop, ControllerClient]] = {}


def controller_client(config: AgentLoopConfig) -> ControllerClient:
    """One pooled client per controller URL and event loop (agent loops are created per sample)."""
    if not config.controller_url:
        raise ValueError(
            "agentrl.agent_loop.controller_url is not set; the agentrl agent loop talks to environments "
            "through a controller, e.g. agentrl.agent_loop.controller_url=http://127.0.0.1:5020/api"
        )
    url = config.controller_url
    loop = asyncio.get_running_loop()
    key = (url, id(loop))
    if key not in _clients:
        if not _clients:
            atexit.register(close_controller_clients)
        client = ControllerClient(
            url,
            retry=RetryPolicy(deadline_s=config.env_retry_deadline_s, max_attempts=config.env_attempts),
            timeout_s=config.env_timeout_s,
            capacity_wait_s=config.env_capacity_wait_s,
        )
        _clients[key] = (loop, client)
    return _clients[key][1]


def validation_settings(config: AgentLoopConfig) -> AgentLoopConfig:
    """The agent loop's settings for validation rows: their controller is ``val_controller_url``
    (when set; the held-out split's)."""
    return dataclasses.replace(config, controller_url=config.val_controller_url or config.controller_url)


def close_controller_clients(timeout_s: float = 2.0) -> None:
    """Close the pooled controller clients (registered with ``atexit``), each on its own event loop.

    verl's agent-loop workers never tell an agent loop that they stop; without this, their
    pooled HTTP sessions are collected unclosed at exit ("Unclosed client session").
    """
    while _clients:
        _key, (loop, client) = _clients.popitem()
        try:
            if loop.is_closed():
                client.close_now()
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(timeout=timeout_s)
            else:
                loop.run_until_complete(client.close())
        except Exception as exc:  # noqa: BLE001  (exiting: close what can be closed, never raise)
            logger.debug("closing the controller client at exit: %s", exc)
            client.close_now()


class TokenActor:
    """The agent as a token server: verl's server manager behind ``generate`` (token-in, token-out).

    Renders the opening with the chat template, generates each turn from the whole token context
    (retrying a generation the server aborted), parses its tool calls, and appends the
    environment's answers as masked tokens found by diffing two renderings; keeps the episode's
    token budgets (``prompt_budget`` for the opening, ``response_budget`` for all after it). One
    actor plays one episode.
    """

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        settings: AgentLoopConfig,
        *,
        prompt_budget: int,
        response_budget: int,
        sampling_params: dict[str, Any],
        parser: Any = None,
    ) -> None:
        self.server_manager, self.tokenizer, self.settings = server_manager, tokenizer, settings
        self.prompt_budget, self.response_budget = prompt_budget, response_budget
        self.sampling_params = sampling_params
        self.parser = parser
        self.abort_retries = settings.abort_retries
        self.abort_retry_delay_s = settings.abort_retry_delay_s
        self.end_token_id = tokenizer.eos_token_id
        #: one request id per episode (the server's prefix cache follows it)
        self.request_id = uuid4().hex
        self.tools: list[dict[str, Any]] | None = None
        self.transcript = Transcript(prompt_ids=[])
        #: per accepted assistant turn, aligned: the pool that generated it, its weights version
        #: (None when the server reports none), its number of model tokens (mask 1)
        self.turn_policies: list[str] = []
        self.turn_versions: list[int | None] = []
        self.turn_tokens: list[int] = []
        #: per accepted assistant turn: a digest of the token context it was generated from (the
        #: turn's state; turns of any episodes with equal digests were taken in the same state), and
        #: the offset of its first token in the response
        self.turn_states: list[str] = []
        self.turn_offsets: list[int] = []
        #: generation calls that came back aborted (retried or, after the last retry, dropped)
        self.aborted_generations = 0
        #: seconds in ``generate``, aborted attempts included
        self.generate_s = 0.0
        self._generated: list[int] = []

    async def begin(self, episode: Episode) -> None:
        self.tools = episode.tools
        self.transcript = Transcript(
            prompt_ids=render(self.tokenizer, episode.messages, self.tools, add_generation_prompt=True)
        )
        transcript = self.transcript
        episode.tokens = {
            "prompt_ids": transcript.prompt_ids,
            "response_ids": transcript.response_ids,
            "response_mask": transcript.response_mask,
        }
        if len(transcript.prompt_ids) > self.prompt_budget:
            raise EpisodeFailed(
                FailureKind.PROMPT_TOO_LONG,
                f"opening prompt of {len(transcript.prompt_ids)} tokens exceeds "
                f"actor_rollout_ref.rollout.prompt_length={self.prompt_budget}",
            )

    async def act(self, episode: Episode) -> Action | None:
        room = self.response_budget - len(self.transcript.response_ids)
        if room < 1:
            return None
        if self.settings.max_tokens_per_turn:
            room = min(room, self.settings.max_tokens_per_turn)
        t0 = time.perf_counter()
        offset = len(self.transcript.response_ids)
        token_ids = await self._generate(episode, room)
        self._generated = token_ids
        message = await self._assistant_message(token_ids)
        return Action(
            message,
            policy=self.turn_policies[-1],
            version=self.turn_versions[-1],
            tokens=len(token_ids),
            offset=offset,
            generate_s=time.perf_counter() - t0,
        )

    async def observe(self, episode: Episode, messages: list[dict[str, Any]]) -> bool:
        """Append the environment's turn (masked); False when it does not fit the response budget."""
        try:
            env_ids = env_token_ids(
                self.tokenizer, episode.messages, messages, self.tools, self._generated, self.end_token_id
            )
        except TemplateNotPrefixStable as exc:
            raise EpisodeFailed(FailureKind.TEMPLATE_NOT_PREFIX_STABLE, str(exc)) from exc
        if len(self.transcript.response_ids) + len(env_ids) >= self.response_budget:
            return False
        self.transcript.add_env_tokens(env_ids)
        return True

    def turn_fields(self) -> dict[str, list[Any]]:
        """The per-turn lists, aligned, under their names in ``extra_fields["agentrl"]``."""
        return {
            "turn_policies": self.turn_policies,
            "turn_versions": self.turn_versions,
            "turn_tokens": self.turn_tokens,
            "turn_states": self.turn_states,
            "turn_offsets": self.turn_offsets,
        }

    def _add_turn(self, token_ids: list[int], log_probs: list[float] | None, extra: dict[str, Any]) -> None:
        """Record an accepted generation: its tokens in the transcript and its per-turn fields."""
        self.turn_states.append(context_digest(self.transcript.all_ids))
        self.turn_offsets.append(len(self.transcript.response_ids))
        self.transcript.add_model_tokens(token_ids, log_probs)
        self.turn_policies.append(str(extra.get("policy", "current")))
        version = extra.get("global_steps")
        self.turn_versions.append(int(version) if version is not None else None)
        self.turn_tokens.append(len(token_ids))

    async def _generate(self, episode: Episode, max_tokens: int) -> list[int]:
        """One assistant turn's tokens; an aborted generation is retried, then the episode dropped."""
        for attempt in range(self.abort_retries + 1):
            if attempt and self.abort_retry_delay_s > 0:
                await asyncio.sleep(self.abort_retry_delay_s)
            t0 = time.perf_counter()
            out = await self.server_manager.generate(
                self.request_id,
                prompt_ids=self.transcript.all_ids,
                sampling_params={**self.sampling_params, "max_tokens": max_tokens},
            )
            self.generate_s += time.perf_counter() - t0
            if out.stop_reason not in ABORTED_STOP_REASONS:
                token_ids = list(out.token_ids)
                self._add_turn(token_ids, out.log_probs, out.extra_fields)
                return token_ids
            self.aborted_generations += 1
            logger.info(
                "generation of %s[%s] turn %d aborted (%d partial tokens discarded), attempt %d of %d",
                episode.task, episode.index, len(self.turn_tokens) + 1, len(out.token_ids),
                attempt + 1, self.abort_retries + 1,
            )  # fmt: skip
        raise EpisodeFailed(
            FailureKind.GENERATION_ABORTED,
            f"generation of turn {len(self.turn_tokens) + 1} came back aborted {self.abort_retries + 1} times "
            f"(agentrl.agent_loop.abort_retries={self.abort_retries})",
        )

    async def _assistant_message(self, token_ids: list[int]) -> dict[str, Any]:
        if self.parser is not None:
            # the parser sees the turn's body: its end-of-turn token is template glue, not content
            body = token_ids[:-1] if token_ids and token_ids[-1] == self.end_token_id else token_ids
            content, calls = await self.parser.extract_tool_calls(body, _tool_schemas(self.tools))
            tool_calls = [
                {
                    "id": f"call_{uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
        else:
            text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
            content, tool_calls = parse_hermes_tool_calls(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return message


def could_not_reach_controller(exc: BaseException | None) -> bool:
    """Whether an episode failed because this process could not use the controller at all: no
    answer after every retry, or its credentials refused (401/403). A controller that answers for
    a worker that died or is full (5xx) is the environment failing, not this node's reach."""
    while exc is not None:  # the driver's EpisodeFailed carries the client's error as its cause
        if isinstance(exc, ControllerUnavailable):
            return True
        if isinstance(exc, ControllerError):
            return exc.status in (401, 403)
        exc = exc.__cause__
    return False


def tool_parser(tool_format: str, tokenizer: Any) -> Any:
    """verl's tool parser of ``tool_format``, or None for hermes (parsed here, keeping malformed calls)."""
    if tool_format == "hermes":
        return None
    from verl.experimental.agent_loop.tool_parser import ToolParser

    return ToolParser.get_tool_parser(tool_format, tokenizer)


def context_digest(token_ids: list[int]) -> str:
    """A digest of a token context: equal contexts give equal digests in every process."""
    return hashlib.blake2b(np.asarray(token_ids, dtype=np.int64).tobytes(), digest_size=12).hexdigest()


@register(AGENT_NAME)
class AgentRLAgentLoop(AgentLoopBase):
    """Multi-turn, multi-task agent loop over the AgentRL function-call protocol: verl's adapter
    over :func:`~agentrl_ext.rollout.episode.drive_episode` with a :class:`TokenActor`."""

    tokenizer: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        agentrl = run_spec(self.config).agentrl
        self.settings = agentrl.agent_loop
        self.records = agentrl.records
        #: retries of a generation that came back aborted (``agentrl.agent_loop.abort_retries``)
        self.abort_retries = self.settings.abort_retries
        self.abort_retry_delay_s = self.settings.abort_retry_delay_s
        self.response_budget = int(self.rollout_config.response_length)
        self.prompt_budget = int(self.rollout_config.prompt_length)
        self._parser: Any = tool_parser(self.settings.tool_format, self.tokenizer)
        #: whether the current row is a validation row (``extra_info.split`` val)
        self.validation = False

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task = str(kwargs.get("data_source"))
        extra = kwargs.get("extra_info") or {}
        index = decode_sample_index(extra.get("sample_index"))
        if index is None:
            raise ValueError(
                f"dataset row of task {task!r} has no extra_info.sample_index; build it with agentrl-build-dataset"
            )
        # validation rows (agentrl-build-dataset --kind val) play on the held-out split's controller
        self.validation = extra.get("split") == "val"
        client = self.controller_client()
        actor = TokenActor(
            self.server_manager,
            self.tokenizer,
            self.settings,
            prompt_budget=self.prompt_budget,
            response_budget=self.response_budget,
            sampling_params=dict(sampling_params),
            parser=self._parser,
        )
        actor.abort_retries, actor.abort_retry_delay_s = self.abort_retries, self.abort_retry_delay_s
        episode = await drive_episode(client, task, index, actor, max_turns=self.settings.max_turns)
        if episode.failed:
            logger.warning(
                "episode %s[%s] dropped from the loss (%s): %s",
                task, index, episode.failure_kind.value if episode.failure_kind else None, episode.error,
            )  # fmt: skip
            output = self._dropped(episode, actor)
        else:
            output = self._finished(episode, actor)
        # Policy versions (verl's off-policy bookkeeping): the weights versions that generated the turns.
        versions = [v for v in output.extra_fields["agentrl"]["turn_versions"] if v is not None]
        fallback = kwargs.get("global_steps")
        output.extra_fields["min_global_steps"] = min(versions) if versions else fallback
        output.extra_fields["max_global_steps"] = max(versions) if versions else fallback
        if self.records.rate > 0 and random.random() < self.records.rate:
            if fallback is not None:
                episode.meta["global_steps"] = fallback
            write_record(self.records.dir, episode)
        return output

    def controller_client(self) -> ControllerClient:
        """The controller client of this episode: the pooled one of this process and event loop
        (for a validation row, of ``agentrl.agent_loop.val_controller_url`` when set)."""
        if self.validation and self.settings.val_controller_url:
            return controller_client(validation_settings(self.settings))
        return controller_client(self.settings)

    def _extra(
        self,
        episode: Episode,
        actor: TokenActor,
        status: SampleStatus,
        reward: float,
        success: bool,
        trained: bool = True,
    ) -> dict[str, Any]:
        turns = actor.turn_fields() if trained else {name: [] for name in actor.turn_fields()}
        return {
            "agentrl": {
                "reward": reward,
                "task": episode.task,
                "index": episode.index,
                "status": status.value,
                "success": success,
                "failed": False,
                "failure_kind": None,
                **turns,
                "aborted_generations": actor.aborted_generations,
                "start_wait_s": episode.start_wait_s,
                "env_metrics": episode.env_metrics,
                "seconds": episode.seconds,
                # wall-clock start and end (the async trainer measures the rollout's idle time)
                "t_start": episode.started,
                "t_end": time.time(),
            },
            # verl groups these by data_source in its validation metrics
            "reward_extra_info": {"success": float(success), "failed": 0.0},
        }

    def _finished(self, episode: Episode, actor: TokenActor) -> AgentLoopOutput:
        completed = episode.status == SampleStatus.COMPLETED
        reward = episode.reward if completed else self.settings.incomplete_punishment
        success = completed and episode.reward >= self.settings.success_reward
        transcript = actor.transcript
        return AgentLoopOutput(
            prompt_ids=transcript.prompt_ids,
            response_ids=transcript.response_ids,
            response_mask=transcript.response_mask,
            response_logprobs=transcript.response_logprobs,
            reward_score=reward,
            num_turns=len(episode.messages),
            metrics=AgentLoopMetrics(generate_sequences=actor.generate_s, tool_calls=episode.env_s),
            extra_fields=self._extra(episode, actor, episode.status, reward, success),
        )

    def _dropped(self, episode: Episode, actor: TokenActor) -> AgentLoopOutput:
        """A sample that could not be run: one masked token, so it adds nothing to the loss."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # nothing of the episode is trained: no turns to attribute to a pool or a version
        extra = self._extra(episode, actor, episode.status, 0.0, False, trained=False)
        extra["agentrl"].update(
            failed=True,
            failure_kind=episode.failure_kind.value if episode.failure_kind else None,
            error=episode.error,
            env_metrics={},
            unreachable=could_not_reach_controller(episode.exception),
        )
        extra["reward_extra_info"]["failed"] = 1.0
        return AgentLoopOutput(
            prompt_ids=[pad],
            response_ids=[pad],
            response_mask=[0],
            response_logprobs=[0.0],
            reward_score=0.0,
            num_turns=0,
            metrics=AgentLoopMetrics(generate_sequences=actor.generate_s, tool_calls=episode.env_s),
            extra_fields=extra,
        )


def _tool_schemas(tools: list[dict[str, Any]] | None) -> list[Any] | None:
    """The env's tool schemas as verl's parsers take them (typed parameters), or None if they do not fit."""
    if not tools:
        return None
    from pydantic import ValidationError
    from verl.tools.schemas import OpenAIFunctionToolSchema

    try:
        return [OpenAIFunctionToolSchema.model_validate(t) for t in tools]
    except ValidationError as exc:
        logger.debug("tool schemas not in verl's OpenAI form, parsing without them: %s", exc)
        return None
