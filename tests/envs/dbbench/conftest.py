"""Fixtures for the dbbench task: the data directory and a private MariaDB server.

The data comes from the vendored copy (``../shared/data``), installed into a temporary data
directory with ``agentrl-data``'s own code. MariaDB tests use a private server started with
``scripts/mariadb.sh`` in temporary folders (Debian's ``mariadb-server``; ``scripts/test.sh``
installs it) and are skipped, with the reason, when none can start.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the helper module next to this file imports as a top-level module whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dbbench_helpers import MariaDBServer, start_private_mariadb  # noqa: E402

from agentrl_ext.testing.vendored_data import installed_data_dir  # noqa: E402


@pytest.fixture(scope="session")
def dbbench_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory with the vendored data installed (skips when there is no copy)."""
    return installed_data_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def mariadb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    """One private MariaDB server for the session."""
    server = start_private_mariadb(tmp_path_factory.mktemp("mariadb"))
    yield server
    server.stop()
