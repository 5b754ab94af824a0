"""``agentrl_ext.eval.guess_probe``: the deciding node of each secret, and what a policy does there."""

from __future__ import annotations

import json
import subprocess
import sys

from agentrl_ext.eval.guess_probe import deciding_node, probe


def binary_search_guesses(secret: int, high: int) -> list[int]:
    """Written here from the task's rules, not read from the expert."""
    low, top, out = 1, high, []
    while True:
        mid = (low + top) // 2
        out.append(mid)
        if mid == secret:
            return out
        low, top = (mid + 1, top) if mid < secret else (low, mid - 1)


def test_deciding_node_is_the_binary_search_path_on_cpu():
    for high in (16, 7):
        for secret in range(1, high + 1):
            messages, guesses = deciding_node(secret, high, 6)
            assert guesses == binary_search_guesses(secret, high)
            # the conversation holds every guess but the deciding one, each answered
            answers = [m["content"] for m in messages if m["role"] == "tool"]
            assert len(answers) == len(guesses) - 1
            assert all(
                a == ("higher" if g < secret else "lower") for g, a in zip(guesses, answers, strict=False)
            )
    assert [len(deciding_node(s, 16, 6)[1]) for s in (8, 4, 12, 7, 16)] == [1, 2, 2, 4, 5]


def test_deciding_node_with_show_range_names_the_range_left_on_cpu():
    messages, guesses = deciding_node(7, 16, 6, show_range=True)
    assert guesses == [8, 4, 6, 7]
    assert [m["content"] for m in messages if m["role"] == "tool"] == [
        "lower: from 1 to 7",
        "higher: from 5 to 7",
        "higher: from 7 to 7",
    ]


def test_probe_counts_the_sampled_guesses_on_cpu():
    calls = []

    def sampler(messages):
        secret = len(calls) + 1  # probe visits secrets 1..high in order
        calls.append(messages)
        call = '<tool_call>{"name": "guess", "arguments": {"number": %d}}</tool_call>'
        return [call % secret] * 3 + [
            call % (secret + 1),
            "no call",
            '<tool_call>{"name": "move"}</tool_call>',
        ]

    rows = probe(sampler, high=16, max_turns=6)
    assert [r["secret"] for r in rows] == list(range(1, 17))
    for row in rows:
        s = row["secret"]
        assert row["guesses"] == {str(s): 3, "bad": 2, str(s + 1): 1}
        assert row["correct"] == 0.5
    assert calls[7][-1]["role"] == "user"  # secret 8: the opening alone


def test_probe_cli_on_the_tiny_model_on_cpu(tmp_path):
    from agentrl_ext.testing.tiny_model import tiny_model_path

    out = tmp_path / "probe.json"
    cmd = [sys.executable, "-m", "agentrl_ext.eval.guess_probe", str(tiny_model_path()), "--samples", "3",
           "--max-tokens", "8", "--high", "4", "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.strip().splitlines()) == 1 + 4
    rows = json.loads(out.read_text())["rows"]
    assert [sum(r["guesses"].values()) for r in rows] == [3, 3, 3, 3]

    bad = subprocess.run([*cmd[:3], str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "missing is not a folder" in bad.stderr
