"""Cross-policy evaluation with a pool of two OpenAI-compatible "models" (fakes on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from agentrl_ext.eval import evaluate_async
from agentrl_ext.eval.cli import eval_pool_main
from agentrl_ext.rollout.openai_pool import PoolMember
from agentrl_ext.testing.env_servers import env_servers, free_port


def _fake_openai_server() -> tuple[str, list[dict[str, Any]]]:
    """Two models behind one /v1: 'writer-a' says aaaa with a say() call, 'writer-b' says bbbb."""
    app, seen = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def chat(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body)
        letter = "a" if body["model"] == "writer-a" else "b"
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "say", "arguments": f'{{"text": "{letter * 4}"}}'},
        }
        return {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]
        }

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}/v1", seen


def test_pool_members_share_turns_and_episodes_complete_on_cpu(tmp_path):
    base_url, seen = _fake_openai_server()
    models = [f"a={base_url},writer-a", f"b={base_url},writer-b"]
    workers = [("letters", "letters", "agentrl_ext.envs.letters.task:LettersTask")]
    with env_servers(workers, tmp_path / "logs") as servers:
        report = asyncio.run(
            evaluate_async(servers.controller_url, ["letters"], models, limit=20, progress=False)
        )
        # the old command still runs, as agentrl-eval-run with --member read as --model
        out = tmp_path / "pool.json"
        argv = ["--controller", servers.controller_url, "--tasks", "letters", "--limit", "4", "--no-progress"]
        assert eval_pool_main([*argv, "--member", models[0], "--member", models[1], "--out", str(out)]) == 0
    results = report.episodes
    assert len(results) == 20
    assert all(r.status == "completed" and len(r.models) == 3 for r in results)
    assert 0.3 < report.turn_share["a"] < 0.7
    assert {b["model"] for b in seen} == {"writer-a", "writer-b"}
    assert all(b["tools"][0]["function"]["name"] == "say" for b in seen)
    # index 0 asks for "a": an episode written only by writer-a scores 1.0, only by writer-b 0.0
    for r in results:
        if r.index % 10 == 0:
            assert r.reward == pytest.approx(r.models.count("a") / 3)
    assert report.summary["letters"].episodes == 20
    assert out.is_file()


def test_bad_member_spec_is_named_on_cpu():
    with pytest.raises(ValueError, match="name=http"):
        PoolMember.parse("just-a-url")
    assert PoolMember.parse("q=http://127.0.0.1:8000/v1/,Qwen,2").weight == 2.0
