"""Fixtures for the os task: the data directory, a Docker engine and the session image.

The data comes from the vendored copy (``../shared/data``), installed into a temporary data
directory with ``agentrl-data``'s own code. Docker tests use the engine of
:func:`agentrl_ext.testing.docker_engine.docker_engine` (``$DOCKER_HOST``, else the project's
private engine, started here when needed and stopped afterwards), and build
``agentrl-os:default`` with ``scripts/build_os_image.sh`` when it is missing (about 75 s the
first time); they are skipped, with the reason, when no engine can start.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the helper module next to this file imports as a top-level module whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agentrl_ext.testing.docker_engine import NoDockerEngine, docker_engine  # noqa: E402
from agentrl_ext.testing.env_servers import REPO  # noqa: E402
from agentrl_ext.testing.vendored_data import (
    installed_data_dir,  # noqa: E402
)

OS_IMAGE = "agentrl-os:default"


@pytest.fixture(scope="session")
def os_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory with the vendored data installed (skips when there is no copy)."""
    return installed_data_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def os_docker_host() -> Iterator[str]:
    """A reachable engine holding ``agentrl-os:default``; ``DOCKER_HOST`` is set to it meanwhile."""
    try:
        with docker_engine() as host:
            import docker

            client = docker.DockerClient(base_url=host, timeout=60)
            try:
                client.images.get(OS_IMAGE)
            except docker.errors.ImageNotFound:
                build = subprocess.run(
                    ["bash", str(REPO / "scripts" / "build_os_image.sh")],
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                if build.returncode != 0:
                    pytest.skip(
                        f"cannot build {OS_IMAGE} here: {(build.stdout + build.stderr).strip()[-400:]}"
                    )
            finally:
                client.close()
            yield host
    except NoDockerEngine as exc:
        pytest.skip(str(exc))
