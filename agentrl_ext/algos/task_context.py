"""What verl does not pass to an advantage estimator, handed over for one call.

verl 0.9.1 calls a registered estimator with ``token_level_rewards, response_mask, config, index
(uid)`` only (``verl.trainer.ppo.ray_trainer.compute_advantage``): not with ``non_tensor_batch``,
so ``task_norm_grpo`` cannot see each sample's task (``data_source``) or its turn records. The
trainer that knows the batch (our ``agentrl_sync`` / ``agentrl_async`` trainers, or any caller)
builds one :class:`BatchContext` (the tasks by uid, the turn records, and the step's metrics dict)
and hands it to the estimator for the duration of verl's advantage call (:func:`estimating`); the
estimator writes its metrics straight into that dict. The hand-over is a ``ContextVar``: scoped to
the calling thread and block, gone when the block ends, nothing kept between steps.

A caller that invokes the math itself passes everything explicitly
(:func:`agentrl_ext.algos.estimator.estimate`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

#: the estimator that needs the batch's tasks, and the trainer modes that hand them over
ESTIMATOR_NAME = "task_norm_grpo"
TRAINER_MODE = "agentrl_sync"
ASYNC_TRAINER_MODE = "agentrl_async"
TRAINER_MODES = (TRAINER_MODE, ASYNC_TRAINER_MODE)


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


@dataclass(frozen=True)
class BatchContext:
    """One advantage call's inputs that verl cannot pass, and where its metrics go."""

    tasks: Mapping[str, str]  # uid -> task
    turns: BatchTurns | None = None  # per-turn records (agentrl.turn_credit), in the batch's row order
    metrics: dict[str, float] = field(default_factory=dict)  # the step's metrics: the estimator adds to it

    def tasks_for(self, index: Iterable[Any]) -> list[str]:
        """Tasks of the given uids; ``KeyError`` names a uid the context lacks."""
        uids = [str(u) for u in index]
        missing = [u for u in uids if u not in self.tasks]
        if missing:
            raise KeyError(f"no task handed over for uid(s) {missing[:3]} ({len(missing)} missing)")
        return [self.tasks[u] for u in uids]

    def turns_for(self, index: Iterable[Any]) -> BatchTurns | None:
        """The turn records, or ``None``; ``ValueError`` when their rows are not the given uids in
        the same order (they would be spread over the wrong samples)."""
        if self.turns is None:
            return None
        uids = [str(u) for u in index]
        if uids != self.turns.uids:
            raise ValueError(
                f"the turn records are for {len(self.turns.uids)} rows whose uids differ from the "
                f"{len(uids)} rows being estimated; hand them over in the batch's row order"
            )
        return self.turns


_current: ContextVar[BatchContext | None] = ContextVar("agentrl_batch_context", default=None)


@contextmanager
def estimating(context: BatchContext) -> Iterator[BatchContext]:
    """Hand ``context`` to the estimator verl calls inside the block."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def current() -> BatchContext | None:
    """The context handed over by the enclosing :func:`estimating` block, if any."""
    return _current.get()
