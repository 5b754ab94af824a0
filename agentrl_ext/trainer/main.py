"""Entry point: ``agentrl-train --config-name <recipe> [hydra overrides...]``.

Composes a recipe from ``recipes/`` on top of verl's ``ppo_trainer`` config, builds
missing offline assets, checks the config for mistakes we can name, fills in the CPU
plumbing when verl runs on the CPU platform, and hands over to verl's own trainer
(``verl.trainer.main_ppo``) unchanged.
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from agentrl_ext.config import AgentRLConfig

logger = logging.getLogger(__name__)

GPU_ONLY_ROLLOUTS = ("vllm", "sglang", "trtllm")
#: rollouts for which the cross-policy stale pool is built
STALE_POOL_ROLLOUTS = ("hf",)
AGENT_LOOP_NAME = "agentrl"


RECIPES_PACKAGE = "agentrl_ext.recipes"  # the repository's recipes/, shipped in the wheel (setup.py)


def recipes_search_path() -> str:
    """Hydra's config path of the recipes: ``$AGENTRL_RECIPES_DIR`` or ``pkg://agentrl_ext.recipes``."""
    env = os.environ.get("AGENTRL_RECIPES_DIR")
    return str(Path(env).resolve()) if env else f"pkg://{RECIPES_PACKAGE}"


def recipes_dir() -> str:
    """The recipes' folder on disk: ``$AGENTRL_RECIPES_DIR`` or the installed ``agentrl_ext.recipes``."""
    path = recipes_search_path()
    if not path.startswith("pkg://"):
        return path
    try:
        return str(resources.files(RECIPES_PACKAGE))
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{RECIPES_PACKAGE} is not installed (agentrl_ext is imported from {Path(__file__).parents[1]}); "
            f"install the package (pip install -e .) or set AGENTRL_RECIPES_DIR to a recipes folder"
        ) from exc


def prepare_assets(config: DictConfig, agentrl: AgentRLConfig) -> None:
    """Build the tiny model / toy data where the recipe asks for them and they are missing."""
    model_path = Path(str(config.actor_rollout_ref.model.path))
    if agentrl.assets.build_tiny_model and not (model_path / "config.json").exists():
        from agentrl_ext.models.tiny import build_tiny_model

        logger.info("building the tiny offline model at %s", model_path)
        build_tiny_model(model_path, seed=agentrl.assets.tiny_model_seed)
    if agentrl.assets.build_toy_data:
        from agentrl_ext.data.toy import build_toy_dataset

        train = Path(str(config.data.train_files))
        build_toy_dataset(train.parent)


def _local_data_files(config: DictConfig) -> list[tuple[str, str]]:
    """``(key, path)`` of every local file in ``data.train_files`` / ``data.val_files`` (URLs left out)."""
    out = []
    for key in ("train_files", "val_files"):
        files = config.data.get(key)
        for f in [files] if isinstance(files, str) else list(files or []):
            if "://" not in str(f):
                out.append((key, str(f)))
    return out


def check_config(config: DictConfig, cuda: bool) -> None:
    """Raise on configuration mistakes before Ray starts, naming the value and the fix."""
    rollout = str(config.actor_rollout_ref.rollout.name)
    if rollout in GPU_ONLY_ROLLOUTS and not cuda:
        raise ValueError(
            f"actor_rollout_ref.rollout.name={rollout} needs a CUDA GPU, and this machine has none. "
            f"On CPU use the HF-transformers rollout server: actor_rollout_ref.rollout.name=hf "
            f"(the cpu_smoke recipe does)."
        )
    model_path = str(config.actor_rollout_ref.model.path)
    if "://" not in model_path and not Path(model_path).exists():
        raise FileNotFoundError(
            f"actor_rollout_ref.model.path={model_path} does not exist. Point it to a local HF model directory, "
            f"or build the tiny offline model there with `agentrl-tiny-model {model_path}` "
            f"(or set agentrl.assets.build_tiny_model=true)."
        )
    for key, f in _local_data_files(config):
        if not Path(f).exists():
            raise FileNotFoundError(f"data.{key} names {f}, which does not exist")
    check_cross_policy(config)


