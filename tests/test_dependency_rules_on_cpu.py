"""The dependency rules of DESIGN §5, checked on the source (what may import what)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(folder: Path) -> dict[str, set[str]]:
    """Every module each file under ``folder`` imports (top level and inside functions)."""
    out = {}
    for path in sorted(folder.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        out[str(path.relative_to(ROOT))] = names
    return out


def _offenders(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path} imports {name}"
        for path, names in _imports(ROOT / folder).items()
        for name in sorted(names)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        (
            "agentrl_ext/env",
            ("verl", "torch", "agentrl_ext.trainer", "agentrl_ext.rollout", "agentrl_ext.algos"),
        ),
        ("envs", ("verl", "torch", "agentrl_ext.trainer", "agentrl_ext.rollout", "agentrl_ext.algos")),
        (
            "agentrl_ext/algos",
            ("agentrl_ext.env", "agentrl_ext.rollout", "agentrl_ext.trainer", "httpx", "aiohttp"),
        ),
        ("agentrl_ext/rollout", ("agentrl_ext.trainer",)),
        (
            "agentrl_ext/platform",
            ("agentrl_ext.env", "agentrl_ext.rollout", "agentrl_ext.trainer", "agentrl_ext.algos"),
        ),
    ],
)
def test_dependency_rules_on_cpu(folder, forbidden):
    assert _offenders(folder, forbidden) == []
