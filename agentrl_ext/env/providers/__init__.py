"""Per-session resources for tasks: Docker containers, or local temp dirs where no engine exists."""

from __future__ import annotations

import logging

from agentrl_ext.env.providers.base import (
    DEFAULT_IMAGE,
    ExecResult,
    ResourceProvider,
    ResourceSpec,
    SessionResource,
)
from agentrl_ext.env.providers.local import LocalProvider

logger = logging.getLogger(__name__)


def default_provider(spec: ResourceSpec | None = None) -> ResourceProvider:
    """A :class:`DockerProvider` when an engine answers (``DOCKER_HOST`` or the default socket),
    else a :class:`LocalProvider` (no isolation; logged as a warning)."""
    try:
        import docker

        from agentrl_ext.env.providers.docker import DockerProvider

        client = docker.from_env()
        client.ping()
        return DockerProvider(client, spec)
    except Exception as exc:  # any failure to reach an engine means: no engine
        logger.warning("no Docker engine reachable (%s); using LocalProvider, which isolates nothing", exc)
        return LocalProvider(default_spec=spec)


__all__ = [
    "DEFAULT_IMAGE",
    "ExecResult",
    "LocalProvider",
    "ResourceProvider",
    "ResourceSpec",
    "SessionResource",
    "default_provider",
]
