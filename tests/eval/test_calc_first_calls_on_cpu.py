"""``agentrl_ext.eval.calc_first_calls``: each first calculator call in its class, on episodes written by hand."""

from __future__ import annotations

import json

import pytest

from agentrl_ext.eval.calc_first_calls import classify, main

OPENING = {
    "role": "user",
    "content": "Compute (8 * 18) + 12. Use the calculator one step at a time, then answer. You have 5 steps.",
}


def episode(name: str, arguments: str) -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return [OPENING, {"role": "assistant", "content": "", "tool_calls": [call]}]


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("calculator", '{"expression": "8 * 18"}', "bracket"),
        ("calculator", '{"expression": " 18 + 12 "}', "other grouping"),
        ("calculator", '{"expression": "8 + 12"}', "mixed"),  # a op2 c
        ("calculator", '{"expression": "18 * 18"}', "mixed"),
        ("calculator", '{"expression": "9 + 19"}', "off by one"),  # seen in run s18a
        ("calculator", '{"expression": "8 * 20"}', "other"),
        ("calculator", '{"expression": "8 * 18 + 12"}', "no step"),
        ("calculator", '{"expression": 144}', "no step"),
        ("calculator", '{"expression": "8 * 18"', "no step"),  # not JSON
        ("answer", '{"value": 156}', "no step"),
    ],
)
def test_each_first_call_in_its_class_on_cpu(name, arguments, expected):
    assert classify(episode(name, arguments)) == expected


def test_an_episode_without_a_call_and_one_of_another_task_on_cpu():
    assert classify([OPENING, {"role": "assistant", "content": "156"}]) == "no step"
    with pytest.raises(ValueError, match="not a calc episode"):
        classify([{"role": "user", "content": "Guess my number from 1 to 3."}])


def test_the_command_prints_shares_per_file_and_writes_counts_on_cpu(tmp_path, capsys):
    rows = [
        {"task": "calc", "messages": episode("calculator", '{"expression": "8 * 18"}')},
        {"task": "calc", "messages": episode("calculator", '{"expression": "9 + 19"}')},
        {"task": "guess", "messages": [{"role": "user", "content": "Guess my number from 1 to 3."}]},
    ]
    path = tmp_path / "before_rl.episodes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(path), "--out", str(tmp_path / "calls.json")]) == 0
    out = capsys.readouterr().out
    assert "| bracket | 50% |" in out and "| off by one | 50% |" in out and "| calc episodes | 2 |" in out
    assert json.loads((tmp_path / "calls.json").read_text()) == {str(path): {"bracket": 1, "off by one": 1}}
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.jsonl")])
