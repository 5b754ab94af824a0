"""The agentrl agent loop on real verl objects: every exit path, its tokens, mask, status and counters.

Expected token ids never come from our own ``render``/``env_token_ids``: they are the tiny
tokenizer's encoding of the chat template's literal text, written out by hand from the template
in ``agentrl_ext/models/chat_template.py`` (special tokens split the text, so encoding a
conversation piecewise at ``<|im_end|>`` boundaries gives the same ids as encoding it whole).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.workers.rollout.replica import TokenOutput

from agentrl_ext.config import AgentLoopConfig
from agentrl_ext.env.client import ControllerError, ControllerUnavailable, StartedSample
from agentrl_ext.env.protocol import InteractResponse, SampleStatus
from agentrl_ext.rollout import agent_loop as agent_loop_mod
from agentrl_ext.rollout.agent_loop import AgentRLAgentLoop
from agentrl_ext.rollout.transcript import parse_hermes_tool_calls
from agentrl_ext.testing.env_servers import EnvServers, wait_routable
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
SESSION = 7
VERSION = 4

# --- the chat template's literal text (agentrl_ext/models/chat_template.py), written out by hand ---
PROMPT_TEXT = (
    "<|im_start|>system\nYou are an OS agent.\n\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>\n\nFor each function call, return a json object with "
    "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nHow many files?<|im_end|>\n<|im_start|>assistant\n"
)


def hermes_call(script: str) -> str:
    """What a Qwen2.5-style model writes for one call (the body of its turn, before <|im_end|>)."""
    return '<tool_call>\n{"name": "bash_action", "arguments": {"script": "' + script + '"}}\n</tool_call>'


def tool_turn(content: str) -> str:
    """Template text from the end of the model's turn (after its <|im_end|>) to the next generation prompt."""
    return (
        f"\n<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


CALL_LS, CALL_WC, ANSWER = hermes_call("ls"), hermes_call("ls | wc -l"), "3"
ABORT = object()  # a generation the server aborts


def tool_reply(content: str) -> InteractResponse:
    return InteractResponse(messages=[{"role": "tool", "content": content, "tool_call_id": "c"}])


def finish(status: SampleStatus = SampleStatus.COMPLETED, reward: float = 1.0, error: str | None = None):
    return InteractResponse(finish=True, status=status, reward=reward, error=error)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_model_path()))


@pytest.fixture(scope="module")
def ids(tokenizer):
    """Token ids of literal template text: ``ids(text)``; ``ids.turn(body)`` adds the model's <|im_end|>."""

    class Ids:
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")

        def __call__(self, text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))

        def turn(self, body: str) -> list[int]:
            return self(body) + [self.end]

    assert Ids.end == tokenizer.eos_token_id
    return Ids()


class FakeController:
    """A scripted controller session: each ``interact`` answers the next entry (or raises it)."""

    def __init__(self, answers: list[Any], start_error: Exception | None = None) -> None:
        self.answers, self.start_error = list(answers), start_error
        self.start_answer: InteractResponse | None = None
        self.received: list[list[dict[str, Any]]] = []
        self.cancelled: list[int] = []

    async def start_sample(self, name: str, index: Any) -> StartedSample:
        if self.start_error is not None:
            raise self.start_error
        if self.start_answer is not None:
            return StartedSample(session_id=SESSION, response=self.start_answer)
        return StartedSample(session_id=SESSION, response=InteractResponse(messages=OPENING, tools=TOOLS))

    async def interact(self, session_id: int, messages: list[dict[str, Any]]) -> InteractResponse:
        assert session_id == SESSION
        self.received.append(messages)
        answer = self.answers[len(self.received) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def cancel(self, session_id: int) -> None:
        self.cancelled.append(session_id)


class ScriptedModel:
    """A server that 'generates' the scripted turn bodies (+ <|im_end|>), honouring ``max_tokens``."""

    def __init__(self, tokenizer: Any, turns: list[Any], abort_reason: str = "aborted") -> None:
        self.tokenizer, self.turns, self.abort_reason = tokenizer, list(turns), abort_reason
        self.prompts: list[list[int]] = []
        self.max_tokens: list[int] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        self.max_tokens.append(sampling_params["max_tokens"])
        turn = self.turns[len(self.prompts) - 1]
        extra = {"policy": "current", "global_steps": VERSION}
        if turn is ABORT:  # vLLM returns what it had so far (often nothing) with stop_reason aborted
            return TokenOutput(token_ids=[5, 6], stop_reason=self.abort_reason, extra_fields=extra)
        tokens = self.tokenizer.encode(turn, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        tokens = tokens[: sampling_params["max_tokens"]]
        return TokenOutput(
            token_ids=tokens, log_probs=[-0.5] * len(tokens), stop_reason="completed", extra_fields=extra
        )


def _loop(
    tokenizer,
    server,
    *,
    response_length: int = 512,
    prompt_length: int = 512,
    records: dict[str, Any] | None = None,
    **settings,
):
    agentrl: dict[str, Any] = {"agent_loop": {"controller_url": "http://127.0.0.1:1/api", **settings}}
    if records is not None:
        agentrl["records"] = records
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"prompt_length": prompt_length, "response_length": response_length}
            },
            "data": {},
            "agentrl": agentrl,
        }
    )
    loop = AgentRLAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
    )
    loop.abort_retry_delay_s = 0.0
    return loop


