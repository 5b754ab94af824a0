"""Every place where agentrl_ext touches verl 0.9.1 internals, in one module.

Public registries (platform, rollout replica, engine) are used where verl has them;
the rest are small, named adjustments that ``tests/test_verl_compat_on_cpu.py``
checks against the installed verl, so that a verl upgrade fails loudly there.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

logger = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"

#: verl private names we rely on: (module, attribute).
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("verl.workers.rollout.base", "_ROLLOUT_REGISTRY"),
    ("verl.single_controller.ray.base", "ResourcePoolManager._check_resource_available"),
    ("verl.utils.distributed", "initialize_global_process_group_ray"),
    ("verl.utils.distributed", "initialize_global_process_group"),
    ("verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithLMHead"),
    ("verl.workers.engine.fsdp.transformer_impl", "CPUOffloadPolicy"),
    ("verl.trainer.main_ppo", "main.__wrapped__"),
    ("verl.workers.engine.base", "EngineRegistry._engines"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._compute_old_log_prob"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._compute_advantage"),
    ("verl.workers.rollout.replica", "RolloutReplicaRegistry._registry"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._add_prompts_to_generate"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._build_replay_buffer"),
    ("verl.trainer.ppo.v1.replay_buffer", "ReplayBuffer._wait_for_next_poll"),
    ("verl.utils.dataset.multiturn_sft_dataset", "MultiTurnSFTDataset._read_files_and_process"),
)

#: verl private instance attributes we set (checked through verl's public accessors).
PRIVATE_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("verl.workers.rollout.replica.RolloutReplica", "_server_handle"),
    ("verl.workers.rollout.replica.RolloutReplica", "_server_address"),
    ("verl.trainer.ppo.v1.trainer_base.PPOTrainer", "_enable_hybrid_replicas"),
)

#: verl conventions we parse (not API): name -> what we rely on
PRIVATE_CONVENTIONS: dict[str, str] = {
    "agent-loop worker actor name": "AgentLoopManager names its workers agent_loop_worker_{rank}_{8 hex}",
    "vLLM replica worker query": "vLLMReplica.launch_servers asks each rollout worker __ray_call__.remote(fn) for (node id, accelerator id) and only counts the workers it passes to vLLMHttpServer",
    "TransferQueue replay layout": "v1 trainer: prompt key {uid} tagged is_prompt/status (pending, running, finished, failure)/global_steps; trajectory keys {uid}_{session}_{index} (ReplayBuffer docstring)",
}

#: Ray private names we rely on: (module, attribute).
RAY_PRIVATE_NAMES: tuple[tuple[str, str], ...] = (("ray._private.state", "available_resources_per_node"),)


def check_verl_version() -> None:
    """Raise with a clear message when the installed verl is not the pinned one."""
    import verl

    if verl.__version__ != VERL_VERSION:
        raise RuntimeError(
            f"agentrl_ext is built against verl=={VERL_VERSION} but verl {verl.__version__} is installed; "
            f"install verl[verl-core]=={VERL_VERSION} or update agentrl_ext.verl_compat"
        )


def register_rollout(name: str, server_adapter: str, replica: str) -> None:
    """Register rollout ``name`` in verl's two rollout registries: its async server adapter and its
    replica class, each by dotted path (imported when verl first asks for them)."""
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    rollout_base._ROLLOUT_REGISTRY[(name, "async")] = server_adapter

    def _load_replica() -> type:
        module, _, attr = replica.rpartition(".")
        return getattr(importlib.import_module(module), attr)

    RolloutReplicaRegistry.register(name, _load_replica)


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
            f"(defaults {defaults}); update agentrl_ext.verl_compat.use_gloo_process_group"
        )
    fn.__defaults__ = (None, "gloo")


def use_gloo_in_torchrun_process_group() -> None:
    """verl's torchrun entry points (``verl.trainer.sft_trainer``) call
    ``initialize_global_process_group()``, which builds the same ``cpu:gloo,cpu:gloo`` backend
    string and takes no backend argument. Replace it (the module attribute: callers import it at
    call time) with one that initialises plain gloo and returns ``(local_rank, rank, world_size)``
    as verl's does."""
    import inspect
    from datetime import timedelta

    import torch.distributed
    from verl.utils import distributed

    current = distributed.initialize_global_process_group
    if getattr(current, "_agentrl_cpu", False):
        return
    parameters = list(inspect.signature(current).parameters)
    if parameters != ["timeout_second"]:
        raise RuntimeError(
            f"verl.utils.distributed.initialize_global_process_group changed signature (parameters "
            f"{parameters}); update agentrl_ext.verl_compat.use_gloo_in_torchrun_process_group"
        )

    @functools.wraps(current)
    def initialize_gloo(timeout_second: int = 36000) -> tuple[int, int, int]:
        torch.distributed.init_process_group(
            backend="gloo",
            timeout=timedelta(seconds=timeout_second),
            init_method=os.environ.get("DIST_INIT_METHOD", None),
        )
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    initialize_gloo._agentrl_cpu = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group = initialize_gloo


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


