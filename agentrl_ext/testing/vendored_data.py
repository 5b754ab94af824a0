"""Where tests find the vendored benchmark data: ``$AGENTRL_VENDORED_DATA``, else ``../shared/data``
next to the repository (the layout of development and CI machines)."""

from __future__ import annotations

import os
from pathlib import Path

from agentrl_ext.testing.env_servers import REPO

VENDORED_DATA_ENV = "AGENTRL_VENDORED_DATA"


def vendored_data_dir() -> Path:
    """The folder holding the vendored copy (with its ``SHA256SUMS``), whether or not it exists."""
    explicit = os.environ.get(VENDORED_DATA_ENV)
    return Path(explicit) if explicit else REPO.parent / "shared" / "data"
