"""The main job: what ``agentrl-train`` runs around verl's RL trainer when a recipe asks for it.

``recipes/cpu_multitask.yaml`` (``make train``) turns every stage on; each is a key of the
``agentrl:`` node and works alone too:

1. **environments** (``agentrl.envs.launch``): the controller and the task workers, train split
   and held-out split (``<task>_<split>``), started here and stopped at the end, also on Ctrl-C;
2. **RL data** (``agentrl.assets.build_env_data``): ``data.train_files`` from the controller's
   train indices with AgentRL's task mixing;
   then the **assets** the recipe asks for (``agentrl.assets``: the tiny model, toy data), and
   every check of the run (:mod:`agentrl_ext.trainer.checks`) before the first expensive stage;
3. **SFT warm start** (``agentrl.sft.enable``): the tasks' experts play through the controller,
   verl's SFT trainer trains the model on their episodes, RL starts from the weights it saved;
4. **held-out evaluation before RL** (``agentrl.eval.enable``);
5. **RL**: verl's trainer with our agent loop (``trainer.v1.trainer_mode``), checkpointing the
   actor's Hugging Face weights at the last step;
6. **held-out evaluation after RL** of those weights;
7. **report**: the per-task table before/after (printed, and ``report.md``), the evaluation JSON
   files, and the plots of ``agentrl-plot`` in ``plots/``.

Everything goes to the run folder, verl's ``trainer.default_local_dir``: ``sft/``, ``data/``,
``global_step_N/`` (verl's checkpoints), ``metrics.jsonl`` (verl's file logger), ``eval/``,
``plots/``, ``report.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from agentrl_ext.config import AgentRLConfig
from agentrl_ext.run_spec import RunSpec
from agentrl_ext.trainer.interrupt import JobInterrupt

logger = logging.getLogger(__name__)

__all__ = ["job_stages_enabled", "run_job"]


def job_stages_enabled(agentrl: AgentRLConfig) -> bool:
    """Whether the config asks for anything beyond verl's RL run."""
    return bool(
        agentrl.sft.enable or agentrl.eval.enable or agentrl.envs.launch or agentrl.assets.build_env_data
    )


@contextlib.contextmanager
def _stage(name: str, timings: dict[str, float]) -> Iterator[None]:
    logger.info("== %s", name)
    started = time.monotonic()
    try:
        yield
    finally:
        timings[name] = time.monotonic() - started
        logger.info("== %s: %.0f s", name, timings[name])


def run_dir_of(config: DictConfig) -> Path:
    """The run folder: verl's ``trainer.default_local_dir``, absolute."""
    return Path(os.path.expanduser(str(config.trainer.default_local_dir))).resolve()


def _rl_tasks(config: DictConfig, agentrl: AgentRLConfig) -> list[str]:
    if agentrl.envs.tasks:
        return list(agentrl.envs.tasks)
    from agentrl_ext.trainer.checks import dataset_tasks

    return sorted(dataset_tasks(config))


def build_env_data(
    config: DictConfig,
    controller_url: str,
    tasks: list[str],
    seed: int,
    weights: dict[str, float] | None = None,
) -> None:
    """``data.train_files`` (AgentRL's mixing, repeated tasks, each ``weights[task]`` times as
    often as the others: ``agentrl.assets.task_weights``) and ``data.val_files`` (each index once)
    from the controller's indices of ``tasks``."""
    import asyncio

    from agentrl_ext.data.multitask import (
        build_multitask_dataset,
        check_training_splits,
        fetch_indices,
        fetch_splits,
    )

    fix = (
        "Set agentrl.envs.split=train (the default); evaluation has its own held-out workers (agentrl.eval)."
    )
    check_training_splits(asyncio.run(fetch_splits(controller_url, tasks)), controller_url, fix)
    indices = asyncio.run(fetch_indices(controller_url, tasks))
    build_multitask_dataset(
        indices, str(config.data.train_files), seed=seed, split="train", weights=dict(weights or {})
    )
    build_multitask_dataset(indices, str(config.data.val_files), seed=seed, split="val")
    logger.info(
        "RL data: %s -> %s",
        ", ".join(f"{t} ({len(i)} indices)" for t, i in indices.items()),
        config.data.train_files,
    )