def run_verl_main(config: Any, pre_validation_hooks: bool = True) -> None:
    """Run verl's ``main_ppo.main`` body on an already-composed config (no copy of it):
    ``hydra.main`` keeps the undecorated function as ``__wrapped__``. ``pre_validation_hooks=False``
    runs it without the hooks of :func:`run_before_verl_config_validation` (the caller ran their
    work itself)."""
    from verl.trainer import main_ppo

    body = getattr(main_ppo.main, "__wrapped__", None)
    if body is None:
        raise RuntimeError("verl.trainer.main_ppo.main is no longer a hydra.main wrapper; update verl_compat")
    global _pre_validation_hooks_on
    previous, _pre_validation_hooks_on = _pre_validation_hooks_on, pre_validation_hooks
    try:
        body(config)
    finally:
        _pre_validation_hooks_on = previous


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


# ---------------------------------------------------------------------------------------------
# verl's v1 trainer step: two private per-step methods turned into named hooks.


class TrainerStepHooks:
    """Mixin for a subclass of verl's v1 ``PPOTrainer`` (e.g. ``PPOTrainerSync``): exposes some of
    its private methods as hooks, so trainer code never overrides verl's private names.

    - :meth:`after_old_log_prob` runs after verl set ``old_log_probs`` (recomputed by the actor,
      or the rollout log-probs in rollout-correction bypass mode);
    - :meth:`around_advantage` is a context manager around verl's advantage computation;
    - :meth:`replay_buffer_poll_interval_s` sets how often verl's replay buffer looks for a
      finished batch (verl: every 2.0 s, with no config key, so that each step's generation ends
      on a 2-second boundary).
    """

    def _build_replay_buffer(self) -> Any:
        buffer = super()._build_replay_buffer()  # type: ignore[misc]
        interval = self.replay_buffer_poll_interval_s()
        if interval is not None:
            buffer.poll_interval = float(interval)  # what ReplayBuffer._wait_for_next_poll sleeps
        return buffer

    def replay_buffer_poll_interval_s(self) -> float | None:
        """Seconds between the replay buffer's looks for a finished batch; None keeps verl's."""
        return None

    def _compute_old_log_prob(self, batch: Any, metrics: dict) -> Any:
        batch = super()._compute_old_log_prob(batch, metrics)  # type: ignore[misc]
        self.after_old_log_prob(batch, metrics)
        return batch

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        with self.around_advantage(batch, metrics):
            return super()._compute_advantage(batch, metrics)  # type: ignore[misc]

    def after_old_log_prob(self, batch: Any, metrics: dict) -> None:
        """Called with the step's batch once its ``old_log_probs`` are set."""

    @contextmanager
    def around_advantage(self, batch: Any, metrics: dict) -> Iterator[None]:
        """Wraps verl's advantage computation of the step's batch."""
        yield


def _plain(values: Any) -> list[Any]:
    """Python values of a TransferQueue / tensordict non-tensor field."""
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    return [getattr(item, "data", item) for item in items]


