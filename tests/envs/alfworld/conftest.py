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


from agentrl_ext.testing.vendored_data import installed_data_dir  # noqa: E402


@pytest.fixture(scope="session")
def alfworld_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory with the vendored data installed (skips when there is no copy)."""
    return installed_data_dir(tmp_path_factory)
