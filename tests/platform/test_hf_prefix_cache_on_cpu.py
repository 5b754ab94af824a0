"""Prefix caching in the HF rollout server: an episode's next turn reuses the KV of the turns before
(found by content, whatever the request id) and prefills only the new tokens, with the tokens and log-probs a plain
forward pass over the whole conversation gives; weight updates and diverging prompts never reuse
stale or foreign KV; the cache stays within its token budget."""

from __future__ import annotations

import asyncio

import pytest
import torch
from hf_reference import plain_log_probs

from agentrl_ext.platform.hf_server import HFRolloutServer
from agentrl_ext.testing.tiny_model import tiny_model_path

TOL = 1e-5  # float32 rounding between batch layouts (~1e-7 on the tiny model)


def _server(**rollout_overrides) -> HFRolloutServer:
    from verl.workers.config import HFModelConfig, RolloutConfig

    fields = dict(
        name="hf", dtype="float32", prompt_length=128, response_length=64, tensor_model_parallel_size=1
    )
    fields.update(rollout_overrides)
    return HFRolloutServer(RolloutConfig(**fields), HFModelConfig(path=str(tiny_model_path())))


def _tokens(n: int, offset: int) -> list[int]:
    return [(13 * i + 7 + offset) % 900 + 10 for i in range(n)]


def _greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens, each from a full forward pass over everything before it (no cache)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


async def _gen(server: HFRolloutServer, prompt: list[int], request_id: str, **params):
    return await server.generate(prompt_ids=prompt, sampling_params=params, request_id=request_id)


def _check_against_reference(server: HFRolloutServer, prompt: list[int], out, temperature: float) -> None:
    expected = plain_log_probs(server.model, prompt, list(out.token_ids), temperature)
    diff = (expected - torch.tensor(out.log_probs)).abs().max().item()
    assert diff < TOL, f"log-probs differ from a plain forward pass by {diff}"


def _episode(server: HFRolloutServer, request_id: str, opening: int, turns: int, offset: int, **params):
    """Turns of one episode as an agent loop sends them: each prompt is the previous prompt, the
    tokens generated for it and an 'environment answer'. Every turn gets its own request id, as
    verl's ``LLMServerClient`` sends them. Returns [(prompt, output)] per turn."""

    async def main():
        prompt, played = _tokens(opening, offset), []
        for turn in range(turns):
            out = await _gen(server, prompt, f"{request_id}-turn{turn}", **params)
            played.append((prompt, out))
            prompt = prompt + list(out.token_ids) + _tokens(5 + turn, offset + 100 + turn)
        return played

    return asyncio.run(main())


GREEDY = dict(temperature=0.0, max_tokens=8, ignore_eos=True)


def test_next_turn_prefills_only_its_new_tokens_and_matches_a_plain_forward_on_cpu():
    server = _server()
    stats = server.engine.stats
    played = _episode(server, "ep", opening=20, turns=3, offset=0, **GREEDY)
    for prompt, out in played:
        assert list(out.token_ids) == _greedy_reference(server.model, prompt, len(out.token_ids))
        _check_against_reference(server, prompt, out, 1.0)
    # turn 1 prefilled 20 tokens; turns 2 and 3 reused all but the last generated token of the turn before
    reused = [len(played[0][0]) + 8 - 1, len(played[1][0]) + 8 - 1]
    assert stats["prefix_hit_tokens"] == sum(reused)
    assert stats["prefill_tokens"] == sum(len(p) for p, _ in played) - sum(reused)


def test_sampled_turns_batched_with_fresh_requests_match_a_plain_forward_on_cpu():
    """Four episodes at different depths and a fresh request decode together; every row's
    log-probs still equal a plain forward pass over its own conversation."""
    server = _server()
    params = dict(temperature=0.8, max_tokens=6, ignore_eos=True)

    async def main():
        # turn 1 of four episodes with different opening lengths
        openings = [_tokens(7 + 9 * i, i) for i in range(4)]
        firsts = await asyncio.gather(*(_gen(server, p, f"e{i}", **params) for i, p in enumerate(openings)))
        seconds = [
            p + list(o.token_ids) + _tokens(3 + 2 * i, 50 + i)
            for i, (p, o) in enumerate(zip(openings, firsts, strict=True))
        ]
        fresh = _tokens(30, 77)
        outs = await asyncio.gather(
            *(_gen(server, p, f"e{i}", **params) for i, p in enumerate(seconds)),
            _gen(server, fresh, "new", **params),
        )
        return seconds + [fresh], outs

    prompts, outs = asyncio.run(main())
    assert server.engine.stats["prefix_hit_tokens"] > 0
    for prompt, out in zip(prompts, outs, strict=True):
        assert len(out.token_ids) == 6
        _check_against_reference(server, prompt, out, 0.8)