def _batch_with_ids(batch: Any, fields: list[str]) -> tuple[dict[str, list[Any]], Any]:
    """``fields`` of a v1 trainer batch (a TransferQueue ``KVBatchMeta``), and each sample's
    ``uid`` and ``data_source`` as strings."""
    import transfer_queue as tq

    data = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "data_source", *fields]
    )
    ids = {
        "uid": [str(u) for u in _plain(data["uid"])],
        "data_source": [str(t) for t in _plain(data["data_source"])],
    }
    return ids, data


def batch_samples(batch: Any) -> dict[str, list[Any]]:
    """Per-sample ``uid``, ``data_source``, ``extra_fields`` (dicts) and ``reward`` (summed
    ``rm_scores``) of a v1 trainer batch (a TransferQueue ``KVBatchMeta``)."""
    ids, data = _batch_with_ids(batch, ["extra_fields", "rm_scores"])
    return {
        **ids,
        "extra_fields": [e if isinstance(e, dict) else {} for e in _plain(data["extra_fields"])],
        "reward": [float(r.sum()) for r in data["rm_scores"].unbind(0)],
    }


def batch_advantages(batch: Any) -> dict[str, list[Any]]:
    """Per sample of a v1 trainer batch once verl computed its advantages: ``uid``,
    ``data_source``, ``advantages`` and ``response_mask`` (1-D tensors of the response length).
    verl's ``_compute_advantage`` stores the advantages as a jagged tensor over the response
    (``response_to_nested(advantages, response_mask)``)."""
    ids, data = _batch_with_ids(batch, ["advantages", "response_mask"])
    return {
        **ids,
        "advantages": list(data["advantages"].unbind()),
        "response_mask": list(data["response_mask"].unbind()),
    }


def actor_and_rollout_log_probs(trainer: Any, batch: Any) -> dict[str, list[Any]]:
    """Run the actor's log-prob forward on a v1 trainer batch (as verl's decoupled mode does) and
    return per sample: ``current`` (actor log-probs of the response tokens), ``rollout`` (the
    rollout engine's log-probs), ``response_mask`` (1-D tensors) and ``extra_fields``."""
    import transfer_queue as tq
    from verl.workers.utils.padding import response_from_nested

    batch.extra_info.update(
        {
            "calculate_entropy": False,
            "compute_loss": False,
            "temperature": trainer.config.actor_rollout_ref.rollout.temperature,
        }
    )
    output = trainer.actor_rollout_wg.compute_log_prob(batch)
    if len(output) != len(batch):
        raise RuntimeError(f"actor compute_log_prob returned {len(output)} rows for a batch of {len(batch)}")
    data = tq.kv_batch_get(
        keys=batch.keys,
        partition_id=batch.partition_id,
        select_fields=["log_probs", "response_mask", "rollout_log_probs", "extra_fields"],
    )
    current = response_from_nested(data["log_probs"], data["response_mask"])
    return {
        "current": list(current.unbind()),
        "rollout": list(data["rollout_log_probs"].unbind()),
        "response_mask": list(data["response_mask"].unbind()),
        "extra_fields": [e if isinstance(e, dict) else {} for e in _plain(data["extra_fields"])],
    }


def register_agent_loop_by_path(name: str, module: str, qualname: str) -> None:
    """Register an agent loop in verl by import path, without importing it here.

    verl's ``register(name)`` records only ``{"_target_": f"{cls.__module__}.{cls.__qualname__}"}``
    and the agent-loop worker instantiates that target with Hydra, importing the module then (an
    import error surfaces there, with its cause). A stand-in carrying those two names is enough.
    """
    from verl.experimental.agent_loop.agent_loop import register

    stand_in = type(qualname.rsplit(".", 1)[-1], (), {"__module__": module, "__qualname__": qualname})
    register(name)(stand_in)


