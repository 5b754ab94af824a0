"""A separate virtual environment holding AgentRL's published packages, for the interop tests.

``agentrl-worker`` 0.4.0 and ``agentrl-eval`` 0.1.2 cannot share our venv: ``agentrl-eval``
pulls ``anthropic[bedrock]`` whose ``botocore`` needs ``python-dateutil<3`` and would downgrade
the ``python-dateutil`` 4.x that verl's stack installed. So they live in their own venv, built
once from PyPI and cached under ``.cache/interop-venv`` (git-ignored); the tests run their worker
and their evaluation client as subprocesses from there.

Run ``python tests/env/interop_venv.py`` to build it ahead of the tests (about a minute).
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

from agentrl_ext.testing.env_servers import REPO

VENV_DIR = REPO / ".cache" / "interop-venv"
REQUIREMENTS = ("agentrl-worker==0.4.0", "agentrl-eval==0.1.2")
_READY = VENV_DIR / ".agentrl-interop-ready"


def venv_python() -> Path:
    return VENV_DIR / "bin" / "python"


def ensure_interop_venv() -> Path:
    """Build the venv if missing (or built for other requirements); returns its python.

    Raises RuntimeError with pip's output when the packages cannot be installed.
    """
    wanted = "\n".join(REQUIREMENTS)
    if _READY.exists() and _READY.read_text() == wanted and venv_python().exists():
        return venv_python()
    VENV_DIR.parent.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(VENV_DIR)
    result = subprocess.run(
        [str(venv_python()), "-m", "pip", "install", "--disable-pip-version-check", "-q", *REQUIREMENTS],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"pip install {' '.join(REQUIREMENTS)} failed:\n{(result.stdout + result.stderr)[-3000:]}"
        )
    _READY.write_text(wanted)
    return venv_python()


if __name__ == "__main__":
    print(ensure_interop_venv())
    sys.exit(0)
