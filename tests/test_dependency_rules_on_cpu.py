"""The dependency rules of DESIGN §5, checked on the source (what may import what).

Every import counts: top level and inside functions, absolute and relative (resolved against the
importing module), and ``importlib.import_module("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a folder and the package name its modules have once installed (setup.py ships envs/ inside)
PACKAGES = {"agentrl_ext": "agentrl_ext", "envs": "agentrl_ext.envs"}


def _module_name(path: Path) -> str:
    folder = path.relative_to(ROOT).parts[0]
    parts = [PACKAGES[folder], *path.relative_to(ROOT / folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _names_in(path: Path) -> set[str]:
    """Every module ``path`` imports, as absolute names."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            names |= {f"{prefix}.{alias.name}" for alias in node.names}  # ``from pkg import module``
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def _imports(folder: Path) -> dict[str, set[str]]:
    return {str(path.relative_to(ROOT)): _names_in(path) for path in sorted(folder.rglob("*.py"))}


def _matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _offenders(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path} imports {name}"
        for path, names in _imports(ROOT / folder).items()
        for name in sorted(names)
        if _matches(name, forbidden)
    ]


ENV_SIDE_FORBIDDEN = ("verl", "torch", "agentrl_ext.trainer", "agentrl_ext.rollout", "agentrl_ext.algos")


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        # the environment side is the ground floor: slim processes and containers, nothing above it
        (
            "agentrl_ext/env",
            (
                *ENV_SIDE_FORBIDDEN,
                "agentrl_ext.data",
                "agentrl_ext.eval",
                "agentrl_ext.models",
                "agentrl_ext.platform",
                "agentrl_ext.config",
                "agentrl_ext.envs",
            ),
        ),
        ("envs", (*ENV_SIDE_FORBIDDEN, "agentrl_ext.data", "agentrl_ext.eval", "agentrl_ext.config")),
        (
            "agentrl_ext/algos",
            ("agentrl_ext.env", "agentrl_ext.rollout", "agentrl_ext.trainer", "httpx", "aiohttp"),
        ),
        # the rollout side reaches tasks only through the controller client; the dataset builders,
        # the expert data and evaluation stand on it, not it on them
        (
            "agentrl_ext/rollout",
            ("agentrl_ext.trainer", "agentrl_ext.envs", "agentrl_ext.data", "agentrl_ext.eval"),
        ),
        (
            "agentrl_ext/platform",
            ("agentrl_ext.env", "agentrl_ext.rollout", "agentrl_ext.trainer", "agentrl_ext.algos"),
        ),
    ],
)
def test_dependency_rules_on_cpu(folder, forbidden):
    assert _offenders(folder, forbidden) == []


@pytest.mark.parametrize(
    ("where", "allowed"),
    [
        # DESIGN §5: a task imports only the environment side (and its own task package)
        ("envs", ("agentrl_ext.env", "agentrl_ext.envs")),
        # DESIGN §5: the CPU backend for verl knows nothing of AgentRL
        ("agentrl_ext/platform", ("agentrl_ext.platform", "agentrl_ext.verl_compat")),
        # the one module that touches verl's private names stands on nothing of ours
        ("agentrl_ext/verl_compat.py", ()),
    ],
)
def test_what_may_import_agentrl_ext_on_cpu(where, allowed):
    path = ROOT / where
    found = _imports(path) if path.is_dir() else {where: _names_in(path)}
    assert [
        f"{file} imports {name}"
        for file, names in found.items()
        for name in sorted(names)
        if _matches(name, ("agentrl_ext",)) and not _matches(name, allowed) and name != "agentrl_ext"
    ] == []


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("from ..data import store\n", "agentrl_ext.data.store"),
        ("from .store import require\n", "agentrl_ext.env.store"),
        ("import importlib\nimportlib.import_module('agentrl_ext.data.store')\n", "agentrl_ext.data.store"),
        ("def f():\n    from agentrl_ext.data import store\n", "agentrl_ext.data.store"),
    ],
)
def test_the_rules_see_relative_lazy_and_importlib_imports_on_cpu(tmp_path, monkeypatch, source, name):
    """The checker itself: each way of importing is seen (a module placed in agentrl_ext/env)."""
    module = tmp_path / "agentrl_ext" / "env" / "planted.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert name in _names_in(module)
    offenders = _offenders("agentrl_ext/env", ("agentrl_ext.data",))
    if name.startswith("agentrl_ext.data"):
        assert f"agentrl_ext/env/planted.py imports {name}" in offenders
    else:
        assert offenders == []


#: the floors of the house, lowest first (docs/architecture.md): an import never reaches a higher floor
FLOORS = {
    "agentrl_ext": 0,
    "cli": 0,
    "env": 0,
    "envs": 0,
    "models": 1,
    "config": 2,
    "run_spec": 2,
    "algos": 2,
    "platform": 2,
    "verl_compat": 2,
    "rollout": 3,
    "data": 4,
    "eval": 4,
    "trainer": 5,
    "plugin": 6,
    "testing": 6,
}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_import_reaches_a_higher_floor_on_cpu():
    found = {**_imports(ROOT / "agentrl_ext"), **_imports(ROOT / "envs")}
    rooms = {_room(_module_name(ROOT / path)) for path in found}
    assert rooms <= set(FLOORS), f"rooms without a floor: {sorted(rooms - set(FLOORS))}"
    up = [
        f"{path} ({_room(_module_name(ROOT / path))}) imports {name}"
        for path, names in found.items()
        for name in sorted(names)
        if name.startswith("agentrl_ext.")
        and FLOORS.get(_room(name), 0) > FLOORS[_room(_module_name(ROOT / path))]
    ]
    assert up == []


def test_no_import_circles_on_cpu():
    """No module of agentrl_ext or envs reaches back to itself through its imports (lazy ones too)."""
    found = {**_imports(ROOT / "agentrl_ext"), **_imports(ROOT / "envs")}
    modules = {_module_name(ROOT / path): names for path, names in found.items()}

    def owner(
        name: str,
    ) -> str | None:  # the module an imported name lives in (``pkg.mod.func`` -> ``pkg.mod``)
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: {o for n in names if (o := owner(n)) and o != m} for m, names in modules.items()}
    circles, done = [], set()
    for start in sorted(edges):  # a depth-first walk from each module, reporting a path back to it
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges[node]):
                if nxt == start and frozenset(path) not in done:
                    done.add(frozenset(path))
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen and nxt > start:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert circles == []
