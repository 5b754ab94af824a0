"""alfworld through the real controller -> worker path, driven by the raw AgentRL protocol.

The engine's expert plan (the PDDL planner's plan; the train games' walkthrough) wins one game of
every task type of ``new_std`` and a wrong plan scores 0; ``put``/``move`` are one command in both
grammars; invalid steps and a dead game process end with the documented statuses; the worker keeps
serving throughout.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from alfworld_helpers import ALFWORLD_TASK, RawClient, call, descendants, expert_plans, require_engine

from agentrl_ext.data.expert import play_expert_episode
from agentrl_ext.env.client import ControllerClient
from agentrl_ext.testing.env_servers import EnvServers, ServerProcess, list_workers, wait_until
from envs.alfworld.data import TASK_TYPES, load_split
from envs.alfworld.prompts import BAD_TOOL_CALL, NO_TOOL_CALL, SYSTEM_PROMPT, TOOLS

PUT = re.compile(r"^put (.+) in/on (.+)$")
MOVE = re.compile(r"^move (.+) to (.+)$")


def wrong_plan(plan: list[str], steps: int = 20) -> list[str]:
    """The plan without its last (winning) step, then look/inventory in turns up to ``steps``."""
    filler = ["look", "inventory"] * steps
    return (plan[:-1] + filler)[:steps]


@pytest.fixture(scope="module")
def alfworld(tmp_path_factory, alfworld_data_dir) -> Iterator[dict[str, Any]]:
    """A controller with three workers: ``alfworld`` (new_std, ``on_invalid_action="end"``), ``alfworld-train``
    and ``alfworld-feedback`` (the default rule, AgentBench-FC's)."""
    require_engine()
    data = str(alfworld_data_dir)
    with EnvServers(tmp_path_factory.mktemp("alfworld")) as servers:
        controller = servers.controller()
        workers = {
            "alfworld": servers.worker(
                controller,
                ALFWORLD_TASK,
                name="alfworld",
                task_kwargs={"data_dir": data, "on_invalid_action": "end"},
            ),
            "alfworld-train": servers.worker(
                controller,
                ALFWORLD_TASK,
                name="alfworld-train",
                task_kwargs={
                    "data_dir": data,
                    "split": "train",
                    "name": "alfworld-train",
                    "on_invalid_action": "end",
                },
            ),
            "alfworld-feedback": servers.worker(
                controller,
                ALFWORLD_TASK,
                name="alfworld-feedback",
                task_kwargs={"data_dir": data, "name": "alfworld-feedback"},  # the default rule
            ),
        }
        for task in workers:
            servers.wait_routable(controller, task, timeout_s=90)
        yield {"controller": controller, "workers": workers, "data_dir": alfworld_data_dir}


# The engine's expert plans (TextWorld's PDDL planner, ``GameProcess.plan()``) of the smallest
# new_std game of every task type, as the planner printed them (checked live for #7 below). The
# planner finds no plan for some pick_two_obj games (#100, #101): #97 is used instead.
PLANS: dict[int, list[str]] = {
    7: [
        "go to countertop 1",
        "take soapbottle 3 from countertop 1",
        "go to toilet 1",
        "put soapbottle 3 in/on toilet 1",
    ],
    11: [
        "go to countertop 3",
        "take spatula 1 from countertop 3",
        "go to sinkbasin 1",
        "clean spatula 1 with sinkbasin 1",
        "go to drawer 1",
        "open drawer 1",
        "put spatula 1 in/on drawer 1",
    ],
    22: [
        "go to sinkbasin 1",
        "take tomato 2 from sinkbasin 1",
        "go to microwave 1",
        "heat tomato 2 with microwave 1",
        "go to garbagecan 1",
        "put tomato 2 in/on garbagecan 1",
    ],
    52: [
        "go to countertop 3",
        "take bread 1 from countertop 3",
        "go to fridge 1",
        "cool bread 1 with fridge 1",
        "go to countertop 2",
        "put bread 1 in/on countertop 2",
    ],
    87: ["go to garbagecan 1", "take cd 2 from garbagecan 1", "go to desk 1", "use desklamp 1"],
    97: [
        "go to countertop 1",
        "take soapbar 2 from countertop 1",
        "go to cabinet 1",
        "open cabinet 1",
        "put soapbar 2 in/on cabinet 1",
        "go to sinkbasin 1",
        "take soapbar 1 from sinkbasin 1",
        "go to cabinet 1",
        "put soapbar 1 in/on cabinet 1",
    ],
}


@pytest.fixture(scope="module")
def sample(alfworld) -> dict[int, list[str]]:
    """One ``new_std`` game of every task type -> the engine's expert plan for it."""
    split = load_split("new_std", alfworld["data_dir"])
    assert sorted(split.game(i).task_type for i in PLANS) == sorted(TASK_TYPES)
    return PLANS


def test_engine_expert_plan_is_the_planners_on_cpu(alfworld):
    split = load_split("new_std", alfworld["data_dir"])
    assert expert_plans([split.game(7).file]) == [PLANS[7]]


def test_opening_turn_is_agentbench_fc_on_cpu(alfworld):
    client = RawClient(alfworld["controller"].api)
    game = load_split("new_std", alfworld["data_dir"]).game(7)
    goal = re.search(r"Your task is to: [^\"]*\.", game.file.read_text())
    assert goal is not None
    session, opening = client.start(7)
    assert opening["tools"] == TOOLS and opening["status"] == "running" and not opening["finish"]
    system, user = opening["messages"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    text = user["content"]
    assert text.startswith(
        "Here is your task. You are in the middle of a room. Looking quickly around you, you see "
    )
    assert "Welcome to TextWorld" not in text and text.endswith("\n")
    situation, actions = text.split(" AVAILABLE ACTIONS: ")
    assert situation.endswith("\n" + goal.group(0))
    assert {"look", "inventory", "go to toilet 1"} <= set(actions.splitlines())
    client.cancel(session)


def test_expert_plan_wins_one_game_of_every_type_on_cpu(alfworld, sample):
    client = RawClient(alfworld["controller"].api)
    for index, plan in sample.items():
        assert 0 < len(plan) <= 20, (index, plan)
        session, _ = client.start(index)
        done = client.play(session, plan)
        assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 1.0), (
            index,
            plan,
            done,
        )
        last = done["messages"][-1]
        assert last["role"] == "tool" and last["tool_call_id"] == f"call-{len(plan) - 1}"


def test_wrong_plan_scores_0_on_cpu(alfworld, sample):
    client = RawClient(alfworld["controller"].api)
    for index in list(sample)[:1]:
        session, _ = client.start(index)
        done = client.play(session, wrong_plan(sample[index]))
        assert (done["finish"], done["status"], done["reward"]) == (True, "task limit reached", 0.0), (
            index,
            done,
        )


def test_expert_plan_wins_through_the_controller_client_on_cpu(alfworld, sample):
    index, plan = next(iter(sample.items()))

    def policy(messages: list[dict[str, Any]]) -> dict[str, Any]:
        step = sum(1 for m in messages if m["role"] == "assistant")
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [call({"action": plan[step]}, call_id=f"c{step}")],
        }

    async def play() -> Any:
        async with ControllerClient(alfworld["controller"].api) as client:
            return await play_expert_episode(client, "alfworld", index, policy)

    episode = asyncio.run(play())
    assert (episode.status.value, episode.reward, episode.turns) == ("completed", 1.0, len(plan))


