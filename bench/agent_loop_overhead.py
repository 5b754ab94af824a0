"""How much of an agent-loop turn is the model, and how much is everything around it.

The main job's model and tasks, the same number of concurrent episodes, three ways, side by side
in one run (the machine is noisy: compare the ratios):

- ``raw``: the HF rollout server alone (in this process), replaying the turns the agent loop
  played in ``loop-ray``: each episode's turns in order, with the same prompt token ids and the
  same number of generated tokens (``ignore_eos``, ``max_tokens`` = the recorded count), the same
  episodes concurrent. No controller, no chat template, no parsing, no Ray.
- ``loop-local``: the ``agentrl`` agent loop's episodes in this process with the server in this
  process (as ``agentrl-eval-run`` runs it, one request id per episode): controller and task
  workers over HTTP, chat template rendering and tokenization, tool-call parsing; no Ray.
- ``raw-ray``: the same replay, sent straight to the server running as a Ray actor (as the trainer
  hosts it: one torch thread, Ray's default for an actor without ``num_cpus``).
- ``loop-ray``: what the trainer runs: the agent loop calls the server as a Ray actor through verl's
  own ``LLMServerClient`` and ``GlobalRequestLoadBalancer`` (an acquire RPC per turn, a fresh request
  id per turn), with the sampling parameters verl's agent-loop worker sends.

Both loop modes play each episode as the agent loop does (``AgentRLAgentLoop.run`` is a thin adapter
over it): the one episode driver, ``rollout.episode.drive_episode``, with the loop's token actor
(``TokenActor``), its typed settings (``AgentLoopConfig``) and its pooled controller client.

Each prints generated tokens/s (model tokens only), episodes/s and the per-turn breakdown the agent
loop records (time in ``generate``, time in the controller round trip, the rest: rendering,
tokenizing, parsing, asyncio), and the ratio loop/raw. Results: ``bench/results/agent_loop_overhead.json``.

    .venv/bin/python bench/agent_loop_overhead.py --model outputs/cpu_multitask/sft/huggingface
    .venv/bin/python bench/agent_loop_overhead.py --model M --label before   # e.g. on another checkout

``--model`` is an HF checkpoint that plays the tasks (the main job's SFT weights: an untrained model
ends every episode at its first malformed call, which measures nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = ["guess", "calc", "gridroom"]


def _rollout_config(args: argparse.Namespace) -> Any:
    from verl.workers.config import RolloutConfig

    return RolloutConfig(
        name="hf",
        dtype="float32",
        prompt_length=args.prompt_length,
        response_length=args.response_length,
        tensor_model_parallel_size=1,
        max_num_seqs=args.concurrency,
    )


class RecordingServer:
    """An in-process server manager that records every turn's prompt and generated count."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.turns: dict[str, list[tuple[list[int], int]]] = {}

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> Any:
        # the episode's request id, as agentrl-eval-run passes it
        out = await self.server.generate(
            prompt_ids=prompt_ids, sampling_params=sampling_params, request_id=request_id
        )
        self.turns.setdefault(request_id, []).append((list(prompt_ids), len(out.token_ids)))
        return out


class RecordingClient:
    """Wraps verl's LLMServerClient (the trainer's path) and records turns the same way."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.turns: dict[str, list[tuple[list[int], int]]] = {}

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        out = await self.client.generate(request_id, **kwargs)
        self.turns.setdefault(request_id, []).append((list(kwargs["prompt_ids"]), len(out.token_ids)))
        return out


async def _play(
    server_manager: Any, tokenizer: Any, controller_url: str, rows: list[tuple[str, int]], params: dict[str, Any],
    args: argparse.Namespace,
) -> tuple[float, list[dict]]:  # fmt: skip
    """The episodes of ``rows``, all at once, as the agent loop plays them: the one episode driver
    (``drive_episode``) with the token actor, on the agent loop's pooled controller client."""
    from agentrl_ext.config import AgentLoopConfig
    from agentrl_ext.rollout.agent_loop import TokenActor, controller_client, tool_parser
    from agentrl_ext.rollout.episode import drive_episode

    settings = AgentLoopConfig(
        controller_url=controller_url, max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn
    )
    parser = tool_parser(settings.tool_format, tokenizer)
    client = controller_client(settings)

    async def episode(task: str, index: int) -> dict[str, Any]:
        actor = TokenActor(
            server_manager,
            tokenizer,
            settings,
            prompt_budget=args.prompt_length,
            response_budget=args.response_length,
            sampling_params=dict(params),
            parser=parser,
        )
        played = await drive_episode(client, task, index, actor, max_turns=settings.max_turns)
        return {
            "task": played.task,
            "status": played.status.value,
            "failed": played.failed,
            "turns": len(actor.turn_tokens),
            "generated": sum(actor.turn_tokens),
            "seconds": played.seconds,
            "generate_s": actor.generate_s,
            "env_s": played.env_s,
        }

    started = time.perf_counter()
    episodes = await asyncio.gather(*(episode(task, index) for task, index in rows))
    wall = time.perf_counter() - started
    await client.close()  # this event loop's pooled client ends with it
    return wall, list(episodes)


