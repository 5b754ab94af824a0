"""Learning broken on purpose, for the learning test's negative controls (test-only).

Loaded in every process of a run (the driver, the trainer workers, the agent-loop workers) after
agentrl_ext's plugin, with ``VERL_USE_EXTERNAL_PLUGINS=none`` and
``VERL_USE_EXTERNAL_MODULES=agentrl_ext.plugin,broken_learning`` (this folder on ``PYTHONPATH``).
``AGENTRL_BREAK_LEARNING`` says what it breaks, by replacing one registered component under its
own name, so that the run's configuration is the learning test's, unchanged:

- ``negate_advantages``: the ``task_norm_grpo`` estimator returns its advantages negated (RL then
  climbs away from what wins);
- ``zero_loss_mask``: the ``agentrl`` agent loop sets every response token's loss mask to 0
  (nothing is trained).
"""

from __future__ import annotations

import os
from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

from agentrl_ext.algos.task_context import ESTIMATOR_NAME
from agentrl_ext.rollout.agent_loop import AGENT_NAME, AgentRLAgentLoop

BREAKS = ("negate_advantages", "zero_loss_mask")


def negated_task_norm_grpo(**kwargs: Any) -> Any:
    from agentrl_ext.algos.estimator import task_norm_grpo_estimator

    advantages, returns = task_norm_grpo_estimator(**kwargs)
    return -advantages, -returns


class ZeroMaskAgentLoop(AgentRLAgentLoop):
    """The ``agentrl`` agent loop whose episodes train no token."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        output = await super().run(sampling_params, **kwargs)
        output.response_mask = [0] * len(output.response_mask)
        return output


BREAK = os.environ.get("AGENTRL_BREAK_LEARNING", "")
if BREAK not in BREAKS:
    raise ValueError(f"AGENTRL_BREAK_LEARNING={BREAK!r}: use one of {BREAKS}")
if BREAK == "negate_advantages":
    ADV_ESTIMATOR_REGISTRY[ESTIMATOR_NAME] = negated_task_norm_grpo
else:
    register(AGENT_NAME)(ZeroMaskAgentLoop)
