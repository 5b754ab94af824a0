"""Centralized controller: the single entry point for trainers and evaluators.

Task workers register by heartbeat; ``start_sample`` goes to the healthy worker of the task
with the most free capacity; ``interact`` and ``cancel`` are forwarded to the session's worker
over pooled keep-alive connections; idle sessions expire; ``/metrics`` serves Prometheus metrics.
State is in memory only (see :mod:`agentrl_ext.env.controller.service` for what a restart loses).
"""

from __future__ import annotations

from agentrl_ext.env.controller.app import create_app, main
from agentrl_ext.env.controller.config import ControllerConfig
from agentrl_ext.env.controller.service import ControllerService

__all__ = ["ControllerConfig", "ControllerService", "create_app", "main"]
