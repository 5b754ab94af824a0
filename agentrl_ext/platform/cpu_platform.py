"""A ``cpu`` platform for verl's platform registry.

verl 0.9.1 ships platforms for NVIDIA, Ascend and ROCm only, and falls back to
"nvidia" when none is found. This platform lets verl's real trainer run on a
machine without accelerators: tensors live on ``cpu``, collectives use gloo,
and Ray schedules trainer workers on CPU slots.

It knows nothing about AgentRL and is useful to any verl user as it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"
#: verl's trainer-side adapter of its vLLM rollout (kept as it is on CPU)
VERL_VLLM_SERVER_ADAPTER = "verl.workers.rollout.vllm_rollout.ServerAdapter"
#: the KV cache of each vLLM-CPU engine, in GiB, unless ``VLLM_CPU_KVCACHE_SPACE`` is set
DEFAULT_VLLM_KVCACHE_GIB = "1"


class _CPUDeviceModule(types.ModuleType):
    """Stands in for ``torch.cuda``: the calls verl makes on its device module.

    Stream/event/sync calls go to ``torch.cpu``; memory statistics come from the
    process's host memory; cache and allocator calls are no-ops (the CPU has no
    caching allocator to release).
    """

    def __init__(self) -> None:
        super().__init__("agentrl_ext.platform.cpu_device")

    def __getattr__(self, name: str) -> Any:
        # Anything torch.cpu already provides (Stream, Event, current_stream, stream,
        # synchronize, device_count, is_available, ...).
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        raise AttributeError(
            f"the CPU platform's device module has no attribute {name!r}; verl called a "
            f"torch.cuda API the CPU backend does not emulate (add it to {__name__})"
        )

    # -- device selection ------------------------------------------------------
    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    # -- RNG -------------------------------------------------------------------
    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    # -- memory ----------------------------------------------------------------
    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        import psutil

        return int(psutil.Process().memory_info().rss)

    memory_reserved = memory_allocated
    max_memory_allocated = memory_allocated
    max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None


cpu_device_module = _CPUDeviceModule()


def cuda_present() -> bool:
    """Whether this host has a CUDA device (or the NVIDIA driver tool that says so)."""
    return torch.cuda.is_available() or shutil.which("nvidia-smi") is not None


def vllm_cpu_version() -> str | None:
    """Version of the installed ``vllm-cpu`` distribution (vLLM built for CPUs), None without it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-cpu")
    except PackageNotFoundError:
        return None


def cpu_platform_requested() -> bool:
    """Whether the user asked for the CPU platform explicitly (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def cpu_platform_active() -> bool:
    """Whether verl in this process will run on the CPU platform."""
    explicit = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if explicit:
        return cpu_platform_requested()
    return not cuda_present()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform for CPU-only hosts (gloo collectives, CPU Ray slots)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return cpu_device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Auto-detection probes nvidia/npu/rocm first; we claim the host only when it
        # has no CUDA device at all, so GPU clusters are never switched to CPU.
        return cpu_platform_requested() or not cuda_present()

    def current_device(self) -> str:  # type: ignore[override]
        # verl writes ``tensor.to(get_device_id())``; an int would mean ``cuda:<id>``.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # No device masking on CPU; a name nobody else sets keeps verl's bookkeeping inert.
        return "AGENTRL_CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # One trainer "device" is one logical Ray CPU slot.
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def rollout_env_vars(self) -> dict[str, str]:
        # verl puts these into its rollout servers' environment: vLLM-CPU sizes its KV cache from
        # this variable (with none set it takes a share of host memory per engine).
        return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", DEFAULT_VLLM_KVCACHE_GIB)}

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
