"""The ``agentrl:`` config node (every key we add to verl's config lives under it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


@dataclass
class AssetsConfig:
    """``agentrl.assets``: offline assets the entry point builds before launching verl, when missing."""

    #: build the tiny offline model at ``actor_rollout_ref.model.path`` if that path does not exist
    build_tiny_model: bool = False
    tiny_model_seed: int = 0
    #: build the toy letters dataset at ``data.train_files`` / ``data.val_files`` if missing
    build_toy_data: bool = False


@dataclass
class AgentLoopConfig:
    """``agentrl.agent_loop``: the multi-turn function-call agent loop (``agent_name: agentrl``)."""

    #: controller base URL, e.g. http://127.0.0.1:5020/api
    controller_url: str | None = None
    #: hard cap on assistant turns (each task's own turn limit applies too)
    max_turns: int = 32
    #: reward of a trajectory that does not end ``completed`` (AgentRL: -0.2)
    incomplete_punishment: float = -0.2
    #: an episode counts as a success when it ends ``completed`` with at least this reward
    success_reward: float = 1.0
    #: cap on the tokens of one assistant turn (None: the whole remaining response budget)
    max_tokens_per_turn: int | None = None
    #: the model's tool-call format: hermes (Qwen2.5) or any verl tool parser name
    tool_format: str = "hermes"
    #: attempts for a session start / interact on transport errors (then the sample is dropped)
    env_attempts: int = 3
    #: seconds one environment call may take
    env_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"agentrl.agent_loop.max_turns={self.max_turns} must be >= 1")
        if self.env_attempts < 1:
            raise ValueError(f"agentrl.agent_loop.env_attempts={self.env_attempts} must be >= 1")


@dataclass
class CrossPolicyConfig:
    """``agentrl.cross_policy``: AgentRL's cross-policy sampling with a stale pool."""

    enable: bool = False
    #: probability that a generation call goes to the stale pool (AgentRL: 0.25)
    stale_ratio: float = 0.25
    #: the stale pool's weights are refreshed every this many steps (AgentRL: 25)
    stale_step: int = 25
    #: replicas in the stale pool
    stale_replicas: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.stale_ratio <= 1.0:
            raise ValueError(f"agentrl.cross_policy.stale_ratio={self.stale_ratio} must be within [0, 1]")
        if self.stale_step < 1:
            raise ValueError(f"agentrl.cross_policy.stale_step={self.stale_step} must be >= 1")
        if self.stale_replicas < 1:
            raise ValueError(f"agentrl.cross_policy.stale_replicas={self.stale_replicas} must be >= 1")


_NESTED: dict[str, type] = {
    "assets": AssetsConfig,
    "agent_loop": AgentLoopConfig,
    "cross_policy": CrossPolicyConfig,
}


@dataclass
class AgentRLConfig:
    """Validated view of the ``agentrl:`` node."""

    cache_dir: str = ".cache/agentrl"
    assets: AssetsConfig = field(default_factory=AssetsConfig)
    agent_loop: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    cross_policy: CrossPolicyConfig = field(default_factory=CrossPolicyConfig)

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
        nested = {}
        for key, klass in _NESTED.items():
            values = raw.pop(key, None) or {}
            _reject_unknown(f"agentrl.{key}", values, klass)
            nested[key] = klass(**values)
        return cls(**nested, **raw)


def _reject_unknown(where: str, raw: dict[str, Any], klass: type) -> None:
    known = {f.name for f in fields(klass)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} under {where}; known keys: {sorted(known)}")
