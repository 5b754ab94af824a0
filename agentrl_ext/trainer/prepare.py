"""The steps before verl starts, each explicit and named: pin the run spec, build the assets,
apply the CPU platform's changes, check.

- :func:`pin_spec`: the resolved ``agentrl`` node written into verl's config, once
  (:func:`agentrl_ext.run_spec.pin_run_spec`: verl's processes receive nothing else);
- :func:`build_assets`: the assets stage (:mod:`agentrl_ext.trainer.assets`), ``agentrl-train``
  only;
- :func:`platform_changes`: on the CPU platform, the settings verl needs there
  (:func:`agentrl_ext.platform.cpu_defaults.cpu_preflight`: changed keys are logged as
  ``key: old -> new``; idempotent);
- :func:`fleet_changes`: with the environment fleet on verl's Ray cluster
  (``agentrl.envs.placement=ray``), verl's TransferQueue storage kept off the environment nodes;
- :func:`agentrl_ext.trainer.checks.check_run`: the checks, which only check.

``agentrl-train`` runs them in that order (the main job with its stages in between,
:mod:`agentrl_ext.trainer.job`). verl's own ``main_ppo`` runs :func:`before_verl_main` through the
plugin's hook in front of verl's ``validate_config``: pin, platform changes, checks; it builds
nothing. ``agentrl-train`` has done the same before it hands the config to ``main_ppo``, which
then runs without the hook (:func:`agentrl_ext.verl_compat.run_verl_main`).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf, open_dict

from agentrl_ext.run_spec import RunSpec, pin_run_spec
from agentrl_ext.trainer.checks import EarlyCheckError, check_run

logger = logging.getLogger(__name__)

STORAGE_NODE_KEY = "transfer_queue.backend.SimpleStorage.required_node_resource"
#: Ray's own resource of the head node: where verl's storage goes on the CPU platform (one trainer node)
HEAD_NODE_RESOURCE = "node:__internal_head__"


def pin_spec(config: DictConfig) -> RunSpec:
    """:func:`~agentrl_ext.run_spec.pin_run_spec` (e.g. ``agentrl.cache_dir`` made absolute: unset,
    paths such as ``${agentrl.cache_dir}/agentrl_data`` would read ``None/agentrl_data``), its
    mistakes raised as :class:`EarlyCheckError`."""
    try:
        return pin_run_spec(config)
    except ValueError as exc:
        raise EarlyCheckError(str(exc)) from exc


def build_assets(config: DictConfig, spec: RunSpec) -> None:
    """The assets stage: the tiny model / toy data the recipe asks for, where missing."""
    from agentrl_ext.trainer.assets import prepare_assets

    try:
        prepare_assets(config, spec)
    except (ValueError, LookupError, FileNotFoundError, TimeoutError) as exc:
        raise EarlyCheckError(str(exc)) from exc


def platform_changes(config: DictConfig) -> None:
    """The CPU platform's changes to verl's config (and the environment its processes inherit),
    when verl runs on CPU; nothing on GPUs."""
    from agentrl_ext.platform.cpu_defaults import cpu_preflight

    cpu_preflight(config)


def fleet_changes(config: DictConfig, spec: RunSpec) -> list[str]:
    """With the environment fleet on the trainer's Ray cluster (``agentrl.envs.placement=ray``),
    verl's TransferQueue storage units go to trainer nodes only: TransferQueue places them round
    robin over every alive node, environment nodes included (there, pinned to a node whose CPUs the
    workers hold, the first step waits forever). Sets ``required_node_resource`` to ``GPU`` (on the
    CPU platform: the head node) unless the user set it; returns the change made."""
    from agentrl_ext.platform.cpu_platform import cuda_present

    envs = spec.agentrl.envs
    if not (envs.launch and envs.placement == "ray"):
        return []
    storage = OmegaConf.select(config, STORAGE_NODE_KEY.rpartition(".")[0])
    if storage is None or storage.get("required_node_resource") is not None:
        return []
    resource = "GPU" if cuda_present() else HEAD_NODE_RESOURCE
    with open_dict(config):
        OmegaConf.update(config, STORAGE_NODE_KEY, resource, force_add=True)
    change = f"{STORAGE_NODE_KEY}: None -> {resource} (keep verl's storage off the environment nodes)"
    logger.info("%s", change)
    return [change]


#: what agentrl_ext sets in this process's environment for verl's Ray processes
FORWARDED_ENV = ("VERL_PLATFORM", "TQ_NUM_THREADS", "VERL_FILE_LOGGER_PATH")


def cluster_env_vars(config: DictConfig) -> dict[str, str]:
    """Joining a running Ray cluster (``ray_kwargs.ray_init.address``), verl's processes start
    from the cluster's environment, not this process's: the variables of :data:`FORWARDED_ENV`
    set here (e.g. where the metrics file goes) are put in ``ray_init.runtime_env.env_vars``
    (a value the user set there wins). Returns what was added."""
    import os

    address = OmegaConf.select(config, "ray_kwargs.ray_init.address")
    if address in (None, "", "local"):
        return {}
    given = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
    added = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ and k not in given}
    if added:
        with open_dict(config):
            for key, value in added.items():
                OmegaConf.update(
                    config, f"ray_kwargs.ray_init.runtime_env.env_vars.{key}", value, force_add=True
                )
        logger.info("joining the Ray cluster at %s: verl's processes get %s", address, sorted(added))
    return added


def before_verl_main(config: DictConfig) -> RunSpec:
    """What verl's ``main_ppo`` runs before ``ray.init`` (the plugin's hook): pin, platform
    changes, checks."""
    spec = pin_spec(config)
    platform_changes(config)
    fleet_changes(config, spec)
    cluster_env_vars(config)
    check_run(config, spec)
    return spec
