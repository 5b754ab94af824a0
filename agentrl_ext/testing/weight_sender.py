"""A stand-in for verl's actor worker in weight-sync tests: a verl ``Worker`` holding a HF model that
sends its weights through a checkpoint engine.

Its ``update_weights`` / ``execute_checkpoint_engine`` have the dispatch modes and bodies of verl's
``ActorRolloutRefWorker`` for a non-``naive`` mode (build the engine from the backend name with
``is_master`` on rank 0; ``await checkpoint_engine.send_weights(per-tensor weights)``), so verl's
``CheckpointEngineManager`` drives it as it drives the real actor group, without an FSDP engine,
an optimizer or a dataset. ``perturb`` stands in for an optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.checkpoint_engine import CheckpointEngineRegistry
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register

from agentrl_ext.platform.hf_server import load_causal_lm

#: verl's ``Dispatch`` is a dynamic enum whose members mypy cannot see
DISPATCH: Any = Dispatch


class WeightSenderWorker(Worker):
    """A model's weights, sent through checkpoint engine ``backend`` when verl asks for them."""

    def __init__(
        self, model_path: str, backend: str, bucket_megabytes: int = 16, device: str = "cpu"
    ) -> None:
        super().__init__()
        self.model = load_causal_lm(model_path, torch.float32).to(device)
        self.checkpoint_engine = CheckpointEngineRegistry.new(
            backend, is_master=self.rank == 0, bucket_size=bucket_megabytes << 20
        )
        self.sends = 0

    def _weights(self) -> Any:
        # the HF names, each tensor once (a tied lm_head is in state_dict() as its own name too)
        return ((name, tensor.detach()) for name, tensor in self.model.state_dict().items())

    @register(dispatch_mode=DISPATCH.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> dict:
        if mode == "naive":
            raise ValueError("WeightSenderWorker sends through a checkpoint engine only, not naive")
        self.sends += 1
        return await self.checkpoint_engine.send_weights(self._weights(), global_steps=global_steps) or {}

    @register(dispatch_mode=DISPATCH.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.checkpoint_engine, method)(*args, **kwargs)

    @register(dispatch_mode=DISPATCH.ONE_TO_ALL)
    def perturb(self, seed: int, std: float = 0.05) -> None:
        """Move every weight by Gaussian noise (an optimizer step, for the tests)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.model.parameters():
                noise = torch.randn(param.shape, generator=generator) * std
                param.add_(noise.to(param.device, param.dtype))

    @register(dispatch_mode=DISPATCH.ONE_TO_ALL)
    def scale(self, factor: float) -> None:
        """Multiply every weight by ``factor`` (0 gives a model whose every next token is uniform)."""
        with torch.no_grad():
            for param in self.model.parameters():
                param.mul_(factor)

    @register(dispatch_mode=DISPATCH.ONE_TO_ALL)
    def state(self) -> dict[str, torch.Tensor]:
        """The weights as CPU copies."""
        return {name: tensor.to("cpu").clone() for name, tensor in self._weights()}

    @register(dispatch_mode=DISPATCH.ONE_TO_ALL)
    def send_count(self) -> int:
        """How many times verl asked this worker to send its weights."""
        return self.sends


def sender_group(model_path: str, backend: str, device: str = "cpu", **kwargs: Any) -> Any:
    """One :class:`WeightSenderWorker` in a verl ``RayWorkerGroup`` on a resource pool of its own
    (one device slot: a GPU, or on the CPU platform one logical CPU), as verl places its actor."""
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.utils.device import get_device_name

    pool = RayResourcePool([1], use_gpu=True, max_colocate_count=1, name_prefix="weight_sender")
    worker = RayClassWithInitArgs(
        cls=ray.remote(WeightSenderWorker), model_path=model_path, backend=backend, device=device, **kwargs
    )
    return RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, device_name=get_device_name())
