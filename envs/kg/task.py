"""``kg``: AgentBench-FC's knowledge-graph task as a task worker, on an offline graph or on Freebase.

The agent answers a question by probing a knowledge base with AgentBench's seven tools
(``get_relations``, ``get_neighbors``, ``intersection``, ``get_attributes``, ``argmax``,
``argmin``, ``count``), each call making a variable ``#k``, and ends with a text step
``Final Answer: #k`` (no tool call). At most ``max_round`` (15) agent steps. Reward 1 when the
answer variable's members equal the gold answer set, else 0; the F1 of the two sets is a metric.

Sources: ``offline`` (default) generates questions on a real graph built from PyPI packages'
data (:mod:`.offline`, :mod:`.questions`); ``agentbench`` serves AgentBench's own questions
from the data directory and needs a Freebase SPARQL endpoint (``sparql_url``; not reachable
offline).

Statuses: ``completed`` after ``Final Answer: #k`` (reward 1/0); ``task limit reached`` after
``max_round`` steps without one; ``agent validation failed`` for a final answer naming a
variable that does not exist. Tool errors (a relation the variable lacks, ...) go back to the
agent as ``Error processing tool call: ...``. Invalid steps with ``on_invalid_action="end"``
(for RL recipes that want it): a step with neither a tool call nor a final answer, arguments that
are not a JSON object or lack a parameter -> ``agent validation failed``; an unknown tool ->
``agent invalid action``. ``on_invalid_action="feedback"`` (the default) is AgentBench-FC's own behaviour: the
agent gets AgentBench's message and the step counts as a round. A backend that fails (SPARQL
endpoint down) -> ``task error``; the worker keeps serving.

    python -m agentrl_ext.env.worker agentrl_ext.envs.kg.task:KGTask \\
        --controller-url http://127.0.0.1:5020/api --task-kwargs '{"split": "test"}'
"""

from __future__ import annotations

import asyncio
import logging
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus, TaskOutput
from agentrl_ext.env.worker import InvalidAction, SampleResult, Session, Task
from agentrl_ext.env.worker.actions import ToolCall

from . import prompts
from .graph import Backend
from .offline import build_offline_graph
from .questions import OFFLINE_SPLITS, KGQuestion, generate_questions, load_agentbench_split, split_questions
from .sparql import KGBackendError, SparqlBackend
from .tools import KGToolbox, ToolError

logger = logging.getLogger(__name__)

SOURCES = ("offline", "agentbench")
INVALID_ACTION_POLICIES = ("end", "feedback")
FINAL_ANSWER = re.compile(r"(?:Find|Final) Answer: #(\d+)")
"""AgentBench's pattern for the final answer (it also accepts its own typo ``Find Answer``)."""


def f1(predicted: set[str], gold: set[str]) -> float:
    """The F1 of two answer sets (0 when they share nothing)."""
    shared = len(predicted & gold)
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted), shared / len(gold)
    return 2 * precision * recall / (precision + recall)


