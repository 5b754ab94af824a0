"""HF rollout server: decoding, log-probs, weight updates, stop conditions (in-process, no Ray)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl_ext.platform.hf_server import HFRolloutServer, filter_logits
from agentrl_ext.testing.tiny_model import tiny_model_path


def _server(**rollout_overrides) -> HFRolloutServer:
    from verl.workers.config import HFModelConfig, RolloutConfig

    path = str(tiny_model_path())
    fields = dict(
        name="hf", dtype="float32", prompt_length=32, response_length=16, tensor_model_parallel_size=1
    )
    fields.update(rollout_overrides)
    return HFRolloutServer(RolloutConfig(**fields), HFModelConfig(path=path))


@pytest.fixture(scope="module")
def server() -> HFRolloutServer:
    return _server()


def _gen(server: HFRolloutServer, prompt: list[int], **params):
    return asyncio.run(server.generate(prompt_ids=prompt, sampling_params=params, request_id="t"))


PROMPT = [5, 17, 42, 99, 7]


def test_greedy_decoding_is_deterministic_on_cpu(server):
    a = _gen(server, PROMPT, temperature=0.0, max_tokens=8, ignore_eos=True)
    b = _gen(server, PROMPT, temperature=0.0, max_tokens=8, ignore_eos=True)
    assert a.token_ids == b.token_ids
    assert len(a.token_ids) == 8


def test_log_probs_equal_direct_forward_pass_on_cpu(server):
    temperature = 0.7
    out = _gen(server, PROMPT, temperature=temperature, max_tokens=12, ignore_eos=True, seed=3)
    ids = torch.tensor([PROMPT + out.token_ids])
    with torch.no_grad():
        logits = server.model(input_ids=ids).logits[0].float()
    # position t predicts token t+1
    pred = torch.log_softmax(logits[len(PROMPT) - 1 : -1] / temperature, dim=-1)
    expected = pred.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    diff = (expected - torch.tensor(out.log_probs)).abs().max().item()
    assert diff < 1e-4, f"rollout log-probs differ from a forward pass by {diff}"


def test_weight_update_changes_output_on_cpu():
    server = _server()
    before = _gen(server, PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True)
    state = {k: v.clone() for k, v in server.model.state_dict().items()}
    torch.manual_seed(0)
    state = {k: v + 0.5 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}
    asyncio.run(server.update_weights(state, global_steps=7))
    after = _gen(server, PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True)
    assert after.log_probs != before.log_probs
    assert after.extra_fields["global_steps"] == 7


def test_weight_update_rejects_unknown_names_on_cpu(server):
    with pytest.raises(KeyError, match="not parameters"):
        asyncio.run(server.update_weights({"no.such.weight": torch.zeros(1)}))


def test_max_tokens_is_honoured_on_cpu(server):
    out = _gen(server, PROMPT, temperature=1.0, max_tokens=3, ignore_eos=True, seed=1)
    assert len(out.token_ids) == 3 and len(out.log_probs) == 3


def test_stop_token_ends_generation_on_cpu(server):
    free = _gen(server, PROMPT, temperature=0.0, max_tokens=8, ignore_eos=True)
    stop_at = free.token_ids[2]
    first = free.token_ids.index(stop_at)
    out = _gen(server, PROMPT, temperature=0.0, max_tokens=8, ignore_eos=True, stop_token_ids=[stop_at])
    assert out.token_ids == free.token_ids[: first + 1]


def test_default_max_tokens_follows_response_length_on_cpu(server):
    out = _gen(server, PROMPT, temperature=1.0, ignore_eos=True, seed=0)
    assert len(out.token_ids) == 16


def test_prompt_without_room_is_a_clear_error_on_cpu(server):
    with pytest.raises(ValueError, match="max_model_len"):
        _gen(server, list(range(48)), temperature=0.0)


def test_top_k_one_equals_greedy_on_cpu(server):
    greedy = _gen(server, PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True)
    topk = _gen(server, PROMPT, temperature=1.0, top_k=1, max_tokens=6, ignore_eos=True, seed=5)
    assert topk.token_ids == greedy.token_ids


def test_filter_logits_top_p_keeps_nucleus_on_cpu():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = torch.isfinite(filter_logits(logits, top_k=-1, top_p=0.7))
    assert kept.tolist() == [True, True, False, False]
