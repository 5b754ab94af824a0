"""The tiny model's compact chat template: one short line per tool, turns as in the Qwen2.5 form.

Expected texts are written out by hand here, not produced by the template under test.
"""

from __future__ import annotations

import pytest

from agentrl_ext.config import AssetsConfig
from agentrl_ext.models.chat_template import (
    CHAT_TEMPLATES,
    COMPACT_TOOLS_CHAT_TEMPLATE,
    QWEN25_STYLE_CHAT_TEMPLATE,
)
from agentrl_ext.models.tiny import TinyModelSpec, build_record, build_tokenizer, chat_template_named

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move one cell.",
            "parameters": {
                "type": "object",
                "properties": {
                    "direction": {"type": "string", "enum": ["up", "down"]},
                    "steps": {"type": "integer"},
                },
                "required": ["direction"],
            },
        },
    },
    {"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}},
]

CONVERSATION = [
    {"role": "user", "content": "Find the door."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "move", "arguments": '{"direction": "up"}'}}
        ],
    },
    {"role": "tool", "content": "You at 0,1."},
]

EXPECTED = (
    "<|im_start|>system\nYou are a helpful assistant.\nTools:\n"
    "move(direction: up|down, steps: integer): Move one cell.\n"
    "look()\n"
    'Call one as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nFind the door.<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\nYou at 0,1.\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_compact_template_renders_one_line_per_tool_on_cpu():
    tokenizer = build_tokenizer(chat_template="compact")
    text = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert text == EXPECTED


def test_compact_template_differs_from_qwen25_only_in_the_tool_list_on_cpu():
    compact = build_tokenizer(chat_template="compact")
    qwen = build_tokenizer(chat_template="qwen25")
    a = compact.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    b = qwen.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    # everything after the system turn is identical
    assert a.split("<|im_end|>\n", 1)[1] == b.split("<|im_end|>\n", 1)[1]
    assert len(compact(a)["input_ids"]) < 0.75 * len(qwen(b)["input_ids"])


def test_compact_template_is_prefix_stable_on_cpu():
    tokenizer = build_tokenizer(chat_template="compact")
    before = tokenizer.apply_chat_template(CONVERSATION[:2], tools=TOOLS, tokenize=False)
    after = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert after.startswith(before)


def test_template_names_are_checked_and_recorded_on_cpu():
    assert set(CHAT_TEMPLATES) == {"qwen25", "compact"}
    assert chat_template_named("qwen25") == QWEN25_STYLE_CHAT_TEMPLATE
    assert chat_template_named("compact") == COMPACT_TOOLS_CHAT_TEMPLATE
    with pytest.raises(ValueError, match="compact, qwen25"):
        chat_template_named("chatml")
    with pytest.raises(ValueError, match="tiny_chat_template='chatml'"):
        AssetsConfig(tiny_chat_template="chatml")
    # a model built with another template is another build; the default keeps the old record
    spec = TinyModelSpec()
    assert "chat_template" not in build_record(spec, 0)
    assert build_record(spec, 0, chat_template="compact")["chat_template"] == "compact"
