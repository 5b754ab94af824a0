"""The knowledge graph the tools query: variables as programs, and the in-memory backend.

A *variable* is what AgentBench's KG API calls one: a typed program over the graph, built by the
tools and executed only when needed (relations, attributes, the final answer). Programs are
AgentBench's S-expressions as nested tuples:

| program | meaning |
|---|---|
| ``"m.country_fr"`` | one entity |
| ``("JOIN", relation, p)`` | every object ``o`` with ``s relation o`` for ``s`` in ``p`` (``get_neighbors``) |
| ``("AND", p, q)`` | ``p`` ∩ ``q`` (``intersection``) |
| ``("ARGMAX", p, attribute)`` / ``("ARGMIN", ...)`` | the member of ``p`` with the largest / smallest value (``argmax``/``argmin``) |
| ``("COUNT", p)`` | the number of members of ``p``, as a string (``count``) |

:class:`Backend` is what a graph offers the tools; :class:`InMemoryGraph` is the offline graph
(:mod:`.offline` builds it), :class:`~envs.kg.sparql.SparqlBackend` a Freebase endpoint.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol, Union

Program = Union[str, tuple]  # noqa: UP007 (a recursive alias; tuples hold programs and names)


def render(program: Program) -> str:
    """The S-expression text of ``program`` (logs, errors)."""
    if isinstance(program, str):
        return program
    return "(" + " ".join(render(part) for part in program) + ")"


@dataclass(frozen=True)
class Variable:
    """A typed program; ``type`` is the range of the last relation (or ``type.int`` for a count)."""

    type: str
    program: Program


class Backend(Protocol):
    """What the tools need from a knowledge graph (sync; the task runs it off the event loop)."""

    def is_entity(self, name: str) -> bool:
        """Whether ``name`` is an entity id of this graph."""

    def relations(self, program: Program) -> list[str]:
        """Relations leaving any member of ``program`` (sorted)."""

    def attributes(self, program: Program) -> list[str]:
        """Numeric attributes of any member of ``program`` (sorted)."""

    def range_type(self, relation: str) -> str:
        """The type of a relation's objects."""

    def execute(self, program: Program) -> list[str]:
        """The members of ``program`` (entity ids, or one number for a count)."""


@dataclass
class InMemoryGraph:
    """Entities with names and types, typed relations (every one with its inverse) and numeric attributes."""

    names: dict[str, str] = field(default_factory=dict)
    """entity id -> name"""
    types: dict[str, str] = field(default_factory=dict)
    """entity id -> type"""
    edges: dict[str, dict[str, set[str]]] = field(default_factory=lambda: defaultdict(dict))
    """relation -> subject -> objects"""
    ranges: dict[str, str] = field(default_factory=dict)
    """relation -> type of its objects"""
    values: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    """attribute -> entity -> value"""
    inverses: dict[str, str] = field(default_factory=dict)
    """relation -> its inverse"""
    out_relations: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    out_attributes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def __post_init__(self) -> None:
        self._members = lru_cache(maxsize=4096)(self._evaluate)

    # -- building ----------------------------------------------------------------------

    def add_entity(self, entity: str, name: str, type_: str) -> str:
        self.names[entity] = name.strip()
        self.types[entity] = type_
        return entity

    def declare(self, relation: str, inverse: str | None, domain: str, range_: str) -> None:
        """A relation from ``domain`` to ``range_``; ``inverse`` (None: symmetric) goes back."""
        self.ranges[relation] = range_
        self.ranges[inverse or relation] = domain
        self.inverses[relation] = inverse or relation
        self.inverses[inverse or relation] = relation

    def link(self, subject: str, relation: str, obj: str) -> None:
        """``subject relation obj`` and its inverse."""
        for s, r, o in ((subject, relation, obj), (obj, self.inverses[relation], subject)):
            self.edges[r].setdefault(s, set()).add(o)
            self.out_relations[s].add(r)

    def set_value(self, entity: str, attribute: str, value: float) -> None:
        self.values[attribute][entity] = float(value)
        self.out_attributes[entity].add(attribute)

    # -- Backend -----------------------------------------------------------------------

    def is_entity(self, name: str) -> bool:
        return name in self.types

    def relations(self, program: Program) -> list[str]:
        found: set[str] = set()
        for member in self.members(program):
            found |= self.out_relations.get(member, set())
        return sorted(found)

    def attributes(self, program: Program) -> list[str]:
        found: set[str] = set()
        for member in self.members(program):
            found |= self.out_attributes.get(member, set())
        return sorted(found)

    def range_type(self, relation: str) -> str:
        return self.ranges[relation]

    def execute(self, program: Program) -> list[str]:
        return sorted(self.members(program))

    def members(self, program: Program) -> frozenset[str]:
        """The set ``program`` denotes (cached: programs are immutable)."""
        return self._members(program)

    def _evaluate(self, program: Program) -> frozenset[str]:
        if isinstance(program, str):
            return frozenset([program]) if program in self.types else frozenset()
        op = program[0]
        if op == "JOIN":
            subjects = self.edges.get(program[1], {})
            found: set[str] = set()
            for member in self.members(program[2]):
                found |= subjects.get(member, set())
            return frozenset(found)
        if op == "AND":
            return self.members(program[1]) & self.members(program[2])
        if op in ("ARGMAX", "ARGMIN"):
            values = self.values.get(program[2], {})
            scored = [(values[m], m) for m in self.members(program[1]) if m in values]
            if not scored:
                return frozenset()
            best = max(v for v, _ in scored) if op == "ARGMAX" else min(v for v, _ in scored)
            # AgentBench's SPARQL takes one row (ORDER BY ... LIMIT 1); ties go to the smallest id here
            return frozenset([min(m for v, m in scored if v == best)])
        if op == "COUNT":
            return frozenset([str(len(self.members(program[1])))])
        raise ValueError(f"unknown program operator {op!r} in {render(program)}")
