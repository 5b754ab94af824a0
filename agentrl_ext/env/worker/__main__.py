"""``python -m agentrl_ext.env.worker``: same as ``agentrl-task-worker``."""

from __future__ import annotations

from agentrl_ext.env.worker.cli import main

main()