def check_cross_policy(config: DictConfig) -> None:
    """Cross-policy sampling needs a stale pool for the rollout, and the behaviour log-probs of
    every turn must drive the PPO ratio (else stale turns would be trained as on-policy)."""
    from agentrl_ext.config import agentrl_config

    if not agentrl_config(config).cross_policy.enable:
        return
    rollout = config.actor_rollout_ref.rollout
    if str(rollout.name) not in STALE_POOL_ROLLOUTS:
        raise ValueError(
            f"agentrl.cross_policy.enable=true needs a stale pool for actor_rollout_ref.rollout.name={rollout.name}, "
            f"which is built only for {list(STALE_POOL_ROLLOUTS)} so far; set agentrl.cross_policy.enable=false "
            f"to train on {rollout.name} without cross-policy sampling"
        )
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


def _dataset_tasks(config: DictConfig) -> set[str]:
    """The ``data_source`` values of rows that the ``agentrl`` agent loop will play."""
    import pandas as pd

    default_loop = config.actor_rollout_ref.rollout.agent.get("default_agent_loop")
    tasks: set[str] = set()
    for _key, f in _local_data_files(config):
        frame = pd.read_parquet(f)
        agent = frame["agent_name"] if "agent_name" in frame else pd.Series([default_loop] * len(frame))
        tasks |= set(frame.loc[agent.fillna(default_loop) == AGENT_LOOP_NAME, "data_source"].astype(str))
    return tasks


def check_environment(config: DictConfig, agentrl: AgentRLConfig, timeout_s: float = 10.0) -> None:
    """When the agentrl agent loop will run: the controller answers and serves every task of the data."""
    tasks = _dataset_tasks(config)
    if not tasks:
        return
    url = agentrl.agent_loop.controller_url
    if not url:
        raise ValueError(
            f"the dataset has agentrl episodes (tasks {sorted(tasks)}) but agentrl.agent_loop.controller_url is "
            f"not set; start agentrl-controller and set e.g. agentrl.agent_loop.controller_url=http://127.0.0.1:5020/api"
        )
    import httpx

    try:
        workers = httpx.get(f"{url.rstrip('/')}/list_workers", timeout=timeout_s).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ConnectionError(
            f"agentrl.agent_loop.controller_url={url} does not answer ({type(exc).__name__}: {exc}); "
            f"start agentrl-controller there or fix the URL"
        ) from exc
    missing = sorted(t for t in tasks if not any(w.get("healthy") for w in workers.get(t, [])))
    if missing:
        raise LookupError(
            f"the controller at {url} has no healthy worker for task(s) {missing} named by the dataset's "
            f"data_source; it serves {sorted(workers)}. Start their task workers (agentrl-task-worker ...)."
        )


#: the fewest logical CPU slots Ray needs for verl's actors (with fewer, placement waits forever)
MIN_RAY_CPUS = 8


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
    if num_cpus is None or num_cpus < MIN_RAY_CPUS:
        wanted = max(MIN_RAY_CPUS, os.cpu_count() or 1)
        change(
            "ray_kwargs.ray_init.num_cpus",
            wanted,
            f"Ray schedules verl's actors on logical CPUs and needs at least {MIN_RAY_CPUS}, whatever the cores",
            works=num_cpus is not None and num_cpus >= MIN_RAY_CPUS,
        )
    if config.actor_rollout_ref.rollout.name == "hf":
        tp = config.actor_rollout_ref.rollout.tensor_model_parallel_size
        change(
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            1,
            "the HF rollout server is one process",
            tp == 1,
        )
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


def run(config: DictConfig) -> None:
    """Prepare, check and launch verl's trainer with a composed config."""
    from agentrl_ext.platform import activate, cpu_platform_active
    from agentrl_ext.platform.cpu_platform import cuda_present
    from agentrl_ext.platform.verl_compat import run_verl_main

    activate()
    agentrl = AgentRLConfig.from_config(config.get("agentrl"))
    with open_dict(config):
        # Ray processes may not share the driver's working directory: pin paths down.
        config.agentrl = config.get("agentrl") or {}
        config.agentrl.cache_dir = agentrl.cache_dir
    prepare_assets(config, agentrl)
    check_config(config, cuda=cuda_present())
    check_environment(config, agentrl)
    if cpu_platform_active():
        os.environ.setdefault("VERL_PLATFORM", "cpu")  # inherited by every Ray process
        apply_cpu_defaults(config, explicit_overrides())
    run_verl_main(config)


@hydra.main(config_path=recipes_search_path(), config_name="cpu_smoke", version_base=None)
def _hydra_main(config: DictConfig) -> None:
    run(config)


def main() -> None:
    """Console script ``agentrl-train``."""
    _hydra_main()


if __name__ == "__main__":
    main()
