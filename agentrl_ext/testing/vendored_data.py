"""Where tests find the vendored benchmark data: ``$AGENTRL_VENDORED_DATA``, else ``../shared/data``
next to the repository (the layout of development and CI machines)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentrl_ext.testing.env_servers import REPO

VENDORED_DATA_ENV = "AGENTRL_VENDORED_DATA"


def vendored_data_dir() -> Path:
    """The folder holding the vendored copy (with its ``SHA256SUMS``), whether or not it exists."""
    explicit = os.environ.get(VENDORED_DATA_ENV)
    return Path(explicit) if explicit else REPO.parent / "shared" / "data"


def installed_data_dir(tmp_path_factory: Any) -> Path:
    """A fresh data directory (from pytest's ``tmp_path_factory``) with the vendored copy
    installed through ``agentrl-data``'s own install; skips when there is no copy (a failure in
    strict mode)."""
    import pytest

    from agentrl_ext.data.store import install_from

    shared = vendored_data_dir()
    if not (shared / "SHA256SUMS").is_file():
        pytest.skip(f"no vendored data copy at {shared}")
    root = Path(tmp_path_factory.mktemp("agentrl-data"))
    install_from(shared, root)
    return root