def _run(loop: AgentRLAgentLoop, controller: FakeController, monkeypatch) -> Any:
    monkeypatch.setattr(agent_loop_mod, "controller_client", lambda settings: controller)
    row = {"data_source": "os", "extra_info": {"sample_index": "3"}, "global_steps": 9}
    out = asyncio.run(loop.run({"temperature": 1.0}, **row))
    _check_turn_fields(out)
    return out


def _check_turn_fields(out: Any) -> None:
    """Invariants of every exit: aligned per-turn lists, turn_tokens adding up to the loss mask."""
    info = out.extra_fields["agentrl"]
    assert len(info["turn_tokens"]) == len(info["turn_policies"]) == len(info["turn_versions"])
    assert len(info["turn_tokens"]) == len(info["turn_states"]) == len(info["turn_offsets"])
    assert sum(info["turn_tokens"]) == sum(out.response_mask)
    # each turn's span (offset, tokens) is model tokens, and together they are all of them
    spans = [
        i for o, n in zip(info["turn_offsets"], info["turn_tokens"], strict=True) for i in range(o, o + n)
    ]
    assert spans == [i for i, m in enumerate(out.response_mask) if m]
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert set(out.response_mask) <= {0, 1}


def _expected(ids, *pieces: tuple[str, Any]) -> tuple[list[int], list[int]]:
    """Response ids and mask from ('model', token ids) and ('glue', text) pieces."""
    response: list[int] = []
    mask: list[int] = []
    for kind, piece in pieces:
        tokens = piece if kind == "model" else ids(piece)
        response += tokens
        mask += [1 if kind == "model" else 0] * len(tokens)
    return response, mask


def _three_turns(ids) -> tuple[list[int], list[int]]:
    """The expected response of the scripted episode ls -> "a b c" -> wc -> "3" -> answer."""
    return _expected(
        ids,
        ("model", ids.turn(CALL_LS)),
        ("glue", tool_turn("a b c")),
        ("model", ids.turn(CALL_WC)),
        ("glue", tool_turn("3")),
        ("model", ids.turn(ANSWER)),
    )


def _assert_dropped(out: Any, kind: str, status: str, reason: str) -> None:
    info = out.extra_fields["agentrl"]
    assert out.response_mask == [0] and out.reward_score == 0.0
    assert info["failed"] is True and info["failure_kind"] == kind and info["status"] == status
    assert reason in info["error"]
    assert info["turn_tokens"] == info["turn_policies"] == info["turn_versions"] == []
    assert info["turn_states"] == info["turn_offsets"] == []
    assert out.extra_fields["reward_extra_info"]["failed"] == 1.0
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 9


