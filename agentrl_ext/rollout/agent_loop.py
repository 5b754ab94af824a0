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
``incomplete_punishment``. Environment failures that survive the client's retries
drop the sample from the loss (mask zero) and are counted; they never fail the step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from agentrl_ext.data.multitask import decode_sample_index
from agentrl_ext.env.client import ControllerClient, ControllerError, ControllerUnavailable, RetryPolicy
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.rollout.transcript import Transcript, env_token_ids, parse_hermes_tool_calls, render
from agentrl_ext.config import AgentLoopConfig, agentrl_config

logger = logging.getLogger(__name__)

AGENT_NAME = "agentrl"

#: statuses that end an episode as "the environment could not run it" (not the agent's fault)
ENV_FAILURE_STATUSES = {SampleStatus.TASK_ERROR, SampleStatus.UNKNOWN}

_clients: dict[tuple[str, int], ControllerClient] = {}


def controller_client(config: AgentLoopConfig) -> ControllerClient:
    """One pooled client per controller URL and event loop (agent loops are created per sample)."""
    if not config.controller_url:
        raise ValueError(
            "agentrl.agent_loop.controller_url is not set; the agentrl agent loop talks to environments "
            "through a controller, e.g. agentrl.agent_loop.controller_url=http://127.0.0.1:5020/api"
        )
    key = (config.controller_url, id(asyncio.get_running_loop()))
    if key not in _clients:
        _clients[key] = ControllerClient(
            config.controller_url,
            retry=RetryPolicy(max_attempts=config.env_attempts),
            timeout_s=config.env_timeout_s,
        )
    return _clients[key]


class EpisodeFailed(Exception):
    """The environment could not run the episode (after retries)."""


