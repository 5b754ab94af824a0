"""AgentRL's multi-turn function-call agent loop, registered in verl as ``agentrl``.

One episode = one controller session of (task, index) taken from the dataset row:

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
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from uuid import uuid4

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from agentrl_ext.config import AgentLoopConfig
from agentrl_ext.data.multitask import decode_sample_index
from agentrl_ext.env.client import ControllerClient, ControllerError, ControllerUnavailable, RetryPolicy
from agentrl_ext.env.protocol import InteractResponse, SampleStatus
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

#: statuses that end an episode as "the environment could not run it" (not the agent's fault)
ENV_FAILURE_STATUSES = {SampleStatus.TASK_ERROR, SampleStatus.UNKNOWN}

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
    loop = asyncio.get_running_loop()
    key = (config.controller_url, id(loop))
    if key not in _clients:
        if not _clients:
            atexit.register(close_controller_clients)
        client = ControllerClient(
            config.controller_url,
            retry=RetryPolicy(deadline_s=config.env_retry_deadline_s, max_attempts=config.env_attempts),
            timeout_s=config.env_timeout_s,
        )
        _clients[key] = (loop, client)
    return _clients[key][1]


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


class FailureKind(str, Enum):
    """Why an episode was dropped from the loss (``extra_fields["agentrl"]["failure_kind"]``)."""

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


class EpisodeFailed(Exception):
    """The episode could not be run to an end; it is dropped from the loss and counted."""

    def __init__(self, kind: FailureKind, reason: str, status: SampleStatus = SampleStatus.CANCELLED) -> None:
        super().__init__(reason)
        self.kind = kind
        #: the status the episode reports: the environment's, ``task error`` when it could not be
        #: reached, ``cancelled`` when the loop ended the session itself
        self.status = status


@dataclass
class EpisodeState:
    """Everything one episode accumulates; the loop's handlers read and update it."""

    task: str
    index: Any
    started: float
    session_id: int | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    transcript: Transcript = field(default_factory=lambda: Transcript(prompt_ids=[]))
    status: SampleStatus = SampleStatus.RUNNING
    reward: float = 0.0
    env_metrics: dict[str, Any] = field(default_factory=dict)
    #: per accepted assistant turn, aligned: the pool that generated it, its weights version
    #: (None when the server reports none), its number of model tokens (mask 1)
    turn_policies: list[str] = field(default_factory=list)
    turn_versions: list[int | None] = field(default_factory=list)
    turn_tokens: list[int] = field(default_factory=list)
    #: per accepted assistant turn: a digest of the token context it was generated from (the
    #: turn's state; turns of any episodes with equal digests were taken in the same state), and
    #: the offset of its first token in the response
    turn_states: list[str] = field(default_factory=list)
    turn_offsets: list[int] = field(default_factory=list)
    #: generation calls that came back aborted (retried or, after the last retry, dropped)
    aborted_generations: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0

    def add_turn(self, token_ids: list[int], log_probs: list[float] | None, extra: dict[str, Any]) -> None:
        """Record an accepted generation: its tokens in the transcript and its per-turn fields."""
        self.turn_states.append(context_digest(self.transcript.all_ids))
        self.turn_offsets.append(len(self.transcript.response_ids))
        self.transcript.add_model_tokens(token_ids, log_probs)
        self.turn_policies.append(str(extra.get("policy", "current")))
        version = extra.get("global_steps")
        self.turn_versions.append(int(version) if version is not None else None)
        self.turn_tokens.append(len(token_ids))


def context_digest(token_ids: list[int]) -> str:
    """A digest of a token context: equal contexts give equal digests in every process."""
    return hashlib.blake2b(np.asarray(token_ids, dtype=np.int64).tobytes(), digest_size=12).hexdigest()