def _summary(mode: str, wall: float, episodes: list[dict]) -> dict[str, Any]:
    turns = sum(e["turns"] for e in episodes)
    generated = sum(e["generated"] for e in episodes)
    per_turn = {}
    if turns:
        gen = sum(e["generate_s"] for e in episodes)
        env = sum(e["env_s"] for e in episodes)
        total = sum(e["seconds"] for e in episodes)
        per_turn = {
            "episode_ms_per_turn": 1000 * total / turns,
            "generate_ms_per_turn": 1000 * gen / turns,
            "env_ms_per_turn": 1000 * env / turns,
            "rest_ms_per_turn": 1000 * (total - gen - env) / turns,
        }
    return {
        "mode": mode,
        "wall_s": wall,
        "episodes": len(episodes),
        "failed": sum(e["failed"] for e in episodes),
        "turns": turns,
        "generated_tokens": generated,
        "generated_tokens_per_s": generated / wall if wall else 0.0,
        "episodes_per_s": len(episodes) / wall if wall else 0.0,
        **per_turn,
    }


async def _replay(
    server: Any, turns: dict[str, list[tuple[list[int], int]]], params: dict[str, Any], remote: bool = False
) -> tuple[float, int]:
    """Raw generation: each recorded episode's turns in order, all episodes concurrent; ``remote``:
    ``server`` is the Ray actor, called directly (no load balancer, no agent loop)."""

    async def episode(key: str, seq: list[tuple[list[int], int]]) -> int:
        n_total = 0
        for prompt, n in seq:
            call = server.generate.remote if remote else server.generate
            out = await call(
                prompt_ids=prompt,
                sampling_params={**params, "max_tokens": n, "ignore_eos": True},
                request_id=f"raw-{key}",  # one id per episode: the server's prefix cache at its best
            )
            n_total += len(out.token_ids)
        return n_total

    started = time.perf_counter()
    counts = await asyncio.gather(*(episode(key, seq) for key, seq in turns.items()))
    return time.perf_counter() - started, sum(counts)


