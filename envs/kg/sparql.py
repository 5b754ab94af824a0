"""A Freebase SPARQL endpoint as the KG task's backend (for AgentBench's own questions).

AgentBench's KG questions (``std``/``dev``/``train`` in the data directory) name Freebase
entities (``m.05t073s``) and relations; answering them needs a Freebase dump served over SPARQL
(AgentBench uses Virtuoso at ``http://localhost:3001/sparql``). None is reachable offline, so
this backend is a configuration option (``sparql_url``) for users who run one.

Variables compile to SPARQL here (our own compiler of the programs in :mod:`.graph`):
``JOIN`` is a triple pattern, ``AND`` two patterns on one variable, ``ARGMAX``/``ARGMIN`` a
sub-select ordered by the attribute with ``LIMIT 1`` (as AgentBench), ``COUNT`` a
``COUNT(DISTINCT ...)``. Where AgentBench filters relations and attributes with its ontology
files, this backend keeps IRIs (relations) and numeric or date literals (attributes) and drops
Freebase's bookkeeping properties (``type.*``, ``common.*``, ``freebase.*``, ``kg.*``); a
relation's type is its ``type.property.expected_type``.
"""

from __future__ import annotations

import itertools
from typing import Any

import httpx

from .graph import Program, render

FREEBASE = "http://rdf.freebase.com/ns/"
PREFIXES = f"PREFIX ns: <{FREEBASE}>\nPREFIX xsd: <http://www.w3.org/2001/XMLSchema#>\n"
HIDDEN_DOMAINS = ("type.", "common.", "freebase.", "kg.", "base.")
NUMERIC_TYPES = "xsd:integer, xsd:int, xsd:float, xsd:double, xsd:decimal, xsd:dateTime, xsd:date, xsd:gYear"


class KGBackendError(RuntimeError):
    """The SPARQL endpoint cannot be reached or answers with an error."""


class SparqlBackend:
    """Runs the tools' programs on a Freebase SPARQL endpoint (blocking HTTP: run it in a thread)."""

    blocking = True

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        self.url = url
        self.http = httpx.Client(timeout=timeout_s)
        self._names = itertools.count()

    def check(self) -> None:
        """Raise KGBackendError, saying what to do, when the endpoint does not answer a trivial query."""
        self.query("ASK { }")

    def query(self, text: str) -> dict[str, Any]:
        try:
            response = self.http.post(
                self.url,
                data={"query": PREFIXES + text},
                headers={"Accept": "application/sparql-results+json"},
            )
            response.raise_for_status()
            return dict(response.json())
        except (httpx.HTTPError, ValueError) as exc:
            raise KGBackendError(
                f"the Freebase SPARQL endpoint sparql_url={self.url!r} did not answer ({type(exc).__name__}: {exc}). "
                "AgentBench's KG questions (source='agentbench') need a Freebase dump served over SPARQL, "
                "which is not available offline: start one (envs/kg/README.md) or use source='offline'"
            ) from exc

    def close(self) -> None:
        self.http.close()

    # -- Backend ---------------------------------------------------------------------

    def is_entity(self, name: str) -> bool:
        return name.startswith(("m.", "f."))

    def relations(self, program: Program) -> list[str]:
        where = self._pattern(program, "x")
        rows = self._select(f"SELECT DISTINCT ?r WHERE {{ {where} ?x ?r ?o . FILTER(isIRI(?o)) }}")
        return sorted(r for r in rows if not r.startswith(HIDDEN_DOMAINS))

    def attributes(self, program: Program) -> list[str]:
        where = self._pattern(program, "x")
        rows = self._select(
            f"SELECT DISTINCT ?r WHERE {{ {where} ?x ?r ?o . "
            f"FILTER(isLiteral(?o) && datatype(?o) IN ({NUMERIC_TYPES})) }}"
        )
        return sorted(r for r in rows if not r.startswith(HIDDEN_DOMAINS))

    def range_type(self, relation: str) -> str:
        rows = self._select(f"SELECT ?t WHERE {{ ns:{relation} ns:type.property.expected_type ?t }} LIMIT 1")
        return rows[0] if rows else "type.object"

    def execute(self, program: Program) -> list[str]:
        if isinstance(program, tuple) and program[0] == "COUNT":
            where = self._pattern(program[1], "x")
            return self._select(f"SELECT (COUNT(DISTINCT ?x) AS ?c) WHERE {{ {where} }}")
        return sorted(set(self._select(f"SELECT DISTINCT ?x WHERE {{ {self._pattern(program, 'x')} }}")))

    # -- compiling ---------------------------------------------------------------------

    def _select(self, text: str) -> list[str]:
        bindings = self.query(text).get("results", {}).get("bindings", [])
        values = []
        for row in bindings:
            for cell in row.values():
                values.append(str(cell["value"]).removeprefix(FREEBASE))
        return values

    def _pattern(self, program: Program, var: str) -> str:
        if isinstance(program, str):
            return f"VALUES ?{var} {{ ns:{program} }}"
        op = program[0]
        if op == "JOIN":
            inner = f"s{next(self._names)}"
            return f"{self._pattern(program[2], inner)} ?{inner} ns:{program[1]} ?{var} ."
        if op == "AND":
            return f"{self._pattern(program[1], var)} {self._pattern(program[2], var)}"
        if op in ("ARGMAX", "ARGMIN"):
            value = f"v{next(self._names)}"
            order = "DESC" if op == "ARGMAX" else "ASC"
            return (
                f"{{ SELECT ?{var} WHERE {{ {self._pattern(program[1], var)} ?{var} ns:{program[2]} ?{value} }} "
                f"ORDER BY {order}(?{value}) LIMIT 1 }}"
            )
        raise ValueError(f"cannot compile {render(program)} to SPARQL")
