"""Continuous batching in the HF rollout server: a request decoded among others gives the tokens and
log-probs it gets alone; every sampling parameter works per row; abort and weight updates."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from hf_reference import plain_log_probs

from agentrl_ext.platform.hf_server import HFGenerator, HFRolloutServer, SamplingSpec
from agentrl_ext.testing.tiny_model import tiny_model_path

TOL = 1e-5  # float32: batched and unbatched differ only by rounding (~1e-7 on the tiny model)


def _server(**rollout_overrides) -> HFRolloutServer:
    from verl.workers.config import HFModelConfig, RolloutConfig

    fields = dict(
        name="hf", dtype="float32", prompt_length=48, response_length=24, tensor_model_parallel_size=1
    )
    fields.update(rollout_overrides)
    return HFRolloutServer(RolloutConfig(**fields), HFModelConfig(path=str(tiny_model_path())))


@pytest.fixture(scope="module")
def server() -> HFRolloutServer:
    return _server()


def _prompt(n: int, offset: int = 0) -> list[int]:
    return [(17 * i + 5 + offset) % 900 + 10 for i in range(n)]


async def _gen(server: HFRolloutServer, prompt: list[int], request_id: str = "r", **params):
    return await server.generate(prompt_ids=prompt, sampling_params=params, request_id=request_id)


def _run_together(server: HFRolloutServer, requests: list[tuple[list[int], dict]]):
    async def main():
        return await asyncio.gather(*(_gen(server, p, f"r{i}", **kw) for i, (p, kw) in enumerate(requests)))

    return asyncio.run(main())


def _alone(server: HFRolloutServer, prompt: list[int], **params):
    return asyncio.run(_gen(server, prompt, **params))


def _assert_same(a, b) -> None:
    assert a.token_ids == b.token_ids
    diff = (torch.tensor(a.log_probs) - torch.tensor(b.log_probs)).abs().max().item()
    assert diff < TOL, f"log-probs differ by {diff}"
    assert a.stop_reason == b.stop_reason


# Seven companions of different lengths and parameters: the padding, the positions and the
# per-row sampling of the others must not leak into the request under test.
OTHERS = [
    (_prompt(3, 1), dict(temperature=1.0, max_tokens=20, ignore_eos=True, seed=11)),
    (_prompt(40, 2), dict(temperature=0.0, max_tokens=5, ignore_eos=True)),
    (_prompt(9, 3), dict(temperature=0.7, top_p=0.8, max_tokens=24, ignore_eos=True)),
    (_prompt(22, 4), dict(temperature=1.3, top_k=5, max_tokens=3, ignore_eos=True, seed=2)),
    (_prompt(1, 5), dict(temperature=0.9, repetition_penalty=1.3, max_tokens=17, ignore_eos=True)),
    (_prompt(31, 6), dict(temperature=1.0, max_tokens=1, ignore_eos=True)),
    (_prompt(15, 7), dict(temperature=0.0, max_tokens=24, ignore_eos=True)),
]


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.0, max_tokens=16, ignore_eos=True),
        dict(temperature=0.8, max_tokens=16, ignore_eos=True, seed=3),
    ],
    ids=["greedy", "seeded"],
)
def test_request_among_seven_others_equals_request_alone_on_cpu(server, params):
    prompt = _prompt(12)
    alone = _alone(server, prompt, **params)
    for position in (0, 4, 7):  # first, middle and last row of the batch
        server.engine.stats["max_rows"] = 0
        requests = OTHERS[:position] + [(prompt, params)] + OTHERS[position:]
        batched = _run_together(server, requests)[position]
        _assert_same(batched, alone)
        # the max_tokens=1 companion ends at its prefill; the other seven rows decode together
        assert server.engine.stats["max_rows"] == 7, "the requests were not decoded in one batch"


def test_batched_log_probs_equal_independent_forward_pass_on_cpu(server):
    requests = [
        (_prompt(4 + 5 * i, i), dict(temperature=0.6 + 0.1 * i, max_tokens=12, ignore_eos=True))
        for i in range(8)
    ]
    outputs = _run_together(server, requests)
    for (prompt, params), out in zip(requests, outputs, strict=True):
        assert len(out.token_ids) == 12
        expected = plain_log_probs(server.model, prompt, out.token_ids, params["temperature"])
        diff = (expected - torch.tensor(out.log_probs)).abs().max().item()
        assert diff < TOL, f"batched log-probs differ from a plain forward pass by {diff}"


SAMPLING_CASES = {
    "greedy": dict(temperature=0.0, max_tokens=10, ignore_eos=True),
    "temperature": dict(temperature=1.7, max_tokens=10, ignore_eos=True, seed=21),
    "top_k": dict(temperature=1.0, top_k=3, max_tokens=10, ignore_eos=True, seed=22),
    "top_p": dict(temperature=1.0, top_p=0.5, max_tokens=10, ignore_eos=True, seed=23),
    "repetition_penalty": dict(temperature=0.0, repetition_penalty=1.5, max_tokens=10, ignore_eos=True),
    "max_tokens": dict(temperature=1.0, max_tokens=2, ignore_eos=True, seed=24),
    "eos": dict(temperature=1.0, max_tokens=24, seed=25),
    "stop_token_ids": dict(temperature=1.0, max_tokens=24, ignore_eos=True, seed=26),
    "stop": dict(temperature=1.0, max_tokens=24, ignore_eos=True, seed=27),
}


def test_every_sampling_param_batched_equals_single_sequence_decoder_on_cpu(server):
    """All cases in one batch (prompts of different lengths); each must match the plain
    one-request decoder (HFGenerator) with the same parameters."""
    tokenizer = server.model_config.tokenizer
    reference = HFGenerator(server.model, server.engine.eos_token_ids, tokenizer)
    cases = {name: (_prompt(5 + 3 * i, i), dict(kw)) for i, (name, kw) in enumerate(SAMPLING_CASES.items())}

    def free_run(name: str) -> list[int]:
        prompt, kw = cases[name]
        return reference.generate(
            prompt, SamplingSpec(max_tokens=24, temperature=1.0, ignore_eos=True, seed=kw["seed"])
        )[0]

    # stops that fire mid-sequence, taken from the free-running output of the same seed
    stop_token = free_run("stop_token_ids")[3]
    cases["stop_token_ids"][1]["stop_token_ids"] = [stop_token]
    stop_text = tokenizer.decode(free_run("stop")[4:6])
    cases["stop"][1]["stop"] = [stop_text]

    outputs = dict(zip(cases, _run_together(server, list(cases.values())), strict=True))
    for name, (prompt, kw) in cases.items():
        tokens, log_probs, _ = reference.generate(prompt, server._sampling_spec(len(prompt), dict(kw)))
        out = outputs[name]
        assert out.token_ids == tokens, name
        diff = (torch.tensor(out.log_probs) - torch.tensor(log_probs)).abs().max().item()
        assert diff < TOL, f"{name}: log-probs differ by {diff}"
    assert len(outputs["max_tokens"].token_ids) == 2
    assert (
        outputs["stop_token_ids"].token_ids[-1] == stop_token
        and len(outputs["stop_token_ids"].token_ids) <= 4
    )
    assert stop_text in tokenizer.decode(outputs["stop"].token_ids) and len(outputs["stop"].token_ids) <= 6
    greedy = outputs["greedy"].token_ids
    assert outputs["repetition_penalty"].token_ids != greedy or len(set(greedy)) == len(greedy)


def test_seeded_request_same_tokens_in_any_batch_on_cpu(server):
    params = dict(temperature=1.0, max_tokens=20, ignore_eos=True, seed=1234)
    prompt = _prompt(7)
    first = _run_together(server, [(prompt, params)] + OTHERS[:3])[0]
    second = _run_together(server, OTHERS[3:] + [(prompt, params)])[-1]
    _assert_same(first, second)
    other_seed = _alone(server, prompt, **{**params, "seed": 4321})
    assert other_seed.token_ids != first.token_ids, "the seed must drive the sampling"


async def _wait_for(condition, what: str) -> None:
    """Poll ``condition`` on the event loop (no timing assumption; pytest's timeout bounds it)."""
    for _ in range(100_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never saw: {what}")


def test_request_joining_mid_decode_equals_request_alone_on_cpu(server):
    params = dict(temperature=0.9, max_tokens=16, ignore_eos=True, seed=5)
    prompt = _prompt(26)  # longer than the rows already running: both sides get left padding
    alone = _alone(server, prompt, **params)
    engine = server.engine

    async def main():
        long_runs = [
            asyncio.create_task(
                _gen(server, _prompt(n, n), f"long{n}", temperature=1.0, max_tokens=24, ignore_eos=True)
            )
            for n in (4, 9)
        ]
        start = engine.stats["decode_forwards"]
        await _wait_for(lambda: engine.stats["decode_forwards"] >= start + 3, "three decode steps")
        joined = await _gen(server, prompt, "late", **params)
        rest = await asyncio.gather(*long_runs)
        return joined, rest

    joined, rest = asyncio.run(main())
    _assert_same(joined, alone)
    assert all(len(r.token_ids) == 24 for r in rest)


def test_one_at_a_time_mode_decodes_single_rows_with_same_results_on_cpu():
    single = _server(max_num_seqs=1)
    requests = OTHERS[:4]
    outputs = _run_together(single, requests)
    assert single.engine.stats["max_rows"] == 1
    assert single.engine.stats["prefill_forwards"] == 4
    batched = _run_together(single, requests[:1])  # sanity: same server, same answer
    _assert_same(batched[0], outputs[0])


def test_prefill_token_budget_splits_admission_on_cpu():
    small = _server(max_num_batched_tokens=40)
    prompt = _prompt(12)
    params = dict(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = _run_together(small, [(_prompt(30, i), params) for i in range(3)] + [(prompt, params)])
    assert small.engine.stats["prefill_forwards"] >= 3  # at most one 30-token prompt per prefill
    _assert_same(outputs[-1], _alone(small, prompt, **params))


def test_abort_returns_partial_outputs_then_resume_serves_again_on_cpu():
    server = _server(response_length=400, prompt_length=16)
    engine = server.engine

    async def main():
        tasks = [
            asyncio.create_task(
                _gen(server, _prompt(5 + i, i), f"a{i}", temperature=1.0, max_tokens=400, ignore_eos=True)
            )
            for i in range(4)
        ]
        await _wait_for(lambda: engine.stats["decode_forwards"] >= 2, "decoding under way")
        report = await server.abort_all_requests()
        partial = await asyncio.gather(*tasks)
        refused = await _gen(server, _prompt(5), "late", temperature=0.0, max_tokens=4)
        await server.resume_generation()
        served = await _gen(server, _prompt(5), "after", temperature=0.0, max_tokens=4, ignore_eos=True)
        return report, partial, refused, served

    report, partial, refused, served = asyncio.run(main())
    assert report["aborted_count"] == 4 and report["request_ids"] == ["a0", "a1", "a2", "a3"]
    for out in partial:
        assert out.stop_reason == "aborted"
        assert 1 <= len(out.token_ids) < 400 and len(out.log_probs) == len(out.token_ids)
    assert refused.stop_reason == "aborted" and refused.token_ids == []
    assert served.stop_reason == "completed" and len(served.token_ids) == 4


def test_weight_update_waits_for_the_forward_in_progress_on_cpu():
    server = _server()
    before = server.state_dict_checksum()
    state = {k: v + 1.0 if v.is_floating_point() else v for k, v in server.model.state_dict().items()}
    done = threading.Event()

    def update():
        asyncio.run(server.update_weights(state, global_steps=3))
        done.set()

    with server.engine.model_lock:  # what the decode thread holds during every forward
        updater = threading.Thread(target=update)
        updater.start()
        assert not done.wait(0.5), "weights were swapped while a forward held the model"
        assert server.state_dict_checksum() == before
    updater.join()
    assert done.is_set() and server.state_dict_checksum() != before


def test_cancelled_caller_frees_its_row_on_cpu():
    server = _server(response_length=400, prompt_length=16)
    engine = server.engine

    async def main():
        task = asyncio.create_task(
            _gen(server, _prompt(5), "c", temperature=1.0, max_tokens=400, ignore_eos=True)
        )
        await _wait_for(lambda: engine.stats["decode_forwards"] >= 2, "decoding under way")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_for(lambda: engine.pending == 0, "the cancelled row dropped")
        return engine.stats["decoded_rows"]

    assert asyncio.run(main()) < 400


def test_unseeded_rows_draw_from_the_filtered_distribution_on_cpu(server):
    """Unseeded rows share one vectorised sampler: top-k must hold for every token it draws."""
    requests = [
        (_prompt(6 + 4 * i, i), dict(temperature=1.0, top_k=3, max_tokens=12, ignore_eos=True))
        for i in range(6)
    ]
    for (prompt, _), out in zip(requests, _run_together(server, requests), strict=True):
        with torch.no_grad():
            logits = server.model(input_ids=torch.tensor([prompt + out.token_ids])).logits[
                0, len(prompt) - 1 : -1
            ]
        ranks = (logits > logits.gather(1, torch.tensor(out.token_ids)[:, None])).sum(dim=1)
        assert ranks.max().item() < 3, f"a token outside the top 3 was drawn: ranks {ranks.tolist()}"


def test_inverse_cdf_sampler_matches_probabilities_on_cpu(monkeypatch):
    from agentrl_ext.platform import hf_decoding

    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]])
    torch.manual_seed(0)
    draws = torch.stack([hf_decoding._inverse_cdf_sample(probs) for _ in range(4000)])
    freq = torch.stack([torch.bincount(draws[:, r], minlength=5) / 4000 for r in range(2)])
    assert (freq - probs).abs().max().item() < 0.03
    assert freq[0, 1] == 0 and freq[0, 4] == 0 and freq[1, 3] == 1
    # a draw that rounds up to the total mass must still land on a token with probability > 0
    monkeypatch.setattr(hf_decoding.torch, "rand", lambda *shape: torch.ones(*shape))
    assert hf_decoding._inverse_cdf_sample(probs).tolist() == [3, 3]


