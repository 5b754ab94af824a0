"""verl plugin entry point (group ``verl.plugins``), imported by ``import verl`` in
every process: the driver, the trainer workers and the rollout servers.

Also usable as ``VERL_USE_EXTERNAL_MODULES=agentrl_ext.plugin``.
"""

from __future__ import annotations

from agentrl_ext.platform import activate

activate()

# AgentRL components, registered by name in verl's registries.
import agentrl_ext.algos.task_norm  # noqa: E402, F401  (algorithm.adv_estimator=task_norm_grpo)
import agentrl_ext.rollout.agent_loop  # noqa: E402, F401  (agent_name / default_agent_loop=agentrl)
import agentrl_ext.trainer.agentrl_trainer  # noqa: E402, F401  (trainer.v1.trainer_mode=agentrl_sync)
