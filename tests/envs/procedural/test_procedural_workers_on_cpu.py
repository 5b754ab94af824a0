"""The procedural tasks through the real controller -> worker path (processes on 127.0.0.1).

One controller, one worker per task serving the held-out ``test`` split: the expert solves every
sampled test index, random valid play ends with the documented statuses and rewards, invalid
steps end the sample as AgentRL does, and the workers keep serving after all of it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import httpx
import pytest
from agentrl_ext.envs.procedural import TRAIN_START, tool_call_message

from agentrl_ext.data.expert import (
    expert_policy,
    has_careless_action,
    noisy_policy,
    play_expert_episode,
    play_expert_episodes,
)
from agentrl_ext.env.client import ControllerClient
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.testing.env_servers import EnvServers

TASKS = {
    "guess": "agentrl_ext.envs.guess.task:GuessTask",
    "calc": "agentrl_ext.envs.calc.task:CalcTask",
    "gridroom": "agentrl_ext.envs.gridroom.task:GridRoomTask",
}
NUM_TEST = 100


def random_step(task: str, rng: random.Random, step: int) -> dict:
    """A random valid tool call of ``task``."""
    if task == "guess":
        return tool_call_message("guess", {"number": rng.randint(1, 16)}, step)
    if task == "calc":
        if rng.random() < 0.2:
            return tool_call_message("answer", {"value": rng.randint(-50, 500)}, step)
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        return tool_call_message("calculator", {"expression": f"{a} {rng.choice('+-*')} {b}"}, step)
    return tool_call_message("move", {"direction": rng.choice(["up", "down", "left", "right"])}, step)


@pytest.fixture(scope="module")
def controller_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A controller with one ``test``-split worker per procedural task."""
    with EnvServers(tmp_path_factory.mktemp("procedural")) as servers:
        controller = servers.controller()
        for name, spec in TASKS.items():
            servers.worker(controller, spec, name=name, task_kwargs={"split": "test", "num_test": NUM_TEST})
        for name in TASKS:
            servers.wait_routable(controller, name)
        yield controller.api


def start(api: str, task: str, index: int) -> tuple[int, dict]:
    answer = httpx.post(f"{api}/start_sample", json={"name": task, "index": index}, timeout=10)
    assert answer.status_code == 200, answer.text
    return int(answer.headers["session_id"]), answer.json()


