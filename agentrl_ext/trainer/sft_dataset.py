"""verl's multi-turn SFT dataset, with each row's tool schemas exactly as the task advertises them.

Parquet gives a column one schema. A ``tools`` column of struct values therefore comes back with
the union of every tool's keys, the missing ones as null: calc's ``calculator(expression)`` and
``answer(value)`` read back as ``calculator(expression, value: null)`` and
``answer(expression: null, value)``. verl's :class:`MultiTurnSFTDataset` renders those nulls into
the system prompt, so the model would be warm-started on a prompt that RL and evaluation never
show it (they render the controller's schemas). :func:`agentrl_ext.trainer.sft.write_expert_dataset`
also writes each row's schemas as JSON text (``tools_json``); this class renders those instead.
``agentrl_ext.trainer.sft.sft_command`` selects it through verl's ``data.custom_cls``. Files
without ``tools_json`` are read exactly as verl reads them.
"""

from __future__ import annotations

from agentrl_ext.trainer.sft import TOOLS_JSON_COLUMN
from agentrl_ext.verl_compat import sft_dataset_with_tools_from

__all__ = ["ExpertSFTDataset"]

#: :class:`MultiTurnSFTDataset` that takes each row's tools from ``tools_json`` when present
ExpertSFTDataset = sft_dataset_with_tools_from(TOOLS_JSON_COLUMN, "ExpertSFTDataset", __name__)
