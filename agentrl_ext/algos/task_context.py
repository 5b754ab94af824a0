"""Which task each sample of the batch being trained belongs to.

verl 0.9.1 calls custom advantage estimators with ``token_level_rewards,
response_mask, config, index (uid)`` only: not with ``non_tensor_batch``, so an
estimator cannot see ``data_source``. The trainer that knows the batch (our
``agentrl_sync`` / ``agentrl_async`` trainers, or any caller) publishes ``uid -> task`` here for the
duration of the advantage computation; the estimator looks the uids up, and
leaves its per-task metrics here for the trainer to log.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: the estimator that needs the batch's tasks, and the trainer mode that publishes them
ESTIMATOR_NAME = "task_norm_grpo"
TRAINER_MODE = "agentrl_sync"
ASYNC_TRAINER_MODE = "agentrl_async"
#: every trainer mode that publishes the tasks
TRAINER_MODES = (TRAINER_MODE, ASYNC_TRAINER_MODE)

_lock = threading.Lock()
_tasks: dict[str, str] | None = None
_turns: BatchTurns | None = None
_metrics: dict[str, float] = {}


@dataclass(frozen=True)
class BatchTurns:
    """Per row of the batch (in the estimator's row order): its uid and its turns' states, first
    token offsets and lengths in the response; with ``agentrl.turn_credit``'s weight and gamma."""

    uids: list[str]
    states: list[list[str]]
    offsets: list[list[int]]
    lengths: list[list[int]]
    weight: float
    gamma: float


@contextmanager
def batch_tasks(uid_to_task: Mapping[str, str]) -> Iterator[None]:
    """Publish the batch's ``uid -> task`` mapping while the block runs."""
    global _tasks
    with _lock:
        previous, _tasks = _tasks, {str(k): str(v) for k, v in uid_to_task.items()}
    try:
        yield
    finally:
        with _lock:
            _tasks = previous


def tasks_for(index: Iterable[Any]) -> list[str] | None:
    """Tasks of the given uids, or ``None`` when no mapping is published.

    Raises ``KeyError`` naming a uid that the published mapping lacks.
    """
    with _lock:
        mapping = _tasks
    if mapping is None:
        return None
    uids = [str(u) for u in index]
    missing = [u for u in uids if u not in mapping]
    if missing:
        raise KeyError(f"no task published for uid(s) {missing[:3]} ({len(missing)} missing)")
    return [mapping[u] for u in uids]


@contextmanager
def batch_turns(turns: BatchTurns) -> Iterator[None]:
    """Publish the batch's per-turn records (``agentrl.turn_credit``) while the block runs."""
    global _turns
    with _lock:
        previous, _turns = _turns, turns
    try:
        yield
    finally:
        with _lock:
            _turns = previous


def turns_for(index: Iterable[Any]) -> BatchTurns | None:
    """The published per-turn records, or ``None``; raises ``ValueError`` when their rows are not
    the given uids in the same order (they would be spread over the wrong samples)."""
    with _lock:
        turns = _turns
    if turns is None:
        return None
    uids = [str(u) for u in index]
    if uids != turns.uids:
        raise ValueError(
            f"the published turn records are for {len(turns.uids)} rows whose uids differ from the "
            f"{len(uids)} rows being estimated; publish them in the batch's row order"
        )
    return turns


def record_metrics(metrics: Mapping[str, float]) -> None:
    """Leave metrics for the trainer to log with this step."""
    with _lock:
        _metrics.update(metrics)


def drain_metrics() -> dict[str, float]:
    """Take (and clear) the metrics recorded since the last call."""
    with _lock:
        out = dict(_metrics)
        _metrics.clear()
    return out
