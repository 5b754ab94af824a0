"""The steps before verl starts, each explicit and named: pin the run spec, build the assets,
apply the CPU platform's changes, check.

- :func:`pin_spec`: the resolved ``agentrl`` node written into verl's config, once
  (:func:`agentrl_ext.run_spec.pin_run_spec`: verl's processes receive nothing else);
- :func:`build_assets`: the assets stage (:mod:`agentrl_ext.trainer.assets`), ``agentrl-train``
  only;
- :func:`platform_changes`: on the CPU platform, the settings verl needs there
  (:func:`agentrl_ext.platform.cpu_defaults.cpu_preflight`: changed keys are logged as
  ``key: old -> new``; idempotent);
- :func:`agentrl_ext.trainer.checks.check_run`: the checks, which only check.

``agentrl-train`` runs them in that order (the main job with its stages in between,
:mod:`agentrl_ext.trainer.job`). verl's own ``main_ppo`` runs :func:`before_verl_main` through the
plugin's hook in front of verl's ``validate_config``: pin, platform changes, checks; it builds
nothing. ``agentrl-train`` has done the same before it hands the config to ``main_ppo``, which
then runs without the hook (:func:`agentrl_ext.verl_compat.run_verl_main`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from agentrl_ext.run_spec import RunSpec, pin_run_spec
from agentrl_ext.trainer.checks import EarlyCheckError, check_run


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


def before_verl_main(config: DictConfig) -> RunSpec:
    """What verl's ``main_ppo`` runs before ``ray.init`` (the plugin's hook): pin, platform
    changes, checks."""
    spec = pin_spec(config)
    platform_changes(config)
    check_run(config, spec)
    return spec
