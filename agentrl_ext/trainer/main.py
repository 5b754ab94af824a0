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

import hydra
from omegaconf import DictConfig, open_dict

from agentrl_ext.config import AgentRLConfig

logger = logging.getLogger(__name__)

GPU_ONLY_ROLLOUTS = ("vllm", "sglang", "trtllm")
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


def apply_cpu_defaults(config: DictConfig) -> None:
    """Fill in what verl needs to run on the CPU platform, where the user left verl's GPU defaults."""
    with open_dict(config):
        config.trainer.device = "cpu"
        ray_init = config.ray_kwargs.ray_init
        if ray_init.get("num_cpus") is None:
            # Ray schedules on logical CPUs; verl's actors need more slots than a laptop has cores.
            ray_init.num_cpus = max(8, os.cpu_count() or 1)
        rollout = config.actor_rollout_ref.rollout
        if rollout.name == "hf":
            rollout.tensor_model_parallel_size = 1
        storage = config.transfer_queue.backend.SimpleStorage
        if storage.num_data_storage_units == 8:  # verl's GPU default hangs on a 2-core machine
            storage.num_data_storage_units = 1
        model = config.actor_rollout_ref.model
        model.override_config.setdefault("attn_implementation", "sdpa")  # flash-attn does not exist on CPU
        for role in ("actor", "ref"):
            node = config.actor_rollout_ref[role]
            if node.get("strategy") == "fsdp":  # FSDP1 needs a GPU; FSDP2 runs on CPU with gloo
                node.strategy = "fsdp2"
        if config.data.get("dataloader_num_workers", 0):
            config.data.dataloader_num_workers = 0


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
        apply_cpu_defaults(config)
    run_verl_main(config)


@hydra.main(config_path=recipes_search_path(), config_name="cpu_smoke", version_base=None)
def _hydra_main(config: DictConfig) -> None:
    run(config)


def main() -> None:
    """Console script ``agentrl-train``."""
    _hydra_main()


if __name__ == "__main__":
    main()
