"""The seven KG tools with AgentBench's semantics, over any :class:`~envs.kg.graph.Backend`.

One :class:`KGToolbox` per episode holds the variables the agent made (``#0``, ``#1``, ...).
Arguments are resolved as AgentBench does: ``#k`` is variable k, a name from the question's
``Entities`` list is that entity's id, anything else is taken as given (an entity id such as
``m.country_fr``, a relation, an attribute). The observations are AgentBench's texts:

- ``get_relations`` / ``get_attributes``: ``Observation: [r1, r2, ...]`` (sorted here);
- the others: ``Observation: variable #k, which are instances of TYPE`` (``which is a number``
  for ``count``); the new variable is #k.

A call that breaks a tool's rule (a relation the variable does not have, two variables of
different types, ``#7`` when there are three variables, ...) raises :class:`ToolError`, whose
text AgentBench sends back as ``Error processing tool call: ...``.
"""

from __future__ import annotations

import re
from typing import Any

from .graph import Backend, Variable
from .prompts import ARGMAX, ARGMIN, COUNT, GET_ATTRIBUTES, GET_NEIGHBORS, GET_RELATIONS, INTERSECTION

ENTITY_ID = re.compile(r"^([mf])\.[\w_]+$")
"""AgentBench's test for an entity id (Freebase's ``m.`` / ``f.`` ids)."""


class ToolError(ValueError):
    """A tool call that cannot run; the message goes back to the agent."""


class KGToolbox:
    """The tools of one episode: ``call(name, arguments)`` returns the observation text."""

    def __init__(self, backend: Backend, entities: dict[str, str]) -> None:
        self.backend = backend
        self.entities = entities
        self.variables: list[Variable] = []

    def resolve(self, value: Any) -> Variable | str:
        """``#k`` -> variable k; an entity name of the question -> its id; else the value itself."""
        if not isinstance(value, str):
            raise ToolError(f"arguments must be strings, got {value!r}")
        if value.startswith("#"):
            try:
                return self.variables[int(value[1:])]
            except (ValueError, IndexError):
                made = f"#0..#{len(self.variables) - 1}" if self.variables else "none yet"
                raise ToolError(f"there is no variable {value} (variables: {made})") from None
        return self.entities.get(value, value)

    def call(self, name: str, arguments: list[Any]) -> str:
        """Run tool ``name`` with its arguments in ``TOOLS_PARAM_ORDER``; returns the observation."""
        resolved = [self.resolve(a) for a in arguments]
        if name == GET_RELATIONS:
            return f"Observation: [{', '.join(self._relations(resolved[0], name))}]"
        if name == GET_NEIGHBORS:
            subject, relation = resolved
            if not isinstance(relation, str) or relation not in self._relations(subject, name):
                raise ToolError(f"{name}: relation must be a relation of the variable")
            program = subject.program if isinstance(subject, Variable) else subject
            return self._new(Variable(self.backend.range_type(relation), ("JOIN", relation, program)))
        if name == INTERSECTION:
            first, second = (self._variable(v, name) for v in resolved)
            if first.type != second.type:
                raise ToolError(f"{name}: two variables must have the same type")
            return self._new(Variable(first.type, ("AND", first.program, second.program)))
        if name == GET_ATTRIBUTES:
            variable = self._variable(resolved[0], name)
            return f"Observation: [{', '.join(self.backend.attributes(variable.program))}]"
        if name in (ARGMAX, ARGMIN):
            variable, attribute = self._variable(resolved[0], name), resolved[1]
            if not isinstance(attribute, str) or attribute not in self.backend.attributes(variable.program):
                raise ToolError(f"{name}: attribute must be an attribute of the variable")
            return self._new(Variable(variable.type, (name.upper(), variable.program, attribute)))
        if name == COUNT:
            variable = self._variable(resolved[0], name)
            self.variables.append(Variable("type.int", ("COUNT", variable.program)))
            return f"Observation: variable #{len(self.variables) - 1}, which is a number"
        raise ToolError(f"unknown tool {name!r}")

    def answer(self, index: int) -> set[str]:
        """The members of variable ``index`` (the final answer); IndexError when it does not exist."""
        if not 0 <= index < len(self.variables):
            raise IndexError(index)
        return set(self.backend.execute(self.variables[index].program))

    def _relations(self, subject: Variable | str, tool: str) -> list[str]:
        if isinstance(subject, Variable):
            return self.backend.relations(subject.program)
        if not ENTITY_ID.match(subject):
            raise ToolError(f"{tool}: variable must be a variable or an entity")
        return self.backend.relations(subject)

    @staticmethod
    def _variable(value: Variable | str, tool: str) -> Variable:
        if not isinstance(value, Variable):
            raise ToolError(f"{tool}: variable must be a variable (#k), got {value!r}")
        return value

    def _new(self, variable: Variable) -> str:
        self.variables.append(variable)
        return f"Observation: variable #{len(self.variables) - 1}, which are instances of {variable.type}"
