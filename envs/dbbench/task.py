"""``dbbench``: AgentBench-FC's DBBench as a task worker.

The agent answers a question about (or makes a change to) a table by calling
``execute_sql(query)`` and finally ``commit_final_answer(answers)``; at most ``max_round`` (15)
agent steps. Each episode runs on a fresh database holding only its own tables (SQLite in
memory, or a database and user of its own on a MariaDB server). Scoring as AgentBench does
(:mod:`.checking`): questions by the committed answers against the label, modifications by the
tables' hash against ``answer_md5``. Reward 1 or 0.

Statuses: ``completed`` after a commit (reward 1/0); ``task limit reached`` after ``max_round``
steps without one (reward 0). Invalid steps, with ``on_invalid_action="end"`` (for RL
recipes that want it): no tool call, or arguments that are not a JSON object or lack a value ->
``agent validation failed``; an unknown tool -> ``agent invalid action``. With
``on_invalid_action="feedback"`` (the default: AgentBench-FC's own DBBench behaviour) the agent gets AgentBench's
error message instead and the step counts as a round. A database that fails (server down) ->
``task error``; the worker keeps serving.

    python -m agentrl_ext.env.worker agentrl_ext.envs.dbbench.task:DBBenchTask \\
        --controller-url http://127.0.0.1:5020/api --task-kwargs '{"split": "standard"}'
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus, TaskOutput
from agentrl_ext.env.worker import InvalidAction, SampleResult, Session, Task
from agentrl_ext.env.worker.actions import ToolCall

from . import prompts
from .backends import DatabaseBackend, EpisodeDatabase, MariaDBBackend, ServerAddress, SQLiteBackend
from .checking import answers_match
from .data import DBBenchSample, load_split

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "sqlite", "mariadb")
INVALID_ACTION_POLICIES = ("end", "feedback")


class DBBenchTask(Task):
    """AgentBench-FC DBBench.

    Args:
        split: ``standard`` (300, evaluation, ``dbbench-std``), ``dev`` (60) or ``train``
            (``db_out_new.jsonl``; a DataError naming the fix when not installed).
        data_dir: the data directory (default: ``$AGENTRL_DATA_DIR`` or the XDG default).
        backend: ``sqlite``, ``mariadb``, or ``auto`` (MariaDB when ``mariadb_url`` is set).
        mariadb_url: administrator address of the MariaDB server, ``unix:///path/mysqld.sock``
            or ``mysql://USER:PASSWORD@127.0.0.1:3306``.
        max_round: agent steps per episode (AgentBench-FC: 15).
        statement_timeout_s: limit on one SQL statement (AgentBench: 60 s).
        on_invalid_action: ``feedback`` (default: AgentBench-FC's rule, its message and the
            step counts against the round limit) or ``end`` (the step ends the episode; for RL
            recipes that want it); see the module docstring. ``calculate_overall`` records it.
        limit: serve only the first ``limit`` samples (smoke tests).
    """

    name = "dbbench"
    tools = prompts.TOOLS
    concurrency = 32

    def __init__(
        self,
        split: str = "standard",
        data_dir: str | Path | None = None,
        backend: str = "auto",
        mariadb_url: str | None = None,
        max_round: int = 15,
        statement_timeout_s: float = 60.0,
        on_invalid_action: str = "feedback",
        limit: int | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(**overrides)
        if backend not in BACKENDS:
            raise ValueError(f"DBBenchTask backend={backend!r}; expected one of {BACKENDS}")
        if backend == "mariadb" and not mariadb_url:
            raise ValueError(
                "DBBenchTask backend='mariadb' needs mariadb_url, e.g. 'unix:///run/agentrl-mariadb/mysqld.sock' "
                "(scripts/mariadb.sh start prints it)"
            )
        if on_invalid_action not in INVALID_ACTION_POLICIES:
            raise ValueError(
                f"DBBenchTask on_invalid_action={on_invalid_action!r}; expected one of {INVALID_ACTION_POLICIES}"
            )
        if max_round < 1:
            raise ValueError(f"DBBenchTask max_round must be >= 1, got {max_round}")
        self.backend_name = (
            "mariadb" if backend == "mariadb" or (backend == "auto" and mariadb_url) else "sqlite"
        )
        self.address = (
            ServerAddress.from_url(mariadb_url) if self.backend_name == "mariadb" and mariadb_url else None
        )
        self.max_round = max_round
        self.statement_timeout_s = statement_timeout_s
        self.on_invalid_action = on_invalid_action
        self.split, samples = load_split(split, data_dir)
        self.samples: list[DBBenchSample] = samples[:limit] if limit is not None else samples
        self.database: DatabaseBackend | None = None

    async def setup(self) -> None:
        threads = self.concurrency + 4
        if self.address is not None:
            self.database = MariaDBBackend(self.address, threads, self.statement_timeout_s)
        else:
            self.database = SQLiteBackend(threads, self.statement_timeout_s)
        await self.database.check()
        logger.info(
            "dbbench: %d %s samples on %s",
            len(self.samples),
            self.split,
            self.address.describe() if self.address else "sqlite",
        )

    async def teardown(self) -> None:
        if self.database is not None:
            await self.database.close()

    def get_indices(self) -> list[SampleIndex]:
        return list(range(len(self.samples)))

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        position = int(index)
        if not 0 <= position < len(self.samples):
            raise IndexError(f"dbbench index {index!r} out of range 0..{len(self.samples) - 1}")
        sample = self.samples[position]
        assert self.database is not None, "setup() was not called"
        database = await self.database.open(sample.tables)
        try:
            return await self._play(sample, position, database, session)
        finally:
            await database.close()

    async def _play(
        self, sample: DBBenchSample, index: int, database: EpisodeDatabase, session: Session
    ) -> SampleResult:
        session.inject(
            {"role": "system", "content": prompts.SYSTEM_PROMPT},
            {"role": "user", "content": prompts.user_prompt(sample.entry)},
        )
        statements = 0
        for _ in range(self.max_round):
            action = await session.action(validate=self.on_invalid_action == "end")
            if action.problem is not None or not action.tool_calls:
                # only in "feedback" mode: AgentBench's answer, and the round counts
                self._feedback(session, action.tool_calls, action.problem)
                continue
            for call in action.tool_calls:
                value = self._argument(call)
                if value is _MISSING:  # "feedback" mode: the call cannot be run
                    session.inject(
                        {"role": "tool", "tool_call_id": call.id, "content": prompts.BAD_ARGUMENTS}
                    )
                elif call.name == prompts.EXECUTE_SQL:
                    statements += 1
                    result = await database.execute(str(value))
                    session.inject({"role": "tool", "tool_call_id": call.id, "content": result})
                else:  # commit_final_answer (unknown tools were handled above)
                    return await self._score(sample, index, database, value, statements)
        return SampleResult(
            SampleStatus.TASK_LIMIT_REACHED,
            reward=0.0,
            metrics={"statements": statements},
            result={"is_correct": False, "type": sample.kind, "index": index},
        )

    def _argument(self, call: ToolCall) -> Any:
        """The call's one argument (AgentBench takes the first value, whatever its name).

        No argument at all: ``agent validation failed`` ("end"), or _MISSING ("feedback").
        """
        wanted = "query" if call.name == prompts.EXECUTE_SQL else "answers"
        if wanted in call.arguments:
            return call.arguments[wanted]
        if call.arguments:
            return next(iter(call.arguments.values()))
        if self.on_invalid_action == "end":
            raise InvalidAction(
                SampleStatus.AGENT_VALIDATION_FAILED, f"tool call {call.name!r} has no {wanted!r} argument"
            )
        return _MISSING

    def _feedback(self, session: Session, calls: list[ToolCall], problem: InvalidAction | None) -> None:
        if not calls:
            session.inject({"role": "user", "content": prompts.NO_TOOL_CALL})
            return
        status = problem.status if problem is not None else None
        content = (
            prompts.UNKNOWN_TOOL if status is SampleStatus.AGENT_INVALID_ACTION else prompts.BAD_ARGUMENTS
        )
        for call in calls:
            session.inject({"role": "tool", "tool_call_id": call.id, "content": content})

    async def _score(
        self, sample: DBBenchSample, index: int, database: EpisodeDatabase, answer: Any, statements: int
    ) -> SampleResult:
        if sample.modifies:
            got: Any = await database.tables_hash(sample.tables)
            gold: Any = sample.answer_md5 if sample.answer_md5 is not None else await self._gold_hash(sample)
        else:
            got, gold = answer, list(sample.label)
        correct = answers_match(got, gold, modifies=sample.modifies)
        return SampleResult(
            SampleStatus.COMPLETED,
            reward=1.0 if correct else 0.0,
            metrics={"correct": int(correct), "statements": statements},
            result={
                "is_correct": correct,
                "answer": answer,
                "ground_truth": gold,
                "type": sample.kind,
                "index": index,
            },
        )

    async def _gold_hash(self, sample: DBBenchSample) -> str:
        """The tables' hash after the gold SQL on a fresh copy (rows without ``answer_md5``)."""
        assert self.database is not None
        scratch = await self.database.open(sample.tables)
        try:
            if sample.gold_sql:
                await scratch.execute(sample.gold_sql)
            return await scratch.tables_hash(sample.tables)
        finally:
            await scratch.close()

    @property
    def benchmark(self) -> str:
        """What this worker runs, as results should name it: ``dbbench-std`` on AgentBench's test split."""
        return "dbbench-std" if self.split == "standard" else f"dbbench-{self.split}"

    def calculate_overall(self, results: list[TaskOutput]) -> dict[str, Any]:
        """The default summary plus accuracy, overall and per SQL type."""
        overall = super().calculate_overall(results)
        by_type: dict[str, Counter[str]] = defaultdict(Counter)
        for output in results:
            result = output.result if isinstance(output.result, dict) else {}
            kind = str(result.get("type", "unknown"))
            by_type[kind]["total"] += 1
            by_type[kind]["correct"] += int(bool(result.get("is_correct")))
        total = sum(c["total"] for c in by_type.values())
        overall["accuracy"] = sum(c["correct"] for c in by_type.values()) / total if total else 0.0
        overall["accuracy_by_type"] = {k: c["correct"] / c["total"] for k, c in sorted(by_type.items())}
        overall["invalid_action_rule"] = self.on_invalid_action
        overall["benchmark"] = self.benchmark
        return overall


_MISSING: Any = object()