@register(AGENT_NAME)
class AgentRLAgentLoop(AgentLoopBase):
    """Multi-turn, multi-task agent loop over the AgentRL function-call protocol."""

    tokenizer: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = run_spec(self.config).agentrl.agent_loop
        #: retries of a generation that came back aborted (``agentrl.agent_loop.abort_retries``)
        self.abort_retries = self.settings.abort_retries
        self.abort_retry_delay_s = self.settings.abort_retry_delay_s
        self.response_budget = int(self.rollout_config.response_length)
        self.prompt_budget = int(self.rollout_config.prompt_length)
        self.end_token_id = self.tokenizer.eos_token_id
        self._parser: Any = None
        if self.settings.tool_format != "hermes":
            from verl.experimental.agent_loop.tool_parser import ToolParser

            self._parser = ToolParser.get_tool_parser(self.settings.tool_format, self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task = str(kwargs.get("data_source"))
        extra = kwargs.get("extra_info") or {}
        index = decode_sample_index(extra.get("sample_index"))
        if index is None:
            raise ValueError(
                f"dataset row of task {task!r} has no extra_info.sample_index; build it with agentrl-build-dataset"
            )
        client = self.controller_client()
        state = EpisodeState(task=task, index=index, started=time.perf_counter())
        try:
            await self._episode(client, state, dict(sampling_params))
            output = self._finished(state)
        except EpisodeFailed as exc:
            logger.warning("episode %s[%s] dropped from the loss (%s): %s", task, index, exc.kind.value, exc)
            if state.session_id is not None and exc.kind is not FailureKind.ENV_STATUS:
                await self._cancel(client, state.session_id)
            output = self._dropped(state, exc)
        # Policy versions (verl's off-policy bookkeeping): the weights versions that generated the turns.
        versions = [v for v in output.extra_fields["agentrl"]["turn_versions"] if v is not None]
        fallback = kwargs.get("global_steps")
        output.extra_fields["min_global_steps"] = min(versions) if versions else fallback
        output.extra_fields["max_global_steps"] = max(versions) if versions else fallback
        return output

    def controller_client(self) -> ControllerClient:
        """The controller client of this episode: the pooled one of this process and event loop.

        A caller that runs episodes itself (``agentrl_ext.eval``) overrides it with its own client.
        """
        return controller_client(self.settings)

    async def _episode(
        self, client: ControllerClient, state: EpisodeState, sampling_params: dict[str, Any]
    ) -> None:
        """Run the session to its end; sets ``state.status``. Raises :class:`EpisodeFailed`."""
        await self._start(client, state)
        request_id = uuid4().hex
        for _turn in range(self.settings.max_turns):
            room = self.response_budget - len(state.transcript.response_ids)
            if room < 1:
                state.status = SampleStatus.AGENT_CONTEXT_LIMIT
                break
            if self.settings.max_tokens_per_turn:
                room = min(room, self.settings.max_tokens_per_turn)
            token_ids = await self._generate(state, request_id, sampling_params, room)
            assistant = await self._assistant_message(token_ids, state.tools)
            state.messages.append(assistant)
            result = await self._interact(client, state, assistant)
            if result.finish or state.status.finished:
                break
            if not self._add_env_messages(state, result.messages, token_ids):
                state.status = SampleStatus.AGENT_CONTEXT_LIMIT
                break
        else:
            state.status = SampleStatus.TASK_LIMIT_REACHED
        if not state.status.finished or state.status in (
            SampleStatus.AGENT_CONTEXT_LIMIT,
            SampleStatus.TASK_LIMIT_REACHED,
        ):
            await self._cancel(client, state.session_id)

    async def _start(self, client: ControllerClient, state: EpisodeState) -> None:
        try:
            start = await client.start_sample(state.task, state.index)
        except (ControllerError, ControllerUnavailable) as exc:
            raise EpisodeFailed(
                FailureKind.ENV_TRANSPORT, f"start_sample failed: {exc}", SampleStatus.TASK_ERROR
            ) from exc
        state.session_id = start.session_id
        if start.response.finish or start.response.status.finished:
            # the controller ended the session at once (e.g. its worker hung or was lost while starting)
            status = start.response.status
            raise EpisodeFailed(
                FailureKind.ENV_STATUS,
                f"start_sample ended the session with {status.value!r}: {start.response.error}",
                status if status in ENV_FAILURE_STATUSES else SampleStatus.TASK_ERROR,
            )
        state.messages, state.tools = list(start.response.messages), start.response.tools
        state.transcript = Transcript(
            prompt_ids=render(self.tokenizer, state.messages, state.tools, add_generation_prompt=True)
        )
        if len(state.transcript.prompt_ids) > self.prompt_budget:
            raise EpisodeFailed(
                FailureKind.PROMPT_TOO_LONG,
                f"opening prompt of {len(state.transcript.prompt_ids)} tokens exceeds "
                f"actor_rollout_ref.rollout.prompt_length={self.prompt_budget}",
            )

    async def _generate(
        self, state: EpisodeState, request_id: str, sampling_params: dict[str, Any], max_tokens: int
    ) -> list[int]:
        """One assistant turn's tokens; an aborted generation is retried, then the episode dropped."""
        for attempt in range(self.abort_retries + 1):
            if attempt and self.abort_retry_delay_s > 0:
                await asyncio.sleep(self.abort_retry_delay_s)
            t0 = time.perf_counter()
            out = await self.server_manager.generate(
                request_id,
                prompt_ids=state.transcript.all_ids,
                sampling_params={**sampling_params, "max_tokens": max_tokens},
            )
            state.generate_s += time.perf_counter() - t0
            if out.stop_reason not in ABORTED_STOP_REASONS:
                token_ids = list(out.token_ids)
                state.add_turn(token_ids, out.log_probs, out.extra_fields)
                return token_ids
            state.aborted_generations += 1
            logger.info(
                "generation of %s[%s] turn %d aborted (%d partial tokens discarded), attempt %d of %d",
                state.task, state.index, len(state.turn_tokens) + 1, len(out.token_ids),
                attempt + 1, self.abort_retries + 1,
            )  # fmt: skip
        raise EpisodeFailed(
            FailureKind.GENERATION_ABORTED,
            f"generation of turn {len(state.turn_tokens) + 1} came back aborted {self.abort_retries + 1} times "
            f"(agentrl.agent_loop.abort_retries={self.abort_retries})",
        )

    async def _interact(
        self, client: ControllerClient, state: EpisodeState, assistant: dict[str, Any]
    ) -> InteractResponse:
        assert state.session_id is not None, "interact before start_sample"
        t0 = time.perf_counter()
        try:
            result = await client.interact(state.session_id, [assistant])
        except (ControllerError, ControllerUnavailable) as exc:
            raise EpisodeFailed(
                FailureKind.ENV_TRANSPORT, f"interact failed: {exc}", SampleStatus.TASK_ERROR
            ) from exc
        finally:
            state.env_s += time.perf_counter() - t0
        state.status, state.reward, state.env_metrics = (
            result.status,
            float(result.reward),
            dict(result.metrics),
        )
        if result.status in ENV_FAILURE_STATUSES:
            raise EpisodeFailed(
                FailureKind.ENV_STATUS,
                f"environment ended the session with {result.status.value!r}: {result.error}",
                result.status,
            )
        return result

    def _add_env_messages(
        self, state: EpisodeState, env_messages: list[dict[str, Any]], generated: list[int]
    ) -> bool:
        """Append the environment's turn (masked); False when it does not fit the response budget."""
        try:
            env_ids = env_token_ids(
                self.tokenizer, state.messages, env_messages, state.tools, generated, self.end_token_id
            )
        except TemplateNotPrefixStable as exc:
            raise EpisodeFailed(FailureKind.TEMPLATE_NOT_PREFIX_STABLE, str(exc)) from exc
        if len(state.transcript.response_ids) + len(env_ids) >= self.response_budget:
            return False
        state.transcript.add_env_tokens(env_ids)
        state.messages += env_messages
        return True

    async def _assistant_message(self, token_ids: list[int], tools: Any) -> dict[str, Any]:
        if self._parser is not None:
            # the parser sees the turn's body: its end-of-turn token is template glue, not content
            body = token_ids[:-1] if token_ids and token_ids[-1] == self.end_token_id else token_ids
            content, calls = await self._parser.extract_tool_calls(body, _tool_schemas(tools))
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

    async def _cancel(self, client: ControllerClient, session_id: int | None) -> None:
        if session_id is None:
            return
        try:
            await client.cancel(session_id)
        except (ControllerError, ControllerUnavailable) as exc:
            logger.info("cancel of session %s failed (it may already be gone): %s", session_id, exc)

    def _extra(
        self, state: EpisodeState, status: SampleStatus, reward: float, success: bool
    ) -> dict[str, Any]:
        return {
            "agentrl": {
                "reward": reward,
                "task": state.task,
                "index": state.index,
                "status": status.value,
                "success": success,
                "failed": False,
                "failure_kind": None,
                "turn_policies": state.turn_policies,
                "turn_versions": state.turn_versions,
                "turn_tokens": state.turn_tokens,
                "turn_states": state.turn_states,
                "turn_offsets": state.turn_offsets,
                "aborted_generations": state.aborted_generations,
                "env_metrics": state.env_metrics,
                "seconds": time.perf_counter() - state.started,
                # wall-clock start and end (the async trainer measures the rollout's idle time)
                "t_start": time.time() - (time.perf_counter() - state.started),
                "t_end": time.time(),
            },
            # verl groups these by data_source in its validation metrics
            "reward_extra_info": {"success": float(success), "failed": 0.0},
        }

    def _finished(self, state: EpisodeState) -> AgentLoopOutput:
        completed = state.status == SampleStatus.COMPLETED
        reward = state.reward if completed else self.settings.incomplete_punishment
        success = completed and state.reward >= self.settings.success_reward
        transcript = state.transcript
        return AgentLoopOutput(
            prompt_ids=transcript.prompt_ids,
            response_ids=transcript.response_ids,
            response_mask=transcript.response_mask,
            response_logprobs=transcript.response_logprobs,
            reward_score=reward,
            num_turns=len(state.messages),
            metrics=AgentLoopMetrics(generate_sequences=state.generate_s, tool_calls=state.env_s),
            extra_fields=self._extra(state, state.status, reward, success),
        )

    def _dropped(self, state: EpisodeState, failure: EpisodeFailed) -> AgentLoopOutput:
        """A sample that could not be run: one masked token, so it adds nothing to the loss."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # nothing of the episode is trained: no turns to attribute to a pool or a version
        state.turn_policies, state.turn_versions, state.turn_tokens, state.env_metrics = [], [], [], {}
        state.turn_states, state.turn_offsets = [], []
        extra = self._extra(state, failure.status, 0.0, False)
        extra["agentrl"].update(failed=True, failure_kind=failure.kind.value, error=str(failure))
        extra["reward_extra_info"]["failed"] = 1.0
        return AgentLoopOutput(
            prompt_ids=[pad],
            response_ids=[pad],
            response_mask=[0],
            response_logprobs=[0.0],
            reward_score=0.0,
            num_turns=0,
            metrics=AgentLoopMetrics(generate_sequences=state.generate_s, tool_calls=state.env_s),
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