def test_finish_completed_tokens_mask_and_turn_fields_on_cpu(tokenizer, ids, monkeypatch):
    controller = FakeController([tool_reply("a b c"), tool_reply("3"), finish(reward=1.0)])
    model = ScriptedModel(tokenizer, [CALL_LS, CALL_WC, ANSWER])
    out = _run(_loop(tokenizer, model), controller, monkeypatch)

    g1, g2, g3 = ids.turn(CALL_LS), ids.turn(CALL_WC), ids.turn(ANSWER)
    response, mask = _three_turns(ids)
    prompt = ids(PROMPT_TEXT)
    assert out.prompt_ids == prompt
    assert out.response_ids == response
    assert out.response_mask == mask
    # every generation saw exactly the conversation so far
    assert model.prompts == [prompt, prompt + g1 + ids(tool_turn("a b c")), prompt + response[: -len(g3)]]
    assert [lp for lp, m in zip(out.response_logprobs, mask, strict=True) if m] == [-0.5] * sum(mask)
    assert out.reward_score == 1.0
    info = out.extra_fields["agentrl"]
    assert info["status"] == "completed" and info["success"] is True
    assert info["failed"] is False and info["failure_kind"] is None
    assert info["turn_tokens"] == [len(g1), len(g2), len(g3)]
    glue1, glue2 = len(ids(tool_turn("a b c"))), len(ids(tool_turn("3")))
    assert info["turn_offsets"] == [0, len(g1) + glue1, len(g1) + glue1 + len(g2) + glue2]
    assert info["turn_policies"] == ["current"] * 3 and info["turn_versions"] == [VERSION] * 3
    assert info["aborted_generations"] == 0
    # a turn's state names its context: three different contexts, and the same ones again when
    # the same episode is played again (in another loop object)
    assert len(set(info["turn_states"])) == 3
    again = [tool_reply("a b c"), tool_reply("3"), finish(reward=1.0)]
    replay = _run(
        _loop(tokenizer, ScriptedModel(tokenizer, [CALL_LS, CALL_WC, ANSWER])),
        FakeController(again),
        monkeypatch,
    )
    assert replay.extra_fields["agentrl"]["turn_states"] == info["turn_states"]
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == VERSION
    sent = controller.received[0][0]
    assert sent["tool_calls"][0]["function"] == {"name": "bash_action", "arguments": '{"script": "ls"}'}
    assert controller.received[2][0] == {"role": "assistant", "content": "3"}
    assert controller.cancelled == []


def test_sampled_episodes_are_written_as_records_with_tokens_on_cpu(tokenizer, ids, monkeypatch, tmp_path):
    """agentrl.records.rate=1 writes every episode's record: actions, answers, statuses, per-turn
    policy and version, the step, and the token ids and mask the loss sees."""
    folder = tmp_path / "records"
    controller = FakeController([tool_reply("a b c"), tool_reply("3"), finish(reward=1.0)])
    model = ScriptedModel(tokenizer, [CALL_LS, CALL_WC, ANSWER])
    out = _run(_loop(tokenizer, model, records={"rate": 1.0, "dir": str(folder)}), controller, monkeypatch)
    (path,) = folder.glob("records-*.jsonl")
    (line,) = path.read_text().splitlines()
    record = json.loads(line)
    response, mask = _three_turns(ids)
    assert record["tokens"] == {
        "prompt_ids": ids(PROMPT_TEXT),
        "response_ids": response,
        "response_mask": mask,
    }
    assert out.response_ids == response
    assert record["task"] == "os" and record["index"] == 3 and record["meta"] == {"global_steps": 9}
    assert record["opening"] == OPENING and record["tools"] == TOOLS
    turns = record["turns"]
    assert [t["observation"] for t in turns] == [
        [{"role": "tool", "content": "a b c", "tool_call_id": "c"}],
        [{"role": "tool", "content": "3", "tool_call_id": "c"}],
        [],
    ]
    assert [(t["status"], t["reward"], t["finish"]) for t in turns] == [
        ("running", 0.0, False),
        ("running", 0.0, False),
        ("completed", 1.0, True),
    ]
    assert [(t["policy"], t["version"]) for t in turns] == [("current", VERSION)] * 3
    assert [t["tokens"] for t in turns] == [len(ids.turn(t)) for t in (CALL_LS, CALL_WC, ANSWER)]
    assert turns[0]["action"]["tool_calls"][0]["function"] == {
        "name": "bash_action",
        "arguments": '{"script": "ls"}',
    }
    assert turns[2]["action"] == {"role": "assistant", "content": "3"}
    assert (record["status"], record["reward"], record["failed"]) == ("completed", 1.0, False)

    # off by default: nothing written
    again = FakeController([tool_reply("a b c"), tool_reply("3"), finish(reward=1.0)])
    _run(_loop(tokenizer, ScriptedModel(tokenizer, [CALL_LS, CALL_WC, ANSWER])), again, monkeypatch)
    assert len(path.read_text().splitlines()) == 1


