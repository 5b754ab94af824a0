"""DBBench samples from the data directory: splits, tables, gold answers.

Splits (files under ``<data dir>/agentbench/dbbench/``):

| split | file | rows | note |
|---|---|---|---|
| ``standard`` (``std``, ``test``) | ``standard.jsonl`` | 300 | AgentBench's ``dbbench-std``; evaluation |
| ``dev`` | ``dev.jsonl`` | 60 | |
| ``train`` | ``db_out_new.jsonl`` | | ``dbbench-env_train``; not vendored: ``agentrl-data fetch --only agentbench-large``. Missing -> an error naming the fix (never ``dev`` unasked) |

Every row carries its own table(s) (name, columns, rows). The gold answer is ``label`` (a list
of strings) for questions, and ``answer_md5`` (AgentBench's table hash after the gold SQL) for
INSERT / UPDATE / DELETE; rows of modifying type without ``answer_md5`` are scored against the
table state the gold SQL (``label[0]`` or ``sql.query``) produces on a fresh copy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl_ext.env.data_files import DataError, require
from agentrl_ext.env.data_files import data_dir as resolve_data_dir

logger = logging.getLogger(__name__)

DBBENCH_DIR = "agentbench/dbbench"
SPLIT_FILES = {"standard": "standard.jsonl", "dev": "dev.jsonl", "train": "db_out_new.jsonl"}
SPLIT_ALIASES = {"std": "standard", "test": "standard", "env_train": "train"}
MODIFYING_TYPES = ("INSERT", "UPDATE", "DELETE")


@dataclass(frozen=True)
class Table:
    """One table of a sample: its name, column names and rows (values as AgentBench loads them: ``str(v)``)."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class DBBenchSample:
    """One DBBench question with its tables and gold answer."""

    entry: dict[str, Any]
    """The raw row (prompt fields: ``description``, ``add_description``, ``evidence``)."""
    kind: str
    """``entry["type"][0]``: ``INSERT``, ``UPDATE``, ``DELETE``, or a question kind (``counting``, ...)."""
    tables: tuple[Table, ...]
    label: tuple[str, ...]
    answer_md5: str | None
    gold_sql: str | None

    @property
    def modifies(self) -> bool:
        """INSERT / UPDATE / DELETE: scored by the tables' content hash, not by the answer."""
        return self.kind in MODIFYING_TYPES


def _tables(entry: dict[str, Any], where: str) -> tuple[Table, ...]:
    raw = entry.get("table")
    if raw is None:
        raise DataError(
            f"{where}: no 'table' (rows that need AgentBench's SQLite db files are not supported)"
        )
    tables = []
    for table in raw if isinstance(raw, list) else [raw]:
        info = table["table_info"]
        columns = tuple(str(c["name"]) for c in info["columns"])
        rows = tuple(tuple(str(v) for v in row) for row in info["rows"])
        for number, row in enumerate(rows):
            if len(row) != len(columns):
                raise DataError(
                    f"{where}: table {table['table_name']!r} row {number} has {len(row)} values for {len(columns)} columns"
                )
        tables.append(Table(str(table["table_name"]), columns, rows))
    return tuple(tables)


def parse_sample(entry: dict[str, Any], where: str) -> DBBenchSample:
    """A :class:`DBBenchSample` from one JSON row; DataError naming ``where`` when it is malformed."""
    try:
        kind = str(entry["type"][0])
        label = entry.get("label", [])
        label = tuple(str(x) for x in (label if isinstance(label, list) else [label]))
        gold = (entry.get("sql") or {}).get("query") or (
            label[0] if kind in MODIFYING_TYPES and label else None
        )
        return DBBenchSample(entry, kind, _tables(entry, where), label, entry.get("answer_md5"), gold)
    except (KeyError, IndexError, TypeError) as exc:
        raise DataError(f"{where}: malformed DBBench row ({type(exc).__name__}: {exc})") from exc


def split_path(split: str, data_dir: str | Path | None = None) -> tuple[str, Path]:
    """The (canonical split, verified file) of ``split``; DataError when it is not installed."""
    canonical = SPLIT_ALIASES.get(split, split)
    if canonical not in SPLIT_FILES:
        raise ValueError(
            f"unknown DBBench split {split!r}; expected one of {sorted(SPLIT_FILES) + sorted(SPLIT_ALIASES)}"
        )
    relative = f"{DBBENCH_DIR}/{SPLIT_FILES[canonical]}"
    if canonical == "train" and not (resolve_data_dir(data_dir) / relative).exists():
        # Training on the 60 dev rows instead would change the experiment behind the user's back.
        raise DataError(
            f"DBBench split 'train' needs {relative}, which is not installed in {resolve_data_dir(data_dir)} "
            "(it is not in the vendored data): get it with `agentrl-data fetch --only agentbench-large`, "
            "or ask for the dev split (60 rows) explicitly: split='dev' "
            "(in a recipe: agentrl.envs.task_kwargs.dbbench.split=dev)"
        )
    return canonical, require(relative, data_dir)  # a file that is there but corrupt is an error


def load_split(split: str, data_dir: str | Path | None = None) -> tuple[str, list[DBBenchSample]]:
    """All samples of ``split`` (see the module docstring) and the split actually loaded."""
    canonical, path = split_path(split, data_dir)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows: Sequence[dict[str, Any]] = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return canonical, [parse_sample(row, f"{path}:{number + 1}") for number, row in enumerate(rows)]
