"""The ``agentrl:`` config node (every key we add to verl's config lives under it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


@dataclass
class AssetsConfig:
    """Offline assets the entry point builds before launching verl, when missing."""

    #: build the tiny offline model at ``actor_rollout_ref.model.path`` if that path does not exist
    build_tiny_model: bool = False
    tiny_model_seed: int = 0
    #: build the toy letters dataset at ``data.train_files`` / ``data.val_files`` if missing
    build_toy_data: bool = False


@dataclass
class AgentRLConfig:
    """Validated view of the ``agentrl:`` node."""

    cache_dir: str = ".cache/agentrl"
    assets: AssetsConfig = field(default_factory=AssetsConfig)

    def __post_init__(self) -> None:
        if not self.cache_dir:
            raise ValueError(
                "agentrl.cache_dir is empty; set it to a writable directory (default .cache/agentrl)"
            )
        self.cache_dir = str(Path(os.path.expanduser(self.cache_dir)).resolve())

    @classmethod
    def from_config(cls, node: DictConfig | dict[str, Any] | None) -> AgentRLConfig:
        """Build from the composed ``agentrl`` node, naming unknown keys."""
        raw: dict[str, Any] = {}
        if isinstance(node, DictConfig):
            raw = dict(OmegaConf.to_container(node, resolve=True))  # type: ignore[arg-type]
        elif node is not None:
            raw = dict(node)
        _reject_unknown("agentrl", raw, cls)
        assets = raw.pop("assets", None) or {}
        _reject_unknown("agentrl.assets", assets, AssetsConfig)
        return cls(assets=AssetsConfig(**assets), **raw)


def _reject_unknown(where: str, raw: dict[str, Any], klass: type) -> None:
    known = {f.name for f in fields(klass)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} under {where}; known keys: {sorted(known)}")