def test_records_config_names_a_missing_folder_on_cpu():
    from agentrl_ext.config import AgentRLConfig

    with pytest.raises(ValueError, match=r"agentrl.records.dir is not set"):
        AgentRLConfig.from_config({"records": {"rate": 0.1}})
    with pytest.raises(ValueError, match=r"agentrl.records.rate=1.5 must be in \[0, 1\]"):
        AgentRLConfig.from_config({"records": {"rate": 1.5, "dir": "x"}})
    assert AgentRLConfig.from_config({}).records.rate == 0.0


def test_incomplete_final_status_gets_punishment_on_cpu(tokenizer, ids, monkeypatch):
    controller = FakeController(
        [tool_reply("a b c"), tool_reply("3"), finish(SampleStatus.AGENT_INVALID_ACTION, reward=0.7)]
    )
    out = _run(
        _loop(tokenizer, ScriptedModel(tokenizer, [CALL_LS, CALL_WC, ANSWER])), controller, monkeypatch
    )
    assert out.reward_score == -0.2
    info = out.extra_fields["agentrl"]
    assert info["status"] == "agent invalid action" and info["failed"] is False and info["success"] is False
    assert info["turn_tokens"] == [len(ids.turn(t)) for t in (CALL_LS, CALL_WC, ANSWER)]


def test_turn_limit_cancels_and_punishes_on_cpu(tokenizer, ids, monkeypatch):
    controller = FakeController([tool_reply("a b c"), tool_reply("3"), finish()])
    out = _run(
        _loop(tokenizer, ScriptedModel(tokenizer, [CALL_LS, CALL_WC, ANSWER]), max_turns=2),
        controller,
        monkeypatch,
    )
    response, mask = _expected(
        ids,
        ("model", ids.turn(CALL_LS)),
        ("glue", tool_turn("a b c")),
        ("model", ids.turn(CALL_WC)),
        ("glue", tool_turn("3")),
    )
    assert (out.response_ids, out.response_mask) == (response, mask)
    assert out.extra_fields["agentrl"]["status"] == "task limit reached"
    assert out.reward_score == -0.2
    assert controller.cancelled == [SESSION]


def test_turn_cut_off_by_token_cap_gets_its_end_token_as_glue_on_cpu(tokenizer, ids, monkeypatch):
    controller = FakeController([tool_reply("a b c"), finish()])
    model = ScriptedModel(tokenizer, [CALL_LS, CALL_WC])
    out = _run(_loop(tokenizer, model, max_turns=1, max_tokens_per_turn=5), controller, monkeypatch)
    # the model was cut off after 5 tokens: the loop closes its turn with a masked <|im_end|>
    response, mask = _expected(ids, ("model", ids(CALL_LS)[:5]), ("glue", "<|im_end|>" + tool_turn("a b c")))
    assert (out.response_ids, out.response_mask) == (response, mask)
    assert model.max_tokens == [5]
    assert out.extra_fields["agentrl"]["turn_tokens"] == [5]
    assert out.extra_fields["agentrl"]["status"] == "task limit reached"


def test_context_limit_when_env_turn_does_not_fit_on_cpu(tokenizer, ids, monkeypatch):
    g1, g2 = ids.turn(CALL_LS), ids.turn(CALL_WC)
    glue1, glue2 = ids(tool_turn("a b c")), ids(tool_turn("3"))
    budget = len(g1) + len(glue1) + len(g2) + len(glue2)  # the second env turn would fill it: no room left
    controller = FakeController([tool_reply("a b c"), tool_reply("3"), finish()])
    model = ScriptedModel(tokenizer, [CALL_LS, CALL_WC, ANSWER])
    out = _run(_loop(tokenizer, model, response_length=budget), controller, monkeypatch)
    response, mask = _expected(ids, ("model", g1), ("glue", tool_turn("a b c")), ("model", g2))
    assert (out.response_ids, out.response_mask) == (response, mask)
    assert model.max_tokens == [budget, budget - len(g1) - len(glue1)]
    info = out.extra_fields["agentrl"]
    assert info["status"] == "agent context limit" and out.reward_score == -0.2
    assert info["turn_tokens"] == [len(g1), len(g2)]
    assert controller.cancelled == [SESSION]


