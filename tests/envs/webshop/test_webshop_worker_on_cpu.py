"""webshop through the real controller -> worker path, driven by the raw AgentRL protocol.

Buying each test goal's own product with its goal options scores 1 (except where WebShop's own
option matching cannot, see ``colour_glued``); a wrong product scores below 1; invalid clicks
leave the page as it was; invalid steps end with the documented statuses; the worker keeps serving.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from webshop_helpers import WEBSHOP_TASK, RawClient, available_actions, call, colour_glued

from agentrl_ext.env.client import ControllerClient
from agentrl_ext.testing.env_servers import EnvServers, list_workers
from envs.webshop.catalogue import Catalogue
from envs.webshop.goals import Goal, split_goals
from envs.webshop.prompts import SYSTEM_PROMPT, TOOLS


@pytest.fixture(scope="module")
def webshop(tmp_path_factory, webshop_data_dir: Path) -> Iterator[RawClient]:
    """A raw client of a controller with one webshop worker (test split)."""
    with EnvServers(tmp_path_factory.mktemp("webshop")) as servers:
        controller = servers.controller()
        servers.worker(
            controller,
            WEBSHOP_TASK,
            name="webshop",
            task_kwargs={"data_dir": str(webshop_data_dir), "on_invalid_action": "end"},
        )
        servers.wait_routable(controller, "webshop", timeout_s=120)
        yield RawClient(controller.api)


@pytest.fixture(scope="module")
def test_goals(catalogue: Catalogue) -> list[Goal]:
    return split_goals(catalogue, "test")


def buy(client: RawClient, session: str, name: str, asin: str, options: tuple[str, ...]) -> dict[str, Any]:
    """Search the product by its title, open it, select ``options``, buy."""
    results = client.search(session, re.sub(r"[\[\]]", " ", name))  # "[...]" would end the action
    assert results["status"] == "running", results
    assert asin.lower() in available_actions(results)["clickables"], (asin, results)
    item = client.click(session, asin.lower())
    for value in options:
        assert value in available_actions(item)["clickables"], (value, item)
        item = client.click(session, value)
    return client.click(session, "Buy Now")


def test_opening_turn_is_agentbench_fc_on_cpu(webshop: RawClient, test_goals: list[Goal]):
    session, opening = webshop.start(0)
    assert opening["tools"] == TOOLS and opening["status"] == "running" and not opening["finish"]
    system, user = opening["messages"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert SYSTEM_PROMPT.startswith("\nYou are web shopping.\n")
    assert user == {
        "role": "user",
        "content": f"The initial observation:\nWebShop [SEP] Instruction: [SEP] {test_goals[0].instruction_text}"
        " [SEP] Search\n\nAvailable Actions:\n{'has_search_bar': True, 'clickables': ['search']}",
    }
    answer = webshop.search(session, "shoes")
    (tool,) = answer["messages"]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call-0"
    assert tool["content"].startswith("Action: search[shoes]\n\nObservation:\nInstruction: [SEP] ")
    assert (
        "\n\nAvailable Actions:\n{'has_search_bar': False, 'clickables': ['back to search', 'next >', "
        in (tool["content"])
    )
    webshop.cancel(session)


def test_buying_the_goals_own_product_scores_1_on_cpu(
    webshop: RawClient, test_goals: list[Goal], catalogue: Catalogue
):
    full, glued = 0, 0
    for index, goal in enumerate(test_goals):
        session, _ = webshop.start(index)
        done = buy(webshop, session, catalogue.by_asin[goal.asin].name, goal.asin, goal.option_values)
        assert done["finish"] and done["status"] == "completed", (index, done)
        quirk = goal.kind == "synthetic" and any(colour_glued(v) for v in goal.option_values)
        if quirk:
            assert done["reward"] < 1.0, (index, goal, done)
            glued += 1
        else:
            assert done["reward"] == 1.0, (index, goal, done)
            full += 1
    assert full >= 150 and full + glued == len(test_goals)
    assert any(g.kind == "human" for g in test_goals)


def test_wrong_purchases_score_below_1_on_cpu(
    webshop: RawClient, test_goals: list[Goal], catalogue: Catalogue
):
    for index, goal in enumerate(test_goals[:10]):
        other = next(g for g in test_goals if g.asin != goal.asin and g.query != goal.query)
        session, _ = webshop.start(index)
        done = buy(webshop, session, catalogue.by_asin[other.asin].name, other.asin, other.option_values)
        assert done["status"] == "completed" and done["reward"] < 1.0, (index, done)
    # the right product without its options: attributes and price only
    index, goal = next((i, g) for i, g in enumerate(test_goals) if len(g.goal_options) == 2)
    session, _ = webshop.start(index)
    done = buy(webshop, session, catalogue.by_asin[goal.asin].name, goal.asin, ())
    n = len(goal.attributes)
    assert done["reward"] == pytest.approx((n + 1) / (n + 2 + 1)), done


def test_invalid_clicks_leave_the_page_as_it_was_on_cpu(webshop: RawClient):
    session, opening = webshop.start(1)
    page = opening["messages"][1]["content"].removeprefix("The initial observation:\n")
    for value in ("no such button", "search", "Buy Now"):
        answer = webshop.click(session, value)
        assert (answer["finish"], answer["status"], answer["reward"]) == (False, "running", 0.0), answer
        assert answer["messages"][0]["content"] == f"Action: click[{value}]\n\nObservation:\n{page}"
    results = webshop.search(session, "tea")
    again = webshop.click(session, "< prev")  # no "< Prev" on the first results page
    assert again["status"] == "running"
    assert (
        again["messages"][0]["content"].split("Observation:\n", 1)[1]
        == (results["messages"][0]["content"].split("Observation:\n", 1)[1])
    )
    assert webshop.click(session, "back to search")["status"] == "running"
    webshop.cancel(session)


@pytest.mark.parametrize(
    ("step", "status"),
    [
        ({"content": "I would buy the red one."}, "agent validation failed"),  # no tool call
        ({"calls": [call("add_to_cart", {"value": "x"})]}, "agent invalid action"),
        ({"calls": [call("click_action", "{not json")]}, "agent validation failed"),
        ({"calls": [call("search_action", "[1, 2]")]}, "agent validation failed"),  # not an object
        ({"calls": [call("search_action", {})]}, "agent validation failed"),  # no keywords
    ],
    ids=["no-tool-call", "unknown-tool", "bad-json", "not-an-object", "no-argument"],
)
def test_invalid_steps_end_with_documented_status_on_cpu(webshop: RawClient, step, status):
    session, _ = webshop.start(2)
    answer = webshop.step(session, *step.get("calls", []), content=step.get("content"))
    assert (answer["finish"], answer["status"], answer["reward"]) == (True, status, 0.0), answer
    session, _ = webshop.start(2)  # the worker keeps serving
    assert webshop.search(session, "shoes")["status"] == "running"
    webshop.cancel(session)


def test_only_the_first_call_of_a_step_runs_on_cpu(webshop: RawClient):
    session, _ = webshop.start(3)
    answer = webshop.step(
        session, call("search_action", {"keywords": "tea"}, "a"), call("click_action", {"value": "x"}, "b")
    )
    first, second = answer["messages"]
    assert (first["tool_call_id"], second["tool_call_id"]) == ("a", "b")
    assert second["content"].startswith("Not executed") and first["content"].startswith("Action: search[tea]")
    webshop.cancel(session)


def test_turn_limit_ends_with_task_limit_reached_on_cpu(webshop: RawClient):
    session, _ = webshop.start(4)
    for _ in range(19):
        assert webshop.click(session, "nothing")["status"] == "running"
    last = webshop.click(session, "nothing")
    assert (last["finish"], last["status"], last["reward"]) == (True, "task limit reached", 0.0)
    assert last["messages"] == [{"role": "tool", "tool_call_id": "call-0", "content": "Task limit reached."}]


def test_worker_is_healthy_after_everything_on_cpu(webshop: RawClient):
    workers = list_workers(webshop.api)["webshop"]
    assert len(workers) == 1 and workers[0]["healthy"] and workers[0]["open_sessions"] == 0


def test_the_trainers_client_plays_through_the_controller_on_cpu(
    webshop: RawClient, test_goals: list[Goal], catalogue: Catalogue
):
    """The same path with ``ControllerClient`` (what the agent loop uses), and the summary."""
    index = next(i for i, g in enumerate(test_goals) if g.kind == "human")
    goal = test_goals[index]

    def tool_call(name: str, argument: str) -> list[dict[str, Any]]:
        key = "keywords" if name == "search_action" else "value"
        return [{"role": "assistant", "content": None, "tool_calls": [call(name, {key: argument})]}]

    async def play() -> tuple[float, Any]:
        async with ControllerClient(webshop.api) as client:
            session_id = (await client.start_sample("webshop", index)).session_id
            await client.interact(session_id, tool_call("search_action", catalogue.by_asin[goal.asin].name))
            await client.interact(session_id, tool_call("click_action", goal.asin.lower()))
            for value in goal.option_values:
                await client.interact(session_id, tool_call("click_action", value))
            done = await client.interact(session_id, tool_call("click_action", "Buy Now"))
            assert done.finish and done.status == "completed"
            return done.reward, await client.get_indices("webshop")

    reward, indices = asyncio.run(play())
    assert reward == 1.0 and list(indices) == list(range(len(test_goals)))


def test_default_rule_answers_like_agentbench_fc_and_counts_rounds_on_cpu(tmp_path, webshop_data_dir: Path):
    kwargs = {"data_dir": str(webshop_data_dir), "limit": 5}  # the default rule, AgentBench-FC's
    with EnvServers(tmp_path) as servers:
        controller = servers.controller()
        servers.worker(controller, WEBSHOP_TASK, task_kwargs=kwargs)
        servers.wait_routable(controller, "webshop", timeout_s=120)
        client = RawClient(controller.api)
        session, _ = client.start(0)
        answer = client.step(session, content="Let me think.")
        assert answer["status"] == "running"
        assert answer["messages"] == [
            {
                "role": "user",
                "content": "Observation:\nNo executable tool calls found! You should call a tool instead.\n\n"
                "Available Actions:\n{'has_search_bar': True, 'clickables': ['search']}",
            }
        ]
        answer = client.step(session, call("add_to_cart", {"value": "x"}))
        assert answer["status"] == "running"
        assert answer["messages"][0] == {
            "role": "tool",
            "tool_call_id": "call-0",
            "content": "No valid tool call found from agent.",
        }
        assert answer["messages"][1]["content"].startswith("Observation:\nWebShop [SEP] Instruction: [SEP] ")
        assert client.search(session, "shoes")["status"] == "running"
        client.cancel(session)
        # each turn without a tool call counts against the 20-round limit
        session, _ = client.start(1)
        for _ in range(19):
            assert client.step(session, content="Let me think.")["status"] == "running"
        last = client.step(session, content="Let me think.")
        assert (last["finish"], last["status"], last["reward"]) == (True, "task limit reached", 0.0), last
        with pytest.raises(AssertionError, match="index 5 is not an index of task 'webshop'"):
            client.start(5)  # limit=5: five goals
