"""Entry point: ``agentrl-train --config-name <recipe> [hydra overrides...]``.

Composes a recipe from ``recipes/`` on top of verl's ``ppo_trainer`` config, then runs the steps of
:mod:`agentrl_ext.trainer.prepare` (pin the run spec, build the assets the recipe asks for, apply
the CPU platform's changes, check: :mod:`agentrl_ext.trainer.checks`) and hands over to verl's own
trainer (``verl.trainer.main_ppo``) unchanged; with the main job's stages around it when the recipe
enables them (:mod:`agentrl_ext.trainer.job`).
"""

from __future__ import annotations

import logging
import os
import warnings
from importlib import resources
from pathlib import Path

import hydra
from omegaconf import DictConfig

from agentrl_ext.trainer.checks import EarlyCheckError
from agentrl_ext.trainer.interrupt import INTERRUPTED_EXIT_CODE, JobInterrupt

logger = logging.getLogger(__name__)


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


def run(config: DictConfig) -> None:
    """Prepare, check and launch verl's trainer with a composed config; with the main job's stages
    (``agentrl.envs`` / ``sft`` / ``eval``) around it when the recipe enables them."""
    from agentrl_ext.platform import activate
    from agentrl_ext.trainer.job import job_stages_enabled, run_job
    from agentrl_ext.trainer.prepare import build_assets, pin_spec

    activate()
    spec = pin_spec(config)
    if job_stages_enabled(spec.agentrl):
        run_job(config, run_rl)
    else:
        with JobInterrupt():
            build_assets(config, spec)
            run_rl(config)


def run_rl(config: DictConfig) -> None:
    """Pin, apply the platform's changes, check, and run verl's trainer (whose own pre-Ray hook
    is then not needed: everything it would run has run)."""
    from agentrl_ext.trainer.prepare import before_verl_main
    from agentrl_ext.verl_compat import run_verl_main

    before_verl_main(config)
    try:
        run_verl_main(config, pre_validation_hooks=False)
    except KeyboardInterrupt:
        # stop verl's Ray cluster (its actors, the agent loop's episodes) now, before the stages
        # that started first stop what they started (the controller the episodes talk to)
        import ray

        if ray.is_initialized():
            logger.warning("stopping verl's Ray cluster")
            ray.shutdown()
        raise


@hydra.main(config_path=recipes_search_path(), config_name="cpu_smoke", version_base=None)
def _hydra_main(config: DictConfig) -> None:
    try:
        run(config)
    except EarlyCheckError as exc:
        raise SystemExit(f"agentrl-train: {exc}") from None


def check_agentrl_overrides(args: list[str]) -> None:
    """Name an ``agentrl.*`` override that is no key, with the closest keys, before Hydra composes
    (whose own message names the dataclass, not the key you meant)."""
    from agentrl_ext.config import unknown_agentrl_override

    for arg in args:
        key, eq, _value = arg.partition("=")
        key = key.lstrip("+~")
        if eq and key.startswith("agentrl.") and (error := unknown_agentrl_override(key)):
            raise EarlyCheckError(error)


HELP_FLAGS = ("--help", "-h")


def recipe_description(path: Path) -> str:
    """A recipe's description: its leading ``#`` lines up to the first indented one (its command)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#") or line.startswith("#  "):
            break
        lines.append(line[1:].strip())
    return " ".join(lines).removesuffix(":")


def verl_config_dir() -> Path:
    """verl's ``trainer/config`` folder, found without importing verl (its import takes seconds and
    prints warnings about engines that are not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise RuntimeError("verl is not installed: pip install 'verl==0.9.1'")
    return Path(spec.origin).parent / "trainer" / "config"


def help_text() -> str:
    """``agentrl-train --help``: usage, the recipes, the ``agentrl.*`` keys and the CPU changes."""
    import textwrap

    from hydra import compose, initialize_config_dir

    from agentrl_ext.config import describe_keys
    from agentrl_ext.platform.cpu_defaults import apply_cpu_defaults

    out = [
        "usage: agentrl-train --config-name RECIPE [key=value ...]",
        "",
        "Composes RECIPE on top of verl's ppo_trainer config, checks it, applies the CPU changes when",
        "verl runs on the CPU platform, and runs verl's main_ppo. Overrides are Hydra's: key=value",
        "(--cfg job prints the composed config, --hydra-help Hydra's own help).",
        "",
        f"recipes (in {recipes_dir()}):",
    ]
    recipes = sorted(Path(recipes_dir()).glob("*.yaml"))
    width = max(len(p.stem) for p in recipes) + 4
    for path in recipes:
        head = f"  {path.stem:<{width - 2}}"
        out.append(
            textwrap.fill(recipe_description(path), 100, initial_indent=head, subsequent_indent=" " * width)
        )
    out += ["", "agentrl.* keys (agentrl_ext/config.py; with verl's main_ppo add them with '+'):"]
    for key, default, meaning in describe_keys():
        out.append(f"  {key} = {default}" + (f"  # {meaning}" if meaning else ""))
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        verl_defaults = compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.rollout.name=hf"])
    quiet = logging.getLogger("agentrl_ext.platform.cpu_defaults")
    level, quiet.level = quiet.level, logging.ERROR  # listed below, not logged as if applied
    try:
        changes = apply_cpu_defaults(verl_defaults)
    finally:
        quiet.setLevel(level)
    out += ["", "On the CPU platform, verl's GPU defaults that cannot work there are changed (each logged):"]
    out += [f"  {line}" for line in changes]
    out += [
        "  A value you set yourself is never rewritten: one that cannot work on CPU is an error naming the fix."
    ]
    return "\n".join(out)


def main() -> None:
    """Console script ``agentrl-train``."""
    import sys

    if any(arg in HELP_FLAGS for arg in sys.argv[1:]):
        print(help_text())
        return
    # verl warns, at import, about every optional engine that is not installed: noise before any message
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    try:
        check_agentrl_overrides(sys.argv[1:])
    except EarlyCheckError as exc:
        raise SystemExit(f"agentrl-train: {exc}") from None
    try:
        _hydra_main()
    except KeyboardInterrupt as exc:
        # everything the run started has stopped (agentrl_ext.trainer.interrupt)
        print(f"agentrl-train: stopped by {str(exc) or 'a signal'}", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None


if __name__ == "__main__":
    main()