def sft_dataset_with_tools_from(column: str, name: str, module: str, group_column: str = "task") -> type:
    """verl's ``MultiTurnSFTDataset``, rendering each row's tools from the JSON text in ``column``
    (when the files have it) instead of the ``tools`` struct column; named ``module.name`` so that
    verl's ``data.custom_cls`` can load it. It also keeps each row's ``group_column`` value
    (``batch_groups``) and the data config's ``train_batch_size`` (``global_batch_size``).

    ``MultiTurnSFTDataset._read_files_and_process`` reads the parquet files into ``self.dataframe``
    and each row's tools into ``self.tools``, which ``__getitem__`` renders; the subclass replaces
    ``self.tools`` after it.
    """
    import json

    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    class Dataset(MultiTurnSFTDataset):
        #: each row's task (the ``task`` column, when the files have it), for a sampler that
        #: batches one task at a time (:func:`use_sft_train_sampler`); None: no such column
        batch_groups: list[str] | None = None
        #: the data config's ``train_batch_size`` (the global batch)
        global_batch_size: int | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            config = args[2] if len(args) > 2 else kwargs.get("config")
            size = (config or {}).get("train_batch_size")
            self.global_batch_size = int(size) if size else None

        def _read_files_and_process(self) -> None:
            super()._read_files_and_process()
            if column in self.dataframe.columns:
                self.tools = [json.loads(text) for text in self.dataframe[column].tolist()]
            if group_column in self.dataframe.columns:
                self.batch_groups = [str(g) for g in self.dataframe[group_column].tolist()]

    Dataset.__name__ = Dataset.__qualname__ = name
    Dataset.__module__ = module
    return Dataset


def use_sft_train_sampler(sampler: type) -> None:
    """Make verl's SFT trainer build its samplers with ``sampler`` instead of torch's
    ``DistributedSampler``.

    ``verl.trainer.sft_trainer.SFTTrainer._build_dataloader`` calls the module's
    ``DistributedSampler(dataset, shuffle=..., num_replicas=..., rank=..., drop_last=True)`` for the
    train split (and the validation split, unshuffled), then batches its indices in order with
    ``data.train_batch_size // dp_size`` per batch. Replace that module attribute; ``sampler`` takes
    the same arguments. Call it in the trainer's process, before its ``main``.
    """
    import inspect

    import verl.trainer.sft_trainer as sft_trainer
    from torch.utils.data import DistributedSampler

    source = inspect.getsource(sft_trainer.SFTTrainer._build_dataloader)
    if sft_trainer.DistributedSampler not in (DistributedSampler, sampler) or not re.search(
        r"DistributedSampler\(\s*self\.train_dataset, shuffle=True, num_replicas=dp_size, rank=dp_rank",
        source,
    ):
        raise RuntimeError(
            "verl.trainer.sft_trainer no longer builds its train sampler as "
            "DistributedSampler(self.train_dataset, shuffle=True, num_replicas=dp_size, rank=dp_rank, ...); "
            "update agentrl_ext.verl_compat.use_sft_train_sampler"
        )
    setattr(sft_trainer, "DistributedSampler", sampler)  # noqa: B010  (mypy: a class name)


def set_replica_server(replica: Any, handle: Any, address: str) -> None:
    """Record a replica's server for verl's public ``server_handle`` / ``server_address``
    properties (verl's own replicas set the private fields behind them in ``launch_servers``)."""
    replica._server_handle = handle
    replica._server_address = address


#: verl 0.9.1 names its agent-loop worker actors ``agent_loop_worker_{i}_{8 hex}``
#: (``AgentLoopManager._init_agent_loop_workers``); ``i`` is the worker's rank
_AGENT_LOOP_WORKER_NAME = re.compile(r"agent_loop_worker_(\d+)_[0-9a-f]+")


def agent_loop_worker_rank() -> int | None:
    """Rank of the verl agent-loop worker this process hosts, or None outside one.

    verl hands its ``AgentLoopWorker`` actors no rank, but names them by their index
    (0 .. ``rollout.agent.num_workers`` - 1), which is stable from run to run.
    """
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:  # the driver, not an actor
        return None
    match = _AGENT_LOOP_WORKER_NAME.fullmatch(context.get_actor_name() or "")
    return int(match.group(1)) if match else None


