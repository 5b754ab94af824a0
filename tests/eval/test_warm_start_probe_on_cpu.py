"""The warm start's demonstrators (each task's ``feasible_action``), the room they leave RL and the
probe of what a checkpoint reads (``agentrl_ext.eval.warm_start_probe``).

Expected values come from outside the code under test: the range a guess may take is tracked
here from the worker's own answers, gridroom's legal moves from the room's rules written out
below, calc's numbers from the problem's text; the demonstrator's success on guess from the
recursion of uniform guessing inside the range left (:func:`feasible_win_rate`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from functools import cache

import pytest

from agentrl_ext.data.expert import expert_function, noisy_policy, play_expert_episodes
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.eval.warm_start_probe import (
    ProbeResult,
    format_report,
    measure_room,
    probe_moves,
    report_json,
)
from agentrl_ext.testing.env_servers import EnvServers

TASKS = {
    "guess": "agentrl_ext.envs.guess.task:GuessTask",
    "calc": "agentrl_ext.envs.calc.task:CalcTask",
    "gridroom": "agentrl_ext.envs.gridroom.task:GridRoomTask",
}
GUESS = {"high": 7, "max_turns": 3}


@cache
def feasible_win_rate(numbers: int, guesses: int) -> float:
    """P(win) guessing uniformly among ``numbers`` still possible, the secret uniform among them."""
    if numbers == 0:
        return 1.0
    if guesses == 0:
        return 0.0
    total = 0.0
    for guess in range(1, numbers + 1):
        below, above = guess - 1, numbers - guess
        total += (
            1 + below * feasible_win_rate(below, guesses - 1) + above * feasible_win_rate(above, guesses - 1)
        ) / numbers
    return total / numbers


def test_the_recursion_against_hand_counts_on_cpu():
    # 1..3 in 2 guesses: open 2 always wins, open 1 or 3 wins 1/3 + 2/3 * 1/2
    assert feasible_win_rate(3, 2) == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    assert feasible_win_rate(1, 1) == 1.0 and feasible_win_rate(2, 1) == 0.5


@pytest.fixture(scope="module")
def controller_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A controller with one ``test``-split worker per procedural task (guess 1..7 in 3)."""
    with EnvServers(tmp_path_factory.mktemp("warm_start")) as servers:
        controller = servers.controller()
        for name, spec in TASKS.items():
            kwargs = {"split": "test", **(GUESS if name == "guess" else {})}
            servers.worker(controller, spec, name=name, task_kwargs=kwargs)
        for name in TASKS:
            servers.wait_routable(controller, name)
        yield controller.api


def _moves(episode) -> Iterator[tuple[int, dict, list[dict]]]:
    for position, message in enumerate(episode.messages):
        if message["role"] == "assistant":
            call = message["tool_calls"][0]["function"]
            yield (
                position,
                {"name": call["name"], **json.loads(call["arguments"])},
                episode.messages[:position],
            )


async def test_guess_demonstrator_guesses_inside_the_range_the_answers_leave_on_cpu(controller_api):
    episodes = await play_expert_episodes(
        controller_api, "guess", list(range(100)), epsilon=1.0, move="feasible", seed=1
    )
    first_guesses = set()
    for episode in episodes:
        low, high = 1, 7
        for position, move, _ in _moves(episode):
            assert low <= move["number"] <= high, (move, low, high)
            if position == 1:
                first_guesses.add(move["number"])
            answer = episode.messages[position + 1]["content"] if position + 1 < len(episode.messages) else ""
            if answer.startswith("higher"):
                low = move["number"] + 1
            elif answer.startswith("lower"):
                high = move["number"] - 1
    assert first_guesses == set(range(1, 8))  # random, not the expert's 4
    won = sum(e.status == SampleStatus.COMPLETED for e in episodes)
    # 100 episodes: the binomial's sd is ~0.047 around 0.678
    assert abs(won / 100 - feasible_win_rate(7, 3)) < 0.15


async def test_gridroom_demonstrator_never_walks_into_a_wall_or_the_locked_door_on_cpu(controller_api):
    episodes = await play_expert_episodes(
        controller_api, "gridroom", list(range(60)), epsilon=1.0, move="feasible", seed=1
    )
    steps = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    for episode in episodes:
        for position, move, history in _moves(episode):
            state = [m["content"] for m in history if m["role"] in ("user", "tool")][-1]
            row, col = map(int, re.search(r"You at (\d),(\d)", state).groups())
            door = tuple(map(int, re.search(r"Door at (\d),(\d)", state).groups()))
            target = (row + steps[move["direction"]][0], col + steps[move["direction"]][1])
            assert 0 <= target[0] <= 2 and 0 <= target[1] <= 2, (state, move)
            assert not ("Key at" in state and target == door), (state, move)
            reply = episode.messages[position + 1]["content"]
            assert not reply.startswith(("Wall", "Locked")), reply