def test_concurrent_requests_to_the_ray_actor_are_batched_on_cpu():
    """As deployed: a Ray async actor (its own event loop) with concurrent generate calls."""
    import ray
    from verl.workers.config import HFModelConfig, RolloutConfig

    config = RolloutConfig(
        name="hf", dtype="float32", prompt_length=48, response_length=24, tensor_model_parallel_size=1
    )
    model_config = HFModelConfig(path=str(tiny_model_path()))
    params = dict(temperature=0.8, max_tokens=12, ignore_eos=True, seed=9)
    prompt = _prompt(12)
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    try:
        actor = (
            ray.remote(HFRolloutServer)
            .options(max_concurrency=64)
            .remote(config=config, model_config=model_config)
        )
        alone = ray.get(actor.generate.remote(prompt_ids=prompt, sampling_params=params, request_id="alone"))
        refs = [
            actor.generate.remote(prompt_ids=p, sampling_params=kw, request_id=f"r{i}")
            for i, (p, kw) in enumerate(OTHERS + [(prompt, params)])
        ]
        batched = ray.get(refs)[-1]
        stats = ray.get(actor.__ray_call__.remote(lambda self: dict(self.engine.stats)))
    finally:
        ray.shutdown()
    _assert_same(batched, alone)
    assert stats["max_rows"] > 1, "concurrent calls to the actor were decoded one at a time"


def test_close_ends_the_decode_thread_mid_request_on_cpu():
    """What an in-process server does before its process exits (Ctrl-C mid-evaluation): a decode
    thread still in a forward at interpreter shutdown would end the process with SIGABRT."""
    server = _server(response_length=400, prompt_length=16)
    engine = server.engine
    started = threading.Event()
    outcome: list = []

    async def main():
        task = asyncio.create_task(
            _gen(server, _prompt(5), "long", temperature=1.0, max_tokens=400, ignore_eos=True)
        )
        await _wait_for(lambda: engine.stats["decode_forwards"] >= 2, "decoding under way")
        decoder = next(t for t in threading.enumerate() if t.name == "hf-rollout-decode")
        started.set()
        assert server.close(timeout_s=60)
        outcome.append(decoder.is_alive())
        return await task

    out = asyncio.run(main())
    assert started.is_set() and outcome == [False], "the decode thread outlived close()"
    assert out.stop_reason == "aborted" and 1 <= len(out.token_ids) < 400
    assert server.close() and engine.pending == 0  # twice, and with no thread, is fine
