"""The wheel holds the recipes and the task workers, and runs from outside the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What the wheel is built from. The build runs on a copy: setuptools' build/ folder in the
# checkout could carry modules deleted since an earlier build into the wheel.
BUILD_INPUTS = (
    "setup.py",
    "setup.cfg",
    "pyproject.toml",
    "README.md",
    "agentrl_ext",
    "recipes",
    "envs",
    "scripts",
)


def _pip(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"


def _shipped(folder: str, pattern: str, package: str) -> set[str]:
    """The wheel paths of the checkout's ``folder/**/pattern`` files, installed as ``package``."""
    return {f"{package}/{p.relative_to(REPO / folder).as_posix()}" for p in (REPO / folder).rglob(pattern)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    for name in BUILD_INPUTS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, work / "src" / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (work / "src").mkdir(exist_ok=True)
            shutil.copy2(source, work / "src" / name)
    _pip("wheel", "./src", "--no-deps", "--no-build-isolation", "-w", "dist", cwd=work)
    (built,) = (work / "dist").glob("agentrl_ext-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel installed into a throwaway folder (its dependencies come from the venv)."""
    target = tmp_path_factory.mktemp("site")
    _pip("install", "--no-deps", "--target", str(target), str(wheel), cwd=target)
    return target


def _run_outside(installed: Path, argv: list[str], tmp_path: Path) -> str:
    """Run in a folder outside the checkout, with the installed wheel (not the checkout) importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGENTRL_RECIPES_DIR")}
    env["PYTHONPATH"] = str(installed)
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_wheel_holds_recipes_task_workers_and_nothing_at_top_level_on_cpu(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = _shipped("recipes", "*.yaml", "agentrl_ext/recipes")
    expected |= _shipped("envs", "*.py", "agentrl_ext/envs")
    expected |= _shipped("agentrl_ext", "*.py", "agentrl_ext")
    assert {"agentrl_ext/recipes/cpu_agentrl.yaml", "agentrl_ext/envs/letters/task.py"} <= expected
    # the servers agentrl-envs up starts (dbbench's MariaDB, the private Docker engine)
    expected |= {"agentrl_ext/scripts/mariadb.sh", "agentrl_ext/scripts/dockerd.sh"}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    # no top-level `envs` or `recipes` package in site-packages: everything lives under agentrl_ext
    assert {n.split("/")[0] for n in names} == {"agentrl_ext", wheel.name.split("-py3")[0] + ".dist-info"}


def test_installed_wheel_composes_a_recipe_from_any_directory_on_cpu(installed, tmp_path):
    script = installed / "bin" / "agentrl-train"
    out = _run_outside(installed, [str(script), "--config-name", "cpu_agentrl", "--cfg", "job"], tmp_path)
    assert "adv_estimator: task_norm_grpo" in out
    assert "default_agent_loop: agentrl" in out


def test_installed_wheel_imports_task_workers_and_recipes_on_cpu(installed, tmp_path):
    probe = (
        "import json, agentrl_ext\n"
        "from agentrl_ext.env.launcher import script_path\n"
        "from agentrl_ext.env.worker.cli import load_task\n"
        "from agentrl_ext.trainer.main import recipes_dir\n"
        "task = load_task('agentrl_ext.envs.letters.task:LettersTask', {})\n"
        "print(json.dumps({'package': agentrl_ext.__file__, 'recipes': recipes_dir(), 'task': task.name,\n"
        "                  'mariadb': str(script_path('mariadb.sh'))}))\n"
    )
    found = json.loads(_run_outside(installed, [sys.executable, "-c", probe], tmp_path).splitlines()[-1])
    assert Path(found["package"]).is_relative_to(installed), f"imported {found['package']}, not the wheel"
    assert Path(found["recipes"]) == installed / "agentrl_ext" / "recipes"
    assert found["task"] == "letters"
    assert Path(found["mariadb"]) == installed / "agentrl_ext" / "scripts" / "mariadb.sh"


def test_build_dataset_names_the_extra_without_pandas_on_cpu(monkeypatch, capsys):
    from agentrl_ext.data import multitask

    monkeypatch.setitem(sys.modules, "pandas", None)  # as in the base install, which lacks pandas
    with pytest.raises(SystemExit):
        multitask.main(["--controller", "http://127.0.0.1:1/api", "--tasks", "letters", "--out", "x.parquet"])
    assert "needs pandas: pip install 'agentrl_ext[data]'" in capsys.readouterr().err


def test_recipes_come_from_the_package_unless_agentrl_recipes_dir_is_set_on_cpu(monkeypatch, tmp_path):
    from agentrl_ext.trainer.main import recipes_dir, recipes_search_path

    monkeypatch.delenv("AGENTRL_RECIPES_DIR", raising=False)
    assert recipes_search_path() == "pkg://agentrl_ext.recipes"
    assert Path(recipes_dir()) == REPO / "recipes"  # the editable install maps the package to the folder
    monkeypatch.setenv("AGENTRL_RECIPES_DIR", str(tmp_path))
    assert recipes_search_path() == recipes_dir() == str(tmp_path.resolve())