class KGTask(Task):
    """AgentBench-FC knowledge graph.

    Args:
        split: offline: ``test`` (150), ``dev`` (50) or ``train`` (the rest, ~2,860);
            agentbench: ``std`` (150, alias ``test``), ``dev`` (20) or ``train`` (1,214).
        source: ``offline`` (generated questions on the offline graph) or ``agentbench``.
        seed: the offline splits' seed.
        test_size, dev_size: offline split sizes.
        min_city_population: cities in the offline graph (capitals always).
        sparql_url: the Freebase SPARQL endpoint (source ``agentbench``), e.g.
            ``http://127.0.0.1:3001/sparql``.
        sparql_timeout_s: limit on one SPARQL query.
        data_dir: the data directory (source ``agentbench``).
        max_round: agent steps per episode (AgentBench-FC: 15).
        one_shot: prepend AgentBench's one-shot example; default: on for the test split (as
            AgentBench's ``kg-std``), off otherwise (as ``kg-env_train``).
        on_invalid_action: ``feedback`` (default: AgentBench-FC's rule, its message and the
            step counts against the round limit) or ``end`` (the step ends the episode; for RL
            recipes that want it); see the module docstring. ``calculate_overall`` records it.
        limit: serve only the first ``limit`` questions.
    """

    name = "kg"
    tools = prompts.TOOLS
    concurrency = 32

    def __init__(
        self,
        split: str = "test",
        source: str = "offline",
        seed: int = 0,
        test_size: int = 150,
        dev_size: int = 50,
        min_city_population: int = 100_000,
        sparql_url: str | None = None,
        sparql_timeout_s: float = 60.0,
        data_dir: str | Path | None = None,
        max_round: int = 15,
        one_shot: bool | None = None,
        on_invalid_action: str = "feedback",
        limit: int | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(**overrides)
        if source not in SOURCES:
            raise ValueError(f"KGTask source={source!r}; expected one of {SOURCES}")
        if on_invalid_action not in INVALID_ACTION_POLICIES:
            raise ValueError(
                f"KGTask on_invalid_action={on_invalid_action!r}; expected one of {INVALID_ACTION_POLICIES}"
            )
        if max_round < 1:
            raise ValueError(f"KGTask max_round must be >= 1, got {max_round}")
        self.source = source
        self.max_round = max_round
        self.on_invalid_action = on_invalid_action
        self.backend: Backend
        if source == "agentbench":
            if not sparql_url:
                raise ValueError(
                    "KGTask source='agentbench' needs sparql_url, a Freebase SPARQL endpoint such as "
                    "'http://127.0.0.1:3001/sparql' (not available offline; see envs/kg/README.md), "
                    "or use source='offline'"
                )
            self.split, questions = load_agentbench_split(split, data_dir)
            self.backend = SparqlBackend(sparql_url, sparql_timeout_s)
        else:
            if split not in OFFLINE_SPLITS:
                raise ValueError(
                    f"KGTask split={split!r} for source='offline'; expected one of {OFFLINE_SPLITS}"
                )
            graph = build_offline_graph(min_city_population)
            splits = split_questions(generate_questions(graph), seed, test_size, dev_size)
            self.split, questions = split, splits[split]
            self.backend = graph
        self.questions: list[KGQuestion] = questions[:limit] if limit is not None else questions
        self.one_shot = self.split in ("test", "std") if one_shot is None else one_shot

    async def setup(self) -> None:
        if isinstance(self.backend, SparqlBackend):
            await asyncio.to_thread(self.backend.check)  # KGBackendError: the worker does not start
        logger.info("kg: %d %s questions (%s)", len(self.questions), self.split, self.source)

    async def teardown(self) -> None:
        if isinstance(self.backend, SparqlBackend):
            self.backend.close()

    def get_indices(self) -> list[SampleIndex]:
        return list(range(len(self.questions)))

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        position = int(index)
        if not 0 <= position < len(self.questions):
            raise IndexError(f"kg index {index!r} out of range 0..{len(self.questions) - 1}")
        question = self.questions[position]
        session.inject({"role": "system", "content": prompts.INSTRUCTIONS.format(max_round=self.max_round)})
        if self.one_shot:
            session.inject(*prompts.ONE_SHOT)
        session.inject(
            {"role": "user", "content": prompts.user_prompt(question.question, list(question.entities))}
        )
        toolbox = KGToolbox(self.backend, question.entities)
        for _ in range(self.max_round):
            action = await session.action(validate=False)
            if not action.tool_calls:
                final = FINAL_ANSWER.findall(
                    (action.content or "").split("Observation:")[0].replace("\\_", "_")
                )
                if final:
                    return await self._score(question, position, toolbox, int(final[0]))
                if self.on_invalid_action == "end":
                    raise action.problem or InvalidAction(
                        SampleStatus.AGENT_VALIDATION_FAILED,
                        "the step has neither a tool call nor 'Final Answer: #k'",
                    )
                session.inject({"role": "user", "content": prompts.NO_VALID_CALL})
                continue
            if action.problem is not None and self.on_invalid_action == "end":
                raise action.problem
            for call in action.tool_calls:
                content = await self._run(toolbox, call)
                session.inject({"role": "tool", "tool_call_id": call.id, "content": content})
        return SampleResult(
            SampleStatus.TASK_LIMIT_REACHED,
            reward=0.0,
            metrics={"f1": 0.0, "variables": len(toolbox.variables)},
            result={"is_correct": False, "f1": 0.0, "template": question.template, "index": position},
        )

    async def _run(self, toolbox: KGToolbox, call: ToolCall) -> str:
        """The tool message for one call (AgentBench's texts for calls that cannot run)."""
        if call.name not in prompts.TOOLS_PARAM_ORDER:
            return prompts.unknown_function(call.name)  # "feedback" only: "end" raised before
        order = prompts.TOOLS_PARAM_ORDER[call.name]
        if any(parameter not in call.arguments for parameter in order):
            if self.on_invalid_action == "end":
                raise InvalidAction(
                    SampleStatus.AGENT_VALIDATION_FAILED,
                    f"tool call {call.name!r} needs the arguments {order}, got {sorted(call.arguments)}",
                )
            return prompts.bad_arguments(call.name)
        arguments = [call.arguments[parameter] for parameter in order]
        try:
            return await self._backend_call(toolbox.call, call.name, arguments)
        except ToolError as exc:
            return prompts.tool_error(exc)

    async def _backend_call(self, function: Any, *args: Any) -> Any:
        """Run a backend-touching call: in a thread for a blocking backend (SPARQL over HTTP)."""
        if getattr(self.backend, "blocking", False):
            return await asyncio.to_thread(function, *args)
        return function(*args)

    async def _score(
        self, question: KGQuestion, index: int, toolbox: KGToolbox, variable: int
    ) -> SampleResult:
        try:
            predicted = await self._backend_call(toolbox.answer, variable)
        except IndexError:
            raise InvalidAction(
                SampleStatus.AGENT_VALIDATION_FAILED,
                f"final answer #{variable} names no variable (variables: {len(toolbox.variables)})",
            ) from None
        gold = set(question.gold)
        correct = predicted == gold
        score = f1(predicted, gold)
        return SampleResult(
            SampleStatus.COMPLETED,
            reward=1.0 if correct else 0.0,
            metrics={"correct": int(correct), "f1": score, "variables": len(toolbox.variables)},
            result={
                "is_correct": correct,
                "f1": score,
                "predicted": sorted(predicted),
                "gold": sorted(gold),
                "template": question.template,
                "index": index,
            },
        )

    @property
    def benchmark(self) -> str:
        """What this worker runs, as results should name it. ``kg-offline``: the offline graph, which
        is not AgentBench's ``kg-std`` (Freebase); ``kg-std`` only with ``source="agentbench"``."""
        if self.source == "agentbench":
            return "kg-std" if self.split in ("std", "test") else f"kg-{self.split}"
        return "kg-offline" if self.split == "test" else f"kg-offline-{self.split}"

    def calculate_overall(self, results: list[TaskOutput]) -> dict[str, Any]:
        """The default summary plus accuracy and mean F1, overall and per question template."""
        overall = super().calculate_overall(results)
        by_template: dict[str, list[tuple[bool, float]]] = defaultdict(list)
        for output in results:
            result = output.result if isinstance(output.result, dict) else {}
            by_template[str(result.get("template", "unknown"))].append(
                (bool(result.get("is_correct")), float(result.get("f1", 0.0)))
            )
        every = [item for items in by_template.values() for item in items]
        overall["accuracy"] = sum(c for c, _ in every) / len(every) if every else 0.0
        overall["f1"] = statistics.fmean(f for _, f in every) if every else 0.0
        overall["accuracy_by_template"] = {
            name: sum(c for c, _ in items) / len(items) for name, items in sorted(by_template.items())
        }
        overall["invalid_action_rule"] = self.on_invalid_action
        overall["benchmark"] = self.benchmark
        return overall


__all__ = ["KGBackendError", "KGTask", "f1"]
