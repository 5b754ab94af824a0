"""The ``megatron`` extra installs what verl 0.9.1's Megatron engine imports.

verl's engine (``verl/workers/engine/megatron/``, ``verl/models/mcore/``) imports ``megatron.core``
and, by default (``vanilla_mbridge: False``), NVIDIA Megatron-Bridge (``megatron.bridge``) to convert
the HF checkpoint; its layer specs use TransformerEngine (``use_transformer_engine=True`` in
``verl/models/mcore/model_initializer.py``). verl's ``mcore`` extra brings only the legacy
``mbridge``; its ``megatron`` extra brings all of them. Read from the installed metadata and
source: nothing GPU-only is installed here.
"""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: top-level module -> the PyPI distribution that provides it
PROVIDERS = {
    "megatron.core": "megatron-core",
    "megatron.bridge": "megatron-bridge",
    "transformer_engine": "transformer-engine",
    "mbridge": "mbridge",
}


def _engine_imports() -> set[str]:
    """``megatron.<pkg>`` / ``mbridge`` modules imported anywhere in verl's Megatron engine."""
    verl = Path(importlib.util.find_spec("verl").origin).parent
    found = set()
    for folder in (verl / "workers" / "engine" / "megatron", verl / "models" / "mcore"):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "megatron" and len(parts) > 1:
                        found.add(".".join(parts[:2]))
                    elif parts[0] in ("mbridge", "transformer_engine"):
                        found.add(parts[0])
    return found


def _our_extra(name: str) -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return [line.strip() for line in parser["options.extras_require"][name].splitlines() if line.strip()]


def _verl_extra(extras: set[str]) -> set[str]:
    """The distributions verl 0.9.1 requires for ``extras`` (its metadata's ``extra == "..."`` markers)."""
    out = set()
    for requirement in importlib.metadata.requires("verl") or []:
        marker = re.search(r'extra == "([^"]+)"', requirement)
        if marker and marker.group(1) in extras:
            out.add(re.split(r"[\s;<>=!\[~]", requirement, maxsplit=1)[0].lower())
    return out


def test_megatron_extra_provides_every_module_verls_megatron_engine_imports_on_cpu():
    (line,) = _our_extra("megatron")
    match = re.fullmatch(r"verl\[([^\]]+)\]==0\.9\.1", line)
    assert match, line
    provided = _verl_extra({e.strip() for e in match.group(1).split(",")})
    needed = _engine_imports() | {"transformer_engine"}  # the layer specs' TE modules
    assert {"megatron.core", "megatron.bridge"} <= needed
    missing = {m: PROVIDERS[m] for m in needed if PROVIDERS[m] not in provided}
    assert not missing, f"setup.cfg's megatron extra ({line}) installs nothing that provides {missing}"


def test_verls_mcore_extra_alone_would_lack_megatron_bridge_on_cpu():
    # why the extra is verl[megatron]: verl[mcore] is the legacy mbridge only
    assert "megatron-bridge" not in _verl_extra({"mcore"})
    assert "megatron-bridge" in _verl_extra({"megatron"})
