"""``python -m agentrl_ext.env.controller``: same as ``agentrl-controller``."""

from __future__ import annotations

from agentrl_ext.env.controller.app import main

main()
