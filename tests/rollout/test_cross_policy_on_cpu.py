"""Cross-policy sampling: routing share, per-call routing, the stale refresh schedule (the refresh
itself: ``test_standalone_pool_on_cpu.py``)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import ray
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from agentrl_ext.rollout.cross_policy import CURRENT, STALE, CrossPolicyLLMServerClient, PolicyRouter
from agentrl_ext.rollout.standalone_pool import refresh_due
from agentrl_ext.verl_compat import agent_loop_worker_rank


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 1.0])
def test_routing_share_within_tolerance_on_cpu(ratio):
    router = PolicyRouter(ratio, seed=123)
    n = 20000
    share = sum(router.draw() == STALE for _ in range(n)) / n
    tolerance = 4 * math.sqrt(ratio * (1 - ratio) / n)  # 4 sigma of a binomial share
    assert abs(share - ratio) <= tolerance


def test_bad_ratio_is_named_on_cpu():
    with pytest.raises(ValueError, match="stale_ratio=1.5"):
        PolicyRouter(1.5)


class _FakeClient:
    def __init__(self, pool: str) -> None:
        self.pool, self.calls = pool, []

    async def generate(self, request_id: Any, **kwargs: Any) -> TokenOutput:
        self.calls.append(request_id)
        return TokenOutput(token_ids=[1], log_probs=[-0.1], extra_fields={"served_by": self.pool})


def test_every_generation_call_is_routed_and_tagged_on_cpu(monkeypatch):
    current = _FakeClient(CURRENT)
    monkeypatch.setattr(LLMServerClient, "generate", lambda self, rid, **kw: current.generate(rid, **kw))
    client = CrossPolicyLLMServerClient(
        config=None, load_balancer_handle=None, stale_load_balancer_handle=None, stale_ratio=0.3
    )
    client._stale = _FakeClient(STALE)

    async def many() -> list[TokenOutput]:
        return [await client.generate("sample-1", prompt_ids=[1], sampling_params={}) for _ in range(2000)]

    outputs = asyncio.run(many())
    assert all(o.extra_fields["policy"] == o.extra_fields["served_by"] for o in outputs)
    share = sum(o.extra_fields["policy"] == STALE for o in outputs) / len(outputs)
    assert abs(share - 0.3) < 0.05
    # the same request id goes to each pool: stickiness inside a pool is the pool balancer's job
    assert set(current.calls) == set(client._stale.calls) == {"sample-1"}


def test_client_pickles_without_its_rng_on_cpu():
    import pickle

    client = CrossPolicyLLMServerClient(
        config=None, load_balancer_handle=None, stale_load_balancer_handle=None, stale_ratio=0.3
    )
    client.router.draw()
    assert pickle.loads(pickle.dumps(client))._router is None


def _client(seed: int = 0, worker_rank: int | None = None) -> CrossPolicyLLMServerClient:
    return CrossPolicyLLMServerClient(
        config=None,
        load_balancer_handle=None,
        stale_load_balancer_handle=None,
        stale_ratio=0.5,
        seed=seed,
        worker_rank=worker_rank,
    )


def _stream(client: CrossPolicyLLMServerClient, n: int = 200) -> list[str]:
    return [client.router.draw() for _ in range(n)]


def test_same_seed_and_worker_rank_draw_the_same_stream_on_cpu():
    import pickle

    stream = _stream(_client(seed=5, worker_rank=1))
    assert _stream(_client(seed=5, worker_rank=1)) == stream
    assert _stream(pickle.loads(pickle.dumps(_client(seed=5, worker_rank=1)))) == stream
    assert _stream(_client(seed=5, worker_rank=2)) != stream  # another worker
    assert _stream(_client(seed=6, worker_rank=1)) != stream  # another seed
    # outside a verl agent-loop worker (here: no Ray) the client seeds as rank 0
    assert agent_loop_worker_rank() is None
    assert _stream(_client(seed=5)) == _stream(_client(seed=5, worker_rank=0))


def test_stale_refresh_schedule_on_cpu():
    assert [s for s in range(0, 101) if refresh_due(s, 25)] == [25, 50, 75, 100]
    assert [s for s in range(0, 6) if refresh_due(s, 1)] == [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_workers_that_verl_starts_know_their_rank_on_cpu(local_ray):
    # verl's own AgentLoopManager._init_agent_loop_workers starts the workers (names and all); a
    # stand-in worker class reports the rank agent_loop_worker_rank() reads from its actor name
    import asyncio
    from types import SimpleNamespace

    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    @ray.remote(num_cpus=0)
    class RankReporter:
        def __init__(self, config, llm_client, teacher_client, reward_handles) -> None:
            pass

        def rank(self) -> int | None:
            return agent_loop_worker_rank()

    manager = AgentLoopManager.__new__(AgentLoopManager)
    manager.rollout_config = SimpleNamespace(agent=SimpleNamespace(num_workers=3))
    manager.agent_loop_workers_class = RankReporter
    manager.config = manager.llm_client = manager.teacher_client = manager.reward_loop_worker_handles = None
    asyncio.run(manager._init_agent_loop_workers())
    try:
        ranks = ray.get([w.rank.remote() for w in manager.agent_loop_workers])
    finally:
        for worker in manager.agent_loop_workers:
            ray.kill(worker)
    assert ranks == [0, 1, 2], (
        f"verl's agent-loop workers report ranks {ranks}: verl no longer names them agent_loop_worker_<i>_...; "
        "update agentrl_ext.verl_compat.agent_loop_worker_rank"
    )


def test_worker_rank_comes_from_the_agent_loop_worker_actor_on_cpu(local_ray):
    # verl pickles one client (no rank) to each worker actor; each copy seeds by its worker's rank
    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self, client: CrossPolicyLLMServerClient) -> None:
            self.client = client

        def rank_and_stream(self) -> tuple[int | None, list[str]]:
            # (no helper of this test module here: Ray workers cannot import it)
            return agent_loop_worker_rank(), [self.client.router.draw() for _ in range(200)]

    client = _client(seed=5)
    workers = [Worker.options(name=f"agent_loop_worker_{i}_0123abcd").remote(client) for i in (0, 3)]
    (rank0, stream0), (rank3, stream3) = ray.get([w.rank_and_stream.remote() for w in workers])
    assert (rank0, rank3) == (0, 3)
    assert stream0 == _stream(_client(seed=5, worker_rank=0))
    assert stream3 == _stream(_client(seed=5, worker_rank=3))
    assert stream0 != stream3
    assert agent_loop_worker_rank() is None  # the driver is no agent-loop worker
    for worker in workers:
        ray.kill(worker)