async def test_calc_demonstrator_copies_the_numbers_and_picks_a_grouping_on_cpu(controller_api):
    episodes = await play_expert_episodes(
        controller_api, "calc", list(range(60)), epsilon=1.0, move="feasible", seed=1
    )
    groupings = set()
    for episode in episodes:
        a, op1, b, op2, c = re.search(
            r"\((-?\d+) ([-+*]) (-?\d+)\) ([-+*]) (-?\d+)", episode.messages[0]["content"]
        ).groups()
        moves = [move for _, move, _ in _moves(episode)]
        results = [m["content"] for m in episode.messages if m["role"] == "tool"]
        assert [m["name"] for m in moves] == ["calculator", "calculator", "answer"]
        first = moves[0]["expression"]
        assert first in (f"{a} {op1} {b}", f"{b} {op2} {c}")
        groupings.add(first == f"{a} {op1} {b}")
        second = f"{results[0]} {op2} {c}" if first == f"{a} {op1} {b}" else f"{a} {op1} {results[0]}"
        assert moves[1]["expression"] == second
        assert moves[2]["value"] == int(results[1])
        value = eval(f"({a} {op1} {b}) {op2} {c}")  # the problem's own value, by Python
        assert (episode.reward == 1.0) == (int(results[1]) == value)
    assert groupings == {True, False}


def test_demonstrators_are_the_careless_move_at_rate_1_on_cpu():
    opening = [
        {
            "role": "user",
            "content": "Guess my number from 1 to 7. I answer higher, lower or correct. You have 3 guesses.",
        }
    ]
    policy = noisy_policy("guess", 1.0, random.Random(0), "feasible")
    numbers = {
        json.loads(policy(opening)["tool_calls"][0]["function"]["arguments"])["number"] for _ in range(200)
    }
    assert numbers == set(range(1, 8))


@pytest.mark.parametrize(
    ("task", "history", "call", "feasible"),
    [
        ("guess", [("4", "lower: from 1 to 3")], ("guess", {"number": 2}), True),
        (
            "guess",
            [("4", "lower")],
            ("guess", {"number": "3"}),
            True,
        ),  # a string of digits, as the worker reads it
        ("guess", [("4", "lower")], ("guess", {"number": 5}), False),
        ("guess", [("4", "lower"), ("2", "higher")], ("guess", {"number": 2}), False),
        ("guess", [], ("guess", {"number": 8}), False),
        ("guess", [], ("move", {"number": 3}), False),
    ],
)
def test_is_feasible_follows_the_answers_on_cpu(task, history, call, feasible):
    messages = [
        {
            "role": "user",
            "content": "Guess my number from 1 to 7. I answer higher, lower or correct. You have 3 guesses.",
        }
    ]
    for step, (number, answer) in enumerate(history):
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"c{step}",
                        "type": "function",
                        "function": {"name": "guess", "arguments": json.dumps({"number": int(number)})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{step}", "content": answer},
        ]
    assert expert_function(task, "is_feasible")(messages, *call) is feasible


def test_gridroom_and_calc_feasible_checks_on_cpu():
    room = [
        {
            "role": "user",
            "content": "3x3 room, cells row,col from 0,0 at top left. Get the key, then go to the door. You have 8 moves. You at 0,0. Key at 2,2. Door at 0,1.",
        }
    ]
    check = expert_function("gridroom", "is_feasible")
    # from the top-left corner: up and left are the wall, right is the locked door
    assert [d for d in ("up", "down", "left", "right") if check(room, "move", {"direction": d})] == ["down"]
    calc = [
        {
            "role": "user",
            "content": "Compute (12 + 4) - 19. Use the calculator one step at a time, then answer. You have 5 steps.",
        }
    ]
    check = expert_function("calc", "is_feasible")
    assert check(calc, "calculator", {"expression": "12 + 4"}) and check(
        calc, "calculator", {"expression": "4-19"}
    )
    assert not check(calc, "calculator", {"expression": "12 + 5"})
    assert not check(calc, "answer", {"value": 16})
    assert not check(calc, "answer", {"value": "--16"}) and not check(calc, "answer", {"value": "16-"})


