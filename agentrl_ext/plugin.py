"""verl plugin entry point (group ``verl.plugins``), imported by ``import verl`` in
every process: the driver, the trainer workers and the rollout servers.

Also usable as ``VERL_USE_EXTERNAL_MODULES=agentrl_ext.plugin``.
"""

from __future__ import annotations

from agentrl_ext.platform import activate

activate()
