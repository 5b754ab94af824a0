"""Fixtures of the webshop tests: a data directory with the vendored data, the catalogue, the shop.

The data comes from the vendored copy (``../shared/data`` or ``$AGENTRL_VENDORED_DATA``),
installed into a temporary data directory with ``agentrl-data``'s own code; the tests skip,
saying where they looked, when there is no copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the helper module next to this file imports as a top-level module whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agentrl_ext.testing.vendored_data import (
    installed_data_dir,  # noqa: E402
)

pytest.importorskip("bm25s", reason="the webshop extra is not installed (pip install 'agentrl_ext[webshop]')")

from envs.webshop.catalogue import Catalogue, load_catalogue  # noqa: E402
from envs.webshop.env import Shop  # noqa: E402


@pytest.fixture(scope="session")
def webshop_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory with the vendored data installed (skips when there is no copy)."""
    return installed_data_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def catalogue(webshop_data_dir: Path) -> Catalogue:
    return load_catalogue(webshop_data_dir)


@pytest.fixture(scope="session")
def shop(catalogue: Catalogue) -> Shop:
    return Shop(catalogue)
