"""verl's multi-turn SFT dataset, with each row's tool schemas exactly as the task advertises them,
and a sampler whose batches each hold one task's episodes.

Parquet gives a column one schema. A ``tools`` column of struct values therefore comes back with
the union of every tool's keys, the missing ones as null: calc's ``calculator(expression)`` and
``answer(value)`` read back as ``calculator(expression, value: null)`` and
``answer(expression: null, value)``. verl's :class:`MultiTurnSFTDataset` renders those nulls into
the system prompt, so the model would be warm-started on a prompt that RL and evaluation never
show it (they render the controller's schemas). :func:`agentrl_ext.trainer.sft.write_expert_dataset`
also writes each row's schemas as JSON text (``tools_json``); this class renders those instead.
``agentrl_ext.trainer.sft.sft_command`` selects it through verl's ``data.custom_cls``. Files
without ``tools_json`` are read exactly as verl reads them.

:class:`TaskBatchSampler` (``agentrl.sft.batch_by_task``): verl's engine pads each micro-batch
to its longest episode on the CPU platform, so a batch that mixes guess (~130 tokens) with
gridroom (~550) costs gridroom's length for every row; batches of one task each cost about half
the tokens on the main job's data (docs/learning_runs.md, session 16). ``sft_main`` installs it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler

from agentrl_ext.trainer.sft import TASK_COLUMN, TOOLS_JSON_COLUMN
from agentrl_ext.verl_compat import sft_dataset_with_tools_from

__all__ = ["ExpertSFTDataset", "TaskBatchSampler"]

#: :class:`MultiTurnSFTDataset` that takes each row's tools from ``tools_json`` when present
ExpertSFTDataset = sft_dataset_with_tools_from(TOOLS_JSON_COLUMN, "ExpertSFTDataset", __name__, TASK_COLUMN)


class TaskBatchSampler(DistributedSampler):
    """torch's ``DistributedSampler`` whose every run of ``batch size`` indices is one task's.

    For a shuffled dataset that knows each row's task (``batch_groups``) and its global batch
    size: every epoch, each task's rows are shuffled and cut into batches (a task's last partial
    batch is left out, as ``drop_last`` leaves out the epoch's), the batches of all tasks are
    shuffled together (each task keeps its share of the steps), and replica ``rank`` takes every
    ``num_replicas``-th of them. The data loader, which batches the indices in order, then gets
    one task per batch. Anything else (the unshuffled validation split, files without a task
    column) is sampled exactly as ``DistributedSampler`` does.
    """

    def _batches(self) -> list[list[int]] | None:
        groups = getattr(self.dataset, "batch_groups", None)
        size = getattr(self.dataset, "global_batch_size", None)
        if not self.shuffle or not groups or not size:
            return None
        per_replica = max(1, int(size) // self.num_replicas)
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        batches = []
        for group in sorted(set(groups)):
            rows = [i for i, g in enumerate(groups) if g == group]
            order = [rows[i] for i in torch.randperm(len(rows), generator=generator).tolist()]
            batches += [
                order[i : i + per_replica] for i in range(0, len(order) - per_replica + 1, per_replica)
            ]
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        per_rank = len(batches) // self.num_replicas
        return batches[self.rank :: self.num_replicas][:per_rank]

    def __iter__(self) -> Iterator[int]:
        batches = self._batches()
        if batches is None:
            return super().__iter__()
        return iter([i for batch in batches for i in batch])

    def __len__(self) -> int:
        batches = self._batches()
        return super().__len__() if batches is None else sum(map(len, batches))
