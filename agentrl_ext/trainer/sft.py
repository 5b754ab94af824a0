"""SFT warm start: expert trajectories of the procedural tasks, trained with verl's SFT trainer.

Two steps, both usable alone:

- :func:`write_expert_dataset` plays each task's expert (``agentrl_ext.data.expert``) on the
  train split through the real controller -> worker path and writes one parquet file per task in
  the layout of verl's ``MultiTurnSFTDataset`` (``messages``: the whole OpenAI conversation,
  ``tools``: the task's tool schemas). One file per task because parquet gives a column one
  schema: tools of different tasks in one file would be merged into a single struct, and every
  tool would then render with the other tasks' parameters as ``null``. Within one task the same
  merge happens between its tools (calc's ``calculator`` and ``answer`` take different
  arguments), so each row also carries its schemas as JSON text (``tools_json``), which
  :class:`agentrl_ext.trainer.sft_dataset.ExpertSFTDataset` renders instead.
- :func:`run_sft` runs ``verl.trainer.sft_trainer`` (verl's own trainer, FSDP2 engine) under
  ``torch.distributed.run`` in a child process and returns the Hugging Face weights it saved.
  On the CPU platform the child gets gloo collectives, fp32 and SDPA attention (flash attention
  does not exist there); on GPUs verl's defaults stay. Extra verl SFT overrides pass through
  ``agentrl.sft.overrides``.

    paths = write_expert_dataset("http://127.0.0.1:5020/api", ["guess", "calc"], 300, out / "data")
    model_dir = run_sft(base_model, paths, out, SFTConfig(steps=60))
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl_ext.config import SFTConfig
from agentrl_ext.data.expert import DEFAULT_CARELESS_MOVE

logger = logging.getLogger(__name__)

#: the column holding each row's tool schemas as JSON text (read by ``sft_dataset.ExpertSFTDataset``)
TOOLS_JSON_COLUMN = "tools_json"
#: the column naming each row's task (``sft_dataset.TaskBatchSampler`` batches one task at a time)
TASK_COLUMN = "task"

#: a tqdm progress update (``12/60 [00:10<00:40, 1.2it/s]``)
PROGRESS = re.compile(rb"\d+/\d+ \[[^\]]*(?:it/s|s/it)\]")

__all__ = ["expert_rows", "run_sft", "sft_command", "write_expert_dataset"]

# verl's SFT defaults that cannot run on the CPU platform, and what replaces them.
CPU_SFT_OVERRIDES = (
    "trainer.device=cpu",
    "engine.strategy=fsdp2",
    "engine.use_torch_compile=false",
    "+engine.mixed_precision.param_dtype=fp32",
    "+engine.mixed_precision.reduce_dtype=fp32",
    "+engine.mixed_precision.buffer_dtype=fp32",
    "model.use_remove_padding=false",
    "+model.override_config.attn_implementation=sdpa",
    "model.enable_gradient_checkpointing=false",
    "data.use_dynamic_bsz=false",
    "data.num_workers=0",
)


def _clean(value: Any) -> Any:
    """JSON-like copy without ``None`` members (a parquet struct column would keep them as nulls)."""
    if isinstance(value, Mapping):
        return {key: _clean(item) for key, item in value.items() if item is not None}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


def expert_rows(
    controller_url: str,
    task: str,
    count: int,
    concurrency: int = 16,
    epsilon: float = 0.0,
    seed: int = 0,
    move: str = DEFAULT_CARELESS_MOVE,
    keep_lost: bool = False,
) -> list[dict[str, Any]]:
    """``count`` expert episodes of ``task``'s advertised (train) indices, as SFT rows.

    Only episodes the expert won (status ``completed``, reward > 0) are kept, and with
    ``keep_lost`` also those it lost within the task's rules (``completed`` with reward 0, ``task
    limit reached``); the indices are the first ``count`` of the controller's ``get_indices`` for
    ``task``. ``epsilon`` > 0: a careless expert plays (its careless ``move``, ``random`` by
    default, with that probability per turn; ``agentrl_ext.data.expert.noisy_policy``).
    """
    import httpx

    from agentrl_ext.data.expert import play_expert_episodes
    from agentrl_ext.env.protocol import SampleStatus

    response = httpx.get(f"{controller_url}/get_indices", params={"name": task}, timeout=30)
    if response.status_code != 200:
        raise RuntimeError(
            f"controller {controller_url} does not know task {task!r} (HTTP {response.status_code}: "
            f"{response.text[:200]}); start its worker first"
        )
    indices = list(response.json())[:count]
    episodes = asyncio.run(
        play_expert_episodes(
            controller_url, task, indices, concurrency=concurrency, epsilon=epsilon, seed=seed, move=move
        )
    )
    within_rules = (SampleStatus.COMPLETED, SampleStatus.TASK_LIMIT_REACHED)
    kept = [e for e in episodes if e.won or (keep_lost and e.status in within_rules)]
    won = sum(e.won for e in episodes)
    if len(kept) < len(episodes):
        logger.warning(
            "%s: the expert lost %d of %d episodes; they are left out",
            task,
            len(episodes) - len(kept),
            len(episodes),
        )
    elif won < len(episodes):
        logger.info(
            "%s: %d of %d demonstrations won; the lost ones are kept (keep_lost)", task, won, len(episodes)
        )
    return [_row(e.messages, e.tools, task) for e in kept]


def _row(messages: Any, tools: Any, task: str) -> dict[str, Any]:
    """One SFT row: the conversation, the tool schemas, the same schemas as JSON text, the task."""
    tools = _clean(tools)
    return {
        "messages": _clean(messages),
        "tools": tools,
        TOOLS_JSON_COLUMN: json.dumps(tools),
        TASK_COLUMN: task,
    }


def write_expert_dataset(
    controller_url: str,
    tasks: Sequence[str],
    episodes_per_task: int,
    out_dir: str | Path,
    noise: Mapping[str, float] | None = None,
    seed: int = 0,
    moves: Mapping[str, str] | None = None,
    keep_lost: bool = False,
    weights: Mapping[str, int] | None = None,
) -> list[Path]:
    """Write ``<out_dir>/<task>.parquet`` of expert episodes for every task; returns the paths.

    ``noise`` maps a task to the careless expert's ``epsilon``, ``moves`` to its careless move
    (default ``random``), ``keep_lost`` keeps the episodes lost within the rules (see
    :func:`expert_rows`), ``weights`` maps a task to how many times its indices are played (seeds
    ``seed``, ``seed + 1``, ...)."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for task in tasks:
        epsilon = float((noise or {}).get(task, 0.0))
        move = (moves or {}).get(task, DEFAULT_CARELESS_MOVE)
        rows = []
        for repeat in range(int((weights or {}).get(task, 1))):
            rows += expert_rows(
                controller_url,
                task,
                episodes_per_task,
                epsilon=epsilon,
                seed=seed + repeat,
                move=move,
                keep_lost=keep_lost,
            )
        if not rows:
            raise RuntimeError(f"no expert episode of task {task!r} was won: nothing to train on")
        path = out / f"{task}.parquet"
        pd.DataFrame(rows).to_parquet(path)
        careless = f" (careless expert, epsilon {epsilon}, {move} moves)" if epsilon else ""
        logger.info("SFT data: %d expert episodes of %s%s -> %s", len(rows), task, careless, path)
        paths.append(path)
    return paths


