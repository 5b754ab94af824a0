"""Procedural tasks: samples generated from their index, split into train and held-out test seeds.

The CPU learning tasks (``guess``, ``calc``, ``gridroom``) build every sample from its index
alone, with ``random.Random(index)``, so a sample is the same on every machine and in every
process. The index space is split in two fixed ranges:

- **test** (held out): indices ``0 .. num_test - 1`` (default 100);
- **train**: indices from ``10000`` up, ``num_train`` of them (default 1000). A task whose
  observations show the whole sample (``calc``, ``gridroom``) skips the train indices whose
  content equals a test sample's (``content_key``), so no test sample is ever seen in training.

A worker advertises one split (``--task-kwargs '{"split": "test"}'``; default ``train``): that is
what ``get_indices`` returns, hence what the controller accepts and what ``agentrl-build-dataset``
turns into rows. ``start_sample`` plays any index of either split. To serve both splits from one
controller, run the test worker under its own name (``{"split": "test", "name": "guess_test"}``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Hashable
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import InvalidAction, Task
from agentrl_ext.env.worker.actions import ToolCall

SPLITS = ("train", "test")
TEST_START = 0
TRAIN_START = 10_000


class ProceduralTask(Task):
    """A task whose sample ``i`` is generated from ``random.Random(i)``; see the module docstring.

    Args:
        split: ``train`` or ``test``: the indices ``get_indices`` advertises.
        num_train, num_test: sizes of the splits.
        max_turns: agent steps before the sample ends with ``task limit reached``.
    """

    concurrency = 64
    default_max_turns = 6
    disjoint_content = False
    """Skip train indices whose ``content_key`` equals a test sample's."""

    def __init__(
        self,
        split: str = "train",
        num_train: int = 1000,
        num_test: int = 100,
        max_turns: int | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(**overrides)
        if split not in SPLITS:
            raise ValueError(f"{type(self).__name__}: split must be one of {SPLITS}, got {split!r}")
        max_turns = self.default_max_turns if max_turns is None else max_turns
        for key, value in (("num_train", num_train), ("num_test", num_test), ("max_turns", max_turns)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}: {key} must be an integer >= 1, got {value!r}")
        if num_test > TRAIN_START - TEST_START:
            raise ValueError(
                f"{type(self).__name__}: num_test must be at most {TRAIN_START - TEST_START}, got {num_test}"
            )
        self.split = split
        self.max_turns = max_turns
        self.test_indices = list(range(TEST_START, TEST_START + num_test))
        self.train_indices = self._train_indices(num_train)
        self._valid = frozenset(self.test_indices) | frozenset(self.train_indices)

    def _train_indices(self, count: int) -> list[int]:
        if not self.disjoint_content:
            return list(range(TRAIN_START, TRAIN_START + count))
        held_out = {self.content_key(i) for i in self.test_indices}
        indices: list[int] = []
        index = TRAIN_START
        while len(indices) < count:
            if index - TRAIN_START > 20 * count + 1000:
                raise ValueError(
                    f"{type(self).__name__}: found only {len(indices)} train samples whose content differs "
                    f"from the {len(self.test_indices)} test samples; lower num_train or num_test"
                )
            if self.content_key(index) not in held_out:
                indices.append(index)
            index += 1
        return indices

    def split_indices(self, split: str) -> list[int]:
        """The indices of ``split`` (``train`` or ``test``)."""
        if split not in SPLITS:
            raise ValueError(f"{type(self).__name__}: split must be one of {SPLITS}, got {split!r}")
        return list(self.train_indices if split == "train" else self.test_indices)

    def get_indices(self) -> list[SampleIndex]:
        return list(self.split_indices(self.split))

    def rng(self, index: SampleIndex) -> random.Random:
        """The sample's generator; raises ValueError naming an index of neither split."""
        if isinstance(index, bool) or index not in self._valid:
            raise ValueError(
                f"{self.name}: index {index!r} is in neither split (test: {TEST_START}..{TEST_START + len(self.test_indices) - 1}, "
                f"train: {len(self.train_indices)} indices from {TRAIN_START})"
            )
        return random.Random(int(index))

    def content_key(self, index: int) -> Hashable:
        """What makes two samples the same to the agent (used when ``disjoint_content``)."""
        return index


INTEGER = re.compile(r"-?\d+")


def integer_text(text: str) -> int | None:
    """``text`` as an int when it is one (``-12``, `` 7 ``), else None (``--6``, ``6-``, ``1e3``)."""
    text = text.strip()
    return int(text) if INTEGER.fullmatch(text) else None


def integer_argument(call: ToolCall, key: str) -> int:
    """``call.arguments[key]`` as an int (a JSON integer or a string of digits).

    Anything else raises :class:`InvalidAction` with ``agent validation failed``.
    """
    value = call.arguments.get(key)
    number = integer_text(value) if isinstance(value, str) and len(value.strip()) <= 6 else None
    if number is not None:
        return number
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidAction(
        SampleStatus.AGENT_VALIDATION_FAILED,
        f"{call.name}: argument {key!r} must be an integer, got {value!r}",
    )


def choice_argument(call: ToolCall, key: str, choices: tuple[str, ...]) -> str:
    """``call.arguments[key]`` if it is one of ``choices``; else ``agent validation failed``."""
    value = call.arguments.get(key)
    if isinstance(value, str) and value.strip() in choices:
        return value.strip()
    raise InvalidAction(
        SampleStatus.AGENT_VALIDATION_FAILED,
        f"{call.name}: argument {key!r} must be one of {', '.join(choices)}, got {value!r}",
    )


# -- helpers for the expert policies: they read the conversation, they keep no state ------------


def tool_call_message(name: str, arguments: dict[str, Any], step: int) -> dict[str, Any]:
    """An assistant message with one OpenAI tool call (id ``call_<step>``)."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"call_{step}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def opening_text(messages: list[dict[str, Any]]) -> str:
    """The content of the first user message (the task's opening observation)."""
    for message in messages:
        if message.get("role") == "user":
            return str(message.get("content") or "")
    raise ValueError("the conversation has no user message")


def tool_exchanges(messages: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """(arguments of the agent's first tool call, the tool's answer) for every answered step."""
    exchanges: list[tuple[dict[str, Any], str]] = []
    pending: dict[str, Any] | None = None
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            raw = message["tool_calls"][0]["function"].get("arguments") or {}
            pending = json.loads(raw) if isinstance(raw, str) else dict(raw)
        elif message.get("role") == "tool" and pending is not None:
            exchanges.append((pending, str(message.get("content") or "")))
            pending = None
    return exchanges
