"""HF rollout server throughput: batched (continuous batching) vs one request at a time.

In-process (no Ray: its overhead is the same for every mode), on the tiny offline model and on a
larger tiny-architecture model where compute starts to matter. For each concurrency level, that
many closed-loop clients send requests back to back (prompt lengths drawn from
``--prompt-tokens``, ``--max-tokens`` new tokens each, temperature 1, EOS ignored so every request
decodes the same number of tokens); a request is timed from ``generate`` to its result. Modes:

- ``batched``: the server as configured by default (``rollout.max_num_seqs=256``);
- ``one-at-a-time``: the same server with ``rollout.max_num_seqs=1`` (requests decoded singly, FIFO);
- ``legacy``: the server's previous path, the single-sequence ``HFGenerator`` under one lock,
  called through ``asyncio.to_thread`` as the old ``generate`` did (a check that the batch-of-one
  path costs no more than the old code).

Usage (about 3 minutes on 2 cores with the defaults)::

    .venv/bin/python bench/hf_server_throughput.py   # table + bench/results/hf_server_throughput.json
    .venv/bin/python bench/hf_server_throughput.py --models tiny --profile   # where the time goes
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl_ext.models.tiny import build_tiny_model
from agentrl_ext.platform.hf_server import HFGenerator, HFRolloutServer
from agentrl_ext.testing.tiny_model import tiny_model_path

REPO = Path(__file__).resolve().parents[1]
MODES = ("batched", "one-at-a-time", "legacy")
#: a larger model of the same architecture (about 3.3M parameters) built on the fly
SMALL_MODEL = dict(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=768)


@dataclass
class Level:
    model: str
    mode: str
    concurrency: int
    repeat: int
    requests: int
    tokens: int
    seconds: float
    tokens_per_s: float
    latency_p50_s: float
    latency_max_s: float
    mean_rows_per_decode_forward: float | None


class LegacyServer:
    """The pre-batching request path: one ``HFGenerator`` call at a time in a worker thread."""

    def __init__(self, server: HFRolloutServer) -> None:
        self.server = server
        self.generator = HFGenerator(server.model, server.engine.eos_token_ids, server.model_config.tokenizer)

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str) -> Any:
        spec = self.server._sampling_spec(len(prompt_ids), dict(sampling_params))
        tokens, log_probs, _ = await asyncio.to_thread(self.generator.generate, prompt_ids, spec)
        return tokens, log_probs


def make_server(path: str, max_num_seqs: int, args: argparse.Namespace) -> HFRolloutServer:
    from verl.workers.config import HFModelConfig, RolloutConfig

    config = RolloutConfig(
        name="hf",
        dtype="float32",
        prompt_length=args.prompt_tokens[1],
        response_length=args.max_tokens,
        tensor_model_parallel_size=1,
        max_num_seqs=max_num_seqs,
    )
    return HFRolloutServer(config, HFModelConfig(path=path))


async def closed_loop(
    target: Any, concurrency: int, total: int, args: argparse.Namespace, seed: int
) -> tuple[int, float, list[float]]:
    rng = random.Random(seed)
    low, high = args.prompt_tokens
    prompts = [[rng.randrange(10, 1000) for _ in range(rng.randint(low, high))] for _ in range(total)]
    params = dict(temperature=1.0, top_p=1.0, max_tokens=args.max_tokens, ignore_eos=True)
    queue = list(range(total))
    latencies: list[float] = []
    tokens = 0

    async def client() -> None:
        nonlocal tokens
        while queue:
            i = queue.pop()
            started = time.perf_counter()
            out = await target.generate(prompt_ids=prompts[i], sampling_params=params, request_id=str(i))
            latencies.append(time.perf_counter() - started)
            tokens += len(out.token_ids if hasattr(out, "token_ids") else out[0])

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return tokens, time.perf_counter() - started, sorted(latencies)


def measure(name: str, path: str, args: argparse.Namespace) -> list[Level]:
    servers = {"batched": make_server(path, 256, args), "one-at-a-time": make_server(path, 1, args)}
    targets: dict[str, Any] = {**servers, "legacy": LegacyServer(servers["batched"])}
    levels: list[Level] = []
    for mode in args.modes:  # warm up every path once
        asyncio.run(closed_loop(targets[mode], 2, 2, args, seed=-1))
    for concurrency in args.concurrency:
        # a whole number of requests per client, so the last wave is not a partial batch
        total = concurrency * -(-args.requests // concurrency)
        for repeat in range(args.repeats):
            # rotate the order so that no mode always runs first (the box is shared and noisy)
            for k in range(len(args.modes)):
                mode = args.modes[(k + repeat) % len(args.modes)]
                levels.append(run_level(name, mode, targets[mode], concurrency, total, repeat, args))
    return levels


def run_level(
    name: str, mode: str, target: Any, concurrency: int, total: int, repeat: int, args: argparse.Namespace
) -> Level:
    engine = target.engine if isinstance(target, HFRolloutServer) else None
    before = dict(engine.stats) if engine else {}
    tokens, seconds, latencies = asyncio.run(closed_loop(target, concurrency, total, args, seed=concurrency))
    rows = None
    if engine:
        forwards = engine.stats["decode_forwards"] - before["decode_forwards"]
        rows = (engine.stats["decoded_rows"] - before["decoded_rows"]) / max(1, forwards)
    level = Level(
        model=name,
        mode=mode,
        concurrency=concurrency,
        repeat=repeat,
        requests=total,
        tokens=tokens,
        seconds=round(seconds, 3),
        tokens_per_s=round(tokens / seconds, 1),
        latency_p50_s=round(statistics.median(latencies), 4),
        latency_max_s=round(latencies[-1], 4),
        mean_rows_per_decode_forward=None if rows is None else round(rows, 2),
    )
    print(
        f"  {name:5s} {mode:13s} c={concurrency:<3d} {level.tokens_per_s:9.1f} tok/s  "
        f"p50 {level.latency_p50_s:.3f} s  rows/forward {level.mean_rows_per_decode_forward}",
        flush=True,
    )
    return level


def profile_decode_loop(name: str, path: str, args: argparse.Namespace) -> None:
    """cProfile the decode thread (where all model work happens) over one batched level."""
    server = make_server(path, 256, args)
    engine = server.engine
    profiler = cProfile.Profile()
    run = engine._run

    def profiled_run() -> None:
        profiler.enable()
        try:
            run()
        finally:
            profiler.disable()

    engine._run = profiled_run  # type: ignore[method-assign]
    concurrency = max(args.concurrency)
    asyncio.run(
        closed_loop(
            server, concurrency, concurrency * -(-args.requests // concurrency), args, seed=concurrency
        )
    )
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
    print(f"--- decode-thread profile: {name}, batched, concurrency {concurrency}")
    print(out.getvalue())


def best_of(levels: list[Level]) -> dict[tuple[str, str, int], float]:
    """The highest tokens/s of each (model, mode, concurrency) over the repeats."""
    best: dict[tuple[str, str, int], float] = {}
    for lv in levels:
        key = (lv.model, lv.mode, lv.concurrency)
        best[key] = max(best.get(key, 0.0), lv.tokens_per_s)
    return best


def speedups(best: dict[tuple[str, str, int], float]) -> dict[str, dict[str, dict[int, float]]]:
    result: dict[str, dict[str, dict[int, float]]] = {}
    for (model, mode, concurrency), rate in best.items():
        if mode != "batched":
            continue
        for base in ("one-at-a-time", "legacy"):
            if (model, base, concurrency) in best:
                ratio = round(rate / best[(model, base, concurrency)], 2)
                result.setdefault(model, {}).setdefault(f"batched/{base}", {})[concurrency] = ratio
    return result


def print_table(
    best: dict[tuple[str, str, int], float], ratios: dict[str, dict[str, dict[int, float]]]
) -> None:
    print("\ntokens/s (best of the repeats) and the batched speed-up")
    header = " ".join(f"{m:>14s}" for m in MODES)
    print(f"{'model':6s} {'conc':>4s} {header}  batched/one-at-a-time  batched/legacy")
    nan = float("nan")
    for model in dict.fromkeys(k[0] for k in best):
        for concurrency in dict.fromkeys(k[2] for k in best):
            cells = " ".join(f"{best.get((model, m, concurrency), nan):14.1f}" for m in MODES)
            one = ratios.get(model, {}).get("batched/one-at-a-time", {}).get(concurrency, nan)
            legacy = ratios.get(model, {}).get("batched/legacy", {}).get(concurrency, nan)
            print(f"{model:6s} {concurrency:4d} {cells}  {one:20.2f}x  {legacy:13.2f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument(
        "--requests",
        type=int,
        default=48,
        help="requests per run (rounded up to a multiple of the concurrency)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per level and mode; the best one counts")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--prompt-tokens", nargs=2, type=int, default=[16, 96], metavar=("MIN", "MAX"))
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: no OpenMP contention on a shared box)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile the decode loop at the top concurrency"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "hf_server_throughput.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    levels: list[Level] = []
    paths: dict[str, tuple[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="hf-bench-") as tmp:
        for name in args.models:
            path = (
                str(tiny_model_path())
                if name == "tiny"
                else str(build_tiny_model(Path(tmp) / name, **SMALL_MODEL))
            )
            n_params = sum(p.numel() for p in make_server(path, 1, args).model.parameters())
            paths[name] = (path, n_params)
            print(f"model {name}: {n_params / 1e6:.2f}M parameters", flush=True)
            levels += measure(name, path, args)
            if args.profile:
                profile_decode_loop(name, path, args)
    best = best_of(levels)
    ratios = speedups(best)
    print_table(best, ratios)
    payload = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "models": {name: {"parameters": n} for name, (_, n) in paths.items()},
        "best_tokens_per_s": [
            {"model": model, "mode": mode, "concurrency": c, "tokens_per_s": rate}
            for (model, mode, c), rate in best.items()
        ],
        "speedup": ratios,
        "runs": [asdict(lv) for lv in levels],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
