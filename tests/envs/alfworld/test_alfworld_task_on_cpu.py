"""alfworld without the controller: AgentBench's schema and text, the splits, command matching."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml
from alfworld_helpers import SHARED_DATA

from envs.alfworld.actions import normalize, other_wording, resolve
from envs.alfworld.data import load_split
from envs.alfworld.prompts import SYSTEM_PROMPT, TOOLS, intro_text, observation_text, user_prompt
from envs.alfworld.task import ALFWorldTask

# sha256 of the string returned by get_task_instruction() in AgentBench's
# src/server/tasks/alfworld/task.py @ 578c5e9 (computed from that file, not from this project)
AGENTBENCH_INSTRUCTION_SHA256 = "5e2729cf7fbbca0a5f4760507734133749f09053e2687a68a678a29bfc9af3f2"


def test_tool_schema_is_agentbench_config_on_cpu(alfworld_data_dir):
    config = yaml.safe_load((alfworld_data_dir / "agentbench/configs/tasks/alfworld.yaml").read_text())
    assert TOOLS == config["default"]["parameters"]["tools"]
    assert config["default"]["parameters"]["max_step"] == 20


def test_system_prompt_is_agentbench_instruction_on_cpu():
    assert hashlib.sha256(SYSTEM_PROMPT.encode()).hexdigest() == AGENTBENCH_INSTRUCTION_SHA256


def test_message_layout_on_cpu():
    feedback = (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.\n\nYour task is to: x."
    )
    assert intro_text(feedback) == "You are in the middle of a room.\nYour task is to: x."
    assert user_prompt(feedback, ["look", "inventory"]) == (
        "Here is your task. You are in the middle of a room.\nYour task is to: x. AVAILABLE ACTIONS: look\ninventory\n"
    )
    assert (
        observation_text("You arrive at loc 5. On the desk 1, you see a pen 1.")
        == "On the desk 1, you see a pen 1."
    )
    assert (
        observation_text("You arrive at desk 1. On it you see nothing.")
        == "You arrive at desk 1. On it you see nothing."
    )


def _listed(split_file: str) -> list[str]:
    listing = json.loads((SHARED_DATA / "agentbench/alfworld_lists" / split_file).read_text())
    return [path for paths in listing.values() for path in paths]


@pytest.mark.parametrize(
    ("split", "file", "size"),
    [("new_std", "new_std.json", 109), ("dev", "dev.json", 20), ("standard", "standard.json", 50)],
)
def test_evaluation_splits_have_every_game_in_agentbench_order_on_cpu(alfworld_data_dir, split, file, size):
    loaded = load_split(split, alfworld_data_dir)
    listed = _listed(file)
    assert len(listed) == size and loaded.indices == list(range(size))
    assert [loaded.game(i).path for i in range(size)] == listed
    assert all(loaded.game(i).file.is_file() for i in range(size))


def test_train_split_serves_the_vendored_games_at_their_positions_on_cpu(alfworld_data_dir):
    listed = _listed("train_valid.json")
    missing = set((SHARED_DATA / "alfworld/train_valid.missing.txt").read_text().split())
    loaded = load_split("train_valid", alfworld_data_dir)
    assert loaded.name == "train" and len(loaded.games) == len(listed) == 3150
    expected = [i for i, path in enumerate(listed) if path not in missing]
    assert len(expected) == 2714 and loaded.indices == expected
    absent = next(i for i, path in enumerate(listed) if path in missing)
    with pytest.raises(IndexError, match="not vendored"):
        loaded.game(absent)


def test_unknown_split_names_the_valid_ones_on_cpu(alfworld_data_dir):
    with pytest.raises(ValueError, match="new_std"):
        load_split("valid_unseen", alfworld_data_dir)


def test_put_and_move_are_one_command_on_cpu():
    assert other_wording("put apple 1 in/on countertop 1") == "move apple 1 to countertop 1"
    assert other_wording("move apple 1 to countertop 1") == "put apple 1 in/on countertop 1"
    assert other_wording("go to countertop 1") is None
    old = ["go to countertop 1", "put apple 1 in/on countertop 1"]
    new = ["go to countertop 1", "move apple 1 to countertop 1"]
    assert resolve("move apple 1 to countertop 1", old).command == "put apple 1 in/on countertop 1"
    assert resolve("Put apple 1 in/on countertop 1", new).command == "move apple 1 to countertop 1"
    assert resolve("put apple 1 in/on countertop 1", old).how == "exact"


def test_commands_are_matched_like_agentbench_on_cpu():
    pytest.importorskip("nltk", reason="nltk comes with agentrl_ext[alfworld]")
    choices = ["examine cabinet 1", "go to cabinet 1", "open cabinet 1"]
    assert normalize("  Go To Cabinet 1\nbecause it is there") == "go to cabinet 1"
    assert resolve("  Go To Cabinet 1\nbecause", choices).how == "exact"
    # not admissible: the closest admissible command by BLEU
    assert resolve("go to cabinet one", choices).command == "go to cabinet 1"
    assert resolve("go to cabinet one", choices).how == "bleu"
    # nothing in common: the text goes to the game unchanged
    assert resolve("xyzzy", ["look", "inventory"]).command == "xyzzy"
    assert resolve("go to cabinet one", choices, fuzzy=False).how == "unmatched"


@pytest.mark.parametrize(("split", "label"), [("new_std", "alfworld-std"), ("dev", "alfworld-dev")])
def test_results_name_the_benchmark_and_the_invalid_action_rule_on_cpu(alfworld_data_dir, split, label):
    overall = ALFWorldTask(split=split, data_dir=alfworld_data_dir).calculate_overall([])
    assert (overall["benchmark"], overall["invalid_action_rule"]) == (label, "feedback")
