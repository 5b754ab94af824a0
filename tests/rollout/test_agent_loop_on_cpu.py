"""The agentrl agent loop on real verl objects: token ids, loss mask, statuses, rewards."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.workers.rollout.replica import TokenOutput

from agentrl_ext.env.protocol import InteractResponse, SampleStatus
from agentrl_ext.rollout import agent_loop as agent_loop_mod
from agentrl_ext.rollout.agent_loop import AgentRLAgentLoop
from agentrl_ext.rollout.transcript import parse_hermes_tool_calls, render
from agentrl_ext.testing.tiny_model import tiny_model_path

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash_action",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"script": {"type": "string"}},
                "required": ["script"],
            },
        },
    }
]
OPENING = [
    {"role": "system", "content": "You are an OS agent."},
    {"role": "user", "content": "How many files?"},
]


def _call(script: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash_action", "arguments": {"script": script}}}
    ]}  # fmt: skip


ASSISTANT = [_call("ls"), _call("ls | wc -l"), {"role": "assistant", "content": "3"}]
ENV = [
    [{"role": "tool", "content": "a b c", "tool_call_id": "c"}],
    [{"role": "tool", "content": "3", "tool_call_id": "c"}],
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_model_path()))


class FakeController:
    """Scripted controller session: two tool turns, then a final answer that completes."""

    def __init__(self, final_status: SampleStatus = SampleStatus.COMPLETED, reward: float = 1.0) -> None:
        self.received: list[list[dict[str, Any]]] = []
        self.cancelled: list[int] = []
        self.final_status, self.reward = final_status, reward

    async def start_sample(self, name: str, index: Any) -> Any:
        from agentrl_ext.env.client import StartedSample

        return StartedSample(session_id=7, response=InteractResponse(messages=OPENING, tools=TOOLS))

    async def interact(self, session_id: int, messages: list[dict[str, Any]]) -> InteractResponse:
        self.received.append(messages)
        turn = len(self.received) - 1
        if turn < len(ENV):
            return InteractResponse(messages=ENV[turn])
        return InteractResponse(finish=True, status=self.final_status, reward=self.reward)

    async def cancel(self, session_id: int) -> None:
        self.cancelled.append(session_id)


class ScriptedServer:
    """Generates exactly what the chat template renders for the scripted assistant turns."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.turn, self.history = tokenizer, 0, list(OPENING)

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> TokenOutput:
        before = render(self.tokenizer, self.history, TOOLS, add_generation_prompt=True)
        assistant = ASSISTANT[self.turn]
        after = render(self.tokenizer, self.history + [assistant], TOOLS)
        assert prompt_ids == before, "the loop's context differs from the template rendering"
        end = self.tokenizer.eos_token_id
        tokens = after[len(before) : after.index(end, len(before)) + 1]
        self.history += [assistant] + (ENV[self.turn] if self.turn < len(ENV) else [])
        self.turn += 1
        return TokenOutput(
            token_ids=tokens, log_probs=[-0.5] * len(tokens), extra_fields={"policy": "current"}
        )


def _loop(tokenizer, server, **agentrl_loop) -> AgentRLAgentLoop:
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 512, "response_length": 512}},
            "data": {},
            "agentrl": {"agent_loop": {"controller_url": "http://127.0.0.1:1/api", **agentrl_loop}},
        }
    )
    return AgentRLAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
    )


def _run(loop: AgentRLAgentLoop, controller: FakeController, monkeypatch) -> Any:
    monkeypatch.setattr(agent_loop_mod, "controller_client", lambda settings: controller)
    row = {"data_source": "os", "extra_info": {"sample_index": "3"}}
    return asyncio.run(loop.run({"temperature": 1.0}, **row))


def test_three_turn_tokens_and_mask_equal_hand_rendering_on_cpu(tokenizer, monkeypatch):
    controller = FakeController()
    out = _run(_loop(tokenizer, ScriptedServer(tokenizer)), controller, monkeypatch)

    conversation = OPENING + [ASSISTANT[0]] + ENV[0] + [ASSISTANT[1]] + ENV[1] + [ASSISTANT[2]]
    full = render(tokenizer, conversation, TOOLS)
    prompt = render(tokenizer, OPENING, TOOLS, add_generation_prompt=True)
    end = tokenizer.eos_token_id
    last_end = len(full) - 1 - full[::-1].index(end)
    assert out.prompt_ids == prompt
    assert out.response_ids == full[len(prompt) : last_end + 1]

    # hand-computed mask: 1 exactly on each assistant turn's body up to and including <|im_end|>
    expected_mask = [0] * len(out.response_ids)
    history = list(OPENING)
    for k, assistant in enumerate(ASSISTANT):
        start = len(render(tokenizer, history, TOOLS, add_generation_prompt=True)) - len(prompt)
        after = render(tokenizer, history + [assistant], TOOLS)
        stop = after.index(end, start + len(prompt)) + 1 - len(prompt)
        expected_mask[start:stop] = [1] * (stop - start)
        history += [assistant] + (ENV[k] if k < len(ENV) else [])
    assert out.response_mask == expected_mask
    assert [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m] == [-0.5] * sum(
        expected_mask
    )
    assert out.reward_score == 1.0
    assert out.extra_fields["agentrl"]["status"] == "completed"
    assert out.extra_fields["agentrl"]["turn_policies"] == ["current"] * 3
    assert controller.received[0][0]["tool_calls"][0]["function"]["name"] == "bash_action"
    assert controller.cancelled == []


def test_incomplete_trajectory_gets_punishment_on_cpu(tokenizer, monkeypatch):
    controller = FakeController(final_status=SampleStatus.AGENT_INVALID_ACTION, reward=0.7)
    out = _run(_loop(tokenizer, ScriptedServer(tokenizer)), controller, monkeypatch)
    assert out.reward_score == -0.2
    assert out.extra_fields["agentrl"]["status"] == "agent invalid action"


def test_turn_limit_cancels_and_punishes_on_cpu(tokenizer, monkeypatch):
    controller = FakeController()
    out = _run(_loop(tokenizer, ScriptedServer(tokenizer), max_turns=2), controller, monkeypatch)
    assert out.extra_fields["agentrl"]["status"] == "task limit reached"
    assert out.reward_score == -0.2
    assert controller.cancelled == [7]


def test_environment_failure_drops_sample_from_loss_on_cpu(tokenizer, monkeypatch):
    from agentrl_ext.env.client import ControllerUnavailable

    class Broken(FakeController):
        async def interact(self, session_id, messages):
            raise ControllerUnavailable("worker gone")

    out = _run(_loop(tokenizer, ScriptedServer(tokenizer)), Broken(), monkeypatch)
    assert sum(out.response_mask) == 0
    assert out.extra_fields["agentrl"]["failed"] is True
    assert "worker gone" in out.extra_fields["agentrl"]["error"]


def test_hermes_parser_keeps_malformed_calls_on_cpu():
    content, calls = parse_hermes_tool_calls(
        'hi <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert content == "hi" and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    _, bad = parse_hermes_tool_calls("<tool_call>{not json</tool_call>")
    assert bad[0]["function"] == {"name": "", "arguments": "{not json"}
    assert parse_hermes_tool_calls("no call") == ("no call", [])