def test_room_is_the_demonstrators_and_the_experts_success_on_cpu(controller_api):
    room, episodes = measure_room(controller_api, "guess", list(range(100)), 1.0, "feasible", runs=4, seed=0)
    assert room.episodes == len(episodes) == 400
    assert room.expert == 1.0  # binary search finds every secret of 1..7 in 3 guesses
    # 400 episodes: the binomial's sd is ~0.023
    assert abs(room.demonstrator - feasible_win_rate(7, 3)) < 0.08
    assert room.room == pytest.approx(room.expert - room.demonstrator)
    table = format_report([room], [])
    assert "| guess |" in table and "room for RL" in table


def test_the_probe_reports_the_consistent_share_over_all_contexts_on_cpu():
    # 20 later contexts at 90% and 10 openings at 60%: 18 + 6 of 30 (worked by hand)
    probe = ProbeResult("calc", 20, 0.9, 0.5, 0.0, 10, 0.6, 0.3)
    assert probe.all_feasible == pytest.approx(0.8)
    assert ProbeResult("calc", 0, 0.0, 0.0, 0.0, 0, 0.0, 0.0).all_feasible == 0.0
    assert format_report([], [probe]).splitlines()[-1].endswith("| 80.0% |")
    assert json.loads(report_json([], [probe]))["probes"][0]["all_feasible"] == pytest.approx(0.8)


def per_context(turns):
    """A batch sampler from a function of one context (the probe's Sampler takes them all)."""
    return lambda contexts: [turns(messages, tools) for messages, tools in contexts]


def _call_text(name: str, arguments: dict) -> str:
    """A turn in the Hermes format the tiny model's template writes, built by hand."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_probe_counts_consistent_expert_and_invalid_moves_on_cpu(controller_api):
    _, episodes = measure_room(controller_api, "guess", list(range(30)), 1.0, "feasible", runs=1, seed=0)

    def always(number):
        return lambda messages, tools: [_call_text("guess", {"number": number})] * 2

    def middle(messages, tools):  # binary search, written here from the answers
        low, high = 1, 7
        for m, reply in zip(messages, messages[1:], strict=False):
            if m["role"] == "assistant" and reply["role"] == "tool":
                number = json.loads(m["tool_calls"][0]["function"]["arguments"])["number"]
                low, high = (number + 1, high) if reply["content"].startswith("higher") else (low, number - 1)
        return [_call_text("guess", {"number": (low + high) // 2})] * 3

    expert = probe_moves(per_context(middle), "guess", episodes)
    after = sum(1 for e in episodes for m in e.messages[2:] if m["role"] == "assistant")
    assert expert.contexts == after and expert.opening_contexts == len(episodes)
    assert expert.feasible == expert.expert == expert.opening_expert == 1.0 and expert.invalid == 0.0
    seven = probe_moves(per_context(always(7)), "guess", episodes)
    assert seven.opening_feasible == 1.0 and seven.opening_expert == 0.0
    assert 0.0 < seven.feasible < 1.0  # 7 is possible only after "higher"
    garbage = probe_moves(per_context(lambda messages, tools: ["guess 4"]), "guess", episodes)
    assert garbage.invalid == 1.0 and garbage.feasible == 0.0
    # a number of dashes and digits that is no integer (a warm-started model wrote "--6"; the probe
    # then stopped the whole job) is a move like any other: neither consistent nor the expert's
    dashes = probe_moves(
        per_context(lambda messages, tools: [_call_text("guess", {"number": "--6"})]), "guess", episodes
    )
    assert (dashes.feasible, dashes.expert, dashes.invalid) == (0.0, 0.0, 0.0)


def test_hf_sampler_batches_left_padded_contexts_as_it_samples_them_alone_on_cpu(controller_api):
    from agentrl_ext.eval.warm_start_probe import hf_sampler
    from agentrl_ext.testing.tiny_model import tiny_model_path

    _, episodes = measure_room(controller_api, "calc", list(range(6)), 1.0, "feasible", runs=1, seed=0)
    contexts = [(e.messages[: i + 1], e.tools) for e in episodes for i in (0, 2)]  # two lengths each
    assert len({len(m) for m, _ in contexts}) == 2
    greedy = hf_sampler(tiny_model_path(), samples=2, temperature=0.0, max_tokens=12, batch_rows=5)
    batched = greedy(contexts)
    alone = [greedy([context])[0] for context in contexts]
    assert batched == alone
    assert all(len(texts) == 2 and texts[0] == texts[1] for texts in batched)
    sampled = hf_sampler(tiny_model_path(), samples=3, temperature=1.0, max_tokens=12)(contexts[:2])
    assert [len(texts) for texts in sampled] == [3, 3]