def last_actor_weights(run_dir: Path) -> Path:
    """The Hugging Face weights of the actor's last checkpoint in ``run_dir``."""
    tracker = run_dir / "latest_checkpointed_iteration.txt"
    if not tracker.exists():
        raise RuntimeError(
            f"verl wrote no checkpoint in {run_dir}: set trainer.save_freq > 0 so the last step is saved"
        )
    step = int(tracker.read_text().strip())
    weights = run_dir / f"global_step_{step}" / "actor" / "huggingface"
    if not (weights / "config.json").exists():
        raise RuntimeError(
            f"the checkpoint of step {step} has no Hugging Face weights at {weights}: add hf_model to "
            "actor_rollout_ref.actor.checkpoint.save_contents"
        )
    return weights


def evaluate_policy(
    config: DictConfig, spec: RunSpec, controller_url: str, tasks: list[str], model: Path, label: str
) -> Any:
    """Evaluate ``model`` on ``tasks`` at ``controller_url``; writes ``eval/<label>.json`` and, as
    ``agentrl-eval-run --out`` does, every episode with its transcript to
    ``eval/<label>.episodes.jsonl`` (what ``agentrl-replay`` reads)."""
    from agentrl_ext.eval import EvalSettings, evaluate
    from agentrl_ext.eval.report import episodes_path

    agentrl = spec.agentrl
    settings = EvalSettings(
        runs=agentrl.eval.runs_per_sample,
        concurrency=agentrl.eval.concurrency,
        temperature=agentrl.eval.temperature,
        max_turns=spec.eval_max_turns,
        max_tokens=agentrl.agent_loop.max_tokens_per_turn,
        prompt_length=int(config.data.max_prompt_length),
        response_length=int(config.data.max_response_length),
        success_reward=agentrl.agent_loop.success_reward,
        seed=int(config.trainer.get("seed", 0) or 0),
        env_timeout_s=agentrl.agent_loop.env_timeout_s,
    )
    summary = eval_summary_path(run_dir_of(config), label)
    report = evaluate(
        controller_url,
        tasks,
        [str(model)],
        settings,
        limit=agentrl.eval.num_samples,
        label=label,
        episodes_out=episodes_path(summary),
    )
    report.settings["model_path"] = str(model)
    report.save(summary)
    return report


def eval_summary_path(run_dir: Path, label: str) -> Path:
    """The summary of the job's evaluation ``label``: ``<run>/eval/<label>.json`` (its episodes
    beside it: :func:`agentrl_ext.eval.report.episodes_path`)."""
    return run_dir / "eval" / f"{label}.json"


def _transcript_links(run_dir: Path, reports: list[Any]) -> list[str]:
    """The report's lines that link each evaluation's episodes file, and how to replay one."""
    from agentrl_ext.eval.report import episodes_path

    lines = [
        "Every episode with its transcript; `agentrl-replay FILE --launch --split test` re-drives them on "
        "the held-out split (`agentrl.eval.split`):",
        "",
    ]
    for report in reports:
        path = episodes_path(eval_summary_path(run_dir, report.label)).relative_to(run_dir)
        lines.append(f"- {report.label}: [{path}]({path})")
    return [*lines, ""]


@contextlib.contextmanager
def _held_out_stack(spec: RunSpec, tasks: list[str], run_dir: Path, interrupt: JobInterrupt) -> Iterator[str]:
    """The controller the evaluation talks to: with ``agentrl.envs.launch``, a second stack of the
    same tasks on their held-out split (``agentrl.eval.split``), so no held-out sample can reach
    training; else ``agentrl.eval.controller_url`` (default: the agent loop's controller)."""
    agentrl = spec.agentrl
    if not agentrl.envs.launch:
        yield str(spec.eval_controller_url)
        return
    from agentrl_ext.env.launcher import EnvStack, free_port

    stack = EnvStack(
        tasks=tasks,
        port=free_port(),
        docker=agentrl.envs.docker,
        split=agentrl.eval.split,
        kwargs={
            name: dict(values)
            for name, values in dict(agentrl.envs.task_kwargs or {}).items()
            if name in tasks
        },
        log_dir=run_dir / "logs" / f"envs_{agentrl.eval.split}",
        ready_timeout_s=agentrl.envs.ready_timeout_s,
    )
    interrupt.on_force(stack.stop)
    with stack:
        yield stack.api