def test_put_and_move_are_the_same_command_in_both_grammars_on_cpu(alfworld, sample):
    api = alfworld["controller"].api
    # a test game (0.2.2 grammar, "put X in/on Y") played with "move X to Y"
    index, plan = next((i, p) for i, p in sample.items() if any(PUT.match(c) for c in p))
    moved = [PUT.sub(r"move \1 to \2", command) for command in plan]
    assert moved != plan
    client = RawClient(api)
    session, _ = client.start(index)
    done = client.play(session, moved)
    assert (done["status"], done["reward"]) == ("completed", 1.0), done
    # a train game (newer grammar, "move X to Y", with a walkthrough) played with "put X in/on Y"
    train = load_split("train", alfworld["data_dir"])
    index = train.indices[0]
    walkthrough = json.loads(train.game(index).file.read_text())["walkthrough"]
    put = [MOVE.sub(r"put \1 in/on \2", command) for command in walkthrough]
    assert put != walkthrough
    client = RawClient(api, task="alfworld-train")
    session, opening = client.start(index)
    assert "move " not in opening["messages"][1]["content"].split(" AVAILABLE ACTIONS: ")[0]
    done = client.play(session, put)
    assert (done["status"], done["reward"]) == ("completed", 1.0), done


@pytest.mark.parametrize(
    ("step", "status"),
    [
        ({"content": "I would go to the desk."}, "agent validation failed"),  # no tool call
        ({"calls": [call({"action": "look"}, name="teleport")]}, "agent invalid action"),
        ({"calls": [call("{not json")]}, "agent validation failed"),
        ({"calls": [call({"action": 3})]}, "agent validation failed"),  # not a string
    ],
    ids=["no-tool-call", "unknown-tool", "bad-json", "not-a-string"],
)
def test_invalid_steps_end_with_documented_status_on_cpu(alfworld, step, status):
    client = RawClient(alfworld["controller"].api)
    session, _ = client.start(7)
    answer = client.step(session, *step.get("calls", []), content=step.get("content"))
    assert (answer["finish"], answer["status"], answer["reward"]) == (True, status, 0.0), answer


