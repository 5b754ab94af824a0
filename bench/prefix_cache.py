"""HF rollout server on multi-turn episodes: prefix caching on vs off, side by side in one run.

An agent episode sends one request per turn, each the whole conversation so far: the opening
prompt (system prompt with tool schemas, the task), then every earlier assistant turn and
environment answer. Without prefix caching the server prefills all of it again at every turn;
with it (``rollout.enable_prefix_caching``, verl's default) only the new environment answer.

In-process (no Ray, no environment), tiny offline model. ``--concurrency`` closed-loop clients
each play ``--episodes`` episodes back to back: an opening of ``--opening`` tokens, ``--turns``
turns of up to ``--max-tokens`` sampled tokens (temperature 0.7), each followed by an environment
answer of ``--answer`` tokens. The shape defaults to the main job's (``cpu_multitask``: ~300-token
openings, 3-8 turns of ~15 tokens). The two modes alternate over ``--repeats`` rounds; the best
round of each counts.

Usage (about 2 minutes on 2 cores)::

    .venv/bin/python bench/prefix_cache.py   # table + bench/results/prefix_cache.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from agentrl_ext.platform.hf_server import HFRolloutServer
from agentrl_ext.testing.tiny_model import tiny_model_path

REPO = Path(__file__).resolve().parents[1]
MODES = ("prefix-cache", "no-cache")


def make_server(enabled: bool, args: argparse.Namespace) -> HFRolloutServer:
    from verl.workers.config import HFModelConfig, RolloutConfig

    config = RolloutConfig(
        name="hf",
        dtype="float32",
        prompt_length=args.opening[1],
        response_length=args.turns[1] * (args.max_tokens + args.answer[1]),
        tensor_model_parallel_size=1,
        enable_prefix_caching=enabled,
    )
    return HFRolloutServer(config, HFModelConfig(path=str(tiny_model_path())))


async def play(server: HFRolloutServer, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """All clients' episodes; returns episodes, turns, generated tokens and seconds."""
    rng = random.Random(seed)
    plans = [
        (
            [rng.randrange(10, 1000) for _ in range(rng.randint(*args.opening))],
            [
                [rng.randrange(10, 1000) for _ in range(rng.randint(*args.answer))]
                for _ in range(rng.randint(*args.turns))
            ],
        )
        for _ in range(args.concurrency * args.episodes)
    ]
    params = dict(temperature=0.7, top_p=1.0, max_tokens=args.max_tokens)
    counts = {"turns": 0, "tokens": 0}

    async def client(k: int) -> None:
        for e in range(args.episodes):
            prompt, answers = plans[k * args.episodes + e]
            request_id = f"{seed}-{k}-{e}"
            for answer in answers:
                out = await server.generate(prompt_ids=prompt, sampling_params=params, request_id=request_id)
                counts["turns"] += 1
                counts["tokens"] += len(out.token_ids)
                prompt = prompt + list(out.token_ids) + answer

    started = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(args.concurrency)))
    seconds = time.perf_counter() - started
    return {"episodes": len(plans), **counts, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight")
    parser.add_argument("--episodes", type=int, default=2, help="episodes per client per round")
    parser.add_argument("--opening", nargs=2, type=int, default=[260, 330], metavar=("MIN", "MAX"))
    parser.add_argument("--turns", nargs=2, type=int, default=[3, 8], metavar=("MIN", "MAX"))
    parser.add_argument("--answer", nargs=2, type=int, default=[10, 30], metavar=("MIN", "MAX"))
    parser.add_argument("--max-tokens", type=int, default=16, help="cap on one turn's tokens")
    parser.add_argument(
        "--repeats", type=int, default=2, help="rounds per mode (alternating); the best counts"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "prefix_cache.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    servers = {"prefix-cache": make_server(True, args), "no-cache": make_server(False, args)}
    runs: list[dict[str, Any]] = []
    for server in servers.values():  # warm-up
        asyncio.run(
            play(server, argparse.Namespace(**{**vars(args), "concurrency": 2, "episodes": 1}), seed=-1)
        )
    for repeat in range(args.repeats):
        for k in range(len(MODES)):
            mode = MODES[(k + repeat) % len(MODES)]
            engine = servers[mode].engine
            before = dict(engine.stats)
            result = asyncio.run(play(servers[mode], args, seed=repeat))  # same episodes for both modes
            prefilled = engine.stats["prefill_tokens"] - before["prefill_tokens"]
            reused = engine.stats["prefix_hit_tokens"] - before["prefix_hit_tokens"]
            run = {
                "mode": mode,
                "repeat": repeat,
                **result,
                "seconds": round(result["seconds"], 3),
                "episodes_per_s": round(result["episodes"] / result["seconds"], 3),
                "tokens_per_s": round(result["tokens"] / result["seconds"], 1),
                "prefilled_tokens": prefilled,
                "reused_tokens": reused,
            }
            runs.append(run)
            print(
                f"  {mode:12s} round {repeat}: {run['episodes_per_s']:6.2f} episodes/s "
                f"{run['tokens_per_s']:8.1f} tok/s  prefilled {prefilled} reused {reused}",
                flush=True,
            )
    best = {m: max((r for r in runs if r["mode"] == m), key=lambda r: r["episodes_per_s"]) for m in MODES}
    speedup = round(best["prefix-cache"]["episodes_per_s"] / best["no-cache"]["episodes_per_s"], 2)
    print(f"\n{'mode':12s} {'episodes/s':>10s} {'tokens/s':>9s} {'prefilled':>10s} {'reused':>8s}")
    for m in MODES:
        r = best[m]
        print(
            f"{m:12s} {r['episodes_per_s']:10.2f} {r['tokens_per_s']:9.1f} {r['prefilled_tokens']:10d} {r['reused_tokens']:8d}"
        )
    print(f"speed-up (episodes/s, prefix-cache / no-cache): {speedup}x")
    payload = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "best": best,
        "speedup_episodes_per_s": speedup,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