def rollout_names() -> list[str]:
    """Names of the rollouts registered in verl's replica registry (``rollout.name`` values)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    return sorted(RolloutReplicaRegistry._registry)


_pre_validation_hooks_on = True


def run_before_verl_config_validation(hook: Callable[[Any], None]) -> None:
    """Run ``hook(config)`` at the start of ``verl.utils.config.validate_config``.

    verl's ``main_ppo.main`` calls ``validate_config`` on the composed config right before
    ``ray.init``; ``main_ppo`` binds the name when it is imported, which is after verl loaded its
    plugins, so wrapping the module attribute here reaches ``python -m verl.trainer.main_ppo``.
    """
    from verl.utils import config as verl_config

    original = verl_config.validate_config
    hooks = getattr(original, "_agentrl_hooks", None)
    if hooks is None:

        @functools.wraps(original)
        def validate_config(config: Any, *args: Any, **kwargs: Any) -> Any:
            for fn in validate_config._agentrl_hooks if _pre_validation_hooks_on else []:  # type: ignore[attr-defined]
                fn(config)
            return original(config, *args, **kwargs)

        validate_config._agentrl_hooks = hooks = []  # type: ignore[attr-defined]
        verl_config.validate_config = validate_config
    if hook not in hooks:
        hooks.append(hook)


# ---------------------------------------------------------------------------------------------
# verl's v1 trainer: prompts into the rollout (the agentrl_async pipeline's feeder).


def submit_prompts(trainer: Any, num_prompts: int) -> int:
    """Start ``num_prompts`` new prompts (GRPO groups of ``rollout.n`` episodes) on the rollout without
    waiting for them: verl's v1 trainer takes them from its dataloader, tags them ``pending`` in
    TransferQueue (with the prompt data, so a checkpoint can re-issue them) and hands them to the
    agent-loop workers, which write each finished trajectory back. Returns the prompts submitted."""
    if num_prompts <= 0:
        return 0
    return int(trainer._add_prompts_to_generate(num_prompts))


def without_colocated_rollout(trainer: Any) -> None:
    """Build verl's v1 trainer (``trainer``, before its ``init()``) without rollout replicas on the
    actor's devices: its workers then only train (role ``actor``, plus a ``ref`` group where a
    reference policy is needed) and its ``llm_server_manager`` is empty, for a rollout served by
    standalone replicas. verl's ``separate_async`` trainer does the same for
    ``actor_rollout_ref.hybrid_engine=false``: ``PPOTrainer._setup`` and
    ``_init_resource_pool_mgr`` read ``self._enable_hybrid_replicas``."""
    trainer._enable_hybrid_replicas = False


# ---------------------------------------------------------------------------------------------
# verl's vLLM rollout on CPU.


class _WorkerOnCPU:
    """Stands in for a rollout worker handle while verl's ``vLLMReplica.launch_servers`` asks it
    ``__ray_call__.remote(fn)`` for ``(node id, accelerator id)``: answers with the worker's node
    and its rank in the replica (there is no accelerator id on CPU). Holds only those two values,
    so verl may also pass it to the server actor (which only counts its workers)."""

    def __init__(self, node_id: str, slot: int) -> None:
        self.node_id = node_id
        self.slot = slot

    @property
    def __ray_call__(self) -> Any:
        return self

    def remote(self, fn: Any = None, *args: Any, **kwargs: Any) -> Any:
        import ray

        return ray.put((self.node_id, str(self.slot)))


def _node_id(worker_self: Any) -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


@asynccontextmanager
async def workers_without_accelerators(replica: Any) -> AsyncIterator[None]:
    """Within the block, ``replica.workers`` answer verl's accelerator-id question without
    accelerators (verl 0.9.1's ``vLLMReplica.launch_servers`` indexes
    ``get_accelerator_ids()[get_resource_name()]``, which on the CPU platform is ``"CPU"``, a key Ray
    never has); the real handles are back afterwards."""
    import asyncio

    workers = list(replica.workers)
    node_ids = await asyncio.gather(*[worker.__ray_call__.remote(_node_id) for worker in workers])
    replica.workers = [_WorkerOnCPU(node_id, slot) for slot, node_id in enumerate(node_ids)]
    try:
        yield
    finally:
        replica.workers = workers
