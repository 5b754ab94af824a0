"""agentrl_sync vs agentrl_async: the same training, side by side, in one run.

Same tiny model, same tasks, same number of trained trajectories: GRPO on two multi-turn tasks
(``slowletters``, ``slowdigits``: the letters/digits games with realistic environment latency:
every tool call takes 50–200 ms, drawn per sample and turn, and an episode lasts 2 to 6 turns
by sample index, so some groups are slow). Each mode trains ``--steps`` steps of
``data.train_batch_size`` prompts × ``rollout.n`` episodes through ``agentrl-train`` (verl's
trainer, HF rollout, controller and task workers on 127.0.0.1). Four runs, one after the other:

- ``agentrl_sync``;
- ``agentrl_async`` with a buffer of one batch (``agentrl.async_pipeline.buffer_size`` = batch ×
  n): each step trains exactly one batch, as the sync mode does, and the next batch is generated
  while the current one trains (the same number of trajectories as sync);
- ``agentrl_async_2x``: the async mode with its default buffer, AgentRL's 2 × batch × n: the
  rollout may run up to two batches ahead and a step trains all complete groups, at least one
  batch (variable batch: it trains at least as many trajectories in the same steps).
- ``agentrl_async_standalone``: ``agentrl_async`` with a one-batch buffer and a standalone
  current pool (``actor_rollout_ref.hybrid_engine=false``: one ``hf`` replica refreshed through
  the gloo checkpoint engine after every step, the path vLLM/SGLang take on GPUs; a sync aborts
  the turns it catches, which are generated again).

Reported per run, over the training loop (the sum of verl's ``timing_s/step``; start-up not
counted): trajectories/s, tokens/s (verl's ``perf/total_num_tokens``), where a step's time goes
(verl's ``timing_s/*`` means), the rollout's and the trainer's idle fractions, and the
staleness of the trained turns; then the speed-up async / sync, over the whole loop and in steady
state (steps 2..N), each against the sync run. **Read the steady-state figure**: the first step is not comparable between the
modes. verl's first dispatch of prompts to the agent-loop workers costs several seconds once
(about 8 s here); the sync mode pays it inside its first step (``prepare_step``, outside verl's
named timers), the async mode in ``on_train_begin``, before the loop is timed. Sync: the rollout idles while the trainer updates (idle = 1 − gen/step) and the
trainer idles while the rollout generates (gen/step). Async: the pipeline's own metrics
(``agentrl/async/{rollout,trainer}_idle_frac``).

Usage (about 11 minutes on 2 cores with the defaults: 10 steps of 4 prompts x 4 episodes)::

    .venv/bin/python bench/async_vs_sync.py          # table + bench/results/async_vs_sync.json
    .venv/bin/python bench/async_vs_sync.py --steps 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl_ext.envs.letters.task import DigitsTask, LettersTask

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import SampleResult, Session

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "async_vs_sync.json"
LATENCY_S = (0.05, 0.2)
TURNS = (2, 6)


class _SlowMixin:
    """Letters/digits with environment latency on every tool call and episode lengths by index."""

    alphabet: str

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        rng = random.Random(f"{type(self).__name__}/{index}")
        turns = TURNS[0] + int(index) % (TURNS[1] - TURNS[0] + 1)
        target = self.alphabet[int(index) % len(self.alphabet)]
        session.inject({"role": "user", "content": f"Write the character {target} as often as you can."})
        written, reward = "", 0.0
        for turn in range(turns):
            action = await session.action(validate=False)
            await asyncio.sleep(rng.uniform(*LATENCY_S))  # the environment's work on this call
            written += (action.content or "") + "".join(
                str(c.arguments.get("text", "")) for c in action.tool_calls
            )
            reward = written.count(target) / len(written) if written else 0.0
            session.report(reward, chars=len(written))
            if turn + 1 < turns:
                session.inject({"role": "user", "content": f"Again: the character {target}."})
        return SampleResult(SampleStatus.COMPLETED, reward=reward, result={"chars": len(written)})


class SlowLettersTask(_SlowMixin, LettersTask):
    name = "slowletters"


class SlowDigitsTask(_SlowMixin, DigitsTask):
    name = "slowdigits"


WORKERS = [
    ("slowletters", "slowletters", "async_vs_sync:SlowLettersTask"),
    ("slowdigits", "slowdigits", "async_vs_sync:SlowDigitsTask"),
]


#: the current pool as a standalone replica refreshed through the gloo checkpoint engine after every
#: step (docs/training.md, "Where the rollout runs": the path vLLM/SGLang take on GPUs)
STANDALONE = (
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
)

#: run name -> (trainer mode, async buffer in batches: None = the mode's default, 2 x batch x n,
#: further overrides)
RUNS: dict[str, tuple[str, int | None, tuple[str, ...]]] = {
    "agentrl_sync": ("agentrl_sync", 1, ()),
    "agentrl_async": ("agentrl_async", 1, ()),
    "agentrl_async_2x": ("agentrl_async", None, ()),
    "agentrl_async_standalone": ("agentrl_async", 1, STANDALONE),
}


def _train(
    work: Path, controller_url: str, data: dict[str, Path], run: str, args: argparse.Namespace
) -> dict:
    mode, buffer_batches, overrides = RUNS[run]
    metrics_file = work / f"{run}.jsonl"
    env = dict(os.environ, AGENTRL_CACHE_DIR=str(work / "cache"), VERL_FILE_LOGGER_PATH=str(metrics_file))
    n, batch = args.n, args.batch
    cmd = [
        sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", "cpu_agentrl",
        f"agentrl.agent_loop.controller_url={controller_url}",
        f"data.train_files={data['train']}", f"data.val_files={data['val']}",
        f"data.train_batch_size={batch}", f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.rollout.n={n}", f"trainer.total_training_steps={args.steps}",
        "agentrl.cross_policy.enable=false", f"trainer.v1.trainer_mode={mode}",
        f"agentrl.async_pipeline.buffer_size={'null' if buffer_batches is None else buffer_batches * batch * n}",
        "trainer.logger=[console,file]", f"hydra.run.dir={work / run / 'hydra'}", *overrides,
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"{run} failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    steps = {r["step"]: r["data"] for r in map(json.loads, metrics_file.read_text().splitlines())}
    summary = summarize(mode, [steps[s] for s in sorted(steps)], wall)
    summary["run"] = run
    summary["async_buffer_size"] = None if mode == "agentrl_sync" else (buffer_batches or 2) * batch * n
    return summary


def _trajectories(step: dict[str, float]) -> float:
    return step.get("agentrl/async/batch_trajectories") or (
        step["agentrl/task/slowletters/episodes"] + step["agentrl/task/slowdigits/episodes"]
    )


def summarize(mode: str, steps: list[dict[str, float]], wall_s: float) -> dict[str, Any]:
    loop_s = sum(m["timing_s/step"] for m in steps)
    trajectories = sum(_trajectories(m) for m in steps)
    steady = steps[1:] or steps
    steady_per_s = sum(_trajectories(m) for m in steady) / sum(m["timing_s/step"] for m in steady)
    tokens = sum(m["perf/total_num_tokens"] for m in steps)
    timing = {
        k.split("/", 1)[1]: sum(m.get(k, 0.0) for m in steps) / len(steps)
        for k in sorted({k for m in steps for k in m if k.startswith("timing_s/")})
    }
    if mode == "agentrl_sync":
        gen = sum(m.get("timing_s/gen", 0.0) for m in steps)
        rollout_idle, trainer_idle = 1 - gen / loop_s, gen / loop_s
        staleness = {"0": "all (on-policy)"}
    else:
        rollout_idle = steps[-1].get("agentrl/async/rollout_idle_frac")
        trainer_idle = steps[-1].get("agentrl/async/trainer_idle_frac")
        staleness = {}
        for m in steps:
            for k, v in m.items():
                if k.startswith("agentrl/async/staleness/lag_"):
                    lag = k.rsplit("_", 1)[1]
                    staleness[lag] = staleness.get(lag, 0) + int(v)
    return {
        "mode": mode,
        "steps": len(steps),
        "trajectories": int(trajectories),
        "tokens": int(tokens),
        "loop_s": loop_s,
        "wall_s_with_startup": wall_s,
        "trajectories_per_s": trajectories / loop_s,
        "steady_trajectories_per_s": steady_per_s,
        "step_s": [m["timing_s/step"] for m in steps],
        "first_step_timing_s": {
            k.split("/", 1)[1]: v for k, v in steps[0].items() if k.startswith("timing_s/")
        },
        "tokens_per_s": tokens / loop_s,
        "rollout_idle_frac": rollout_idle,
        "trainer_idle_frac": trainer_idle,
        "turn_staleness": staleness,
        # turns cut by a weight sync and generated again (a standalone pool's sync aborts them)
        "aborted_generations": int(sum(m.get("agentrl/rollout/aborted_generations", 0) for m in steps)),
        "timing_s_mean": timing,
    }


def _load() -> dict[str, Any]:
    load1, load5, _ = os.getloadavg()
    return {"loadavg_1m": load1, "loadavg_5m": load5, "cpus": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4, help="prompts per step (data.train_batch_size)")
    parser.add_argument("--n", type=int, default=4, help="episodes per prompt (rollout.n)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    from agentrl_ext.data.multitask import build_multitask_dataset, fetch_indices
    from agentrl_ext.testing.env_servers import EnvServers, wait_routable

    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="async_vs_sync_") as tmp:
        work = Path(tmp)
        with EnvServers(work / "logs", python_path=[BENCH]) as servers:
            controller = servers.controller()
            for name, _task, spec in WORKERS:
                servers.worker(controller, spec, name=name, heartbeat_interval=1.0)
            for _name, task, _spec in WORKERS:
                wait_routable(controller, task, 1, 60.0)
            url = servers.controller_url
            indices = asyncio.run(fetch_indices(url, ["slowletters", "slowdigits"]))
            data = {
                "train": build_multitask_dataset(indices, work / "data" / "train.parquet", seed=0),
                "val": build_multitask_dataset(
                    {t: i[:2] for t, i in indices.items()}, work / "data" / "val.parquet", split="val"
                ),
            }
            runs = [_train(work, url, data, run, args) for run in RUNS]
    sync = runs[0]
    for r in runs:
        r["speedup"] = r["trajectories_per_s"] / sync["trajectories_per_s"]
        r["steady_speedup"] = r["steady_trajectories_per_s"] / sync["steady_trajectories_per_s"]
    print(
        f"\n{'run':<25} {'traj':>5} {'loop s':>7} {'traj/s':>7} {'tok/s':>8} {'rollout idle':>12} "
        f"{'trainer idle':>12} {'speed-up':>8} {'steady traj/s':>13} {'steady speed-up':>15}"
    )
    for r in runs:
        print(
            f"{r['run']:<25} {r['trajectories']:>5} {r['loop_s']:>7.1f} {r['trajectories_per_s']:>7.2f} "
            f"{r['tokens_per_s']:>8.0f} {r['rollout_idle_frac']:>12.2f} {r['trainer_idle_frac']:>12.2f} "
            f"{r['speedup']:>7.2f}x {r['steady_trajectories_per_s']:>13.2f} {r['steady_speedup']:>14.2f}x"
        )
    for r in runs[1:]:
        print(f"{r['run']} turn staleness (trained turns per lag):", r["turn_staleness"])
        print(f"{r['run']} aborted generations:", r["aborted_generations"])
    for r in runs:
        print(f"{r['run']} mean step time split:", {k: round(v, 2) for k, v in r["timing_s_mean"].items()})
        print(f"{r['run']} step times:", [round(t, 2) for t in r["step_s"]])
        print(f"{r['run']} first step split:", {k: round(v, 2) for k, v in r["first_step_timing_s"].items()})
    result = {
        "bench": "async_vs_sync",
        "settings": {
            "steps": args.steps,
            "train_batch_size": args.batch,
            "rollout_n": args.n,
            "tool_latency_s": list(LATENCY_S),
            "episode_turns": list(TURNS),
            "async_buffer_sizes": {r["run"]: r["async_buffer_size"] for r in runs},
            "model": "tiny Qwen2 (agentrl-tiny-model, seed 0)",
        },
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "load_before": load_before,
        "load_after": _load(),
        "speedup_trajectories_per_s": runs[1]["speedup"],
        "steady_speedup_trajectories_per_s": runs[1]["steady_speedup"],
        "speedup_default_buffer": runs[2]["speedup"],
        "steady_speedup_default_buffer": runs[2]["steady_speedup"],
        "speedup_standalone": runs[3]["speedup"],
        "steady_speedup_standalone": runs[3]["steady_speedup"],
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
