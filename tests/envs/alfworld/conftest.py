"""Fixtures for the alfworld task: a data directory with the games unpacked.

The data comes from the vendored copy (``../shared/data``), installed (and the game archive
unpacked) into a temporary data directory with ``agentrl-data``'s own code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the helper module next to this file imports as a top-level module whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alfworld_helpers import SHARED_DATA  # noqa: E402

from agentrl_ext.data.store import install_from  # noqa: E402


@pytest.fixture(scope="session")
def alfworld_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory with the vendored data installed (skips when there is no copy)."""
    if not (SHARED_DATA / "SHA256SUMS").is_file():
        pytest.skip(f"no vendored data copy at {SHARED_DATA}")
    root = tmp_path_factory.mktemp("agentrl-data")
    install_from(SHARED_DATA, root)
    return root
