"""Fixtures for the environment service: real uvicorn servers on 127.0.0.1, a real Docker engine.

Controllers and task workers run as subprocesses on free loopback ports, started by the one
launcher, :mod:`agentrl_ext.testing.env_servers`; the test tasks of this folder are importable there.
Docker tests use the engine at ``$DOCKER_HOST``, else the project's private engine
(``scripts/dockerd.sh``), which is started here when it is not running; they are skipped, with
the reason, only when no engine can start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The helper modules next to this file import as top-level modules whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from env_helpers import TESTS_ENV  # noqa: E402

from agentrl_ext.testing.env_servers import REPO, EnvServers  # noqa: E402


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

DOCKERD_SCRIPT = REPO / "scripts" / "dockerd.sh"


def _ping(base_url: str) -> str | None:
    """None when the engine at ``base_url`` answers, else the reason it does not."""
    import docker

    try:
        client = docker.DockerClient(base_url=base_url, timeout=5)
        client.ping()
        client.close()
        return None
    except Exception as exc:  # whatever the failure, this engine is not usable
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """A reachable engine: $DOCKER_HOST, else the project's dockerd (started if needed)."""
    reasons = []
    if os.environ.get("DOCKER_HOST"):
        reason = _ping(os.environ["DOCKER_HOST"])
        if reason is None:
            yield os.environ["DOCKER_HOST"]
            return
        reasons.append(f"DOCKER_HOST={os.environ['DOCKER_HOST']}: {reason}")
    private = subprocess.run([str(DOCKERD_SCRIPT), "host"], capture_output=True, text=True).stdout.strip()
    started_here = False
    if _ping(private) is not None:
        result = subprocess.run([str(DOCKERD_SCRIPT), "start"], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            reasons.append(
                f"scripts/dockerd.sh start failed: {(result.stdout + result.stderr).strip()[-500:]}"
            )
            pytest.skip("no Docker engine can start here: " + "; ".join(reasons))
        started_here = True
    reason = _ping(private)
    if reason is not None:
        pytest.skip(f"no Docker engine reachable at {private}: {reason}")
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = private
    try:
        yield private
    finally:
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous
        if started_here:
            subprocess.run([str(DOCKERD_SCRIPT), "stop"], capture_output=True, timeout=60)


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
