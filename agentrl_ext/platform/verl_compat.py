"""Every place where agentrl_ext touches verl 0.9.1 internals, in one module.

Public registries (platform, rollout replica, engine) are used where verl has them;
the rest are small, named adjustments that ``tests/platform/test_verl_compat_on_cpu.py``
checks against the installed verl, so that a verl upgrade fails loudly there.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"

#: verl private names we rely on: (module, attribute).
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("verl.workers.rollout.base", "_ROLLOUT_REGISTRY"),
    ("verl.single_controller.ray.base", "ResourcePoolManager._check_resource_available"),
    ("verl.utils.distributed", "initialize_global_process_group_ray"),
    ("verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithLMHead"),
    ("verl.workers.engine.fsdp.transformer_impl", "CPUOffloadPolicy"),
    ("verl.trainer.main_ppo", "main.__wrapped__"),
)


def check_verl_version() -> None:
    """Raise with a clear message when the installed verl is not the pinned one."""
    import verl

    if verl.__version__ != VERL_VERSION:
        raise RuntimeError(
            f"agentrl_ext is built against verl=={VERL_VERSION} but verl {verl.__version__} is installed; "
            f"install verl[verl-core]=={VERL_VERSION} or update agentrl_ext.platform.verl_compat"
        )


def register_hf_rollout() -> None:
    """Register the ``hf`` rollout in verl's two rollout registries."""
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    rollout_base._ROLLOUT_REGISTRY[("hf", "async")] = "agentrl_ext.platform.hf_rollout.HFServerAdapter"

    def _load_hf_replica() -> type:
        from agentrl_ext.platform.hf_rollout import HFReplica

        return HFReplica

    RolloutReplicaRegistry.register("hf", _load_hf_replica)


def use_gloo_process_group() -> None:
    """verl builds the backend string ``cpu:gloo,{device}:{backend}``; on CPU that is
    ``cpu:gloo,cpu:gloo``, which torch rejects. Default the backend to plain ``gloo``
    (the function object is shared by every module that imported it)."""
    from verl.utils import distributed

    fn = distributed.initialize_global_process_group_ray
    defaults = fn.__defaults__ or ()
    if defaults != (None, None) and defaults != (None, "gloo"):
        raise RuntimeError(
            f"verl.utils.distributed.initialize_global_process_group_ray changed signature "
            f"(defaults {defaults}); update agentrl_ext.platform.verl_compat.use_gloo_process_group"
        )
    fn.__defaults__ = (None, "gloo")


def register_fsdp_engine_for_cpu() -> None:
    """verl registers its FSDP engines for cuda/npu only; FSDP2 works on CPU with gloo."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    engines = EngineRegistry._engines
    if "cpu" not in engines.get("language_model", {}).get("fsdp", {}):
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
            FSDPEngineWithLMHead
        )
    if "cpu" not in engines.get("value_model", {}).get("fsdp", {}):
        EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device="cpu")(
            FSDPEngineWithValueHead
        )


def count_cpu_slots_in_resource_check() -> None:
    """verl's resource check counts only GPU/NPU resources; on the CPU platform a trainer
    "device" is a logical Ray CPU slot, so count those instead."""
    from verl.single_controller.ray.base import ResourcePoolManager

    original = ResourcePoolManager._check_resource_available
    if getattr(original, "_agentrl_cpu", False):
        return

    @functools.wraps(original)
    def _check(self: Any) -> None:
        from verl.plugin.platform import get_platform

        if get_platform().device_name != "cpu":
            return original(self)
        import ray

        available = sum(
            node.get("CPU", 0) for node in ray._private.state.available_resources_per_node().values()
        )
        required = sum(n for per_node in self.resource_pool_spec.values() for n in per_node)
        if available < required:
            raise ValueError(
                f"the trainer needs {required} CPU slots (trainer.n_gpus_per_node x trainer.nnodes) but Ray has "
                f"{available} free; raise ray_kwargs.ray_init.num_cpus or lower trainer.n_gpus_per_node"
            )

    _check._agentrl_cpu = True  # type: ignore[attr-defined]
    ResourcePoolManager._check_resource_available = _check  # type: ignore[method-assign]


def run_verl_main(config: Any) -> None:
    """Run verl's ``main_ppo.main`` body on an already-composed config (no copy of it):
    ``hydra.main`` keeps the undecorated function as ``__wrapped__``."""
    from verl.trainer import main_ppo

    body = getattr(main_ppo.main, "__wrapped__", None)
    if body is None:
        raise RuntimeError("verl.trainer.main_ppo.main is no longer a hydra.main wrapper; update verl_compat")
    body(config)


def unpinned_fsdp2_offload() -> None:
    """verl gives FSDP2 reference models ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an
    accelerator. On CPU the policy keeps its meaning (params stay on CPU) without pinning."""
    import dataclasses

    from verl.workers.engine.fsdp import transformer_impl

    base = transformer_impl.CPUOffloadPolicy
    if getattr(base, "_agentrl_unpinned", False):
        return

    @dataclasses.dataclass
    class UnpinnedCPUOffloadPolicy(base):  # type: ignore[misc, valid-type]
        _agentrl_unpinned = True

        def __post_init__(self) -> None:
            self.pin_memory = False

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy  # type: ignore[misc]
