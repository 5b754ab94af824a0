"""Fixtures for the environment service: real uvicorn servers on 127.0.0.1, a real Docker engine.

Controllers and task workers run as subprocesses on free loopback ports, started by the one
launcher, :mod:`agentrl_ext.testing.env_servers`; the test tasks of this folder are importable there.
Docker tests use the engine of :func:`agentrl_ext.testing.docker_engine.docker_engine`:
``$DOCKER_HOST``, else the project's private engine (``scripts/dockerd.sh``), which is started
here when it is not running; they are skipped, with the reason, only when no engine can start.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The helper modules next to this file import as top-level modules whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from env_helpers import TESTS_ENV  # noqa: E402

from agentrl_ext.testing.docker_engine import NoDockerEngine, docker_engine  # noqa: E402
from agentrl_ext.testing.env_servers import EnvServers  # noqa: E402


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[EnvServers]:
    """Per-test controllers/workers, stopped at teardown."""
    with EnvServers(tmp_path, python_path=[TESTS_ENV]) as group:
        yield group


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvServers]:
    """Controllers/workers shared by a module's tests."""
    with EnvServers(tmp_path_factory.mktemp("servers"), python_path=[TESTS_ENV]) as group:
        yield group


# ---------------------------------------------------------------------------------------- docker


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """A reachable engine: $DOCKER_HOST, else the project's dockerd (started if needed)."""
    try:
        with docker_engine() as host:
            yield host
    except NoDockerEngine as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def docker_client(docker_host: str) -> Iterator[Any]:
    import docker

    client = docker.DockerClient(base_url=docker_host, timeout=120)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    """The local base image (built once, cached; about a minute the very first time)."""
    from agentrl_ext.env.providers.base_image import BaseImageSpec, ensure_base_image, image_exists

    spec = BaseImageSpec()
    if not image_exists(docker_client, spec.tag):
        try:
            ensure_base_image(spec, docker_client)
        except RuntimeError as exc:
            pytest.skip(f"cannot build the base image {spec.tag} here: {exc}")
    return spec.tag
