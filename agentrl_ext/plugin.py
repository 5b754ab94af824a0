"""verl plugin entry point (group ``verl.plugins``), imported by ``import verl`` in every
process: the driver, the trainer workers and the rollout servers.

Also usable as ``VERL_USE_EXTERNAL_MODULES=agentrl_ext.plugin``.

verl imports plugins inside ``try/except`` and logs a failure at DEBUG level, so anything that
breaks here would vanish in a Ray worker. This module therefore does as little as it can and
never raises: each registration runs on its own, a failure is logged at ERROR with its cause
(and kept in :data:`FAILURES`), and the components are registered lazily where verl allows it,
so that a broken import surfaces, with its traceback, in the process that needs the component:

- ``agentrl`` agent loop: registered by import path; verl's agent-loop worker imports it when it
  instantiates the first episode;
- ``task_norm_grpo`` estimator: a thin function that imports the estimator on first call;
- ``agentrl_sync`` and ``agentrl_async`` trainer modes: verl's registry wants the class itself, so
  they are imported here;
- pre-Ray checks: verl's ``main_ppo`` runs :func:`agentrl_ext.trainer.prepare.before_verl_main` (config
  checks, CPU changes) on its composed config right before ``ray.init``, as ``agentrl-train`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: registrations that failed in this process: name -> the exception
FAILURES: dict[str, BaseException] = {}


def _register(name: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001  (verl would swallow it: log it loudly instead)
        FAILURES[name] = exc
        logger.error(
            "agentrl_ext could not register %s with verl: %s: %s",
            name,
            type(exc).__name__,
            exc,
            exc_info=True,
        )


def _platform() -> None:
    from agentrl_ext.platform import activate

    activate()


def _agent_loop() -> None:
    from agentrl_ext.verl_compat import register_agent_loop_by_path

    register_agent_loop_by_path("agentrl", "agentrl_ext.rollout.agent_loop", "AgentRLAgentLoop")


def _estimator() -> None:
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    from agentrl_ext.algos.task_context import ESTIMATOR_NAME

    if ESTIMATOR_NAME in ADV_ESTIMATOR_REGISTRY:
        return

    @register_adv_est(ESTIMATOR_NAME)
    def task_norm_grpo(**kwargs: Any) -> Any:
        from agentrl_ext.algos.estimator import task_norm_grpo_estimator

        return task_norm_grpo_estimator(**kwargs)


def _trainer_mode() -> None:
    import agentrl_ext.trainer.agentrl_trainer  # noqa: F401  (trainer.v1.trainer_mode=agentrl_sync)


def _async_trainer_mode() -> None:
    import agentrl_ext.trainer.async_trainer  # noqa: F401  (trainer.v1.trainer_mode=agentrl_async)


def _pre_ray_checks() -> None:
    from agentrl_ext.verl_compat import run_before_verl_config_validation

    def before_verl_main(config: Any) -> None:
        from agentrl_ext.trainer.prepare import before_verl_main as prepare_and_check

        prepare_and_check(config)

    run_before_verl_config_validation(before_verl_main)


_register("the CPU platform", _platform)
_register("agent loop 'agentrl'", _agent_loop)
_register("advantage estimator 'task_norm_grpo'", _estimator)
_register("trainer mode 'agentrl_sync'", _trainer_mode)
_register("trainer mode 'agentrl_async'", _async_trainer_mode)
_register("the pre-Ray checks of verl's main_ppo", _pre_ray_checks)
