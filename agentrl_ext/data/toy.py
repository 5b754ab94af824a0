"""A toy single-turn dataset for smoke runs: ask for a letter, reward how often it appears.

The reward (:func:`agentrl_ext.trainer.toy_reward.compute_score`) is dense, so GRPO
groups have reward variance and the policy gradient is non-zero from step one.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

logger = logging.getLogger(__name__)

DATA_SOURCE = "toy_letters"
LETTERS = "abcdefghij"


def toy_rows(n: int, seed: int) -> list[dict]:
    """``n`` verl RLHF rows (``prompt`` chat messages, ``data_source``, ``reward_model``)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        letter = rng.choice(LETTERS)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"Write the letter {letter} as often as you can."}],
                "ability": "toy",
                "reward_model": {"style": "rule", "ground_truth": letter},
                "extra_info": {"index": i, "split": "train"},
            }
        )
    return rows


def build_toy_dataset(
    out_dir: str | Path, n_train: int = 256, n_val: int = 16, seed: int = 0
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir`` (kept if already there)."""
    from agentrl_ext.data.multitask import write_dataset

    out = Path(out_dir)
    train, val = out / "train.parquet", out / "val.parquet"
    for path, n, s in ((train, n_train, seed), (val, n_val, seed + 1)):
        if not path.exists():
            write_dataset(toy_rows(n, s), path)
            logger.info("wrote %d toy rows to %s", n, path)
    return train, val
