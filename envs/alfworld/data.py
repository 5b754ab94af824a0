"""ALFWorld games from the data directory: AgentBench's game lists and the unpacked game files.

Splits (lists under ``<data dir>/agentbench/alfworld_lists/``, games under
``<data dir>/alfworld/json_2.1.1/``, unpacked from ``alfworld/json_2.1.1.tar.xz`` by
:func:`agentrl_ext.env.data_files.unpacked`):

| split | list | games | note |
|---|---|---|---|
| ``new_std`` (``std``, ``test``) | ``new_std.json`` | 109 | AgentBench's ``alfworld-std``; evaluation |
| ``dev`` | ``dev.json`` | 20 | |
| ``standard`` | ``standard.json`` | 50 | AgentBench v0.2's test list |
| ``train`` (``train_valid``, ``env_train``) | ``train_valid.json`` | 2,714 of 3,150 | ``alfworld-env_train``; 436 games are not vendored |

A sample's index is its position in AgentBench's list (the list's task types in file order, then
the games in each), so index ``i`` is AgentBench's index ``i``. The train games that are not
vendored (``alfworld/train_valid.missing.txt``) keep their positions and are left out of the
served indices.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from agentrl_ext.env.data_files import DataError, require, unpacked
from agentrl_ext.env.data_files import data_dir as resolve_data_dir

logger = logging.getLogger(__name__)

LISTS_DIR = "agentbench/alfworld_lists"
ARCHIVE = "alfworld/json_2.1.1.tar.xz"
MISSING_LIST = "alfworld/train_valid.missing.txt"
SPLIT_FILES = {
    "new_std": "new_std.json",
    "dev": "dev.json",
    "standard": "standard.json",
    "train": "train_valid.json",
}
SPLIT_ALIASES = {"std": "new_std", "test": "new_std", "train_valid": "train", "env_train": "train"}
TASK_TYPES = (
    "pick_and_place",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "look_at_obj",
    "pick_two_obj",
)
"""AgentBench's task-type keys (the lists' keys)."""


@dataclass(frozen=True)
class Game:
    """One game of a split."""

    index: int
    """Position in AgentBench's list."""
    path: str
    """Relative to the ALFWorld data root, as in AgentBench's list (``json_2.1.1/.../game.tw-pddl``)."""
    task_type: str
    """The list's key: ``pick_and_place``, ``pick_clean_then_place``, ..."""
    file: Path
    """The game file in the data directory."""


@dataclass(frozen=True)
class Split:
    """The games of a split, by index (``None`` where a listed game is not vendored)."""

    name: str
    games: tuple[Game | None, ...]
    root: Path
    """The ALFWorld data root (``<data dir>/alfworld``): AgentBench's ``data_path``."""

    @property
    def indices(self) -> list[int]:
        """The indices whose game is installed."""
        return [game.index for game in self.games if game is not None]

    def game(self, index: int) -> Game:
        """The game at ``index``; IndexError naming the split and why."""
        if not 0 <= index < len(self.games):
            raise IndexError(f"alfworld {self.name} index {index} out of range 0..{len(self.games) - 1}")
        game = self.games[index]
        if game is None:
            raise IndexError(
                f"alfworld {self.name} index {index} is one of the train games that are not vendored "
                f"(listed in {MISSING_LIST}); get_indices() leaves it out"
            )
        return game


def canonical_split(split: str) -> str:
    """``split`` or its alias resolved; ValueError naming the valid names."""
    canonical = SPLIT_ALIASES.get(split, split)
    if canonical not in SPLIT_FILES:
        raise ValueError(
            f"unknown ALFWorld split {split!r}; expected one of {sorted(SPLIT_FILES) + sorted(SPLIT_ALIASES)}"
        )
    return canonical


def load_split(split: str, data_dir: str | Path | None = None) -> Split:
    """The games of ``split`` (see the module docstring), unpacking the games on first use.

    DataError when a list or the archive is missing or corrupt, or when a game of an evaluation
    split is missing; only ``train`` may lack games (those of ``train_valid.missing.txt``).
    """
    name = canonical_split(split)
    listing = json.loads(require(f"{LISTS_DIR}/{SPLIT_FILES[name]}", data_dir).read_text())
    games_dir = unpacked(ARCHIVE, data_dir)  # <data dir>/alfworld/json_2.1.1
    root = games_dir.parent
    known_missing: set[str] = set()
    if name == "train":
        known_missing = set(require(MISSING_LIST, data_dir).read_text().split())
    games: list[Game | None] = []
    for task_type, paths in listing.items():
        for path in paths:
            file = root / path
            if file.is_file():
                games.append(Game(len(games), path, task_type, file))
            elif path in known_missing:
                games.append(None)
            else:
                raise DataError(
                    f"ALFWorld game {path} of split {name!r} is not in {root} "
                    f"(unpacked from {ARCHIVE} in {resolve_data_dir(data_dir)}); reinstall the data with "
                    "`agentrl-data install --from <copy of the data>`"
                )
    split_data = Split(name, tuple(games), root)
    if len(split_data.indices) < len(games):
        logger.info(
            "alfworld %s: %d of %d listed games installed (%d not vendored, see %s)",
            name,
            len(split_data.indices),
            len(games),
            len(games) - len(split_data.indices),
            MISSING_LIST,
        )
    return split_data
