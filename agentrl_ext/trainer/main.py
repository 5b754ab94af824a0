"""Entry point: ``agentrl-train --config-name <recipe> [hydra overrides...]``.

Composes a recipe from ``recipes/`` on top of verl's ``ppo_trainer`` config, builds
missing offline assets, checks the config for mistakes we can name, fills in the CPU
plumbing when verl runs on the CPU platform, and hands over to verl's own trainer
(``verl.trainer.main_ppo``) unchanged.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, open_dict

from agentrl_ext.trainer.config import AgentRLConfig

logger = logging.getLogger(__name__)

GPU_ONLY_ROLLOUTS = ("vllm", "sglang", "trtllm")


def recipes_dir() -> str:
    """Where recipes live: ``$AGENTRL_RECIPES_DIR`` or the repository's ``recipes/``."""
    env = os.environ.get("AGENTRL_RECIPES_DIR")
    return str(Path(env).resolve()) if env else str(Path(__file__).resolve().parents[2] / "recipes")


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
    for key in ("train_files", "val_files"):
        files = config.data.get(key)
        for f in [files] if isinstance(files, str) else list(files or []):
            if "://" not in str(f) and not Path(str(f)).exists():
                raise FileNotFoundError(f"data.{key} names {f}, which does not exist")


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
    if cpu_platform_active():
        os.environ.setdefault("VERL_PLATFORM", "cpu")  # inherited by every Ray process
        apply_cpu_defaults(config)
    run_verl_main(config)


@hydra.main(config_path=recipes_dir(), config_name="cpu_smoke", version_base=None)
def _hydra_main(config: DictConfig) -> None:
    run(config)


def main() -> None:
    """Console script ``agentrl-train``."""
    _hydra_main()


if __name__ == "__main__":
    main()
