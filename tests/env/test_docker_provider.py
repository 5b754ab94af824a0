"""DockerProvider against a real Docker engine (marker ``docker``; skipped only if no engine can start)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import textwrap

import docker.errors
import pytest

from agentrl_ext.env.providers import ResourceSpec
from agentrl_ext.env.providers.base_image import BaseImageSpec, ensure_base_image
from agentrl_ext.env.providers.docker import LABEL_OWNER, LABEL_SESSION, LABEL_TASK, DockerProvider
from agentrl_ext.testing.env_servers import LOOPBACK, subprocess_env

pytestmark = pytest.mark.docker

TASK = "pytest-docker"


@pytest.fixture
async def provider(docker_client, base_image):
    docker_provider = DockerProvider(docker_client, ResourceSpec(image=base_image, memory_bytes=256 << 20))
    yield docker_provider
    await docker_provider.close()


def test_base_image_is_cached(docker_client, base_image):
    before = docker_client.images.get(base_image).id
    assert ensure_base_image(BaseImageSpec(tag=base_image), docker_client) == base_image
    assert docker_client.images.get(base_image).id == before


async def test_container_has_limits_labels_and_no_network(provider, docker_client):
    spec = ResourceSpec(image=provider.default_spec.image, memory_bytes=128 << 20, cpus=1.5, pids_limit=64)
    async with provider.session(TASK, 11, spec) as box:
        attrs = docker_client.api.inspect_container(box.id)
        host = attrs["HostConfig"]
        assert host["Memory"] == 128 << 20 and host["MemorySwap"] == 128 << 20  # no swap
        assert host["NanoCpus"] == 1_500_000_000 and host["PidsLimit"] == 64
        assert host["NetworkMode"] == "none"
        labels = attrs["Config"]["Labels"]
        assert (
            labels[LABEL_TASK] == TASK
            and labels[LABEL_SESSION] == "11"
            and labels[LABEL_OWNER] == provider.owner
        )
        assert (await box.exec("ls /sys/class/net")).output.split() == ["lo"]


async def test_container_cannot_reach_a_host_loopback_service(provider):
    with socket.socket() as server:
        server.bind((LOOPBACK, 0))
        server.listen()
        port = server.getsockname()[1]
        probe = (
            'python3 -c "import socket; s = socket.socket(); s.settimeout(2); '
            f"print('connected' if s.connect_ex(('127.0.0.1', {port})) == 0 else 'refused')\""
        )
        async with provider.session(TASK, 12) as box:
            result = await box.exec(probe)
    assert result.output.strip() == "refused"


async def test_memory_limit_is_enforced_by_oom_kill(provider):
    spec = ResourceSpec(image=provider.default_spec.image, memory_bytes=64 << 20)
    async with provider.session(TASK, 13, spec) as box:
        result = await box.exec("python3 -c \"b = b'x' * (512 << 20); print('survived')\"")
    assert result.exit_code == 137 and "survived" not in result.output


async def test_pids_limit_is_enforced(provider):
    spec = ResourceSpec(image=provider.default_spec.image, pids_limit=16)
    script = textwrap.dedent(
        """
        import os, time
        started = 0
        try:
            for _ in range(64):
                if os.fork() == 0:
                    os.close(1); os.close(2); time.sleep(30); os._exit(0)
                started += 1
        except OSError as exc:
            print("limited", started, exc.errno)
        else:
            print("unlimited", started)
        """
    )
    async with provider.session(TASK, 14, spec) as box:
        result = await box.exec(f"python3 -c '{script}'")
    words = result.output.split()
    assert words[0] == "limited", result.output
    assert int(words[1]) < 16


async def test_exec_timeout_and_output_truncation(provider):
    async with provider.session(TASK, 15) as box:
        slow = await box.exec("sleep 30", timeout_s=1)
        assert slow.timed_out and slow.exit_code == 124
        big = await box.exec("head -c 100000 /dev/zero | tr '\\0' y", max_output_chars=800)
        assert big.truncated and big.output.startswith("y" * 800) and "more characters" in big.output
        assert (await box.exec("echo ok")).output == "ok\n"  # the container survived both


async def test_container_is_removed_at_session_end(provider, docker_client):
    async with provider.session(TASK, 16) as box:
        container_id = box.id
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container_id)


async def test_parallel_sessions_get_separate_containers(provider):
    async def one(n: int) -> str:
        async with provider.session(TASK, 100 + n) as box:
            await box.exec(f"echo {n} > /root/n")
            return (await box.exec("cat /root/n; hostname")).output

    outputs = await asyncio.gather(*(one(n) for n in range(4)))
    assert [o.split()[0] for o in outputs] == ["0", "1", "2", "3"]
    assert len({o.split()[1] for o in outputs}) == 4


def test_orphans_of_a_crashed_worker_are_swept(docker_client, base_image, docker_host):
    crash = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        from agentrl_ext.env.providers import ResourceSpec
        from agentrl_ext.env.providers.docker import DockerProvider

        async def main():
            provider = DockerProvider(default_spec=ResourceSpec(image={base_image!r}))
            box = await provider.acquire({TASK!r}, 99)
            print(box.id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # crash without cleanup

        asyncio.run(main())
        """
    )
    env = {**subprocess_env(), "DOCKER_HOST": docker_host}
    result = subprocess.run(
        [sys.executable, "-c", crash], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == -9, result.stderr
    orphan_id = result.stdout.strip()
    assert docker_client.containers.get(orphan_id).labels[LABEL_TASK] == TASK

    survivor = DockerProvider(docker_client, ResourceSpec(image=base_image))
    kept = asyncio.run(survivor.acquire(TASK, 98))  # a live owner's container must survive the sweep
    try:
        assert survivor.sweep_orphans(TASK) == 1
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(orphan_id)
        assert docker_client.containers.get(kept.id).status == "running"
    finally:
        asyncio.run(survivor.close())


def test_sweep_command_removes_every_labelled_container(docker_client, base_image, docker_host):
    leftover = docker_client.containers.run(
        base_image,
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        labels={"agentrl.managed": "true", LABEL_TASK: TASK},
    )
    env = {**subprocess_env(), "DOCKER_HOST": docker_host}
    result = subprocess.run(
        [sys.executable, "-m", "agentrl_ext.env.providers.docker", "--all", "--tasks", TASK],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(leftover.id)


def test_no_labelled_container_is_left(docker_client):
    left = docker_client.containers.list(all=True, filters={"label": ["agentrl.managed=true"]})
    assert left == [], json.dumps([c.name for c in left])