def test_cached_and_uncached_servers_give_the_same_episode_on_cpu():
    cached = _episode(_server(), "ep", opening=15, turns=4, offset=3, **GREEDY)
    plain_server = _server(enable_prefix_caching=False)
    plain = _episode(plain_server, "ep", opening=15, turns=4, offset=3, **GREEDY)
    assert plain_server.engine.stats["prefix_hit_tokens"] == 0
    for (p1, o1), (p2, o2) in zip(cached, plain, strict=True):
        assert p1 == p2 and o1.token_ids == o2.token_ids
        assert (torch.tensor(o1.log_probs) - torch.tensor(o2.log_probs)).abs().max().item() < TOL


def test_a_diverging_prompt_reuses_only_the_common_prefix_on_cpu():
    server = _server()
    first = asyncio.run(_gen(server, _tokens(30, 0), "ep", **GREEDY))
    # the prompt differs from token 20 on (past the first 16-token block)
    other = _tokens(20, 0) + _tokens(25, 500)
    assert other[:20] == _tokens(30, 0)[:20] and other[20] != _tokens(30, 0)[20]
    hits_before = server.engine.stats["prefix_hit_tokens"]
    out = asyncio.run(_gen(server, other, "ep", **GREEDY))
    assert server.engine.stats["prefix_hit_tokens"] - hits_before == 20
    assert list(out.token_ids) == _greedy_reference(server.model, other, 8)
    _check_against_reference(server, other, out, 1.0)
    assert first.token_ids  # the first request was served normally


def test_weight_update_drops_the_cached_prefixes_on_cpu():
    server = _server()
    prompt = _tokens(25, 1)
    out = asyncio.run(_gen(server, prompt, "ep", **GREEDY))
    assert server.engine.cached_prefix_tokens == 25 + 8 - 1
    state = {k: v * 1.01 if v.is_floating_point() else v for k, v in server.model.state_dict().items()}
    asyncio.run(server.update_weights(state, global_steps=1))
    assert server.engine.cached_prefix_tokens == 0
    follow_up = prompt + list(out.token_ids) + _tokens(6, 9)
    hits_before = server.engine.stats["prefix_hit_tokens"]
    again = asyncio.run(_gen(server, follow_up, "ep", **GREEDY))
    assert server.engine.stats["prefix_hit_tokens"] == hits_before, "KV of the old weights was reused"
    assert list(again.token_ids) == _greedy_reference(server.model, follow_up, 8)
    _check_against_reference(server, follow_up, again, 1.0)


def test_cache_stays_within_its_token_budget_least_recently_used_out_on_cpu():
    server = _server(max_num_batched_tokens=8)  # budget: 8 x 8 = 64 tokens
    assert server.engine.prefix_cache_tokens == 64

    async def main():
        for i in range(4):  # 4 episodes of 20 + 8 - 1 = 27 cached tokens each
            await _gen(server, _tokens(20, i), f"e{i}", **GREEDY)
            assert server.engine.cached_prefix_tokens <= 64

    asyncio.run(main())
    held = server.engine.prefix_cache.entries()
    assert [entry[:20] for entry in held] == [_tokens(20, 2), _tokens(20, 3)]  # the two most recent fit


def test_an_unrelated_prompt_reuses_nothing_on_cpu():
    server = _server()
    asyncio.run(_gen(server, _tokens(40, 0), "a", **GREEDY))
    out = asyncio.run(_gen(server, _tokens(40, 300), "a", **GREEDY))  # same request id, other tokens
    assert server.engine.stats["prefix_hit_tokens"] == 0
    assert list(out.token_ids) == _greedy_reference(server.model, _tokens(40, 300), 8)


def test_a_prompt_shorter_than_one_block_is_served_without_the_cache_on_cpu():
    server = _server()
    first = asyncio.run(_gen(server, _tokens(5, 0), "a", **GREEDY))
    follow_up = _tokens(5, 0) + list(first.token_ids)[:3]  # 12 tokens: no full block to look up
    asyncio.run(_gen(server, follow_up, "b", **GREEDY))
    assert server.engine.stats["prefix_hit_tokens"] == 0


def test_negative_budget_is_refused_on_cpu():
    from agentrl_ext.platform.hf_decoding import ContinuousBatcher

    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        ContinuousBatcher(torch.nn.Linear(1, 1), set(), prefix_cache_tokens=-1)