def sft_command(
    model_path: str | Path, train_files: Sequence[str | Path], out_dir: str | Path, sft: SFTConfig, cpu: bool
) -> list[str]:
    """The ``torch.distributed.run`` command line of verl's SFT trainer for these inputs."""
    files = ",".join(str(Path(p).resolve()) for p in train_files)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=1"]
    # batch_by_task: verl's SFT trainer with one task per batch (agentrl_ext.trainer.sft_main)
    argv += ["-m", "agentrl_ext.trainer.sft_main" if sft.batch_by_task else "verl.trainer.sft_trainer"]
    argv += [
        f"model.path={Path(model_path).resolve()}",
        f"data.train_files=[{files}]",
        f"data.train_batch_size={sft.batch_size}",
        f"data.micro_batch_size_per_gpu={sft.micro_batch_size}",
        f"data.max_length={sft.max_length}",
        "data.pad_mode=no_padding",
        # the exact tool schemas of each row (tools_json), not parquet's merged struct
        "data.custom_cls.path=pkg://agentrl_ext.trainer.sft_dataset",
        "data.custom_cls.name=ExpertSFTDataset",
        "data.truncation=error",
        f"optim.lr={sft.lr}",
        f"optim.lr_warmup_steps={sft.warmup_steps}",
        f"optim.lr_scheduler_type={sft.lr_scheduler}",
        f"trainer.total_training_steps={sft.steps}",
        "trainer.total_epochs=1000",
        f"trainer.default_local_dir={Path(out_dir).resolve()}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.seed={sft.seed}",
        "trainer.logger=[console]",
        "trainer.project_name=agentrl_ext",
        "trainer.experiment_name=sft",
        "checkpoint.save_contents=[model,hf_model]",
        f"hydra.run.dir={Path(out_dir).resolve() / 'hydra'}",
    ]
    if cpu:
        argv += list(CPU_SFT_OVERRIDES)
    return argv + list(sft.overrides)