def test_context_limit_after_generation_cut_by_budget_on_cpu(tokenizer, ids, monkeypatch):
    g1, glue1 = ids.turn(CALL_LS), ids(tool_turn("a b c"))
    budget = len(g1) + len(glue1) + 3
    controller = FakeController([tool_reply("a b c"), tool_reply("3"), finish()])
    model = ScriptedModel(tokenizer, [CALL_LS, CALL_WC, ANSWER])
    out = _run(_loop(tokenizer, model, response_length=budget), controller, monkeypatch)
    response, mask = _expected(ids, ("model", g1), ("glue", tool_turn("a b c")), ("model", ids(CALL_WC)[:3]))
    assert (out.response_ids, out.response_mask) == (response, mask)
    assert len(out.response_ids) == budget and model.max_tokens == [budget, 3]
    assert out.extra_fields["agentrl"]["status"] == "agent context limit"
    assert out.extra_fields["agentrl"]["turn_tokens"] == [len(g1), 3]


@pytest.mark.parametrize("status", [SampleStatus.TASK_ERROR, SampleStatus.UNKNOWN])
def test_environment_failure_status_drops_sample_on_cpu(tokenizer, monkeypatch, status):
    controller = FakeController([tool_reply("a b c"), finish(status, reward=1.0, error="container died")])
    out = _run(_loop(tokenizer, ScriptedModel(tokenizer, [CALL_LS, CALL_WC])), controller, monkeypatch)
    _assert_dropped(out, "env_status", status.value, "container died")
    assert controller.cancelled == []  # the environment already ended the session


def test_interact_transport_failure_drops_sample_and_cancels_on_cpu(tokenizer, monkeypatch):
    controller = FakeController([tool_reply("a b c"), ControllerUnavailable("worker gone")])
    out = _run(_loop(tokenizer, ScriptedModel(tokenizer, [CALL_LS, CALL_WC])), controller, monkeypatch)
    _assert_dropped(out, "env_transport", "task error", "worker gone")
    assert controller.cancelled == [SESSION]


@pytest.mark.parametrize(
    ("error", "unreachable"),
    [
        (ControllerUnavailable("no answer from http://127.0.0.1:1/api"), True),
        (ControllerError("POST", "http://127.0.0.1:1/api/interact", 401, "bad client secret"), True),
        (ControllerError("POST", "http://127.0.0.1:1/api/interact", 502, "worker 127.0.0.1:9 gone"), False),
    ],
)
def test_a_dropped_episode_says_whether_the_controller_could_be_reached_on_cpu(
    tokenizer, monkeypatch, error, unreachable
):
    """The trainer's transport threshold counts only episodes that could not use the controller."""
    controller = FakeController([tool_reply("a b c"), error])
    out = _run(_loop(tokenizer, ScriptedModel(tokenizer, [CALL_LS, CALL_WC])), controller, monkeypatch)
    assert out.extra_fields["agentrl"]["failure_kind"] == "env_transport"
    assert out.extra_fields["agentrl"]["unreachable"] is unreachable


def test_start_sample_failure_drops_sample_on_cpu(tokenizer, monkeypatch):
    error = ControllerError("POST", "http://127.0.0.1:1/api/start_sample", 503, "no healthy worker for os")
    controller = FakeController([], start_error=error)
    model = ScriptedModel(tokenizer, [])
    out = _run(_loop(tokenizer, model), controller, monkeypatch)
    _assert_dropped(out, "env_transport", "task error", "no healthy worker")
    assert model.prompts == [] and controller.cancelled == []


def test_prompt_over_prompt_length_drops_sample_on_cpu(tokenizer, ids, monkeypatch):
    controller = FakeController([])
    model = ScriptedModel(tokenizer, [])
    out = _run(_loop(tokenizer, model, prompt_length=10), controller, monkeypatch)
    _assert_dropped(out, "prompt_too_long", "cancelled", f"opening prompt of {len(ids(PROMPT_TEXT))} tokens")
    assert model.prompts == [] and controller.cancelled == [SESSION]


def test_non_hermes_tool_parser_on_cpu(tokenizer, ids, monkeypatch):
    # Qwen3-Coder's XML call format, parsed by verl's own qwen3_coder parser
    xml_call = (
        "<tool_call>\n<function=bash_action>\n<parameter=script>\nls\n</parameter>\n</function>\n</tool_call>"
    )
    controller = FakeController([tool_reply("a b c"), finish()])
    model = ScriptedModel(tokenizer, [xml_call, ANSWER])
    out = _run(_loop(tokenizer, model, tool_format="qwen3_coder"), controller, monkeypatch)
    call = controller.received[0][0]["tool_calls"][0]["function"]
    assert call == {"name": "bash_action", "arguments": '{"script": "ls"}'}
    assert controller.received[1][0] == {"role": "assistant", "content": "3"}  # no <|im_end|> in the content
    g1, g2 = ids.turn(xml_call), ids.turn(ANSWER)
    response, mask = _expected(ids, ("model", g1), ("glue", tool_turn("a b c")), ("model", g2))
    assert (out.response_ids, out.response_mask) == (response, mask)
    assert out.extra_fields["agentrl"]["status"] == "completed" and out.reward_score == 1.0


