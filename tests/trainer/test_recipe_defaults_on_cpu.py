"""A recipe sets an ``agentrl.*`` key only to change it.

The rule: each ``agentrl.*`` value a recipe in ``recipes/`` writes (``recipes/base/`` included)
must differ from the value the key has without that line, which is

- what a base recipe the recipe composes sets (``- base/agentrl_gpu`` in its defaults list), else
- the value the run spec derives (``agentrl.agent_loop.controller_url`` with ``agentrl.envs.launch``:
  the launched controller's URL), else
- the dataclass default (agentrl_ext/config.py, the one source of truth).

A value equal to it restates a default: when the default changes, in one place, the recipe would
silently keep the old value, and a reader cannot tell the recipe's choices from the defaults. A
key a recipe must set on purpose has no default (``controller_url``, ``envs.tasks``: null), so it
is never a restatement; a recipe whose meaning rests on a default (e.g. cross-policy sampling off in
the GPU base until measured) says so in a comment. Overriding a base recipe's value back to the
dataclass default is a change, not a restatement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from agentrl_ext.config import AgentRLConfig, describe_keys
from agentrl_ext.run_spec import launched_controller_url
from agentrl_ext.trainer.main import recipes_dir

LEAVES = {key for key, _default, _meaning in describe_keys()}


def _leaves(node: Any, prefix: str = "agentrl") -> dict[str, Any]:
    """The ``agentrl.*`` keys a YAML node writes, with their raw (unresolved) values; a
    mapping-valued key (``task_kwargs``, ``tiny_model_spec``) is one value."""
    out: dict[str, Any] = {}
    for name, value in (node or {}).items():
        key = f"{prefix}.{name}"
        if key not in LEAVES and isinstance(value, dict):
            out |= _leaves(value, key)
        else:
            out[key] = value
    return out


def _raw(path: Path) -> dict[str, Any]:
    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert isinstance(loaded, dict)
    return loaded


def _base_recipes(path: Path, folder: Path) -> list[Path]:
    """The recipes of ``folder`` that ``path`` lists in its defaults (verl's and the ``agentrl``
    group's entries left out), in order."""
    out = []
    for entry in _raw(path).get("defaults") or []:
        if isinstance(entry, str) and (folder / f"{entry}.yaml").exists():
            out.append(folder / f"{entry}.yaml")
    return out


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def restated_defaults(path: Path, folder: Path) -> list[str]:
    """``key=value (default)`` for each ``agentrl.*`` value ``path`` writes that equals the value
    the key would have without it (see the module docstring)."""
    own = _leaves(_raw(path).get("agentrl"))
    inherited = {
        key: _plain(OmegaConf.select(OmegaConf.structured(AgentRLConfig), key[len("agentrl.") :]))
        for key in own
    }
    composed = None
    if (path.parent == folder) and "defaults" in _raw(path):  # a recipe: its values resolved by Hydra
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            composed = compose(config_name=path.stem)
        if composed.agentrl.envs.launch:
            envs = composed.agentrl.envs
            inherited["agentrl.agent_loop.controller_url"] = launched_controller_url(
                envs.port, envs.host, envs.advertise_host
            )
    for base in _base_recipes(path, folder):
        for key, value in _leaves(_raw(base).get("agentrl")).items():
            if key in own:
                inherited[key] = value
    found = []
    for key, value in own.items():
        if composed is not None:
            value = _plain(OmegaConf.select(composed, key))
        if value is not None and value == inherited[key]:
            found.append(
                f"{path.relative_to(folder)}: {key}={value!r} (the value without it: {inherited[key]!r})"
            )
    return found


RECIPES = sorted(p for p in Path(recipes_dir()).rglob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(recipes_dir())))
def test_no_recipe_restates_an_agentrl_default_on_cpu(recipe):
    assert restated_defaults(recipe, Path(recipes_dir())) == []


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_rule_refuses_a_restated_default_and_keeps_a_change_on_cpu(tmp_path):
    """The checker itself, on planted recipes: a paper value that is the default, a value the
    launched stack derives, a base recipe's value repeated: refused; a changed value, a key without
    default and a base value set back to the dataclass default: kept."""
    head = "hydra:\n  searchpath:\n    - pkg://verl.trainer.config\n"
    _write(
        tmp_path / "base" / "shared.yaml",
        "# @package _global_\nagentrl:\n  agent_loop:\n    max_turns: 20\n    success_reward: 0.5\n",
    )
    recipe = _write(
        tmp_path / "planted.yaml",
        head
        + "defaults:\n  - ppo_trainer\n  - agentrl: default\n  - base/shared\n  - _self_\n"
        + "agentrl:\n"
        + "  envs:\n    launch: true\n    tasks: [guess]\n    port: 5123\n"
        + "  agent_loop:\n"
        + "    controller_url: http://127.0.0.1:${..envs.port}/api\n"
        + "    incomplete_punishment: -0.2\n"
        + "    max_turns: 32\n"  # the base's 20 set back to the dataclass default: a change
        + "    success_reward: 0.5\n"  # the base's value again
        + "  cross_policy:\n    stale_ratio: 0.3\n    stale_step: 25\n",
    )
    assert sorted(line.split(": ", 1)[1].split("=")[0] for line in restated_defaults(recipe, tmp_path)) == [
        "agentrl.agent_loop.controller_url",
        "agentrl.agent_loop.incomplete_punishment",
        "agentrl.agent_loop.success_reward",
        "agentrl.cross_policy.stale_step",
    ]
