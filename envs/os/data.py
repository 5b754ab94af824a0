"""OS-interaction samples from the data directory: splits, init/start scripts, evaluation.

Splits (files under ``<data dir>/agentbench/os_interaction/``), as AgentBench's ``os.yaml`` maps them:

| split | problem files | scripts | samples |
|---|---|---|---|
| ``test`` (``std``, ``standard``) | ``data/1..7/*.json`` | ``scripts/<group>/`` | 144 (``os-std``) |
| ``dev`` | ``data/dev.json`` | ``scripts/dev/`` | 26 |
| ``train`` (``env_train``) | ``train_0317/training.json`` | ``scripts/7/`` | 1000 (``os-env_train``) |

Indices are 0..N-1 over the split's files in sorted path order (AgentBench-FC numbers them the
same way, in ``glob`` order, which the file system decides), then in file order.

A sample is read as AgentBench's ``_load_configs`` reads it: ``create.local`` names the image
(``default`` when absent), ``create.init`` is one script or a list, ``start`` runs in the
agent's shell before the first turn, and ``evaluation`` has either ``match`` (a string: exact
answer after ``strip``; or ``{"answer": ...}`` / ``{"regex": ...}``) or ``check`` (a list of
scripts, ``null`` standing for the ``example`` script), with an optional ``example``. A script is
a string (bash), or ``{"language", "file" | "code"}`` with the file relative to the scripts folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl_ext.env.data_files import DataError, require
from agentrl_ext.env.data_files import data_dir as resolve_data_dir

OS_DIR = "agentbench/os_interaction"
TEST_GROUPS = ("1", "2", "3", "4", "5", "6", "7")
SPLITS = ("test", "dev", "train")
SPLIT_ALIASES = {"std": "test", "standard": "test", "env_train": "train"}
LANGUAGES = ("bash", "python")


@dataclass(frozen=True)
class Script:
    """A script to run in the session's container: its language and its source text."""

    language: str
    code: str


@dataclass(frozen=True)
class OSSample:
    """One OS-interaction problem."""

    description: str
    image: str
    """Image subtype (``default``, ``packages``, ``ubuntu``)."""
    init: tuple[Script, ...]
    start: Script | None
    match: dict[str, Any] | None
    """``{"answer": str, "strip": bool}`` or ``{"regex": str, ...}`` for match evaluation."""
    check: tuple[Script | None, ...] | None
    """Check scripts; None entries run ``example`` (whose stdout feeds the next script)."""
    example: Script | None
    labels: tuple[str, ...]
    source: str
    """``<file relative to the os_interaction folder>#<position in the file>``."""

    @property
    def evaluation(self) -> str:
        """``match`` or ``check``."""
        return "match" if self.match is not None else "check"


def _script(raw: Any, scripts: Path, where: str) -> Script | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return Script("bash", raw)
    if not isinstance(raw, dict):
        raise DataError(f"{where}: a script must be a string or an object, got {raw!r}")
    language = str(raw.get("language", "bash"))
    if language not in LANGUAGES:
        raise DataError(f"{where}: unsupported script language {language!r}; expected one of {LANGUAGES}")
    if "file" in raw:
        path = scripts / str(raw["file"])
        if not path.is_file():
            raise DataError(f"{where}: script file {path} does not exist")
        return Script(language, path.read_text(encoding="utf-8"))
    if "code" in raw:
        return Script(language, str(raw["code"]))
    raise DataError(f"{where}: a script object needs 'file' or 'code', got keys {sorted(raw)}")


def parse_sample(item: dict[str, Any], scripts: Path, where: str) -> OSSample:
    """An :class:`OSSample` from one problem object; DataError naming ``where`` when it is malformed."""
    try:
        create = item.get("create")
        create = create if isinstance(create, dict) else {}  # AgentBench reads only dicts' keys
        init_raw = create.get("init")
        init_list = [] if init_raw is None else (init_raw if isinstance(init_raw, list) else [init_raw])
        init = tuple(s for s in (_script(r, scripts, where) for r in init_list) if s is not None)
        evaluation = item["evaluation"]
        match: dict[str, Any] | None = None
        check: tuple[Script | None, ...] | None = None
        if "match" in evaluation:
            raw_match = evaluation["match"]
            match = {"answer": raw_match, "strip": True} if isinstance(raw_match, str) else dict(raw_match)
        elif "check" in evaluation:
            raw_check = evaluation["check"]
            raw_checks = raw_check if isinstance(raw_check, list) else [raw_check]
            check = tuple(_script(r, scripts, where) for r in raw_checks)
        else:
            raise DataError(f"{where}: the evaluation has neither 'match' nor 'check'")
        # AgentBench keeps the example only for check evaluation; kept here for match too (gold runs)
        example = _script(evaluation.get("example"), scripts, where)
        if check is not None and None in check and example is None:
            raise DataError(f"{where}: a check step is null (run the example) but there is no example")
        labels = item.get("labels") or []
        return OSSample(
            description=str(item["description"]),
            image=str(create.get("local", "default")),
            init=init,
            start=_script(item.get("start"), scripts, where),
            match=match,
            check=check,
            example=example,
            labels=tuple(str(label) for label in labels),
            source=where,
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{where}: malformed OS-interaction problem ({type(exc).__name__}: {exc})") from exc


def split_files(split: str) -> tuple[str, list[tuple[str, str]]]:
    """(canonical split, [(problem file, scripts folder)], relative to the os_interaction folder)."""
    canonical = SPLIT_ALIASES.get(split, split)
    if canonical == "test":
        return canonical, [(f"data/{group}", f"scripts/{group}") for group in TEST_GROUPS]
    if canonical == "dev":
        return canonical, [("data/dev.json", "scripts/dev")]
    if canonical == "train":
        return canonical, [("train_0317/training.json", "scripts/7")]
    raise ValueError(
        f"unknown OS-interaction split {split!r}; expected one of {list(SPLITS) + sorted(SPLIT_ALIASES)}"
    )


def load_split(split: str, data_dir: str | Path | None = None) -> tuple[str, list[OSSample]]:
    """All samples of ``split`` (see the module docstring) and its canonical name.

    Every problem file is verified against its pinned checksum (a missing or corrupt file is a
    DataError naming the ``agentrl-data`` command that installs it).
    """
    canonical, entries = split_files(split)
    base = resolve_data_dir(data_dir) / OS_DIR
    samples: list[OSSample] = []
    for problem, scripts in entries:
        files = sorted((base / problem).glob("*.json")) if not problem.endswith(".json") else [base / problem]
        if not files:
            require(f"{OS_DIR}/{problem}/missing.json", data_dir)  # raises the install hint
        for file in files:
            relative = file.relative_to(base).as_posix()
            path = require(f"{OS_DIR}/{relative}", data_dir)
            raw = json.loads(path.read_text(encoding="utf-8"))
            items = raw if isinstance(raw, list) else [raw]
            for position, item in enumerate(items):
                samples.append(parse_sample(item, base / scripts, f"{relative}#{position}"))
    return canonical, samples