def test_same_action_three_times_from_step_four_ends_the_episode_on_cpu(alfworld):
    client = RawClient(alfworld["controller"].api)
    session, _ = client.start(7)
    for number in range(3):
        assert client.act(session, "look", number)["status"] == "running"
    last = client.act(session, "look", 3)
    assert (last["finish"], last["status"], last["reward"]) == (True, "agent invalid action", 0.0)


def test_default_rule_answers_like_agentbench_fc_on_cpu(alfworld, sample):
    index, plan = next(iter(sample.items()))
    client = RawClient(alfworld["controller"].api, task="alfworld-feedback")
    session, _ = client.start(index)
    answer = client.step(session, content="no tool call here")
    # AgentBench-FC's alfworld task answers a turn without a tool call with this user message
    assert NO_TOOL_CALL == "No executable tool calls found. Please call a tool instead"
    assert answer["status"] == "running" and answer["messages"] == [{"role": "user", "content": NO_TOOL_CALL}]
    answer = client.step(session, call("{not json"))
    assert answer["status"] == "running" and answer["messages"] == [
        {"role": "user", "content": BAD_TOOL_CALL}
    ]
    # any tool name is played, as in AgentBench; the game is won, and the status stays the last problem's
    first = client.step(session, call({"action": plan[0]}, name="whatever", call_id="w"))
    assert first["status"] == "running" and first["messages"][0]["tool_call_id"] == "w"
    done = client.play(session, plan[1:])
    assert (done["finish"], done["status"], done["reward"]) == (True, "agent invalid action", 1.0), done
    # each turn without a tool call counts against the 20-step limit
    session, _ = client.start(index)
    for _ in range(19):
        assert client.step(session, content="no tool call here")["status"] == "running"
    last = client.step(session, content="no tool call here")
    assert (last["finish"], last["status"], last["reward"]) == (True, "task limit reached", 0.0), last


def _game_processes(worker: ServerProcess) -> set[int]:
    """The worker's game processes: children of its zygote (the worker's own child)."""
    children = {pid for pid in descendants(worker.pid) if _parent(pid) == worker.pid}
    return {pid for zygote in children for pid in descendants(zygote)}


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def test_dead_game_process_is_task_error_and_worker_keeps_serving_on_cpu(alfworld):
    worker = alfworld["workers"]["alfworld"]
    client = RawClient(alfworld["controller"].api)
    before = _game_processes(worker)
    session, _ = client.start(7)
    started = wait_until(lambda: _game_processes(worker) - before, what="the session's game process")
    for pid in started:
        os.kill(pid, signal.SIGKILL)
    answer = client.act(session, "look")
    assert (answer["finish"], answer["status"]) == (True, "task error"), answer
    session, _ = client.start(7)  # the worker keeps serving
    assert client.act(session, "inventory")["status"] == "running"
    client.cancel(session)
    wait_until(lambda: not (_game_processes(worker) - before), what="the cancelled game's process to exit")


def test_workers_are_healthy_after_everything_on_cpu(alfworld):
    listed = list_workers(alfworld["controller"].api)
    for task in alfworld["workers"]:
        assert len(listed[task]) == 1 and listed[task][0]["healthy"], listed[task]
        assert listed[task][0]["open_sessions"] == 0, listed[task]
