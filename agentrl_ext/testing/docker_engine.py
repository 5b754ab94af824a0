"""A reachable Docker engine for tests and benchmarks: ``$DOCKER_HOST``, else the project's private
engine (``scripts/dockerd.sh``), started when it is not running and stopped again afterwards.

    try:
        with docker_engine() as host:   # DOCKER_HOST is set to ``host`` meanwhile
            ...
    except NoDockerEngine as exc:
        pytest.skip(str(exc))

The test suites' Docker fixtures (``tests/env/conftest.py``, ``tests/envs/os/conftest.py``) are
built on :func:`docker_engine`; a fixture skips with :class:`NoDockerEngine`'s reason.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from agentrl_ext.testing.env_servers import REPO

DOCKERD_SCRIPT = REPO / "scripts" / "dockerd.sh"


class NoDockerEngine(RuntimeError):
    """No engine answers and none can start here; the message says why (a test skips with it)."""


def engine_problem(base_url: str) -> str | None:
    """None when the engine at ``base_url`` answers a ping, else the reason it does not."""
    import docker

    try:
        client = docker.DockerClient(base_url=base_url, timeout=5)
        client.ping()
        client.close()
        return None
    except Exception as exc:  # noqa: BLE001 - whatever the failure, this engine is not usable
        return f"{type(exc).__name__}: {exc}"


def private_engine_host() -> str:
    """The ``DOCKER_HOST`` value of the private engine (``scripts/dockerd.sh host``)."""
    return subprocess.run(
        ["bash", str(DOCKERD_SCRIPT), "host"], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextmanager
def docker_engine(use_docker_host: bool = True) -> Iterator[str]:
    """Yield a reachable engine's address, with ``DOCKER_HOST`` set to it meanwhile.

    ``$DOCKER_HOST`` when it is set, ``use_docker_host`` is true and it answers; else the private
    engine, started here when it does not answer (and then stopped on exit). Raises
    :class:`NoDockerEngine` with the reasons when no engine can be reached.
    """
    reasons = []
    explicit = os.environ.get("DOCKER_HOST")
    host = None
    if use_docker_host and explicit:
        reason = engine_problem(explicit)
        if reason is None:
            host = explicit
        else:
            reasons.append(f"DOCKER_HOST={explicit}: {reason}")
    started_here = False
    if host is None:
        host = private_engine_host()
        if engine_problem(host) is not None:
            result = subprocess.run(
                ["bash", str(DOCKERD_SCRIPT), "start"], capture_output=True, text=True, timeout=120
            )
            if result.returncode != 0:
                reasons.append(
                    f"scripts/dockerd.sh start failed: {(result.stdout + result.stderr).strip()[-500:]}"
                )
                raise NoDockerEngine("no Docker engine can start here: " + "; ".join(reasons))
            started_here = True
        reason = engine_problem(host)
        if reason is not None:
            if started_here:
                subprocess.run(["bash", str(DOCKERD_SCRIPT), "stop"], capture_output=True, timeout=60)
            raise NoDockerEngine(f"no Docker engine reachable at {host}: {reason}")
    os.environ["DOCKER_HOST"] = host
    try:
        yield host
    finally:
        if explicit is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = explicit
        if started_here:
            subprocess.run(["bash", str(DOCKERD_SCRIPT), "stop"], capture_output=True, timeout=60)


__all__ = ["DOCKERD_SCRIPT", "NoDockerEngine", "docker_engine", "engine_problem", "private_engine_host"]