def run_job(config: DictConfig, run_rl: Callable[[DictConfig], None]) -> None:
    """Run the stages the config enables around ``run_rl(config)`` (verl's trainer)."""
    from agentrl_ext.env.launcher import launch_from_config
    from agentrl_ext.trainer.checks import EarlyCheckError, check_run
    from agentrl_ext.trainer.prepare import build_assets, pin_spec, platform_changes

    spec = pin_spec(config)  # before any stage writes below ${agentrl.cache_dir}
    agentrl = spec.agentrl
    run_dir = run_dir_of(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    reports: list[Any] = []
    started = time.monotonic()
    # Ctrl-C / SIGTERM: the stages unwind (each stops what it started); one stuck is ended
    with JobInterrupt() as interrupt, contextlib.ExitStack() as servers:
        with _stage("environments", timings):
            stack = servers.enter_context(launch_from_config(agentrl, register_stop=interrupt.on_force))
            if stack is not None and stack.api != spec.controller_url:
                raise RuntimeError(
                    f"the launched controller serves {stack.api}, but the run spec resolved "
                    f"{spec.controller_url} for the agent loop (agentrl_ext.run_spec.launched_controller_url)"
                )
            controller_url = str(spec.controller_url)
            tasks = _rl_tasks(config, agentrl)
            eval_tasks = list(agentrl.eval.tasks) or tasks
            eval_url = (
                servers.enter_context(_held_out_stack(spec, eval_tasks, run_dir, interrupt))
                if agentrl.eval.enable
                else ""
            )
        if agentrl.assets.build_env_data:
            with _stage("RL data", timings):
                try:
                    build_env_data(
                        config,
                        controller_url,
                        tasks,
                        seed=int(config.trainer.get("seed", 0) or 0),
                        weights=agentrl.assets.task_weights,
                    )
                except ValueError as exc:  # a held-out split: the message names the fix
                    raise EarlyCheckError(str(exc)) from exc
        with _stage("assets", timings):  # the tiny model may take the tasks' expert episodes
            build_assets(config, spec)
        # every check before the first expensive stage (the RL stage runs them again, cheaply)
        platform_changes(config)
        check_run(config, spec)
        if agentrl.sft.enable:
            with _stage("SFT warm start", timings):
                _warm_start(config, agentrl, controller_url, tasks, run_dir)
        probe = ""
        if agentrl.sft.enable and agentrl.eval.enable and agentrl.sft.probe_runs > 0:
            with _stage("warm-start probe", timings):
                probe = _probe_warm_start(config, agentrl, eval_url, eval_tasks, run_dir)
        if agentrl.eval.enable and agentrl.eval.before_rl:
            with _stage("evaluation before RL", timings):
                model = Path(str(config.actor_rollout_ref.model.path))
                reports.append(evaluate_policy(config, spec, eval_url, eval_tasks, model, "before_rl"))
        os.environ.setdefault("VERL_FILE_LOGGER_PATH", str(run_dir / "metrics.jsonl"))
        with _stage("RL", timings):
            run_rl(config)
        if agentrl.eval.enable:
            with _stage("evaluation after RL", timings):
                model = last_actor_weights(run_dir)
                reports.append(evaluate_policy(config, spec, eval_url, eval_tasks, model, "after_rl"))
    timings["total"] = time.monotonic() - started
    _report(run_dir, reports, timings, probe)


def _warm_start(
    config: DictConfig, agentrl: AgentRLConfig, controller_url: str, tasks: list[str], run_dir: Path
) -> None:
    from agentrl_ext.data.expert import DEFAULT_CARELESS_MOVE, experts, has_careless_action
    from agentrl_ext.platform.cpu_platform import cpu_platform_active
    from agentrl_ext.trainer.sft import run_sft, write_expert_dataset

    sft_tasks = list(agentrl.sft.tasks) or [t for t in tasks if t in experts()]
    if not sft_tasks:
        raise ValueError(
            f"agentrl.sft.enable is set but none of the run's tasks {tasks} has an expert "
            f"(known: {', '.join(sorted(experts()))}); set agentrl.sft.tasks or turn the warm start off"
        )
    careless, moves, repeats = _demonstrators(agentrl, sft_tasks, experts())
    problems = [
        f"{task} (its expert module has no {moves.get(task, DEFAULT_CARELESS_MOVE)}_action)"
        for task in sorted(careless)
        if not has_careless_action(task, moves.get(task, DEFAULT_CARELESS_MOVE))
    ]
    if problems:
        raise ValueError(
            f"agentrl.sft.expert_noise names {', '.join(problems)}: remove them or fix "
            "agentrl.sft.careless_move"
        )
    unused = sorted(set(moves) - set(careless))
    if unused:
        raise ValueError(
            f"agentrl.sft.careless_move names {unused} but agentrl.sft.expert_noise gives them no "
            "epsilon > 0; set agentrl.sft.expert_noise for them or remove them"
        )
    files = write_expert_dataset(
        controller_url,
        sft_tasks,
        agentrl.sft.episodes_per_task,
        run_dir / "sft" / "data",
        noise=careless,
        seed=agentrl.sft.seed,
        moves=moves,
        keep_lost=agentrl.sft.keep_lost,
        weights=repeats,
    )
    base = Path(str(config.actor_rollout_ref.model.path))
    weights = run_sft(base, files, run_dir / "sft", agentrl.sft, cpu=cpu_platform_active())
    with open_dict(config):
        config.actor_rollout_ref.model.path = str(weights)
    logger.info("RL starts from the warm-started weights %s", weights)


def _probe_warm_start(
    config: DictConfig, agentrl: AgentRLConfig, eval_url: str, tasks: list[str], run_dir: Path
) -> str:
    """The room each task leaves RL and what the warm-started model reads (``warm_start_probe``),
    on the held-out seeds; written to ``eval/warm_start_probe.json``, returned as markdown."""
    import asyncio

    from agentrl_ext.data.expert import experts
    from agentrl_ext.data.multitask import fetch_indices
    from agentrl_ext.eval.warm_start_probe import format_report, report_json, run_probe

    probed = [t for t in tasks if t in experts()]
    if not probed:
        return ""
    noise, moves, _ = _demonstrators(agentrl, probed, experts())
    indices = asyncio.run(fetch_indices(eval_url, probed))
    limit = agentrl.eval.num_samples
    rooms, probes = run_probe(
        eval_url,
        str(config.actor_rollout_ref.model.path),
        probed,
        {t: list(i)[:limit] if limit else list(i) for t, i in indices.items()},
        noise,
        moves,
        runs=agentrl.sft.probe_runs,
        temperature=agentrl.eval.temperature,
        seed=int(config.trainer.get("seed", 0) or 0),
    )
    out = run_dir / "eval" / "warm_start_probe.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report_json(rooms, probes))
    table = format_report(rooms, probes)
    print("\nThe warm start, before RL (held-out seeds):\n" + table + "\n", flush=True)
    return table


def _demonstrators(
    agentrl: AgentRLConfig, sft_tasks: list[str], known: dict[str, str]
) -> tuple[dict[str, float], dict[str, str], dict[str, int]]:
    """``agentrl.sft``'s per-task settings (expert_noise > 0, careless_move, task_weights) for the
    warm-start tasks. A recipe's entry for a task this run leaves out (``agentrl.envs.tasks=[guess]``
    on a three-task recipe) is skipped; a name that is no task with an expert is an error."""
    noise = {t: e for t, e in agentrl.sft.expert_noise.items() if e > 0}
    moves = dict(agentrl.sft.careless_move)
    weights = dict(agentrl.sft.task_weights)
    for key, names in (("expert_noise", noise), ("careless_move", moves), ("task_weights", weights)):
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ValueError(
                f"agentrl.sft.{key} names {unknown}: no task with an expert has that name "
                f"(known: {', '.join(sorted(known))})"
            )
        skipped = sorted(set(names) - set(sft_tasks))
        if skipped:
            logger.info(
                "agentrl.sft.%s: %s not in this run's warm start (%s), skipped", key, skipped, sft_tasks
            )

    def kept(values: dict[str, Any]) -> dict[str, Any]:
        return {t: v for t, v in values.items() if t in sft_tasks}

    return kept(noise), kept(moves), kept(weights)


def _report(run_dir: Path, reports: list[Any], timings: dict[str, float], probe: str = "") -> None:
    lines = ["# Run report", "", f"run folder: {run_dir}", ""]
    if probe:
        lines += [
            "## The warm start, before RL",
            "",
            "Room: the held-out success of the warm start's demonstrator and of the expert; their "
            "difference is what RL can add. Probe: the warm-started model's sampled moves in the "
            "demonstrator's held-out contexts, and how many are consistent with what the environment "
            "said (eval/warm_start_probe.json).",
            "",
            probe,
            "",
        ]
    if reports:
        from agentrl_ext.eval import plot_run, render_comparison

        table = render_comparison(reports)
        print("\n" + table + "\n", flush=True)
        lines += ["## Held-out evaluation", "", table, "", *_transcript_links(run_dir, reports)]
        plots = plot_run(run_dir)
        lines += ["## Plots", ""] + [f"- {p.relative_to(run_dir)}" for p in plots] + [""]
    lines += ["## Time per stage", ""] + [f"- {name}: {seconds:.0f} s" for name, seconds in timings.items()]
    (run_dir / "report.md").write_text("\n".join(lines) + "\n")
    logger.info("report: %s", run_dir / "report.md")