def interact(api: str, session_id: int, message: dict) -> dict:
    answer = httpx.post(
        f"{api}/interact", json={"messages": [message]}, headers={"session_id": str(session_id)}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("task", list(TASKS))
def test_workers_advertise_the_test_split_on_cpu(controller_api, task):
    assert httpx.get(f"{controller_api}/get_indices", params={"name": task}).json() == list(range(NUM_TEST))
    refused = httpx.post(f"{controller_api}/start_sample", json={"name": task, "index": TRAIN_START})
    assert refused.status_code == 400 and "is not an index" in refused.json()["detail"]


@pytest.mark.parametrize("task", list(TASKS))
async def test_expert_solves_sampled_test_indices_through_the_controller_on_cpu(controller_api, task):
    indices = random.Random(task).sample(range(NUM_TEST), 25)
    episodes = await play_expert_episodes(controller_api, task, indices, concurrency=5)
    assert [(e.status, e.reward) for e in episodes] == [(SampleStatus.COMPLETED, 1.0)] * len(indices)
    first = episodes[0]
    assert first.messages[0]["role"] == "user" and first.tools and first.tools[0]["type"] == "function"
    assert first.messages[1]["tool_calls"][0]["function"]["name"] == first.tools[0]["function"]["name"]
    json.dumps([e.messages for e in episodes])  # plain JSON, ready to be SFT rows


@pytest.mark.parametrize("task", list(TASKS))
def test_random_play_ends_completed_or_at_the_turn_limit_on_cpu(controller_api, task):
    rng = random.Random(0)
    seen = set()
    for index in range(12):
        session_id, answer = start(controller_api, task, index)
        step = 0
        while not answer["finish"]:
            answer = interact(controller_api, session_id, random_step(task, rng, step))
            step += 1
        status, reward = answer["status"], answer["reward"]
        seen.add(status)
        assert status in (SampleStatus.COMPLETED.value, SampleStatus.TASK_LIMIT_REACHED.value)
        assert reward in ((0.0, 1.0) if status == SampleStatus.COMPLETED.value else (0.0,))
        assert step <= {"guess": 6, "calc": 5, "gridroom": 8}[task]
    assert SampleStatus.TASK_LIMIT_REACHED.value in seen


INVALID_STEPS = [
    ({"role": "assistant", "content": "I guess 8."}, SampleStatus.AGENT_VALIDATION_FAILED),
    (tool_call_message("shout", {"text": "8"}, 0), SampleStatus.AGENT_INVALID_ACTION),
]


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize(("step", "status"), INVALID_STEPS)
def test_invalid_steps_end_the_sample_with_reward_0_on_cpu(controller_api, task, step, status):
    session_id, _ = start(controller_api, task, 1)
    answer = interact(controller_api, session_id, step)
    assert (answer["finish"], answer["status"], answer["reward"]) == (True, status.value, 0.0)
    assert answer["error"]


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("malformed", ["wrong type", "not JSON"])
def test_bad_arguments_of_a_known_tool_fail_validation_on_cpu(controller_api, task, malformed):
    name, key = {
        "guess": ("guess", "number"),
        "calc": ("answer", "value"),
        "gridroom": ("move", "direction"),
    }[task]
    step = tool_call_message(name, {key: [1, 2]}, 0)
    if malformed == "not JSON":
        step["tool_calls"][0]["function"]["arguments"] = '{"' + key + '": '
    session_id, _ = start(controller_api, task, 2)
    answer = interact(controller_api, session_id, step)
    assert (answer["status"], answer["reward"]) == (SampleStatus.AGENT_VALIDATION_FAILED.value, 0.0)
    assert (key if malformed == "wrong type" else "not valid JSON") in answer["error"]


async def test_workers_keep_serving_after_invalid_and_cancelled_sessions_on_cpu(controller_api):
    async with ControllerClient(controller_api) as client:
        for task in TASKS:
            abandoned = await client.start_sample(task, 3)
            await client.cancel(abandoned.session_id)
            episode = await play_expert_episode(client, task, 3)
            assert (episode.status, episode.reward) == (SampleStatus.COMPLETED, 1.0)
        workers = await client.list_workers()
        assert all(w.healthy for task in TASKS for w in workers[task])


@pytest.mark.parametrize("task", ["guess", "gridroom"])
async def test_careless_expert_is_seeded_per_index_and_deviates_at_its_rate_on_cpu(controller_api, task):
    indices = list(range(20))
    clean = await play_expert_episodes(controller_api, task, indices, concurrency=5)
    careful = await play_expert_episodes(controller_api, task, indices, concurrency=5, epsilon=0.0, seed=3)
    assert [e.messages for e in careful] == [e.messages for e in clean]
    noisy = await play_expert_episodes(controller_api, task, indices, concurrency=5, epsilon=0.5, seed=3)
    again = await play_expert_episodes(controller_api, task, indices, concurrency=1, epsilon=0.5, seed=3)
    other = await play_expert_episodes(controller_api, task, indices, concurrency=5, epsilon=0.5, seed=4)
    assert [e.messages for e in noisy] == [e.messages for e in again]  # any concurrency, same episodes
    assert [e.messages for e in noisy] != [e.messages for e in other]
    # every turn of a careless episode: the expert's move on that history, or a random one
    expert, deviations, turns = expert_policy(task), 0, 0
    for episode in noisy:
        for position, message in enumerate(episode.messages):
            if message["role"] != "assistant":
                continue
            turns += 1
            call = message["tool_calls"][0]["function"]
            arguments = json.loads(call["arguments"])
            if call != expert(episode.messages[:position])["tool_calls"][0]["function"]:
                deviations += 1
            if task == "guess":
                assert 1 <= arguments["number"] <= 16
            else:
                assert arguments["direction"] in ("up", "down", "left", "right")
    # a random move equals the expert's one time in 16 (guess) or 4 (gridroom): deviations ~ 0.5 * 15/16 or 3/4
    assert 0.2 < deviations / turns < 0.7, (deviations, turns)
    assert all(e.status in (SampleStatus.COMPLETED, SampleStatus.TASK_LIMIT_REACHED) for e in noisy)


def test_careless_expert_refuses_a_task_without_random_moves_and_bad_rates_on_cpu():
    with pytest.raises(ValueError, match="random_action"):
        noisy_policy("calc", 0.3, random.Random(0))
    with pytest.raises(ValueError, match="epsilon"):
        noisy_policy("guess", 1.5, random.Random(0))
    assert noisy_policy("calc", 0.0, random.Random(0)) is not None  # epsilon 0: the expert itself
    assert (
        has_careless_action("guess") and has_careless_action("gridroom") and not has_careless_action("calc")
    )
    assert has_careless_action("guess", "habit") and not has_careless_action("gridroom", "habit")
    with pytest.raises(ValueError, match="habit_action"):
        noisy_policy("gridroom", 0.3, random.Random(0), "habit")


async def test_careless_habit_plays_the_top_of_the_range_or_the_expert_on_cpu(controller_api):
    indices = list(range(20))
    noisy = await play_expert_episodes(controller_api, "guess", indices, epsilon=0.5, seed=3, move="habit")
    expert, habits, turns = expert_policy("guess"), 0, 0
    for episode in noisy:
        for position, message in enumerate(episode.messages):
            if message["role"] != "assistant":
                continue
            turns += 1
            number = json.loads(message["tool_calls"][0]["function"]["arguments"])["number"]
            expert_number = json.loads(
                expert(episode.messages[:position])["tool_calls"][0]["function"]["arguments"]
            )["number"]
            # the worker's guess range is 1..16: a careless turn guesses 16, every other the expert's number
            assert number in (16, expert_number), (number, expert_number)
            habits += number == 16 != expert_number
    assert 0.2 < habits / turns < 0.7, (habits, turns)
