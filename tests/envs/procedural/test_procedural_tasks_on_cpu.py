"""The procedural tasks in-process: seeded samples, train/test splits, experts, invalid steps, prompt size."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agentrl_ext.envs.calc.expert import expert_action as calc_expert  # noqa: E402
from agentrl_ext.envs.calc.expert import feasible_action, is_feasible  # noqa: E402
from agentrl_ext.envs.calc.task import STEP_ERROR, CalcTask  # noqa: E402
from agentrl_ext.envs.gridroom.expert import expert_action as gridroom_expert  # noqa: E402
from agentrl_ext.envs.gridroom.task import GridRoomTask  # noqa: E402
from agentrl_ext.envs.guess.expert import expert_action as guess_expert  # noqa: E402
from agentrl_ext.envs.guess.task import GuessTask  # noqa: E402
from agentrl_ext.envs.guess.task import candidates as candidates_text  # noqa: E402
from agentrl_ext.envs.procedural import TRAIN_START, tool_call_message  # noqa: E402
from procedural_helpers import play  # noqa: E402

from agentrl_ext.env.protocol import SampleStatus  # noqa: E402

EXPERTS = {GuessTask: guess_expert, CalcTask: calc_expert, GridRoomTask: gridroom_expert}
# the most agent steps the expert may take on any sample (the turn limits are 6, 5 and 8)
EXPERT_STEPS = {GuessTask: 5, CalcTask: 3, GridRoomTask: 7}


def scripted(*steps: tuple[str, dict]):
    """A policy that plays ``steps`` in order."""
    queue = list(steps)
    return lambda messages: tool_call_message(*queue.pop(0), len(messages))


@pytest.mark.parametrize("task_class", list(EXPERTS))
def test_splits_are_fixed_ranges_and_follow_the_split_setting_on_cpu(task_class):
    train, test = task_class(), task_class(split="test", num_test=50)
    assert test.get_indices() == list(range(50))
    assert train.get_indices() == train.split_indices("train")
    assert len(train.get_indices()) == 1000 and min(train.get_indices()) >= TRAIN_START
    assert not set(train.get_indices()) & set(test.get_indices())
    with pytest.raises(ValueError, match="split must be one of"):
        task_class(split="val")


@pytest.mark.parametrize("task_class", [CalcTask, GridRoomTask])
def test_train_samples_never_repeat_a_test_sample_on_cpu(task_class):
    task = task_class()
    held_out = {task.content_key(i) for i in task.split_indices("test")}
    assert len(held_out) > 50  # the test split is not a handful of repeats
    assert not held_out & {task.content_key(i) for i in task.split_indices("train")}


def test_samples_are_deterministic_per_index_on_cpu():
    assert [GuessTask().secret(i) for i in range(30)] == [GuessTask().secret(i) for i in range(30)]
    assert len({GuessTask().secret(i) for i in range(100)}) == 16
    assert CalcTask().problem(7) == CalcTask(split="test").problem(7)
    assert GridRoomTask().layout(10_005) == GridRoomTask().layout(10_005)
    assert len({CalcTask().problem(i) for i in range(100)}) > 95


async def test_an_index_of_neither_split_is_refused_on_cpu():
    with pytest.raises(ValueError, match="neither split"):
        await play(GuessTask(num_test=10), 50, guess_expert)


@pytest.mark.parametrize("task_class", list(EXPERTS))
async def test_expert_solves_every_sample_of_both_splits_on_cpu(task_class):
    task = task_class()
    for index in task.split_indices("test") + task.split_indices("train")[:300]:
        played = await play(task, index, EXPERTS[task_class])
        assert (played.status, played.reward) == (SampleStatus.COMPLETED, 1.0), (index, played.messages)
        assert played.turns <= EXPERT_STEPS[task_class]


async def test_guess_feedback_and_turn_limit_on_cpu():
    task = GuessTask()
    secret = task.secret(0)
    low = scripted(*[("guess", {"number": 0})] * 6)
    played = await play(task, 0, low)
    assert (played.status, played.reward, played.turns) == (SampleStatus.TASK_LIMIT_REACHED, 0.0, 6)
    assert [m["content"] for m in played.messages if m["role"] == "tool"] == ["higher"] * 6
    right = await play(task, 0, scripted(("guess", {"number": str(secret)})))  # digits as a string count
    assert (right.status, right.reward, right.messages[-1]["content"]) == (
        SampleStatus.COMPLETED,
        1.0,
        "correct",
    )


async def test_guess_show_range_names_the_range_the_answers_leave_on_cpu():
    task = GuessTask(show_range=True)
    index = next(i for i in range(100) if task.secret(i) == 6)
    # a guess outside the range left (12 after "lower: from 1 to 7") narrows nothing
    steps = [("guess", {"number": n}) for n in (8, 4, 12, 0, 5, 6)]
    played = await play(task, index, scripted(*steps))
    assert [m["content"] for m in played.messages if m["role"] == "tool"] == [
        "lower: from 1 to 7",
        "higher: from 5 to 7",
        "lower: from 5 to 7",
        "higher: from 5 to 7",
        "higher: from 6 to 7",
        "correct",
    ]
    assert (played.status, played.reward) == (SampleStatus.COMPLETED, 1.0)
    # the expert reads the answers' first word, so it still needs at most 5 guesses
    for index in range(100):
        played = await play(task, index, guess_expert)
        assert (played.status, played.turns <= 5) == (SampleStatus.COMPLETED, True), played.messages
    with pytest.raises(ValueError, match="show_range must be true or false"):
        GuessTask(show_range="yes")


@pytest.mark.parametrize(
    ("numbers", "left"),
    [
        ((0, 0, 0, 0, 0, 0), 16),  # "higher" to 0 every time: 1..16 left
        ((8, 4, 16, 16, 16, 16), 3),  # 5..7 left (16 is outside it)
        ((8, 4, 5, 16, 16, 16), 2),  # 6..7
        ((8, 4, 7, 5, 16, 16), 1),  # 6..6: known, but never guessed
    ],
)
async def test_guess_partial_credit_rewards_the_information_of_a_failed_sample_on_cpu(numbers, left):
    # secret 6: a failed sample gets partial_credit x (1 - log2(numbers left) / log2(16))
    expected = 0.5 * (1 - math.log(left, 2) / 4)
    task = GuessTask(partial_credit=0.5)
    index = next(i for i in range(100) if task.secret(i) == 6)
    played = await play(task, index, scripted(*[("guess", {"number": n}) for n in numbers]))
    assert played.status == SampleStatus.TASK_LIMIT_REACHED
    assert played.reward == pytest.approx(expected)
    # no partial credit by default; a solved sample still gets 1
    assert (
        await play(GuessTask(), index, scripted(*[("guess", {"number": n}) for n in numbers]))
    ).reward == 0
    solved = await play(task, index, scripted(("guess", {"number": 6})))
    assert (solved.status, solved.reward) == (SampleStatus.COMPLETED, 1.0)


@pytest.mark.parametrize("bad", [1.0, -0.1, True, "0.5"])
def test_guess_partial_credit_must_stay_below_a_solved_sample_on_cpu(bad):
    with pytest.raises(ValueError, match="partial_credit must be"):
        GuessTask(partial_credit=bad)


@pytest.mark.parametrize(
    ("task_class", "step"),
    [
        (GuessTask, ("guess", {"number": "eight"})),
        (GuessTask, ("guess", {})),
        # not integers, though every character is a digit or a minus (found by a warm-started model)
        (GuessTask, ("guess", {"number": "--6"})),
        (CalcTask, ("answer", {"value": "6-"})),
        (CalcTask, ("calculator", {"expression": 12})),
        (CalcTask, ("answer", {"value": "twelve"})),
        (GridRoomTask, ("move", {"direction": "north"})),
    ],
)
async def test_arguments_off_the_schema_fail_validation_with_reward_0_on_cpu(task_class, step):
    played = await play(task_class(), 0, scripted(step))
    assert (played.status, played.reward, played.turns) == (SampleStatus.AGENT_VALIDATION_FAILED, 0.0, 1)


async def test_calc_wrong_answer_and_malformed_step_on_cpu():
    task = CalcTask()
    problem = task.problem(0)
    wrong = await play(task, 0, scripted(("answer", {"value": problem.value + 1})))
    assert (wrong.status, wrong.reward) == (SampleStatus.COMPLETED, 0.0)
    steps = [("calculator", {"expression": problem.expression})] * 5  # two operations in one step
    limited = await play(task, 0, scripted(*steps))
    assert (limited.status, limited.reward) == (SampleStatus.TASK_LIMIT_REACHED, 0.0)
    assert {m["content"] for m in limited.messages if m["role"] == "tool"} == {STEP_ERROR}


async def test_gridroom_walls_locked_door_and_key_on_cpu():
    task = GridRoomTask()
    indices = task.split_indices("test") + task.split_indices("train")
    index = next(i for i in indices if task.layout(i).start == (0, 0) and task.layout(i).door == (0, 1))
    key = task.layout(index).key
    steps = [("move", {"direction": "up"}), ("move", {"direction": "right"})] * 4
    played = await play(task, index, scripted(*steps))
    first, second = [m["content"] for m in played.messages if m["role"] == "tool"][:2]
    assert first.startswith("Wall. You at 0,0.") and second.startswith("Locked. You at 0,0.")
    assert f"Key at {key[0]},{key[1]}" in second
    assert (played.status, played.reward, played.turns) == (SampleStatus.TASK_LIMIT_REACHED, 0.0, 8)


@pytest.mark.parametrize("task_class", list(EXPERTS))
async def test_prompts_fit_the_tiny_model_context_on_cpu(task_class):
    """Opening prompts (system + tools + task) and whole expert episodes, in the tiny tokenizer."""
    from agentrl_ext.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    task = task_class()
    worst_prompt = worst_episode = 0
    for index in task.split_indices("test")[:30]:
        played = await play(task, index, EXPERTS[task_class])
        render = lambda messages, **kw: tokenizer.apply_chat_template(  # noqa: E731
            messages, tools=task.tools, tokenize=False, **kw
        )
        prompt = render(played.messages[:1], add_generation_prompt=True)
        worst_prompt = max(worst_prompt, len(tokenizer.encode(prompt)))
        worst_episode = max(worst_episode, len(tokenizer.encode(render(played.messages))))
        json.dumps(played.messages)  # episodes are plain JSON (SFT rows)
    # measured with the tiny tokenizer of BUILDER_VERSION 1: 265 / 326 / 313 and 478 / 438 / 745
    assert worst_prompt <= 340
    assert worst_episode <= 760


def test_guess_starts_hold_out_a_secret_position_of_every_range_on_cpu():
    # 1..7 start the range 1..3, 2..4, ..., 7..9; held out: the secret at position start % 3
    train, test = GuessTask(high=3, starts=7), GuessTask(high=3, starts=7, split="test")
    pairs = {split: set() for split in ("train", "test")}
    for split, task in (("train", train), ("test", test)):
        for index in task.split_indices(split):
            low, high, secret = task.sample(index)
            assert (high - low, low <= secret <= high) == (2, True)
            pairs[split].add((low, secret))
    expected_test = {(1, 2), (2, 4), (3, 3), (4, 5), (5, 7), (6, 6), (7, 8)}
    assert pairs["test"] == expected_test  # written out by hand: start + start % 3
    everything = {(low, low + k) for low in range(1, 8) for k in range(3)}
    assert pairs["train"] == everything - expected_test
    # every start opens train samples as well (only its held-out secret is new)
    assert {low for low, _ in pairs["train"]} == {low for low, _ in pairs["test"]}
    # starts=1 keeps the range 1..high and the secrets of before
    assert [GuessTask(high=3).secret(i) for i in range(20)] == [
        __import__("random").Random(i).randint(1, 3) for i in range(20)
    ]
    for bad in (0, "2", True):
        with pytest.raises(ValueError, match="starts must be an integer >= 1"):
            GuessTask(starts=bad)
        with pytest.raises(ValueError, match="first must be an integer >= 1"):
            GuessTask(first=bad)
    # first moves the starts: 500..502 (ranges 500..502, 501..503, 502..504), the secret held out
    # at position start % 3 as before: 500 % 3 = 2, 501 % 3 = 0, 502 % 3 = 1
    moved = GuessTask(high=3, starts=3, first=500, split="test")
    moved_test = {(low, secret) for low, _, secret in map(moved.sample, moved.split_indices("test"))}
    assert moved_test == {(500, 502), (501, 501), (502, 503)}


def test_guess_held_out_ranges_never_open_a_train_sample_on_cpu():
    # held_out: range: starts 500, 503, 504 train, 501, 502 test (the middle two of every four: both
    # splits start ranges on odd and on even numbers); every position of a range in its split
    train = GuessTask(high=3, starts=5, first=500, held_out="range")
    test = GuessTask(high=3, starts=5, first=500, held_out="range", split="test")
    pairs = {
        split: {(low, secret) for low, _, secret in map(task.sample, task.split_indices(split))}
        for split, task in (("train", train), ("test", test))
    }
    assert pairs["train"] == {(low, low + k) for low in (500, 503, 504) for k in range(3)}
    assert pairs["test"] == {(low, low + k) for low in (501, 502) for k in range(3)}
    with pytest.raises(ValueError, match="held_out must be one of position, range"):
        GuessTask(starts=4, held_out="ranges")
    with pytest.raises(ValueError, match="held_out: range needs starts >= 2"):
        GuessTask(held_out="range")


async def test_guess_starts_name_the_range_and_the_expert_reads_it_on_cpu():
    task = GuessTask(high=3, starts=7, show_range=True, max_turns=2, split="test")
    index = next(i for i in range(100) if task.sample(i)[:2] == (5, 7))  # held out: secret 7
    played = await play(task, index, guess_expert)
    assert played.messages[0]["content"].startswith("Guess my number from 5 to 7.")
    assert [m["content"] for m in played.messages if m["role"] == "tool"] == [
        "higher: from 7 to 7",
        "correct",
    ]
    for index in range(100):  # the expert wins every held-out game in 2 guesses
        assert (await play(task, index, guess_expert)).status == SampleStatus.COMPLETED


async def test_guess_show_candidates_lists_the_numbers_left_so_the_middle_is_a_position_on_cpu():
    task = GuessTask(high=3, starts=30, first=500, show_candidates=True, max_turns=2, split="test")
    # 528 % 3 = 0: the held-out secret of the range 528..530 is its bottom, 528
    index = next(i for i in range(100) if task.sample(i)[:2] == (528, 530))
    played = await play(task, index, guess_expert)
    assert played.messages[0]["content"] == (
        "Guess my number, one of 528 529 530. I answer higher, lower or correct. You have 2 guesses."
    )
    assert [m["content"] for m in played.messages if m["role"] == "tool"] == ["lower: one of 528", "correct"]
    # binary search's first guess is the second number named, in every range
    assert [json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in played.messages[1::2]] == [
        {"number": 529},
        {"number": 528},
    ]
    # an edge guess leaves two numbers, a guess outside the list none
    played = await play(task, index, scripted(("guess", {"number": 530}), ("guess", {"number": 527})))
    assert [m["content"] for m in played.messages if m["role"] == "tool"] == [
        "lower: one of 528 529",
        "higher: one of 528 529",
    ]
    played = await play(task, index, scripted(("guess", {"number": 531}), ("guess", {"number": 527})))
    assert [m["content"] for m in played.messages if m["role"] == "tool"][0] == "lower: one of 528 529 530"
    wide = GuessTask(high=16, show_candidates=True)
    played = await play(
        wide,
        next(i for i in range(100) if wide.secret(i) == 6),
        scripted(("guess", {"number": 8}), ("guess", {"number": 6})),
    )
    assert [m["content"] for m in played.messages if m["role"] == "tool"] == [
        "lower: one of 1 2 3 4 5 6 7",
        "correct",
    ]
    assert candidates_text(9, 8) == "none left"
    for index in range(100):  # the expert reads the lists and wins every held-out game in 2 guesses
        assert (await play(task, index, guess_expert)).status == SampleStatus.COMPLETED
    with pytest.raises(ValueError, match="show_candidates must be true or false"):
        GuessTask(show_candidates="yes")
    with pytest.raises(ValueError, match="set show_range: false to list the numbers"):
        GuessTask(show_candidates=True, show_range=True)


async def test_gridroom_show_moves_names_the_goals_direction_and_the_open_moves_on_cpu():
    task = GridRoomTask(show_moves=True)
    indices = task.split_indices("test") + task.split_indices("train")
    # the agent at 0,0, the door at 0,1 (locked), the key at 2,1
    index = next(
        i
        for i in indices
        if (task.layout(i).start, task.layout(i).door, task.layout(i).key) == ((0, 0), (0, 1), (2, 1))
    )
    steps = [("move", {"direction": d}) for d in ("up", "down", "down", "right", "up", "up")]
    played = await play(task, index, scripted(*steps))
    assert played.messages[0]["content"].endswith(
        "You have 8 moves. You at 0,0. Key at 2,1 (down right). Door at 0,1. Open: down."
    )
    # the open moves toward the goal first (the toward order), then the others (up down left right)
    assert [m["content"] for m in played.messages if m["role"] == "tool"] == [
        "Wall. You at 0,0. Key at 2,1 (down right). Door at 0,1. Open: down.",
        "You at 1,0. Key at 2,1 (down right). Door at 0,1. Open: down right up.",
        "You at 2,0. Key at 2,1 (right). Door at 0,1. Open: right up.",
        "Got the key. You at 2,1 with key. Door at 0,1 (up). Open: up left right.",
        "You at 1,1 with key. Door at 0,1 (up). Open: up down left right.",
        "The door opens.",
    ]
    assert (played.status, played.reward) == (SampleStatus.COMPLETED, 1.0)
    # the expert still reads it, and off by default nothing changes
    assert (await play(task, index, gridroom_expert)).status == SampleStatus.COMPLETED
    assert "Open" not in (await play(GridRoomTask(), index, gridroom_expert)).messages[0]["content"]
    with pytest.raises(ValueError, match="show_moves must be true or false"):
        GridRoomTask(show_moves="yes")


async def test_calc_show_rest_restates_what_is_left_after_each_step_on_cpu():
    task = CalcTask(show_rest=True)
    indices = task.split_indices("test") + task.split_indices("train")
    index = next(i for i in indices if task.problem(i).expression == "(12 + 4) - 19")
    bracket_first = [
        ("calculator", {"expression": "3 * 3"}),  # no part of the problem: nothing changes
        ("calculator", {"expression": "12 + 4"}),
        ("calculator", {"expression": "16 - 19"}),
        ("answer", {"value": -3}),
    ]
    played = await play(task, index, scripted(*bracket_first))
    # the opening is the plain one; only the calculator's answers restate what is left
    assert played.messages[0]["content"] == (
        "Compute (12 + 4) - 19. Use the calculator one step at a time, then answer. You have 5 steps."
    )
    assert [m["content"] for m in played.messages if m["role"] == "tool"] == [
        "9. Left: (12 + 4) - 19.",
        "16. Left: 16 - 19.",
        "-3. Left: -3.",
    ]
    assert (played.status, played.reward) == (SampleStatus.COMPLETED, 1.0)
    # the other grouping is substituted as asked: choosing it stays the agent's mistake
    other = [("calculator", {"expression": "4 - 19"}), ("calculator", {"expression": "12 + -15"})]
    played = await play(
        task, index, scripted(*other, ("calculator", {"expression": "1 +"}), ("answer", {"value": -3}))
    )
    assert [m["content"] for m in played.messages if m["role"] == "tool"] == [
        "-15. Left: 12 + -15.",
        "-3. Left: -3.",
        f"{STEP_ERROR}. Left: -3.",
    ]
    # the expert and the demonstrator read the results through the restatement
    assert (await play(task, index, calc_expert)).status == SampleStatus.COMPLETED
    rng = random.Random(0)
    for i in task.split_indices("test")[:40]:
        played = await play(task, i, lambda messages: feasible_action(messages, rng))
        assert (played.status, played.turns) == (SampleStatus.COMPLETED, 3)
        moves = [m for m in played.messages if m["role"] == "assistant"]
        for n, move in enumerate(moves):
            call = move["tool_calls"][0]["function"]
            context = played.messages[: played.messages.index(move)]
            assert is_feasible(context, call["name"], json.loads(call["arguments"])), (n, played.messages)
    plain = (await play(CalcTask(), index, calc_expert)).messages
    assert "Left" not in str(plain)
    assert plain[0]["content"].startswith("Compute (12 + 4) - 19. Use the calculator")
    with pytest.raises(ValueError, match="show_rest must be true or false"):
        CalcTask(show_rest="yes")