@pytest.mark.parametrize("reason", ["aborted", "abort"])  # vLLM / SGLang
def test_aborted_generation_is_retried_and_counted_on_cpu(tokenizer, ids, monkeypatch, reason):
    controller = FakeController([tool_reply("a b c"), tool_reply("3"), finish()])
    model = ScriptedModel(tokenizer, [CALL_LS, ABORT, CALL_WC, ANSWER], abort_reason=reason)
    out = _run(_loop(tokenizer, model), controller, monkeypatch)
    g1, g2, g3 = ids.turn(CALL_LS), ids.turn(CALL_WC), ids.turn(ANSWER)
    response, mask = _three_turns(ids)
    # the aborted attempt's partial tokens are discarded and the same context is generated again
    assert (out.response_ids, out.response_mask) == (response, mask)
    assert model.prompts[1] == model.prompts[2]
    info = out.extra_fields["agentrl"]
    assert info["aborted_generations"] == 1 and info["failed"] is False and info["status"] == "completed"
    assert info["turn_tokens"] == [len(g1), len(g2), len(g3)] and len(info["turn_policies"]) == 3


def test_generation_aborted_after_every_retry_drops_sample_on_cpu(tokenizer, monkeypatch):
    controller = FakeController([tool_reply("a b c"), tool_reply("3"), finish()])
    model = ScriptedModel(tokenizer, [CALL_LS, ABORT, ABORT, ABORT, CALL_WC])
    loop = _loop(tokenizer, model)
    assert loop.abort_retries == 2
    out = _run(loop, controller, monkeypatch)
    _assert_dropped(out, "generation_aborted", "cancelled", "came back aborted 3 times")
    assert out.extra_fields["agentrl"]["aborted_generations"] == 3
    assert len(model.prompts) == 4 and len(controller.received) == 1
    assert controller.cancelled == [SESSION]


def test_chat_template_not_prefix_stable_drops_sample_on_cpu(tokenizer, monkeypatch):
    unstable = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    # a template that announces the conversation's length up front: appending a turn changes earlier text
    unstable.chat_template = (
        "{{- 'turns: ' + (messages | length | string) + '\\n' }}" + tokenizer.chat_template
    )
    controller = FakeController([tool_reply("a b c"), tool_reply("3"), finish()])
    out = _run(_loop(unstable, ScriptedModel(unstable, [CALL_LS, CALL_WC, ANSWER])), controller, monkeypatch)
    _assert_dropped(out, "template_not_prefix_stable", "cancelled", "not prefix-stable")
    assert controller.cancelled == [SESSION]


