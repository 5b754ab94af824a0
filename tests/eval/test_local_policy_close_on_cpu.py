"""An evaluation's in-process models end their decode threads when it closes them (an evaluation
stopped by Ctrl-C closes its policy, then the process exits 130; a decode thread still inside a
forward at interpreter exit would end it with SIGABRT instead)."""

from __future__ import annotations

import asyncio
import threading

from agentrl_ext.eval.policies import LocalBudget, LocalPolicy, Sampling
from agentrl_ext.testing.tiny_model import tiny_model_path


def _decode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hf-rollout-decode"]


def test_closing_a_local_policy_ends_its_decode_threads_mid_generation_on_cpu():
    # the controller is never contacted: only generate() and close() run here
    policy = LocalPolicy(
        [str(tiny_model_path(seed=0)), str(tiny_model_path(seed=1))],
        "http://127.0.0.1:9/api",
        Sampling(),
        LocalBudget(prompt_length=16, response_length=400),
        max_num_seqs=8,
    )
    params = {"temperature": 1.0, "max_tokens": 400, "ignore_eos": True}

    async def main():
        calls = [
            asyncio.create_task(
                server.generate(
                    prompt_ids=[11, 12, 13], sampling_params={**params, "seed": i}, request_id=f"r{i}"
                )
            )
            for i, server in enumerate(policy.servers.values())
        ]
        while len(_decode_threads()) < 2 or any(
            s.engine.stats["decode_forwards"] < 2 for s in policy.servers.values()
        ):
            await asyncio.sleep(0.001)  # pytest's timeout bounds the wait
        await policy.close()
        alive = [t.name for t in _decode_threads()]
        return alive, await asyncio.gather(*calls)

    alive, outputs = asyncio.run(main())
    assert alive == [], "a decode thread outlived the policy's close()"
    for out in outputs:
        assert out.stop_reason == "aborted" and 1 <= len(out.token_ids) < 400
