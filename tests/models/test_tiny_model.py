"""Tests for the tiny offline model builder and its Qwen2.5-style chat template."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

import agentrl_ext.testing.tiny_model as tiny_model_cache
from agentrl_ext.models.tiny import BUILDER_VERSION, IM_END, TinyModelSpec, build_tiny_model
from agentrl_ext.testing.tiny_model import cache_key, tiny_model_path

REPO_ROOT = Path(__file__).resolve().parents[2]

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}


def _tool_call(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


# Three assistant turns: two tool-calling turns (the first with two parallel calls) and an answer.
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris and Tokyo?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            _tool_call("get_weather", {"city": "Paris"}),
            _tool_call("get_weather", '{"city": "Tokyo"}'),
        ],
    },
    {"role": "tool", "content": '{"temp_c": 21}'},
    {"role": "tool", "content": '{"temp_c": 18}'},
    {
        "role": "assistant",
        "content": "Let me check Berlin too.",
        "tool_calls": [_tool_call("get_weather", {"city": "Berlin"})],
    },
    {"role": "tool", "content": '{"temp_c": 15}'},
    {"role": "assistant", "content": "Paris 21, Tokyo 18, Berlin 15."},
]
# Message counts that end on a whole turn (never inside the grouped run of tool messages).
TURN_BOUNDARIES = [2, 3, 5, 6, 7, 8]


def _hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def _ids(encoded: Any) -> list[int]:
    """Token ids from ``apply_chat_template(tokenize=True)``, which returns a BatchEncoding in transformers 5."""
    ids = encoded["input_ids"] if not isinstance(encoded, list) else encoded
    return list(ids)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny_model_path()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(messages, tools=[WEATHER_TOOL], tokenize=False, **kwargs)


def _render_ids(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], **kwargs: Any
) -> list[int]:
    return _ids(tokenizer.apply_chat_template(messages, tools=[WEATHER_TOOL], tokenize=True, **kwargs))


def test_same_seed_builds_identical_files_and_other_seed_differs_on_cpu(tmp_path: Path) -> None:
    first = _hashes(build_tiny_model(tmp_path / "a", seed=0))
    second = _hashes(build_tiny_model(tmp_path / "b", seed=0))
    other_seed = _hashes(build_tiny_model(tmp_path / "c", seed=1))

    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(first)
    assert first == second
    assert other_seed["model.safetensors"] != first["model.safetensors"]
    assert other_seed["tokenizer.json"] == first["tokenizer.json"]  # the seed only drives the weights


def test_cli_in_a_fresh_process_matches_the_api_build_and_reloads_offline_on_cpu(tmp_path: Path) -> None:
    # A fresh interpreter has a different hash seed, so this also checks that BPE training does not
    # depend on per-process state. The reload runs with the hub forced offline and unreachable.
    out = tmp_path / "cli"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    reload = (
        "import sys; from transformers import AutoModelForCausalLM, AutoTokenizer; "
        "from agentrl_ext.models.tiny import main; main([sys.argv[1], '--seed', '3']); "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
        "print('RELOADED', type(m).__name__, t.eos_token, m.config.eos_token_id == t.eos_token_id)"
    )
    result = subprocess.run(
        [sys.executable, "-c", reload, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{out}\nRELOADED Qwen2ForCausalLM {IM_END} True" in result.stdout

    assert _hashes(out) == _hashes(build_tiny_model(tmp_path / "api", seed=3))


def test_invalid_sizes_are_rejected_with_the_bad_value_on_cpu(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"hidden_size \(60\) must be divisible by num_heads \(8\)"):
        build_tiny_model(tmp_path, hidden_size=60, num_heads=8)
    with pytest.raises(ValueError, match=r"num_heads \(4\) must be divisible by num_kv_heads \(3\)"):
        TinyModelSpec(num_kv_heads=3)


def test_tokenizer_and_model_ids_agree_on_cpu(model_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = model.config

    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert config.eos_token_id == tokenizer.eos_token_id
    assert config.pad_token_id == config.bos_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert len(tokenizer) <= config.vocab_size < len(tokenizer) + 64
    assert config.tie_word_embeddings and model.dtype == torch.float32
    assert config._attn_implementation != "flash_attention_2"
    # Tool markup is one token each and survives decoding, as verl's hermes parser needs.
    for token in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=True) == token


def test_chat_template_renders_tools_tool_calls_and_grouped_tool_responses_on_cpu(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    text = _render(tokenizer, CONVERSATION)

    assert text.startswith(
        "<|im_start|>system\nYou are a weather bot.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(WEATHER_TOOL)
        + "\n</tools>\n\n"
    )
    assert (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        in text
    )
    # Dict arguments are JSON-encoded; string arguments (OpenAI wire format) are written verbatim.
    assert (
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call><|im_end|>\n'
    ) in text
    # Consecutive tool messages share one user turn.
    assert (
        '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response>\n'
        '<tool_response>\n{"temp_c": 18}\n</tool_response><|im_end|>\n'
    ) in text
    assert "<|im_start|>assistant\nLet me check Berlin too.\n<tool_call>\n" in text
    assert text.endswith("<|im_start|>assistant\nParis 21, Tokyo 18, Berlin 15.<|im_end|>\n")
    assert text.count("<|im_start|>system") == 1

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("cut", TURN_BOUNDARIES[:-1])
def test_rendering_is_a_prefix_of_the_extended_conversation_on_cpu(
    tokenizer: PreTrainedTokenizerBase, cut: int
) -> None:
    for end in [b for b in TURN_BOUNDARIES if b > cut]:
        shorter, longer = CONVERSATION[:cut], CONVERSATION[:end]
        assert _render(tokenizer, longer).startswith(_render(tokenizer, shorter))
        short_ids = _render_ids(tokenizer, shorter)
        assert _render_ids(tokenizer, longer)[: len(short_ids)] == short_ids
    if cut < len(CONVERSATION) and CONVERSATION[cut]["role"] == "assistant":
        # The generation prompt is exactly where the next assistant message starts.
        prompt_ids = _render_ids(tokenizer, CONVERSATION[:cut], add_generation_prompt=True)
        assert _render_ids(tokenizer, CONVERSATION[: cut + 1])[: len(prompt_ids)] == prompt_ids


def test_splitting_a_run_of_tool_messages_is_not_a_prefix_on_cpu(tokenizer: PreTrainedTokenizerBase) -> None:
    # The documented exception: tool messages in a row form one turn, so the first one alone closes it.
    assert not _render(tokenizer, CONVERSATION[:5]).startswith(_render(tokenizer, CONVERSATION[:4]))


def test_hermes_tool_parser_reads_a_rendered_tool_call_from_token_ids_on_cpu(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    from verl.experimental.agent_loop.tool_parser import ToolParser

    prompt_ids = _render_ids(tokenizer, CONVERSATION[:2], add_generation_prompt=True)
    response_ids = _render_ids(tokenizer, CONVERSATION[:3])[len(prompt_ids) :]
    assert response_ids[-2:] == tokenizer.encode("<|im_end|>\n", add_special_tokens=False)

    parser = ToolParser.get_tool_parser("hermes", tokenizer)
    # The model stops at <|im_end|>, so the response the parser sees ends there.
    content, calls = asyncio.run(parser.extract_tool_calls(response_ids[:-1]))

    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Tokyo"}),
    ]
    assert "<tool_call>" not in content


def test_verl_continuous_token_rollout_matches_the_full_rendering_on_cpu(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    # verl's agent loop builds a rollout incrementally: prompt, model tokens up to <|im_end|>, then
    # tool turns rendered on their own. The result must equal rendering the whole conversation.
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tokenizer, hf_model_type="qwen2")
    assert type(builder).__name__ == "QwenContinuousTokenBuilder"
    tools = [WEATHER_TOOL]
    ids = builder.build_initial_tokens(CONVERSATION[:2], tools=tools)
    for start, end in [(2, 5), (5, 7)]:  # assistant turn, then its tool responses
        prompt_ids = _render_ids(tokenizer, CONVERSATION[:start], add_generation_prompt=True)
        turn_ids = _render_ids(tokenizer, CONVERSATION[: start + 1])
        generated = turn_ids[len(prompt_ids) : -1]  # what the model emits: up to and including <|im_end|>
        ids = builder.merge_assistant_tokens(ids, generated).token_ids
        ids = builder.merge_context_tokens(
            CONVERSATION[: start + 1], CONVERSATION[:end], ids, tools=tools
        ).token_ids

    assert ids == _render_ids(tokenizer, CONVERSATION[:7], add_generation_prompt=True)


def test_model_runs_forward_and_generates_on_cpu(model_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    input_ids = torch.tensor([_render_ids(tokenizer, CONVERSATION[:2], add_generation_prompt=True)])

    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
        output = model.generate(input_ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)

    assert logits.shape == (1, input_ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    assert output.shape == (1, input_ids.shape[1] + 4)
    assert torch.equal(output[:, : input_ids.shape[1]], input_ids)


def test_tiny_model_path_builds_once_and_survives_a_race_on_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Force both threads to finish building before either publishes, so both reach the rename.
    barrier = threading.Barrier(2, timeout=60)
    real_build = tiny_model_cache.build_tiny_model
    builds: list[Path] = []

    def build_then_wait(out_dir: Path, *, seed: int) -> Path:
        builds.append(real_build(out_dir, seed=seed))
        barrier.wait()
        return out_dir

    monkeypatch.setattr(tiny_model_cache, "build_tiny_model", build_then_wait)
    cache = tmp_path / "cache"
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny_model_path(cache, seed=5))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    expected = cache / cache_key(5)
    assert expected.name.startswith(f"seed5-v{BUILDER_VERSION}-")
    assert results == [expected, expected] and len(builds) == 2
    assert [p.name for p in cache.iterdir()] == [expected.name]  # the loser's copy is gone
    assert _hashes(expected) == _hashes(build_tiny_model(tmp_path / "reference", seed=5))

    monkeypatch.setattr(tiny_model_cache, "build_tiny_model", None)  # a cached hit must not build
    assert tiny_model_path(cache, seed=5) == expected


def test_extra_corpus_shortens_the_tasks_text_and_is_recorded_on_cpu(tmp_path: Path) -> None:
    """Episodes of a task as extra tokenizer corpus: another episode of that task then takes fewer
    tokens (its words become single tokens), and the build record tells the two builds apart."""
    from agentrl_ext.models.tiny import BUILD_RECORD, build_tokenizer

    def episode(city: str, degrees: int) -> list[dict[str, Any]]:
        return [
            {"role": "user", "content": f"What is the weather in {city}? Answer in celsius."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
                ],
            },
            {"role": "tool", "content": f"{degrees} degrees celsius, partly cloudy"},
            {"role": "assistant", "content": f"It is {degrees} degrees celsius in {city}."},
        ]

    plain = build_tokenizer()
    corpus = [
        plain.apply_chat_template(episode(c, d), tools=[WEATHER_TOOL], tokenize=False)
        for c, d in [("Oslo", 3), ("Lima", 19), ("Cairo", 31), ("Quito", 14)] * 4
    ]
    trained = build_tokenizer(extra_corpus=corpus)
    held_out = plain.apply_chat_template(episode("Oslo", 27), tools=[WEATHER_TOOL], tokenize=False)
    assert trained.decode(trained(held_out)["input_ids"]) == held_out
    assert len(trained(held_out)["input_ids"]) < 0.85 * len(plain(held_out)["input_ids"])

    a = json.loads((build_tiny_model(tmp_path / "a") / BUILD_RECORD).read_text())
    b = json.loads((build_tiny_model(tmp_path / "b", extra_corpus=corpus) / BUILD_RECORD).read_text())
    assert a["extra_corpus"] is None and b["extra_corpus"] and a["spec"] == b["spec"]


def test_number_tokens_make_every_integer_below_the_bound_one_token_on_cpu(tmp_path: Path) -> None:
    """``number_tokens=1000``: each of 0..999 is one token (as GPT-4's and Llama 3's 1-3 digit
    groups), longer numbers split from the left, text round-trips; the record tells the builds apart."""
    from agentrl_ext.models.tiny import BUILD_RECORD, build_tokenizer

    grouped, plain = build_tokenizer(number_tokens=1000), build_tokenizer()

    def pieces(tokenizer: PreTrainedTokenizerBase, text: str) -> list[str]:
        return [tokenizer.decode([i]) for i in tokenizer(text)["input_ids"]]

    for n in (0, 7, 10, 42, 99, 100, 512, 999):
        assert pieces(grouped, str(n)) == [str(n)]
    assert pieces(plain, "512") == ["5", "1", "2"]
    assert pieces(grouped, "1234") == ["123", "4"]
    assert pieces(grouped, "-137")[-1] == "137"
    text = 'calculator {"expression": "12 * 19"} -> 228, answer 228'
    assert grouped.decode(grouped(text)["input_ids"]) == text
    assert {"12", "19", "228"} <= set(pieces(grouped, text))
    assert len(grouped) >= len(plain) + 990  # the numbers the BPE had not merged are new ids
    with pytest.raises(ValueError, match="number_tokens must be positive"):
        TinyModelSpec(number_tokens=-1)

    a = json.loads((build_tiny_model(tmp_path / "a") / BUILD_RECORD).read_text())
    b = json.loads((build_tiny_model(tmp_path / "b", number_tokens=1000) / BUILD_RECORD).read_text())
    assert "number_tokens" not in a["spec"] and b["spec"]["number_tokens"] == 1000
