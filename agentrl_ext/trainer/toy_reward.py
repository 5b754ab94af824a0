"""Dense toy reward for the CPU smoke recipe (verl ``custom_reward_function``)."""

from __future__ import annotations

from typing import Any


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any
) -> float:
    """Share of the response's characters that equal the requested letter, in [0, 1]."""
    if not solution_str:
        return 0.0
    return solution_str.count(ground_truth) / len(solution_str)
