"""Scoring DBBench answers the way AgentBench does (its ``DBResultProcessor``), re-implemented.

Questions (SELECT kinds): the committed answers and the label are cleaned into lists of strings
(MySQL result text such as ``[('a',), ('b',)]`` is unpacked; quotes, ``%`` and thousands
separators are stripped; ``None``/``null``/``nan``/``inf``/empty mean ``0``), then

- one value each: equal, or both numbers within 0.01;
- several values, all numbers: same count and a one-to-one match within 0.01;
- otherwise: equal as sets.

INSERT / UPDATE / DELETE: the answer text is ignored; the tables after the agent's statements are
hashed (:func:`table_hash`, AgentBench's MySQL query ``md5(group_concat(rowhash order by rowhash))``
over ``substring(md5(concat_ws(',', cols...)), 1, 5)``) and compared with the row's
``answer_md5``. One deliberate difference: AgentBench parses answers with ``eval``; here
``ast.literal_eval`` (no code from an agent is ever run).
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

FLOAT_TOLERANCE = 1e-2
GROUP_CONCAT_MAX_LEN = 1024
"""MySQL's default ``group_concat_max_len``: AgentBench's ``answer_md5`` values were computed with it."""

_SPECIAL_ZERO = {"none", "null", "undefined", "nan", "inf", "infinity", "-inf", "-infinity", ""}


def normalize_value(value: Any) -> str:
    """One answer value as AgentBench compares it."""
    if value is None:
        return "0"
    text = str(value).strip()
    if text.endswith("%"):
        return text[:-1].strip()
    if "," in text and not text.startswith("[") and not text.endswith("]"):
        text = text.replace(",", "")
    return "0" if text.lower() in _SPECIAL_ZERO else text


def _unquoted(item: Any) -> str:
    if isinstance(item, tuple) and len(item) == 1:
        item = item[0]
    return str(item).strip().strip("'\"")


def _split_outside_quotes(text: str) -> list[str]:
    items, current, quoted = [], "", False
    for char in text:
        if char in "\"'":
            quoted = not quoted
        elif char == "," and not quoted:
            if current:
                items.append(current.strip().strip("'\""))
                current = ""
        else:
            current += char
    if current:
        items.append(current.strip().strip("'\""))
    return items


def _mysql_result(text: str) -> list[str] | None:
    """The one-column values of a MySQL result text ``[(v,), (w,)]``; None when it is not one."""
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        parsed = None
    if isinstance(parsed, list) and all(isinstance(item, tuple) for item in parsed):
        return [_unquoted(item) for item in parsed if len(item) == 1]
    inner = text.strip("[]")
    if inner.count("(") == 1 and inner.startswith("(") and inner.endswith(",)"):
        return [inner[1:-2].strip().strip("'\"")]
    return None


def answer_values(answer: Any) -> list[str]:
    """An answer (committed list, label list, MySQL result text or a single value) as cleaned strings."""
    if answer is None:
        return ["0"]
    if isinstance(answer, str):
        text = answer.strip()
        if text.startswith("[") and text.endswith("]"):
            values = _mysql_result(text)
            if values is not None:
                return [normalize_value(v) for v in values]
            try:
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return [normalize_value(v) for v in _split_outside_quotes(text[1:-1])]
            if isinstance(parsed, list):
                return [normalize_value(_unquoted(item)) for item in parsed]
        return [normalize_value(text.strip("'\""))]
    if isinstance(answer, (list, tuple)):
        return [normalize_value(_unquoted(item)) for item in answer]
    return [normalize_value(str(answer).strip().strip("'\""))]


def _is_number(value: str) -> bool:
    try:
        float(value)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


def _close(a: str, b: str) -> bool:
    return abs(float(a) - float(b)) <= FLOAT_TOLERANCE


def answers_match(answer: Any, gold: Any, modifies: bool = False) -> bool:
    """Whether ``answer`` scores 1 against ``gold`` (the label; or the table hash when ``modifies``)."""
    got, want = answer_values(answer), answer_values(gold)
    if modifies:
        return got == want
    if len(got) == 1 and len(want) == 1:
        a, b = got[0], want[0]
        if _is_number(a) and _is_number(b):
            return _close(a, b)
        return a == b
    if all(_is_number(x) for x in got) and all(_is_number(x) for x in want):
        if len(got) != len(want):
            return False
        unmatched = list(want)
        for value in got:
            match = next((i for i, other in enumerate(unmatched) if _close(value, other)), None)
            if match is None:
                return False
            unmatched.pop(match)
        return True
    return set(got) == set(want)


def _mysql_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def table_hash(rows: Iterable[Sequence[Any]]) -> str:
    """AgentBench's hash of one table's rows, computed in Python (used for SQLite).

    Equals MySQL's ``md5(group_concat(rowhash order by rowhash))`` with ``rowhash =
    substring(md5(concat_ws(',', cols...)), 1, 5)`` and ``group_concat_max_len`` 1024 (NULLs
    are skipped by CONCAT_WS); an empty table hashes to NULL, shown as ``None``.
    """
    rowhashes = sorted(
        hashlib.md5(",".join(_mysql_text(v) for v in row if v is not None).encode("utf-8")).hexdigest()[:5]
        for row in rows
    )
    if not rowhashes:
        return "None"
    joined = ",".join(rowhashes).encode("utf-8")[:GROUP_CONCAT_MAX_LEN]
    return hashlib.md5(joined).hexdigest()


def combined_hash(hashes: Iterable[str]) -> str:
    """The hash of several tables: their hashes sorted and joined by ``_`` (AgentBench's rule)."""
    return "_".join(sorted(hashes))