@register(AGENT_NAME)
class AgentRLAgentLoop(AgentLoopBase):
    """Multi-turn, multi-task agent loop over the AgentRL function-call protocol."""

    tokenizer: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        agentrl = agentrl_config(self.config)
        self.settings = agentrl.agent_loop
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
        client = controller_client(self.settings)
        started = time.perf_counter()
        try:
            output = await self._episode(client, task, index, dict(sampling_params), started)
        except EpisodeFailed as exc:
            logger.warning("episode %s[%s] dropped from the loss: %s", task, index, exc)
            output = self._dropped(task, index, str(exc), started)
        # Policy versions (verl's off-policy bookkeeping): the weights versions that generated the turns.
        versions = output.extra_fields["agentrl"].get("turn_versions", [])
        fallback = kwargs.get("global_steps")
        output.extra_fields["min_global_steps"] = min(versions) if versions else fallback
        output.extra_fields["max_global_steps"] = max(versions) if versions else fallback
        return output

    async def _start(self, client: ControllerClient, task: str, index: Any) -> Any:
        try:
            return await client.start_sample(task, index)
        except (ControllerError, ControllerUnavailable) as exc:
            raise EpisodeFailed(f"start_sample failed: {exc}") from exc

    async def _episode(
        self, client: ControllerClient, task: str, index: Any, sampling_params: dict[str, Any], started: float
    ) -> AgentLoopOutput:
        start = await self._start(client, task, index)
        session_id, messages, tools = start.session_id, list(start.response.messages), start.response.tools
        transcript = Transcript(
            prompt_ids=render(self.tokenizer, messages, tools, add_generation_prompt=True)
        )
        if len(transcript.prompt_ids) > self.prompt_budget:
            await self._cancel(client, session_id)
            raise EpisodeFailed(
                f"opening prompt of {len(transcript.prompt_ids)} tokens exceeds rollout.prompt_length={self.prompt_budget}"
            )
        request_id = uuid4().hex
        status, reward, policies, gen_time, env_time = SampleStatus.RUNNING, 0.0, [], 0.0, 0.0
        versions: list[int] = []
        env_metrics: dict[str, Any] = {}
        for _turn in range(self.settings.max_turns):
            room = self.response_budget - len(transcript.response_ids)
            if room < 1:
                status = SampleStatus.AGENT_CONTEXT_LIMIT
                break
            if self.settings.max_tokens_per_turn:
                room = min(room, self.settings.max_tokens_per_turn)
            t0 = time.perf_counter()
            out = await self.server_manager.generate(
                request_id,
                prompt_ids=transcript.all_ids,
                sampling_params={**sampling_params, "max_tokens": room},
            )
            gen_time += time.perf_counter() - t0
            policies.append(str(out.extra_fields.get("policy", "current")))
            if out.extra_fields.get("global_steps") is not None:
                versions.append(int(out.extra_fields["global_steps"]))
            transcript.add_model_tokens(list(out.token_ids), out.log_probs)
            assistant = await self._assistant_message(list(out.token_ids), tools)
            messages.append(assistant)
            t0 = time.perf_counter()
            try:
                result = await client.interact(session_id, [assistant])
            except (ControllerError, ControllerUnavailable) as exc:
                await self._cancel(client, session_id)
                raise EpisodeFailed(f"interact failed: {exc}") from exc
            env_time += time.perf_counter() - t0
            status, reward, env_metrics = result.status, float(result.reward), dict(result.metrics)
            if status in ENV_FAILURE_STATUSES:
                raise EpisodeFailed(f"environment ended the session with {status.value!r}: {result.error}")
            if result.finish or status.finished:
                break
            env_ids = env_token_ids(
                self.tokenizer, messages, result.messages, tools, list(out.token_ids), self.end_token_id
            )
            if len(transcript.response_ids) + len(env_ids) >= self.response_budget:
                status = SampleStatus.AGENT_CONTEXT_LIMIT
                break
            transcript.add_env_tokens(env_ids)
            messages += result.messages
        else:
            status = SampleStatus.TASK_LIMIT_REACHED
        if not status.finished or status in (
            SampleStatus.AGENT_CONTEXT_LIMIT,
            SampleStatus.TASK_LIMIT_REACHED,
        ):
            await self._cancel(client, session_id)
        completed = status == SampleStatus.COMPLETED
        final_reward = reward if completed else self.settings.incomplete_punishment
        success = completed and reward >= self.settings.success_reward
        extra = self._extra(task, index, status.value, final_reward, success, policies, env_metrics, started)
        extra["agentrl"]["turn_versions"] = versions
        return AgentLoopOutput(
            prompt_ids=transcript.prompt_ids,
            response_ids=transcript.response_ids,
            response_mask=transcript.response_mask,
            response_logprobs=transcript.response_logprobs,
            reward_score=final_reward,
            num_turns=len(messages),
            metrics=AgentLoopMetrics(generate_sequences=gen_time, tool_calls=env_time),
            extra_fields=extra,
        )

    async def _assistant_message(self, token_ids: list[int], tools: Any) -> dict[str, Any]:
        if self._parser is not None:
            content, calls = await self._parser.extract_tool_calls(token_ids)
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

    async def _cancel(self, client: ControllerClient, session_id: int) -> None:
        try:
            await client.cancel(session_id)
        except (ControllerError, ControllerUnavailable) as exc:
            logger.info("cancel of session %s failed (it may already be gone): %s", session_id, exc)

    def _extra(
        self,
        task: str,
        index: Any,
        status: str,
        reward: float,
        success: bool,
        policies: list[str],
        env_metrics: dict[str, Any],
        started: float,
        failed: bool = False,
    ) -> dict[str, Any]:
        return {
            "agentrl": {
                "reward": reward,
                "task": task,
                "index": index,
                "status": status,
                "success": success,
                "failed": failed,
                "turn_policies": policies,
                "env_metrics": env_metrics,
                "seconds": time.perf_counter() - started,
            },
            # verl groups these by data_source in its validation metrics
            "reward_extra_info": {"success": float(success), "failed": float(failed)},
        }

    def _dropped(self, task: str, index: Any, reason: str, started: float) -> AgentLoopOutput:
        """A sample the environment could not run: one masked token, so it adds nothing to the loss."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        extra = self._extra(
            task, index, SampleStatus.TASK_ERROR.value, 0.0, False, [], {}, started, failed=True
        )
        extra["agentrl"]["error"] = reason
        return AgentLoopOutput(
            prompt_ids=[pad],
            response_ids=[pad],
            response_mask=[0],
            response_logprobs=[0.0],
            reward_score=0.0,
            num_turns=0,
            metrics=AgentLoopMetrics(),
            extra_fields=extra,
        )