def test_hermes_parser_keeps_malformed_calls_on_cpu():
    content, calls = parse_hermes_tool_calls(
        'hi <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert content == "hi" and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    _, bad = parse_hermes_tool_calls("<tool_call>{not json</tool_call>")
    assert bad[0]["function"] == {"name": "", "arguments": "{not json"}
    assert parse_hermes_tool_calls("no call") == ("no call", [])


def test_pooled_controller_clients_are_closed_at_exit_on_cpu():
    import subprocess
    import sys
    import textwrap

    # a client used on a loop that is then closed, as in a verl agent-loop worker at shutdown:
    # the atexit hook closes it without the "Unclosed client session" warning
    code = textwrap.dedent(
        """
        import asyncio, gc
        from agentrl_ext.config import AgentLoopConfig
        from agentrl_ext.rollout import agent_loop

        async def use():
            client = agent_loop.controller_client(AgentLoopConfig(controller_url="http://127.0.0.1:9/api"))
            client._http()  # open the pooled session, as the first request does
            return client

        loop = asyncio.new_event_loop()
        client = loop.run_until_complete(use())
        loop.close()
        print("registered", len(agent_loop._clients))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "registered 1" in proc.stdout
    assert "Unclosed" not in proc.stderr, proc.stderr[-2000:]


def test_start_sample_that_ends_the_session_drops_sample_on_cpu(tokenizer, monkeypatch):
    # the controller answers start_sample with a finished task error (its worker hung while starting)
    controller = FakeController([])
    controller.start_answer = finish(SampleStatus.TASK_ERROR, reward=0.0, error="worker was lost")
    model = ScriptedModel(tokenizer, [])
    out = _run(_loop(tokenizer, model), controller, monkeypatch)
    _assert_dropped(out, "env_status", "task error", "worker was lost")
    assert model.prompts == [] and controller.cancelled == []  # nothing generated, nothing to cancel


# ----------------------------------------------------------------- a real controller, SIGKILLed mid-episode


def echo_call(text: str) -> str:
    return '<tool_call>\n{"name": "echo", "arguments": {"text": "' + text + '"}}\n</tool_call>'


def _settings(controller_url: str) -> AgentLoopConfig:
    return AgentLoopConfig(controller_url=controller_url)


class RestartingModel(ScriptedModel):
    """Scripted turns; before turn ``at`` it runs ``hook`` (here: SIGKILL and restart the controller)."""

    def __init__(self, tokenizer: Any, turns: list[Any], at: int, hook: Any) -> None:
        super().__init__(tokenizer, turns)
        self.at, self.hook = at, hook

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> Any:
        if len(self.prompts) + 1 == self.at:
            await self.hook()
        return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)


def test_controller_sigkilled_mid_episode_drops_that_episode_and_the_next_one_runs_on_cpu(
    tokenizer, tmp_path
):
    """Issue 32 §4: episodes open when the controller dies are counted as failed (env_transport),
    never an exception out of the agent loop; episodes after its restart run normally."""
    tests_env = Path(__file__).resolve().parents[1] / "env"
    with EnvServers(tmp_path, python_path=[tests_env]) as servers:
        first = servers.controller()
        servers.worker(first, "probe_tasks:ProbeTask", heartbeat_interval=0.2)
        wait_routable(first, "probe")

        async def sigkill_and_restart() -> None:
            first.kill()
            second = await asyncio.to_thread(servers.controller, port=first.port)
            await asyncio.to_thread(wait_routable, second, "probe")

        async def episode(model: Any) -> Any:
            row = {"data_source": "probe", "extra_info": {"sample_index": "echo"}, "global_steps": 9}
            try:
                return await _loop(tokenizer, model, controller_url=first.api).run(
                    {"temperature": 1.0}, **row
                )
            finally:  # close this loop's pooled client while its loop runs
                await agent_loop_mod.controller_client(_settings(first.api)).close()

        model = RestartingModel(tokenizer, [echo_call("a"), echo_call("b")], at=2, hook=sigkill_and_restart)
        out = asyncio.run(episode(model))
        _check_turn_fields(out)
        _assert_dropped(out, "env_transport", "task error", "unknown session_id")

        finish_call = '<tool_call>\n{"name": "finish", "arguments": {"answer": "x"}}\n</tool_call>'
        out = asyncio.run(episode(ScriptedModel(tokenizer, [echo_call("a"), finish_call])))
        info = out.extra_fields["agentrl"]
        assert info["failed"] is False and info["status"] == "completed" and out.reward_score == 1.0


def test_validation_rows_play_on_the_validation_controller_on_cpu(tokenizer, monkeypatch):
    """Rows built with ``agentrl-build-dataset --kind val`` (extra_info.split val) go to
    agentrl.agent_loop.val_controller_url, the held-out split's controller; training rows do not."""
    urls: list[str] = []

    def recording(settings):
        urls.append(settings.controller_url)
        return FakeController([finish(reward=1.0)])

    monkeypatch.setattr(agent_loop_mod, "controller_client", recording)
    for split in ("train", "val"):
        loop = _loop(
            tokenizer, ScriptedModel(tokenizer, [ANSWER]), val_controller_url="http://127.0.0.1:2/api"
        )
        row = {"data_source": "os", "extra_info": {"sample_index": "3", "split": split}, "global_steps": 9}
        out = asyncio.run(loop.run({"temperature": 1.0}, **row))
        assert out.extra_fields["agentrl"]["start_wait_s"] == 0.0
    assert urls == ["http://127.0.0.1:1/api", "http://127.0.0.1:2/api"]