def sft_environment(environ: Mapping[str, str], cpu: bool) -> dict[str, str]:
    """The SFT child's environment. On the CPU platform it gets every core for torch's threads:
    ``torch.distributed.run`` otherwise sets ``OMP_NUM_THREADS=1`` for its one worker, which then
    trains on one core of a machine where nothing else runs during the warm start (measured: a
    forward and backward of the 0.99M model on 16 x 400 tokens, 0.65 s on one thread, 0.36 s on
    two). A value the user set is kept."""
    env = {**environ, "TOKENIZERS_PARALLELISM": "false"}
    if cpu and "OMP_NUM_THREADS" not in environ:
        env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    return env


def run_sft(
    model_path: str | Path,
    train_files: Sequence[str | Path],
    out_dir: str | Path,
    sft: SFTConfig,
    cpu: bool = True,
    log_path: str | Path | None = None,
) -> Path:
    """Train ``model_path`` on ``train_files`` with verl's SFT trainer; returns the saved HF weights.

    The child's output goes to ``log_path`` (default ``<out_dir>/sft.log``) and its progress bar to
    this process's stderr. Ctrl-C (or any exception here) stops the child's whole process group.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = Path(log_path) if log_path else out / "sft.log"
    argv = sft_command(model_path, train_files, out, sft, cpu)
    logger.info(
        "SFT: %d steps of %d episodes with verl's SFT trainer (log: %s)", sft.steps, sft.batch_size, log
    )
    env = sft_environment(os.environ, cpu)
    with open(log, "wb") as sink:
        child = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:
            assert child.stderr is not None
            _tee_progress(child.stderr, sink)
            code = child.wait()
        except BaseException:
            _stop_group(child)
            raise
    if code != 0:
        raise RuntimeError(
            f"verl's SFT trainer exited with code {code}; the errors in {log}:\n{_errors(log)}"
        )
    weights = out / f"global_step_{sft.steps}" / "huggingface"
    if not (weights / "config.json").exists():
        raise RuntimeError(f"verl's SFT trainer finished but saved no Hugging Face weights at {weights}")
    return weights


def _errors(log: Path, count: int = 8) -> str:
    """The last error lines of the child's log, without torchrun's own report of the failure."""
    lines = log.read_text(errors="replace").splitlines()
    errors = [
        line
        for line in lines
        if re.search(r"\w+Error\b|Error executing|Could not|Key '", line)
        and "ChildFailedError" not in line
        and "torch/distributed" not in line
    ]
    return "\n".join(errors[-count:] or lines[-count:])


def _tee_progress(stream: Any, sink: Any) -> None:
    """Copy the child's stderr to ``sink``; echo verl's tqdm progress bar updates to our stderr.

    tqdm redraws with carriage returns, so the stream is cut at ``\r`` and ``\n`` alike.
    """
    pending = b""
    while chunk := os.read(stream.fileno(), 4096):
        sink.write(chunk)
        pending += chunk
        *pieces, pending = re.split(rb"[\r\n]", pending)
        for piece in pieces:
            if PROGRESS.search(piece):
                sys.stderr.write("\r" + piece.decode(errors="replace").strip())
                sys.stderr.flush()
    sys.stderr.write("\n")


def _stop_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's process group, SIGKILL it after 10 s."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    except ProcessLookupError:
        pass
