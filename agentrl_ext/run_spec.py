"""The run spec: verl's composed config resolved once into what agentrl_ext needs, frozen.

The ``agentrl:`` node is parsed into the typed :class:`~agentrl_ext.config.AgentRLConfig` in one
place (:func:`resolve_run_spec`), where the values that follow from others are computed too (the
agent loop's controller: the stack ``agentrl.envs.launch`` starts, or ``agentrl.agent_loop.
controller_url``; the evaluation's controller and turn cap). The result is frozen: no stage changes
it, and no stage writes a value back into verl's config mid-run.

Each key group checks its own values when it is built (``__post_init__`` in config.py); what spans
groups is checked here (:func:`resolve_run_spec`); what ties ``agentrl`` to verl's own keys is
checked before verl starts (``agentrl_ext.trainer.checks.check_config``), which gets this spec.

One explicit step hands the result to verl: verl's trainer and agent-loop workers are separate Ray
processes that receive verl's config and nothing else, so the entry point writes the resolved
``agentrl`` node into verl's config once, before the first stage starts (:func:`pin_run_spec`; also
what makes ``${agentrl.cache_dir}`` in verl's keys absolute). Those processes read it back with
:func:`run_spec`, once per process and config object.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from agentrl_ext.config import AgentRLConfig

logger = logging.getLogger(__name__)

__all__ = ["RunSpec", "freeze", "launched_controller_url", "pin_run_spec", "resolve_run_spec", "run_spec"]

LOOPBACK = "127.0.0.1"


def launched_controller_url(port: int, host: str = LOOPBACK, advertise_host: str | None = None) -> str:
    """The API base of the controller that ``agentrl.envs.launch`` starts on ``port``, as the stack
    advertises it (``agentrl_ext.env.launcher.EnvStack.api``; the main job checks that they agree)."""
    from agentrl_ext.env.launcher.processes import api_url

    return api_url(advertise_host or host, port)


@dataclass(frozen=True)
class RunSpec:
    """Everything agentrl_ext takes from the config, resolved and frozen."""

    #: the typed ``agentrl:`` node (cache_dir absolute, controller_url resolved), frozen
    agentrl: AgentRLConfig
    #: the controller the agent loop, the RL data and the warm start talk to: the launched stack's
    #: (``agentrl.envs.launch``) or ``agentrl.agent_loop.controller_url``; None: none configured
    controller_url: str | None
    #: the evaluation's assistant-turn cap: ``agentrl.eval.max_turns``, else the agent loop's
    eval_max_turns: int
    #: the controller the evaluation talks to without a launched stack: ``agentrl.eval.
    #: controller_url``, else the agent loop's (with ``agentrl.envs.launch`` the main job starts a
    #: held-out stack on a free port instead)
    eval_controller_url: str | None


def freeze(obj: Any) -> Any:
    """Make a config dataclass (and the dataclasses inside it) refuse attribute assignment."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            freeze(getattr(obj, f.name))
        object.__setattr__(obj, "_frozen", True)
    return obj


def resolve_run_spec(config: DictConfig | dict[str, Any]) -> RunSpec:
    """Parse verl's composed config's ``agentrl:`` node (the one place it is parsed) and resolve
    the values that follow from others; raises ValueError naming the value and the fix."""
    node = config.get("agentrl")
    agentrl = AgentRLConfig.from_config(node)
    loop = agentrl.agent_loop
    url = loop.controller_url
    if agentrl.envs.launch:
        envs = agentrl.envs
        launched = launched_controller_url(envs.port, envs.host, envs.advertise_host)
        if url and url != launched:
            raise ValueError(
                f"agentrl.agent_loop.controller_url={url} but agentrl.envs.launch=true starts the "
                f"controller at {launched} (agentrl.envs.port={agentrl.envs.port}), which the agent "
                f"loop then uses; leave agentrl.agent_loop.controller_url unset (or turn launch off "
                f"to use the controller at {url})"
            )
        url = launched
    loop.controller_url = url
    return RunSpec(
        agentrl=freeze(agentrl),
        controller_url=url,
        eval_max_turns=agentrl.eval.max_turns or loop.max_turns,
        eval_controller_url=agentrl.eval.controller_url or url,
    )


_pinned: dict[int, tuple[Any, RunSpec]] = {}


def pin_run_spec(config: DictConfig) -> RunSpec:
    """Resolve ``config`` and write the resolved ``agentrl`` node into it: the one write into
    verl's config, done by the entry point before the first stage (verl's processes get nothing
    else). Idempotent for the same config object."""
    hit = _pinned.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    spec = resolve_run_spec(config)
    with open_dict(config):
        config.agentrl = OmegaConf.structured(spec.agentrl)
    _pinned[id(config)] = (config, spec)
    return spec


def run_spec(config: DictConfig) -> RunSpec:
    """The run spec of verl's ``config`` in a process that holds only that config (verl's
    trainer, its agent-loop workers): the pinned one in the driver, else resolved once per config
    object (verl builds each episode's agent loop with the same object)."""
    hit = _pinned.get(id(config))
    if hit is None or hit[0] is not config:
        hit = (config, resolve_run_spec(config))
        _pinned[id(config)] = hit
    return hit[1]
