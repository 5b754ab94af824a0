"""``agentrl_ext.eval.guess_moves``: first guesses and copies after one number left, on episodes written by hand."""

from __future__ import annotations

import json

import pytest

from agentrl_ext.eval.guess_moves import after_one_left, first_guess, main

OPENING = {
    "role": "user",
    "content": "Guess my number from 527 to 529. I answer higher, lower or correct. You have 2 guesses.",
}


def call(number: object, name: str = "guess") -> dict:
    arguments = json.dumps({"number": number})
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def answer(text: str) -> dict:
    return {"role": "tool", "tool_call_id": "c", "content": text}


@pytest.mark.parametrize(
    ("number", "expected"),
    [(528, "middle"), ("528", "middle"), (527, "bottom"), (529, "top"), (526, "outside"), ("x", "no guess")],
)
def test_each_first_guess_in_its_class_on_cpu(number, expected):
    assert first_guess([OPENING, call(number)]) == expected


def test_a_wider_range_and_no_call_on_cpu():
    wide = {"role": "user", "content": "Guess my number from 1 to 16. You have 5 guesses."}
    assert first_guess([wide, call(8)]) == "middle"
    assert first_guess([wide, call(3)]) == "other inside"
    assert first_guess([wide, {"role": "assistant", "content": "8"}]) == "no guess"
    assert first_guess([OPENING, call(528, name="move")]) == "no guess"
    with pytest.raises(ValueError, match="not a guess episode"):
        first_guess([{"role": "user", "content": "Compute (8 * 18) + 12."}])


@pytest.mark.parametrize(
    ("second", "expected"),
    [(527, ["copied"]), (526, ["one below"]), (528, ["one above"]), (600, ["other"]), ("x", ["no guess"])],
)
def test_the_guess_after_one_number_left_on_cpu(second, expected):
    # 528 answered lower leaves 527 alone, named by the range or listed
    for left in ("lower: from 527 to 527", "lower: one of 527"):
        assert after_one_left([OPENING, call(528), answer(left), call(second)]) == expected


def test_guesses_with_more_than_one_number_left_are_not_counted_on_cpu():
    # 527 answered higher leaves 528..529: two numbers, no copy to make
    assert after_one_left([OPENING, call(527), answer("higher: from 528 to 529"), call(528)]) == []
    assert after_one_left([OPENING, call(528)]) == []


def test_the_command_prints_both_tables_and_writes_counts_on_cpu(tmp_path, capsys):
    rows = [
        {
            "task": "guess",
            "success": True,
            "messages": [OPENING, call(528), answer("lower: from 527 to 527"), call(527)],
        },
        {
            "task": "guess",
            "success": False,
            "messages": [OPENING, call(528), answer("lower: from 527 to 527"), call(526)],
        },
        {
            "task": "guess",
            "success": False,
            "messages": [OPENING, call(529), answer("lower: from 527 to 528"), call(527)],
        },
        {"task": "calc", "success": True, "messages": [{"role": "user", "content": "Compute (1 + 2) * 3."}]},
    ]
    episodes = tmp_path / "before_rl.episodes.jsonl"
    episodes.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "moves.json"
    assert main([str(episodes), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| middle | 2 (1 won) |" in printed
    assert "| top | 1 (0 won) |" in printed
    assert "| copied | 1 (50%) |" in printed
    assert "| one below | 1 (50%) |" in printed
    counts = json.loads(out.read_text())[str(episodes)]
    assert counts == {
        "first": {"middle": 2, "top": 1},
        "won": {"middle": 1, "top": 0},
        "after_one_left": {"copied": 1, "one below": 1},
    }
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.jsonl")])
