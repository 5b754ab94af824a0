"""``agentrl-envs up --docker``: the kg worker runs in its own container, serves an episode through
the controller, and Ctrl-C removes the container; a SIGKILLed launcher's container is swept by
the next launcher; the os worker in its container starts its session containers on the engine
and takes them along when it dies (marker ``docker``).

The launcher runs as a real subprocess on the project's private engine (``scripts/dockerd.sh``,
the engine ``--docker`` uses, started here when it is not running). kg is the cheapest task
image: the launcher builds ``agentrl-kg:latest`` with ``scripts/build_task_image.sh`` when it is
missing (~1 minute on a warm pip cache, once; os: ``agentrl-os:latest`` likewise, and the session
image ``agentrl-os:default`` with ``scripts/build_os_image.sh``); with the images present the
module runs in ~25 s.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx
import pytest
from agentrl_ext.envs.kg.offline import build_offline_graph
from agentrl_ext.envs.kg.prompts import TOOLS
from agentrl_ext.envs.kg.questions import KGQuestion, generate_questions, split_questions
from launcher_helpers import descendants, launcher, read_until, running

from agentrl_ext.env.launcher import CONTAINER_LABEL, EnvStack
from agentrl_ext.env.providers.base_image import BaseImageSpec, ensure_base_image
from agentrl_ext.env.providers.docker import LABEL_OWNER, LABEL_TASK, owner_is_alive, owner_label
from agentrl_ext.testing.docker_engine import NoDockerEngine, docker_engine, private_engine_host
from agentrl_ext.testing.env_servers import REPO, free_port, list_workers
from agentrl_ext.testing.raw_protocol import RawClient, tool_call
from agentrl_ext.testing.vendored_data import vendored_data_dir

pytestmark = pytest.mark.docker

TASK = "kg"
IMAGE = f"agentrl-{TASK}:latest"
OS_SESSION_IMAGE = "agentrl-os:default"
PARAMETERS = {t["function"]["name"]: list(t["function"]["parameters"]["properties"]) for t in TOOLS}


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    """The private engine (the one ``--docker`` uses), with the base image the task image builds on."""
    try:
        with docker_engine(use_docker_host=False) as host:
            client = docker.DockerClient(base_url=host, timeout=120)
            try:
                ensure_base_image(BaseImageSpec(), client)  # a no-op when present
            except RuntimeError as exc:
                pytest.skip(f"cannot build the base image here: {exc}")
            try:
                yield client
            finally:
                client.close()
    except NoDockerEngine as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def question() -> KGQuestion:
    """The first question of kg's test split (the worker's ``index`` 0), computed here."""
    return split_questions(generate_questions(build_offline_graph()), seed=0)["test"][0]


def owned(engine: docker.DockerClient, owner: str) -> list[Any]:
    """The containers the launcher with ``owner`` label started (running or not)."""
    return engine.containers.list(all=True, filters={"label": f"{CONTAINER_LABEL}={owner}"})


def start_launcher(
    engine: docker.DockerClient, log_dir: Path, task: str = TASK, *args: str
) -> tuple[subprocess.Popen[bytes], str, str]:
    """``agentrl-envs up --tasks TASK --docker ARGS`` until ready: (process, controller API, its owner label)."""
    try:
        engine.images.get(f"agentrl-{task}:latest")
        timeout_s = 240.0
    except docker.errors.ImageNotFound:
        timeout_s = 900.0  # the image is built first
    port = free_port()
    proc = launcher("--tasks", task, "--docker", "--port", str(port), *args, log_dir=log_dir)
    printed = read_until(proc, "agentrl-envs: ready", timeout_s=timeout_s, log_dir=log_dir)
    assert f"worker {task:<10} container agentrl-envs-{task}-{proc.pid} (network host)" in printed
    return proc, f"http://127.0.0.1:{port}/api", owner_label(proc.pid)


def play(client: RawClient, actions: list[str], final: str) -> dict[str, Any]:
    """Start sample 0, run the AgentBench-notation ``actions`` (``get_neighbors(#0,rel)``), then say ``final``."""
    session, _ = client.start(0)
    for number, action in enumerate(actions):
        match = re.fullmatch(r"(\w+)\((.*)\)", action)
        assert match, action
        values = [v.strip() for v in match.group(2).split(",")]
        arguments = dict(zip(PARAMETERS[match.group(1)], values, strict=True))
        answer = client.step(session, tool_call(match.group(1), arguments, f"call-{number}"))
        assert answer["status"] == "running", (action, answer)
    return client.step(session, content=final)


def stop_quietly(proc: subprocess.Popen[bytes], engine: docker.DockerClient, *owners: str) -> None:
    """Failure clean-up: the launcher killed, the containers of ``owners`` removed."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    for owner in owners:
        for container in owned(engine, owner):
            container.remove(force=True)
            for session in engine.containers.list(all=True, filters={"label": LABEL_OWNER}):
                if session.labels[LABEL_OWNER].startswith(f"{container.name}:"):
                    session.remove(force=True)


def test_up_docker_serves_kg_from_its_container_and_ctrl_c_removes_it(engine, question, tmp_path):
    proc = launcher_owner = None
    try:
        proc, api, launcher_owner = start_launcher(
            engine, tmp_path, TASK, "--split", "test"
        )  # the question is the test split's
        (container,) = owned(engine, launcher_owner)
        assert container.status == "running" and IMAGE in container.image.tags
        assert container.attrs["HostConfig"]["NetworkMode"] == "host"
        (worker,) = list_workers(api)[TASK]
        assert worker["healthy"] and worker["routable"] and worker["address"].startswith("http://127.0.0.1:")

        client = RawClient(api, TASK)
        last = sum(1 for a in question.actions if not a.startswith(("get_relations(", "get_attributes("))) - 1
        done = play(client, list(question.actions), f"Final Answer: #{last}")
        assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 1.0), done
        # wrong: the count of the answer instead of the answer
        wrong = [*question.actions, f"count(#{last})"]
        answer_variable = last + 1 if not question.actions[-1].startswith("count(") else last - 1
        done = play(client, wrong, f"Final Answer: #{answer_variable}")
        assert (done["finish"], done["status"], done["reward"]) == (True, "completed", 0.0), done

        children = descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, proc.stdout.read() if proc.stdout else ""
        assert owned(engine, launcher_owner) == []
        with pytest.raises(docker.errors.NotFound):
            engine.containers.get(container.id)
        assert not any(running(pid) for pid in children)
        with pytest.raises(httpx.TransportError):
            httpx.get(api, timeout=2)
    finally:
        if proc is not None:
            stop_quietly(proc, engine, *filter(None, [launcher_owner]))


def test_a_killed_launchers_container_is_swept_by_the_next_launcher(engine, tmp_path):
    first = second = None
    owners: list[str] = []
    try:
        first, _, first_owner = start_launcher(engine, tmp_path / "first")
        owners.append(first_owner)
        first.kill()  # SIGKILL: no clean-up; its controller dies with it, its container stays
        first.wait(10)
        (left,) = owned(engine, first_owner)
        assert left.status == "running"

        second, api, second_owner = start_launcher(engine, tmp_path / "second")
        owners.append(second_owner)
        assert owned(engine, first_owner) == []  # swept before the new container started
        assert len(owned(engine, second_owner)) == 1
        second.send_signal(signal.SIGINT)
        assert second.wait(90) == 0
        assert owned(engine, second_owner) == []
    finally:
        for proc in (first, second):
            if proc is not None:
                stop_quietly(proc, engine, *owners)


def test_stop_removes_a_container_it_never_recorded(engine, tmp_path):
    """A Ctrl-C between the engine creating a container and ``containers.run`` returning it."""
    stack = EnvStack(tasks=[TASK], docker=True, log_dir=tmp_path)
    stack.services["dockerd"] = private_engine_host()
    orphan = engine.containers.create(
        BaseImageSpec().tag, ["sleep", "60"], network_mode="none", labels={CONTAINER_LABEL: owner_label()}
    )
    try:
        stack.stop()
        with pytest.raises(docker.errors.NotFound):
            engine.containers.get(orphan.id)
    finally:
        try:
            orphan.remove(force=True)
        except docker.errors.NotFound:
            pass


def test_up_docker_os_worker_runs_sessions_and_its_crash_leaves_no_container(engine, tmp_path):
    """os in its container: the engine's socket is mounted, the worker container has its own host
    name (so the owner labels of its session containers never pass for this host's dead processes),
    and when the worker container dies its sessions' containers go with it."""
    data = vendored_data_dir()
    if not (data / "agentbench" / "os_interaction").is_dir():
        pytest.skip(f"no vendored data copy at {data}")
    try:
        engine.images.get(OS_SESSION_IMAGE)
    except docker.errors.ImageNotFound:
        build = subprocess.run(
            ["bash", str(REPO / "scripts" / "build_os_image.sh")], capture_output=True, text=True, timeout=900
        )
        if build.returncode != 0:
            pytest.skip(f"cannot build {OS_SESSION_IMAGE} here: {(build.stdout + build.stderr)[-400:]}")
    kwargs = json.dumps({"data_dir": str(data)})
    proc = owner = None
    try:
        proc, api, owner = start_launcher(engine, tmp_path, "os", "--task-kwargs", f"os={kwargs}")
        (worker,) = owned(engine, owner)
        assert worker.attrs["Config"]["Hostname"] == worker.name
        client = RawClient(api, "os")
        session, _ = client.start(0)
        answer = client.step(session, tool_call("bash_action", {"script": "echo hello from $(hostname)"}))
        assert answer["status"] == "running" and "hello from " in answer["messages"][0]["content"], answer
        (box,) = [
            c
            for c in engine.containers.list(all=True, filters={"label": f"{LABEL_TASK}=os"})
            if c.labels[LABEL_OWNER].startswith(f"{worker.name}:")
        ]
        # what a sweep on this host (a local os worker starting, agentrl-docker-sweep) asks: alive
        assert owner_is_alive(box.labels[LABEL_OWNER])

        worker.kill()  # the worker dies with its session open: the launcher stops, removing both
        assert proc.wait(90) == 1
        assert owned(engine, owner) == []
        with pytest.raises(docker.errors.NotFound):
            engine.containers.get(box.id)
    finally:
        if proc is not None:
            stop_quietly(proc, engine, *filter(None, [owner]))
