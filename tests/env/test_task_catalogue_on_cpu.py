"""The task catalogue: tasks describe themselves (``TaskSpec``) and are found through the
entry-point group ``agentrl_ext.tasks``, so a third-party package adds a task the way ours do."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from launcher_helpers import launcher, read_until

from agentrl_ext.env.tasks import ENTRY_POINT_GROUP, TaskSpec, task_spec, task_specs
from agentrl_ext.testing.env_servers import REPO, free_port, subprocess_env

#: what every task of ours declares, written out here (not read from the specs under test)
OURS = {
    "alfworld": ("agentrl_ext.envs.alfworld.task:ALFWorldTask", ("data",), None),
    "calc": ("agentrl_ext.envs.calc.task:CalcTask", (), "agentrl_ext.envs.calc.expert:expert_action"),
    "dbbench": ("agentrl_ext.envs.dbbench.task:DBBenchTask", ("mariadb", "data"), None),
    "digits": ("agentrl_ext.envs.letters.task:DigitsTask", (), None),
    "gridroom": (
        "agentrl_ext.envs.gridroom.task:GridRoomTask",
        (),
        "agentrl_ext.envs.gridroom.expert:expert_action",
    ),
    "guess": ("agentrl_ext.envs.guess.task:GuessTask", (), "agentrl_ext.envs.guess.expert:expert_action"),
    "kg": ("agentrl_ext.envs.kg.task:KGTask", (), None),
    "letters": ("agentrl_ext.envs.letters.task:LettersTask", (), None),
    "os": ("agentrl_ext.envs.os.task:OSTask", ("docker", "data"), None),
    "webshop": ("agentrl_ext.envs.webshop.task:WebShopTask", ("data",), None),
}


def test_every_task_of_ours_is_in_the_catalogue_as_declared_on_cpu():
    specs = task_specs()
    assert {name: (s.task_class, s.needs, s.expert) for name, s in specs.items()} == OURS
    assert specs["dbbench"].kwargs_for("test") == {"split": "standard"}
    assert specs["alfworld"].kwargs_for("test", {"data_dir": "/d"}) == {"split": "new_std", "data_dir": "/d"}
    with pytest.raises(ValueError, match=r"unknown task 'guesss' \(did you mean 'guess'\?\)"):
        task_spec("guesss")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"task_class": "no_colon"}, "must be 'module:Class'"),
        ({"task_class": "m:C", "needs": ("redis",)}, "unknown needs/splits"),
        ({"task_class": "m:C", "splits": {"dev": {}}}, "unknown needs/splits"),
        ({"task_class": "m:C", "expert": "no_colon"}, "must be 'module:function'"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field_on_cpu(fields, message):
    with pytest.raises(ValueError, match=message):
        TaskSpec(name="t", **fields)


def _third_party_package(root: Path) -> Path:
    """A distribution that is not agentrl_ext, installed by its metadata on a path entry: a task
    package (a Task and its spec) and an ``agentrl_ext.tasks`` entry point naming the spec."""
    package = root / "shout_tasks"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text(
        textwrap.dedent(
            """
            from agentrl_ext.env.protocol import SampleStatus
            from agentrl_ext.env.worker import SampleResult, Task, function_tool


            class ShoutTask(Task):
                name = "shout"
                tools = [function_tool("shout", "Say it loud.", {"text": {"type": "string"}})]

                def get_indices(self):
                    return list(range(3))

                async def start_sample(self, index, session):
                    session.inject({"role": "user", "content": "shout hello"})
                    action = await session.action()
                    loud = action.tool_calls[0].arguments.get("text") == "HELLO"
                    return SampleResult(SampleStatus.COMPLETED, reward=1.0 if loud else 0.0)
            """
        )
    )
    (package / "spec.py").write_text(
        "from agentrl_ext.env.tasks import TaskSpec\n\nSPEC = TaskSpec(name='shout', task_class='shout_tasks.task:ShoutTask')\n"
    )
    meta = root / "shout_tasks-0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: shout-tasks\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nshout = shout_tasks.spec:SPEC\n")
    return root


def test_a_third_party_task_is_listed_and_started_like_ours_on_cpu(tmp_path):
    site = _third_party_package(tmp_path / "site")
    env = subprocess_env([site])
    listed = subprocess.run(
        [sys.executable, "-m", "agentrl_ext.env.launcher", "list"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert listed.returncode == 0, listed.stderr
    assert "shout_tasks.task:ShoutTask" in listed.stdout and "guess" in listed.stdout
    port = free_port()
    proc = launcher("--tasks", "shout", "--port", str(port), log_dir=tmp_path / "logs", env=env)
    try:
        read_until(proc, "agentrl-envs: ready", 120, tmp_path / "logs")
        api = f"http://127.0.0.1:{port}/api"
        with httpx.Client(timeout=30) as http:
            started = http.post(f"{api}/start_sample", json={"name": "shout", "index": 0})
            assert started.status_code == 200, started.text
            call = {
                "id": "c0",
                "type": "function",
                "function": {"name": "shout", "arguments": json.dumps({"text": "HELLO"})},
            }
            answer = http.post(
                f"{api}/interact",
                headers={"session_id": started.headers["session_id"]},
                json={"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]},
            )
        assert answer.status_code == 200, answer.text
        assert answer.json()["finish"] and answer.json()["reward"] == 1.0
    finally:
        proc.terminate()
        proc.wait(60)
