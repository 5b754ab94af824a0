"""AgentBench's own KG questions stay loadable; their Freebase backend is configured, and fails clearly.

No Freebase endpoint is reachable here: these tests check the configuration path only (the
questions load from the vendored data, a missing ``sparql_url`` and an unreachable endpoint are
errors that say what to do). The vendored copy is read in place (``require`` verifies each file).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentrl_ext.env.data_files import DataError
from agentrl_ext.testing.env_servers import REPO, free_port, subprocess_env
from agentrl_ext.testing.vendored_data import vendored_data_dir
from envs.kg.sparql import KGBackendError
from envs.kg.task import KGTask

SHARED_DATA = vendored_data_dir()


@pytest.fixture(scope="module")
def data_dir():
    if not (SHARED_DATA / "agentbench" / "knowledgegraph" / "std.json").is_file():
        pytest.skip(f"no vendored data copy at {SHARED_DATA}")
    return SHARED_DATA


def unreachable_url() -> str:
    return f"http://127.0.0.1:{free_port()}/sparql"  # a port nobody listens on


@pytest.mark.parametrize(("split", "count"), [("std", 150), ("test", 150), ("dev", 20), ("train", 1214)])
def test_agentbench_questions_load_with_a_sparql_url_on_cpu(data_dir, split, count):
    task = KGTask(split=split, source="agentbench", sparql_url=unreachable_url(), data_dir=data_dir)
    assert len(task.questions) == len(task.get_indices()) == count
    file = {"std": "std.json", "test": "std.json", "dev": "dev.json", "train": "kg_rl_all.json"}[split]
    rows = json.loads((data_dir / "agentbench" / "knowledgegraph" / file).read_text())
    first = task.questions[0]
    assert first.question == rows[0]["question"] and first.entities == rows[0]["entities"]
    assert first.gold == {a["answer_argument"] for a in rows[0]["answer"]}
    assert task.one_shot == (split in ("std", "test"))  # as AgentBench's kg-std / kg-env_train
    # only AgentBench's own questions on Freebase carry AgentBench's name
    assert task.calculate_overall([])["benchmark"] == (
        "kg-std" if split in ("std", "test") else f"kg-{split}"
    )
    task.backend.close()  # type: ignore[attr-defined]


def test_agentbench_source_without_sparql_url_says_what_to_set_on_cpu(data_dir):
    with pytest.raises(ValueError, match=r"sparql_url.*not available offline.*source='offline'"):
        KGTask(split="std", source="agentbench", data_dir=data_dir)


def test_missing_data_names_the_install_command_on_cpu(tmp_path):
    with pytest.raises(DataError, match="agentrl-data install"):
        KGTask(split="std", source="agentbench", sparql_url=unreachable_url(), data_dir=tmp_path)


async def test_unreachable_endpoint_fails_setup_clearly_on_cpu(data_dir):
    url = unreachable_url()
    task = KGTask(split="dev", source="agentbench", sparql_url=url, data_dir=data_dir)
    with pytest.raises(KGBackendError, match=rf"sparql_url='{url}' did not answer.*not available offline"):
        await task.setup()
    await task.teardown()


def test_worker_with_unreachable_endpoint_exits_with_the_reason_on_cpu(data_dir):
    kwargs = {
        "split": "dev",
        "source": "agentbench",
        "sparql_url": unreachable_url(),
        "data_dir": str(data_dir),
    }
    argv = [sys.executable, "-m", "agentrl_ext.env.worker", "agentrl_ext.envs.kg.task:KGTask"]
    argv += ["--port", str(free_port()), "--task-kwargs", json.dumps(kwargs)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO)
    assert result.returncode != 0
    assert "did not answer" in result.stderr and "source='offline'" in result.stderr, result.stderr[-2000:]
