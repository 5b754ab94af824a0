"""The environment side of AgentRL: protocol, controller, task-worker SDK, client, providers.

Imports neither verl nor torch: controllers and task workers run in slim processes and images.

- :mod:`agentrl_ext.env.protocol`: wire models (AgentRL / AgentBench-FC function-call protocol);
- :mod:`agentrl_ext.env.controller`: the centralized controller (``agentrl-controller``);
- :mod:`agentrl_ext.env.worker`: ``Task`` and ``TaskWorker`` (``agentrl-task-worker``);
- :mod:`agentrl_ext.env.client`: ``ControllerClient`` for trainers and evaluators;
- :mod:`agentrl_ext.env.providers`: per-session Docker containers or local sandboxes.
"""

from __future__ import annotations

from agentrl_ext.env.client import (
    ControllerClient,
    ControllerError,
    ControllerUnavailable,
    RetryPolicy,
    StartedSample,
)
from agentrl_ext.env.protocol import InteractResponse, SampleStatus

__all__ = [
    "ControllerClient",
    "ControllerError",
    "ControllerUnavailable",
    "InteractResponse",
    "RetryPolicy",
    "SampleStatus",
    "StartedSample",
]
