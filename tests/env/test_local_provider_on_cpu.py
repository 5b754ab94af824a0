"""LocalProvider: a temp directory and bash subprocesses per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher_helpers import running

from agentrl_ext.env.providers import LocalProvider, ResourceSpec
from agentrl_ext.env.providers.base import TIMEOUT_EXIT_CODE


@pytest.fixture
async def provider(tmp_path: Path):
    local = LocalProvider(root=tmp_path / "sessions")
    yield local
    await local.close()


async def test_commands_run_in_a_private_directory_removed_at_session_end(provider):
    async with provider.session("os", 7) as box:
        directory = Path(box.id)
        assert directory.is_dir() and "agentrl-os-7-" in directory.name
        assert (await box.exec("echo hi > note.txt && pwd")).output.strip() == str(directory)
        result = await box.exec("cat note.txt; exit 3")
        assert result.output == "hi\n" and result.exit_code == 3
    assert not directory.exists()


async def test_timeout_kills_the_whole_process_group(provider, tmp_path):
    async with provider.session("os", 1) as box:
        result = await box.exec("sleep 60 & echo $! > child.pid; wait", timeout_s=0.5)
        assert result.timed_out and result.exit_code == TIMEOUT_EXIT_CODE
        child = int((Path(box.id) / "child.pid").read_text())
        assert not running(child)


async def test_output_is_truncated(provider):
    async with provider.session("os", 2) as box:
        result = await box.exec("head -c 100000 /dev/zero | tr '\\0' x", max_output_chars=800)
        assert result.truncated
        assert result.output.startswith("x" * 800) and "more characters" in result.output
        assert len(result.output) < 900


async def test_memory_limit_applies(tmp_path):
    local = LocalProvider(root=tmp_path, default_spec=ResourceSpec(memory_bytes=256 << 20))
    async with local.session("os", 3) as box:
        result = await box.exec("python3 -c \"b = b'x' * (1 << 30); print('allocated')\"")
    assert result.exit_code != 0 and "allocated" not in result.output
    assert "MemoryError" in result.output


async def test_session_resource_is_released_when_the_task_fails(provider):
    with pytest.raises(RuntimeError):
        async with provider.session("os", 4) as box:
            directory = Path(box.id)
            raise RuntimeError("task failed")
    assert not directory.exists()