def _rows(args: argparse.Namespace, indices: dict[str, list[int]], repeat: int) -> list[tuple[str, int]]:
    """``concurrency`` episodes: prompts taken round-robin over the tasks, ``n`` episodes each."""
    prompts = []
    per_task = {t: iter(indices[t][repeat * args.concurrency :]) for t in TASKS}
    while len(prompts) * args.n < args.concurrency:
        for task in TASKS:
            if len(prompts) * args.n < args.concurrency:
                prompts.append((task, next(per_task[task])))
    return [p for p in prompts for _ in range(args.n)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="HF checkpoint that plays the tasks (the SFT weights)")
    parser.add_argument("--concurrency", type=int, default=64, help="episodes at once (the main job: 16 x 4)")
    parser.add_argument("--n", type=int, default=4, help="episodes per prompt")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-tokens-per-turn", type=int, default=32)
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--response-length", type=int, default=448)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--modes", default="raw,raw-ray,loop-local,loop-ray")
    parser.add_argument(
        "--ray-threads",
        type=int,
        default=0,
        help="OMP_NUM_THREADS of the Ray actors (0: Ray's default, 1 thread per actor without num_cpus)",
    )
    parser.add_argument(
        "--label", default="", help="a name for this code version in the JSON (e.g. before/after)"
    )
    parser.add_argument("--out", default=str(RESULTS / "agent_loop_overhead.json"))
    args = parser.parse_args()
    modes = args.modes.split(",")

    import ray
    from verl.workers.config import HFModelConfig
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from agentrl_ext.data.multitask import fetch_indices
    from agentrl_ext.env.launcher import EnvStack, free_port
    from agentrl_ext.platform.hf_server import HFRolloutServer

    model_config = HFModelConfig(path=str(Path(args.model).resolve()))
    rollout = _rollout_config(args)
    local_server = HFRolloutServer(rollout, model_config)
    tokenizer = local_server.model_config.tokenizer
    # verl's agent-loop worker's sampling parameters (agent_loop_tq.generate_sequences)
    params = {
        "temperature": args.temperature,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": True,
    }

    results: list[dict[str, Any]] = []
    with EnvStack(tasks=TASKS, port=free_port(), split="train") as stack:
        indices = asyncio.run(fetch_indices(stack.api, TASKS))
        env_vars = {"OMP_NUM_THREADS": str(args.ray_threads)} if args.ray_threads else {}
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env_vars})
        try:
            from omegaconf import OmegaConf

            remote_server = ray.remote(HFRolloutServer).remote(rollout, model_config)
            balancer = ray.remote(GlobalRequestLoadBalancer).remote({"hf-0": remote_server})
            verl_config = OmegaConf.create(
                {"actor_rollout_ref": {"rollout": {"name": "hf", "full_determinism": False}}}
            )
            for repeat in range(args.repeats):
                rows = _rows(args, indices, repeat)
                recorded: dict[str, list[tuple[list[int], int]]] = {}
                if "loop-ray" in modes:
                    client = RecordingClient(LLMServerClient(verl_config, balancer))
                    wall, episodes = asyncio.run(_play(client, tokenizer, stack.api, rows, params, args))
                    results.append({**_summary("loop-ray", wall, episodes), "repeat": repeat})
                    recorded = client.turns
                if "loop-local" in modes:
                    local = RecordingServer(local_server)
                    wall, episodes = asyncio.run(_play(local, tokenizer, stack.api, rows, params, args))
                    results.append({**_summary("loop-local", wall, episodes), "repeat": repeat})
                    recorded = recorded or local.turns
                for mode in [m for m in ("raw", "raw-ray") if m in modes and recorded]:
                    server = remote_server if mode == "raw-ray" else local_server
                    wall, generated = asyncio.run(_replay(server, recorded, params, remote=mode == "raw-ray"))
                    turns = sum(len(t) for t in recorded.values())
                    results.append(
                        {
                            "mode": mode,
                            "repeat": repeat,
                            "wall_s": wall,
                            "episodes": len(recorded),
                            "turns": turns,
                            "generated_tokens": generated,
                            "generated_tokens_per_s": generated / wall,
                            "episodes_per_s": len(recorded) / wall,
                        }
                    )
                for r in results[-len(modes) :]:
                    print(
                        f"[{r['mode']:>10} #{repeat}] {r['generated_tokens']:>5} tokens in {r['wall_s']:.2f} s: "
                        f"{r['generated_tokens_per_s']:.0f} tok/s, {r['turns']} turns",
                        flush=True,
                    )
        finally:
            ray.shutdown()

    best = {}
    for mode in modes:
        runs = [r for r in results if r["mode"] == mode]
        if runs:
            best[mode] = max(runs, key=lambda r: r["generated_tokens_per_s"])
    raw = best.get("raw", {}).get("generated_tokens_per_s")
    raw_ray = best.get("raw-ray", {}).get("generated_tokens_per_s")
    print()
    header = f"{'mode':>10} {'tok/s':>7} {'vs raw':>7} {'vs raw-ray':>10} {'eps/s':>6} {'ms/turn':>8} {'generate':>9} {'env':>6} {'rest':>6}"
    print(header)
    print("-" * len(header))
    for mode, r in best.items():
        ratio = r["generated_tokens_per_s"] / raw if raw else float("nan")
        ratio_ray = r["generated_tokens_per_s"] / raw_ray if raw_ray else float("nan")
        r["ratio_to_raw"], r["ratio_to_raw_ray"] = ratio, ratio_ray
        print(
            f"{mode:>10} {r['generated_tokens_per_s']:7.0f} {ratio:7.2f} {ratio_ray:10.2f} {r['episodes_per_s']:6.2f} "
            f"{r.get('episode_ms_per_turn', float('nan')):8.1f} {r.get('generate_ms_per_turn', float('nan')):9.1f} "
            f"{r.get('env_ms_per_turn', float('nan')):6.1f} {r.get('rest_ms_per_turn', float('nan')):6.1f}"
        )
    print(
        "\ntok/s: model-generated tokens per second of wall time; ms/turn: an episode's time per turn "
        "(episodes overlap), split into the generate call, the controller round trip and the rest"
    )
    out = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "label": args.label,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "runs": results,
        "best": best,
        "median_tokens_per_s": {
            m: statistics.median(r["generated_tokens_per_s"] for r in results if r["mode"] == m) for m in best
        },
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(path.read_text()) if path.exists() else {}
    if args.label and isinstance(previous, dict) and "by_label" in previous:
        by_label = previous["by_label"]
    else:
        by_label = {}
    if args.label:
        by_label[args.label] = out
        path.write_text(json.dumps({"by_label": by_label}, indent=2) + "\n")
    else:
        path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
