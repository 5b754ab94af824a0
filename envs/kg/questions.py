"""KG questions: generated on the offline graph, or AgentBench's own (Freebase) from the data directory.

Both kinds are :class:`KGQuestion` records shaped like AgentBench's ``std.json`` rows: the
question, the entities named in it (name -> id), the gold action sequence in AgentBench's
notation (``get_neighbors(#0,location.country.capital)``) and the answer records
(``{"answer_type": "Entity", "answer_argument": id, "entity_name": name}`` or
``{"answer_type": "Value", "answer_argument": "3"}``).

Generated questions come in AgentBench's (GrailQA's) styles: relation chains of one to three
hops, intersections of two paths, superlatives (argmax/argmin over a numeric attribute) and
counts. Their answers are computed on the graph's own tables (:class:`_Plan`), not by the tools.
Every template enumerates all its anchors in a fixed order; ``split_questions`` shuffles each
template's questions with the seed and deals them round-robin, so every split mixes all styles:
``test`` takes the first ``test_size`` (150, as AgentBench's kg-std), ``dev`` the next
``dev_size`` (50), ``train`` the rest. Same seed and package data, same splits.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl_ext.env.data_files import DataError, require

from .graph import InMemoryGraph
from .offline import CITY, CONTINENT, COUNTRY, CURRENCY, GROUP, PERIOD, SERIES, US_STATE

MAX_ANSWERS = 20
"""Entity answers larger than this are not asked (AgentBench's answers are small sets)."""

AGENTBENCH_DIR = "agentbench/knowledgegraph"
AGENTBENCH_SPLITS = {"std": "std.json", "dev": "dev.json", "train": "kg_rl_all.json"}
AGENTBENCH_ALIASES = {"test": "std", "standard": "std", "env_train": "train"}
OFFLINE_SPLITS = ("test", "dev", "train")


@dataclass(frozen=True)
class KGQuestion:
    """One question with its entities, gold actions and gold answers."""

    qid: str
    question: str
    entities: dict[str, str]
    actions: tuple[str, ...]
    answer: tuple[dict[str, Any], ...]
    template: str

    @property
    def gold(self) -> frozenset[str]:
        """The answer set the reward compares with (AgentBench: the ``answer_argument`` values)."""
        return frozenset(str(a["answer_argument"]) for a in self.answer)


def parse_question(row: dict[str, Any], where: str) -> KGQuestion:
    """A KGQuestion from an AgentBench-format row; DataError naming ``where`` when malformed."""
    try:
        return KGQuestion(
            qid=str(row.get("qid", where)),
            question=str(row["question"]),
            entities={str(k): str(v) for k, v in row["entities"].items()},
            actions=tuple(row.get("actions", ())),
            answer=tuple(row["answer"]),
            template=str(row.get("source", "agentbench")),
        )
    except (KeyError, AttributeError, TypeError) as exc:
        raise DataError(f"{where}: malformed KG question ({type(exc).__name__}: {exc})") from exc


def load_agentbench_split(split: str, data_dir: str | Path | None = None) -> tuple[str, list[KGQuestion]]:
    """AgentBench's KG questions (Freebase ids): ``std`` (150), ``dev`` (20), ``train`` (1,214)."""
    canonical = AGENTBENCH_ALIASES.get(split, split)
    if canonical not in AGENTBENCH_SPLITS:
        raise ValueError(
            f"unknown AgentBench KG split {split!r}; expected one of "
            f"{sorted(AGENTBENCH_SPLITS) + sorted(AGENTBENCH_ALIASES)}"
        )
    path = require(f"{AGENTBENCH_DIR}/{AGENTBENCH_SPLITS[canonical]}", data_dir)
    rows = json.loads(path.read_text(encoding="utf-8"))
    return canonical, [parse_question(row, f"{path}[{n}]") for n, row in enumerate(rows)]


# ---------------------------------------------------------------------------- generation


class _Plan:
    """Writes a gold action sequence while computing its result on the graph's tables."""

    def __init__(self, graph: InMemoryGraph) -> None:
        self.graph = graph
        self.actions: list[str] = []
        self.variables = 0

    def _new(self) -> str:
        self.variables += 1
        return f"#{self.variables - 1}"

    def hop(self, ref: str, members: set[str], relation: str) -> tuple[str, set[str]]:
        self.actions += [f"get_relations({ref})", f"get_neighbors({ref},{relation})"]
        table = self.graph.edges[relation]
        found: set[str] = set()
        for member in members:
            found |= table.get(member, set())
        return self._new(), found

    def intersect(self, a: tuple[str, set[str]], b: tuple[str, set[str]]) -> tuple[str, set[str]]:
        self.actions.append(f"intersection({a[0]},{b[0]})")
        return self._new(), a[1] & b[1]

    def extreme(self, ref: str, members: set[str], attribute: str, largest: bool) -> tuple[str, set[str]]:
        """argmax/argmin; the result is empty unless one member alone has the extreme value (of 2+)."""
        self.actions += [f"get_attributes({ref})", f"{'argmax' if largest else 'argmin'}({ref},{attribute})"]
        values = self.graph.values[attribute]
        scored = sorted(((values[m], m) for m in members if m in values), reverse=largest)
        unique = len(scored) >= 2 and scored[0][0] != scored[1][0]
        return self._new(), {scored[0][1]} if unique else set()

    def count(self, ref: str, members: set[str]) -> tuple[str, set[str]]:
        self.actions.append(f"count({ref})")
        return self._new(), {str(len(members))}


def _of_type(graph: InMemoryGraph, type_: str) -> list[str]:
    return sorted(e for e, t in graph.types.items() if t == type_)


def _question(
    graph: InMemoryGraph, template: str, text: str, entities: list[str], plan: _Plan, result: set[str]
) -> KGQuestion | None:
    """The question, or None when it is not askable (empty or too large answer, ambiguous names)."""
    names = [graph.names[e] for e in entities]
    if not result or len(set(names)) != len(names):
        return None
    counting = plan.actions[-1].startswith("count(")
    if counting:
        if result == {"0"}:
            return None
        answer = tuple({"answer_type": "Value", "answer_argument": v} for v in sorted(result))
    else:
        if len(result) > MAX_ANSWERS:
            return None
        answer = tuple(
            {"answer_type": "Entity", "answer_argument": e, "entity_name": graph.names[e]}
            for e in sorted(result)
        )
    return KGQuestion(
        qid=f"offline-{template}-" + "-".join(e.removeprefix("m.") for e in entities),
        question=text,
        entities=dict(zip(names, entities, strict=True)),
        actions=tuple(plan.actions),
        answer=answer,
        template=template,
    )


Template = Callable[[InMemoryGraph], Iterator["KGQuestion | None"]]


def _one_hop(relation: str, anchor_type: str, text: str, name: str) -> Template:
    def generate(graph: InMemoryGraph) -> Iterator[KGQuestion | None]:
        for anchor in _of_type(graph, anchor_type):
            plan = _Plan(graph)
            _, result = plan.hop(anchor, {anchor}, relation)
            yield _question(graph, name, text.format(graph.names[anchor]), [anchor], plan, result)

    return generate


def _chain(relations: list[str], anchor_type: str, text: str, name: str, then: str | None = None) -> Template:
    """Hops along ``relations``; ``then``: None, ``count``, or ``argmax:ATTR`` / ``argmin:ATTR``."""

    def generate(graph: InMemoryGraph) -> Iterator[KGQuestion | None]:
        for anchor in _of_type(graph, anchor_type):
            plan = _Plan(graph)
            ref, members = anchor, {anchor}
            for relation in relations:
                ref, members = plan.hop(ref, members, relation)
            if then == "count":
                ref, members = plan.count(ref, members)
            elif then is not None:
                kind, attribute = then.split(":")
                ref, members = plan.extreme(ref, members, attribute, kind == "argmax")
            yield _question(graph, name, text.format(graph.names[anchor]), [anchor], plan, members)

    return generate


def _intersection(
    first: tuple[str, str], second: tuple[str, str], text: str, name: str, same_type: bool = False
) -> Template:
    """Two one-hop paths (anchor type, relation) intersected; ``same_type`` takes unordered pairs."""

    def generate(graph: InMemoryGraph) -> Iterator[KGQuestion | None]:
        for a in _of_type(graph, first[0]):
            for b in _of_type(graph, second[0]):
                if same_type and b <= a:
                    continue
                plan = _Plan(graph)
                left = plan.hop(a, {a}, first[1])
                right = plan.hop(b, {b}, second[1])
                _, result = plan.intersect(left, right)
                yield _question(
                    graph, name, text.format(graph.names[a], graph.names[b]), [a, b], plan, result
                )

    return generate


TEMPLATES: dict[str, Template] = {
    # relation chains
    "borders": _one_hop(
        "location.country.borders", COUNTRY, "which countries share a border with {}?", "borders"
    ),
    "continent": _one_hop("location.country.continent", COUNTRY, "which continent is {} on?", "continent"),
    "discovered_in": _one_hop(
        "location.country.elements_discovered",
        COUNTRY,
        "which chemical elements were discovered in {}?",
        "discovered_in",
    ),
    "neighbour_capitals": _chain(
        ["location.country.borders", "location.country.capital"],
        COUNTRY,
        "what are the capitals of the countries that border {}?",
        "neighbour_capitals",
    ),
    "capital_continent": _chain(
        ["location.citytown.capital_of", "location.country.continent"],
        CITY,
        "on which continent is the country whose capital is {}?",
        "capital_continent",
    ),
    "group_discovery_countries": _chain(
        ["chemistry.periodic_table_group.elements", "chemistry.chemical_element.discovered_in"],
        GROUP,
        "in which countries were the elements of {} discovered?",
        "group_discovery_countries",
    ),
    # intersections
    "common_neighbours": _intersection(
        (COUNTRY, "location.country.borders"),
        (COUNTRY, "location.country.borders"),
        "which countries border both {} and {}?",
        "common_neighbours",
        same_type=True,
    ),
    "continent_currency": _intersection(
        (CONTINENT, "location.continent.countries"),
        (CURRENCY, "finance.currency.countries_used"),
        "which countries in {} use the {} as their currency?",
        "continent_currency",
    ),
    "series_period": _intersection(
        (SERIES, "chemistry.chemical_series.elements"),
        (PERIOD, "chemistry.periodic_table_period.elements"),
        "which elements of the series {} are in {} of the periodic table?",
        "series_period",
    ),
    # superlatives
    "largest_city": _chain(
        ["location.country.cities"],
        COUNTRY,
        "what is the most populous city in {}?",
        "largest_city",
        "argmax:location.citytown.population",
    ),
    "northernmost_city": _chain(
        ["location.country.cities"],
        COUNTRY,
        "what is the northernmost city in {}?",
        "northernmost_city",
        "argmax:location.citytown.latitude",
    ),
    "largest_city_in_state": _chain(
        ["location.us_state.cities"],
        US_STATE,
        "what is the most populous city in the state of {}?",
        "largest_city_in_state",
        "argmax:location.citytown.population",
    ),
    "largest_neighbour": _chain(
        ["location.country.borders"],
        COUNTRY,
        "which country bordering {} has the largest area?",
        "largest_neighbour",
        "argmax:location.country.area_km2",
    ),
    "least_populous_in_continent": _chain(
        ["location.continent.countries"],
        CONTINENT,
        "which country in {} has the smallest population?",
        "least_populous_in_continent",
        "argmin:location.country.population",
    ),
    "highest_melting_in_group": _chain(
        ["chemistry.periodic_table_group.elements"],
        GROUP,
        "which element of {} has the highest melting point?",
        "highest_melting_in_group",
        "argmax:chemistry.chemical_element.melting_point",
    ),
    "earliest_in_series": _chain(
        ["chemistry.chemical_series.elements"],
        SERIES,
        "which element of the series {} was discovered first?",
        "earliest_in_series",
        "argmin:chemistry.chemical_element.discovery_year",
    ),
    "heaviest_discovered_in_capital_country": _chain(
        ["location.citytown.capital_of", "location.country.elements_discovered"],
        CITY,
        "which element discovered in the country whose capital is {} has the largest atomic mass?",
        "heaviest_discovered_in_capital_country",
        "argmax:chemistry.chemical_element.atomic_mass",
    ),
    # counts
    "count_borders": _chain(
        ["location.country.borders"], COUNTRY, "how many countries does {} border?", "count_borders", "count"
    ),
    "count_currency_users": _chain(
        ["finance.currency.countries_used"],
        CURRENCY,
        "how many countries use the {}?",
        "count_currency_users",
        "count",
    ),
    "count_period": _chain(
        ["chemistry.periodic_table_period.elements"],
        PERIOD,
        "how many elements are in {}?",
        "count_period",
        "count",
    ),
    "count_capital_neighbours": _chain(
        ["location.citytown.capital_of", "location.country.borders"],
        CITY,
        "how many countries border the country whose capital is {}?",
        "count_capital_neighbours",
        "count",
    ),
    "count_discovered_in": _chain(
        ["location.country.elements_discovered"],
        COUNTRY,
        "how many chemical elements were discovered in {}?",
        "count_discovered_in",
        "count",
    ),
}


def generate_questions(graph: InMemoryGraph) -> dict[str, list[KGQuestion]]:
    """Every askable question of every template, in the templates' fixed enumeration order.

    A text asked about two different entities (two capitals named Kingston) is ambiguous and dropped.
    """
    found = {name: [q for q in template(graph) if q is not None] for name, template in TEMPLATES.items()}
    texts = Counter(q.question for items in found.values() for q in items)
    return {name: [q for q in items if texts[q.question] == 1] for name, items in found.items()}


def split_questions(
    by_template: dict[str, list[KGQuestion]], seed: int, test_size: int = 150, dev_size: int = 50
) -> dict[str, list[KGQuestion]]:
    """Deterministic splits: each template shuffled by ``seed``, dealt round-robin, then cut."""
    rng = random.Random(seed)
    decks = []
    for name in sorted(by_template):
        deck = list(by_template[name])
        rng.shuffle(deck)
        decks.append(deck)
    dealt: list[KGQuestion] = []
    for position in range(max((len(d) for d in decks), default=0)):
        dealt += [deck[position] for deck in decks if position < len(deck)]
    return {
        "test": dealt[:test_size],
        "dev": dealt[test_size : test_size + dev_size],
        "train": dealt[test_size + dev_size :],
    }


__all__ = [
    "KGQuestion",
    "TEMPLATES",
    "generate_questions",
    "load_agentbench_split",
    "parse_question",
    "split_questions",
]
