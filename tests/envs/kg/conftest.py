"""The kg tests: helpers import as a top-level module whatever pytest's import mode."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
