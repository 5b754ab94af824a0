"""The strict-skips plugin: in strict mode a skip not marked ``gpu`` fails the run and says why.

Each case runs a real pytest in a subprocess on a tiny project written to a temporary folder,
with the plugin loaded the way ``setup.cfg`` loads it, and reads its exit code and output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_ext.testing.strict_skips import strict_mode

TESTS = """
import pytest

@pytest.fixture
def engine():
    pytest.skip("no Docker engine at unix:///nowhere")

@pytest.fixture
def venv():
    pytest.skip("pip install failed:\\nERROR: No matching distribution found")

def test_needs_venv(venv):
    pass

def test_passes():
    assert True

def test_needs_engine(engine):
    pass

def test_needs_engine_too(engine):
    pass

@pytest.mark.skipif(True, reason="no vendored data copy at /nowhere")
def test_needs_data():
    pass

@pytest.mark.gpu
def test_on_gpu():
    pytest.skip("needs a CUDA GPU")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False
"""

MODULE_SKIP = """
import pytest
pytest.importorskip("a_package_that_is_not_installed", reason="the extra is not installed")

def test_never_runs():
    pass
"""


def _run(tmp_path: Path, files: dict[str, str], **env: str) -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    environ = {
        k: v for k, v in os.environ.items() if k not in ("CI", "AGENTRL_STRICT_SKIPS", "AGENTRL_ALLOW_SKIPS")
    }
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "agentrl_ext.testing.strict_skips", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"CI": "true"}, True),
        ({"CI": "false"}, False),
        ({"AGENTRL_STRICT_SKIPS": "1"}, True),
        ({"CI": "true", "AGENTRL_ALLOW_SKIPS": "1"}, False),
        ({"AGENTRL_STRICT_SKIPS": "1", "AGENTRL_ALLOW_SKIPS": "1"}, False),
    ],
)
def test_strict_mode_switch_on_cpu(environ, expected):
    assert strict_mode(environ)[0] is expected


def test_lenient_run_passes_and_groups_skips_by_reason_on_cpu(tmp_path):
    result = _run(tmp_path, {"test_sample.py": TESTS})
    out = result.stdout
    assert result.returncode == 0, out
    assert "strict skips: off" in out
    assert "1 passed, 5 skipped, 1 xfailed" in out
    assert "5 skipped:" in out
    assert "   2 x no Docker engine at unix:///nowhere" in out
    assert "   1 x no vendored data copy at /nowhere" in out
    assert "   1 x needs a CUDA GPU" in out


@pytest.mark.parametrize("switch", [{"CI": "true"}, {"AGENTRL_STRICT_SKIPS": "1"}])
def test_strict_run_fails_each_non_gpu_skip_with_its_reason_on_cpu(tmp_path, switch):
    result = _run(tmp_path, {"test_sample.py": TESTS}, **switch)
    out = result.stdout
    assert result.returncode == 1, out
    # the three skips of a missing part fail; the gpu skip and the xfail stay as they are
    # (a skip happens while the test is set up, so pytest counts its failure as an error)
    assert "1 passed, 1 skipped, 1 xfailed, 4 errors" in out
    assert "strict skips: on: a skip not marked 'gpu' fails" in out
    for name in ("test_needs_engine", "test_needs_engine_too", "test_needs_data"):
        assert f"ERROR test_sample.py::{name} - skipped in strict mode" in out
    assert "skipped in strict mode (" in out and "): no Docker engine at unix:///nowhere" in out
    assert "4 failed in strict mode" in out
    assert "   2 x no Docker engine at unix:///nowhere" in out
    assert "   1 x no vendored data copy at /nowhere" in out
    # a reason of several lines takes one line of the summary, in full in the test's own report
    assert "   1 x pip install failed: / ERROR: No matching distribution found\n" in out
    assert "pip install failed:\nERROR: No matching distribution found" in out
    assert "1 skipped (marked 'gpu'):" in out and "   1 x needs a CUDA GPU" in out


def test_opt_out_lets_tests_skip_under_ci_on_cpu(tmp_path):
    result = _run(tmp_path, {"test_sample.py": TESTS}, CI="true", AGENTRL_ALLOW_SKIPS="1")
    assert result.returncode == 0, result.stdout
    assert "1 passed, 5 skipped, 1 xfailed" in result.stdout


def test_strict_run_fails_on_a_module_skipped_at_import_on_cpu(tmp_path):
    files = {"test_sample.py": "def test_passes():\n    pass\n", "test_extra.py": MODULE_SKIP}
    lenient = _run(tmp_path, files)
    assert lenient.returncode == 0, lenient.stdout
    strict = _run(tmp_path, files, CI="true")
    assert strict.returncode == 1, strict.stdout
    assert "1 failed in strict mode" in strict.stdout
    assert "test_extra.py (skipped at collection): the extra is not installed" in strict.stdout
