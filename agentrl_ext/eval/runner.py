"""Evaluate models on tasks through the controller: :func:`evaluate` (library) and its settings.

    from agentrl_ext.eval import EvalSettings, evaluate, render_table

    report = evaluate("http://127.0.0.1:5020/api", ["guess", "calc"], ["checkpoints/sft"],
                      EvalSettings(runs=1, concurrency=16), label="before_rl")
    print(render_table(report))
    report.save("runs/main/eval/before_rl.json")

``models`` are local HF checkpoint directories, or (with ``base_url``) model names served by
an OpenAI-compatible endpoint, or ``name=URL,model[,weight]`` specs of several endpoints.
Episodes are (task, index, run) for every selected index and ``runs`` repetitions; the report
keeps them in that order whatever the concurrency.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl_ext.config import AgentLoopConfig, EvalConfig
from agentrl_ext.env.client import ControllerClient, ControllerError, RetryPolicy
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.eval.policies import (
    EndpointPolicy,
    LocalBudget,
    LocalPolicy,
    Played,
    Policy,
    Sampling,
    episode_seed,
    is_checkpoint_dir,
)
from agentrl_ext.eval.report import EpisodeRecord, EvalReport, read_episodes
from agentrl_ext.rollout.openai_pool import PoolMember

logger = logging.getLogger(__name__)

#: where the API key of OpenAI-compatible endpoints is read from, unless told otherwise
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


@dataclass
class EvalSettings:
    """How to evaluate (CLI flags of ``agentrl-eval-run`` in brackets). The defaults that
    ``agentrl.eval`` and ``agentrl.agent_loop`` also have are theirs (agentrl_ext/config.py)."""

    #: repetitions of every (task, index) [--runs]
    runs: int = EvalConfig.runs_per_sample
    #: episodes in flight at once [--concurrency]
    concurrency: int = EvalConfig.concurrency
    #: sampling temperature; 0 is greedy [--temperature]
    temperature: float = EvalConfig.temperature
    top_p: float = 1.0
    #: cap on assistant turns (each task has its own limit too) [--max-turns]
    max_turns: int = AgentLoopConfig.max_turns
    #: cap on one assistant turn's tokens [--max-tokens]
    max_tokens: int | None = AgentLoopConfig.max_tokens_per_turn
    #: local models: the opening prompt's limit and the episode's budget after it [--prompt-length, --response-length]
    prompt_length: int = 1024
    response_length: int = 3072
    dtype: str = "float32"
    #: success = ``completed`` with reward >= this; one value, or per task with a ``"*"`` default [--success-reward]
    success_reward: float | dict[str, float] = AgentLoopConfig.success_reward
    #: seeds the model draws (cross-sampling) and local sampling [--seed]
    seed: int = 0
    #: seconds one environment call may take (then retried, then the episode fails)
    env_timeout_s: float = AgentLoopConfig.env_timeout_s
    #: seconds one endpoint request may take
    model_timeout_s: float = 300.0
    #: anything else to record in the report's ``settings`` (e.g. the checkpoint's training step)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("runs", "concurrency", "max_turns", "prompt_length", "response_length"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"evaluation setting {name}={getattr(self, name)} must be >= 1")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"evaluation setting max_tokens={self.max_tokens} must be >= 1 (or None)")
        if self.temperature < 0:
            raise ValueError(f"evaluation setting temperature={self.temperature} must be >= 0 (0 is greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"evaluation setting top_p={self.top_p} must be in (0, 1]")

    def threshold(self, task: str) -> float:
        """The success threshold of ``task``."""
        if isinstance(self.success_reward, Mapping):
            return float(self.success_reward.get(task, self.success_reward.get("*", 1.0)))
        return float(self.success_reward)

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.max_tokens, self.max_turns)


def make_policy(
    models: Sequence[str],
    controller_url: str,
    settings: EvalSettings,
    base_url: str | None = None,
    api_key: str | None = None,
) -> Policy:
    """Local checkpoints (no ``base_url``, no ``name=URL,model`` spec) or endpoint models."""
    if not models:
        raise ValueError(
            "no model to evaluate: give --model PATH (a local checkpoint) or --model NAME --base-url URL"
        )
    specs = [m for m in models if "=" in m and "://" in m]
    if base_url is None and not specs:
        return LocalPolicy(
            list(models),
            controller_url,
            settings.sampling,
            LocalBudget(settings.prompt_length, settings.response_length, settings.dtype),
            max_num_seqs=settings.concurrency,
        )
    members = []
    for model in models:
        if model in specs:
            member = PoolMember.parse(model)
        elif base_url is None:
            raise ValueError(
                f"model {model!r} has no endpoint: give --base-url URL, or write it as name=URL,model; "
                "local checkpoints and endpoints cannot be mixed in one evaluation"
            )
        else:
            if is_checkpoint_dir(model):
                logger.warning(
                    "%s is a local folder but --base-url is set: asking the endpoint for a model of that name",
                    model,
                )
            member = PoolMember(name=model, base_url=base_url.rstrip("/"), model=model)
        members.append(PoolMember(member.name, member.base_url, member.model, member.weight, api_key))
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ValueError(f"model names {names} must be unique")
    return EndpointPolicy(members, settings.sampling, timeout_s=settings.model_timeout_s)


def parse_indices(spec: str) -> list[Any]:
    """``0:100`` (index values 0..99), ``3,5,7``, or a mix (``0:10,42``); non-integers stay strings."""
    values: list[Any] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if ":" in part:
            lo, _, hi = part.partition(":")
            try:
                values += list(range(int(lo), int(hi)))
            except ValueError:
                raise ValueError(
                    f"index range {part!r} must be START:STOP with integers, e.g. 0:100"
                ) from None
        else:
            values.append(int(part) if re.fullmatch(r"-?\d+", part) else part)
    if not values:
        raise ValueError(f"index selection {spec!r} selects nothing; write e.g. 0:100 or 1,5,9")
    return values


async def _task_indices(
    client: ControllerClient, task: str, wanted: Sequence[Any] | None, limit: int | None
) -> list[Any]:
    """The indices of ``task`` to evaluate: ``wanted`` (checked against what the controller offers) or all."""
    try:
        offered = list(await client.get_indices(task))
    except ControllerError as exc:
        workers = await client.list_workers()
        raise ValueError(
            f"task {task!r} is not served by the controller at {client.base_url} ({exc}); "
            f"tasks with workers: {sorted(workers) or 'none'}. Start its worker first "
            '(a held-out split is a worker started with --task-kwargs \'{"split": "test"}\')'
        ) from exc
    if wanted is None:
        chosen = offered
    else:
        by_text = {str(i): i for i in offered}
        missing = [w for w in wanted if str(w) not in by_text]
        if missing:
            shown = offered if len(offered) <= 6 else [*offered[:3], "...", *offered[-2:]]
            raise ValueError(
                f"task {task!r}: indices {missing[:10]}{' ...' if len(missing) > 10 else ''} are not offered by "
                f"its workers ({len(offered)} indices: {shown}); pick from those, or start a worker of the split you want"
            )
        chosen = [by_text[str(w)] for w in wanted]
    return chosen[:limit] if limit else chosen


#: what :func:`task_cards` keeps of a task's ``calculate_overall``
CARD_KEYS = ("benchmark", "invalid_action_rule")


async def task_cards(client: ControllerClient, tasks: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per task, the benchmark label and invalid-action rule its workers report (the keys of
    :data:`CARD_KEYS` in the task's ``calculate_overall``, asked through the controller, which
    forwards it to one healthy worker of the task); ``{}`` for a task that reports neither (the
    procedural tasks) or whose summary cannot be had (logged)."""
    cards: dict[str, dict[str, Any]] = {}
    for task in tasks:
        try:
            overall = await client.calculate_overall(task, [])
        except ControllerError as exc:
            logger.warning("task %r: no benchmark label or invalid-action rule recorded (%s)", task, exc)
            overall = {}
        keep = overall if isinstance(overall, Mapping) else {}
        cards[task] = {k: keep[k] for k in CARD_KEYS if keep.get(k) is not None}
    return cards


def _record(task: str, index: Any, run: int, played: Any, threshold: float) -> EpisodeRecord:
    if played.record is not None:
        played.record.meta["run"] = run
    completed = played.status == SampleStatus.COMPLETED.value
    reward = float(played.reward) if completed else 0.0
    return EpisodeRecord(
        task=task,
        index=index,
        run=run,
        reward=reward,
        success=completed and reward >= threshold,
        turns=len(played.models),
        status=played.status,
        error=played.error,
        failed=played.failed,
        models=list(played.models),
        messages=list(played.messages),
        record=played.record.to_dict() if played.record is not None else None,
    )


class _EpisodeSink:
    """Writes each episode record to the episodes file as it finishes (a killed run keeps them)."""

    def __init__(self, path: str | os.PathLike[str], append: bool) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a" if append else "w")  # noqa: SIM115  (closed by close())

    def write(self, record: EpisodeRecord) -> None:
        self._file.write(record.to_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


async def evaluate_async(
    controller_url: str,
    tasks: Sequence[str],
    models: Sequence[str | os.PathLike[str]],
    settings: EvalSettings | None = None,
    *,
    indices: Sequence[Any] | Mapping[str, Sequence[Any]] | None = None,
    limit: int | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    label: str = "",
    progress: bool = True,
    episodes_out: str | os.PathLike[str] | None = None,
    resume: bool = False,
) -> EvalReport:
    """:func:`evaluate` inside a running event loop."""
    settings = settings or EvalSettings()
    tasks = list(dict.fromkeys(tasks))
    names = [os.fspath(m) for m in models]  # local paths may come as pathlib.Path
    if not tasks:
        raise ValueError("no task to evaluate: give --tasks NAME (a task registered with the controller)")
    if api_key is None:
        api_key = os.environ.get(DEFAULT_API_KEY_ENV) or None
    started = time.time()
    retry = RetryPolicy()  # waits out a controller restart (up to 60 s) instead of failing samples
    async with ControllerClient(controller_url, retry=retry, timeout_s=settings.env_timeout_s) as client:
        work: list[tuple[str, Any, int]] = []
        for task in tasks:
            wanted = indices.get(task) if isinstance(indices, Mapping) else indices
            for index in await _task_indices(client, task, wanted, limit):
                work += [(task, index, run) for run in range(settings.runs)]
        finished: dict[tuple[str, str, int], EpisodeRecord] = {}
        if resume and episodes_out is not None and Path(episodes_out).is_file():
            wanted_keys = {(t, json.dumps(i), r) for t, i, r in work}
            finished = {
                k: r
                for k, r in read_episodes(Path(episodes_out)).items()
                if not r.failed and k in wanted_keys
            }
            logger.warning(
                "resuming: %d of %d episodes already finished in %s", len(finished), len(work), episodes_out
            )
        cards = await task_cards(client, tasks)
        todo = [(t, i, r) for t, i, r in work if (t, json.dumps(i), r) not in finished]
        sink = _EpisodeSink(episodes_out, append=resume) if episodes_out is not None else None
        policy = make_policy(names, controller_url, settings, base_url, api_key)
        try:
            played = await _run_all(client, policy, todo, settings, progress, sink)
        finally:
            await policy.close()
            if sink is not None:
                sink.close()
        by_key = {**finished, **{r.key: r for r in played}}
        records = [by_key[(t, json.dumps(i), r)] for t, i, r in work]
    run_settings = {
        **{k: v for k, v in asdict(settings).items() if k != "extra"},
        **settings.extra,
        "controller_url": controller_url,
        "models": list(policy.names),
        "base_url": base_url,
        "tasks": tasks,
        "limit": limit,
        "seconds": round(time.time() - started, 2),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
    }
    thresholds = {t: settings.threshold(t) for t in tasks}
    return EvalReport.build(label, run_settings, records, thresholds, task_cards=cards)


async def _run_all(
    client: ControllerClient,
    policy: Policy,
    work: Sequence[tuple[str, Any, int]],
    settings: EvalSettings,
    progress: bool,
    sink: _EpisodeSink | None = None,
) -> list[EpisodeRecord]:
    gate = asyncio.Semaphore(settings.concurrency)
    bar = _progress_bar(len(work), progress)
    done = {"success": 0, "failed": 0}

    async def one(task: str, index: Any, run: int) -> EpisodeRecord:
        async with gate:
            try:
                played = await policy.play(client, task, index, episode_seed(settings.seed, task, index, run))
            except Exception as exc:  # noqa: BLE001  (one episode that cannot run is counted, not fatal)
                logger.debug("episode %s[%s] run %d raised", task, index, run, exc_info=True)
                played = Played(
                    SampleStatus.TASK_ERROR.value, 0.0, [], failed=True, error=f"{type(exc).__name__}: {exc}"
                )
        record = _record(task, index, run, played, settings.threshold(task))
        if record.failed:
            logger.warning(
                "episode %s[%s] run %d failed (%s): %s", task, index, run, record.status, record.error
            )
        if sink is not None:
            sink.write(record)
        done["success"] += record.success
        done["failed"] += record.failed
        bar.set_postfix(success=f"{done['success']}/{bar.n + 1}", failed=done["failed"], refresh=False)
        bar.update(1)
        return record

    try:
        return list(await asyncio.gather(*(one(*w) for w in work)))
    finally:
        bar.close()


def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr (a disabled one without tqdm: ``pip install 'agentrl_ext[eval]'`` brings it)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if enabled:
            logger.warning("no progress bar: tqdm is not installed (pip install 'agentrl_ext[eval]')")
        from types import SimpleNamespace

        noop = lambda *args, **kwargs: None  # noqa: E731
        return SimpleNamespace(n=0, update=noop, set_postfix=noop, close=noop)
    return tqdm(total=total, desc="evaluating", unit="episode", disable=not enabled, dynamic_ncols=True)


def evaluate(
    controller_url: str,
    tasks: Sequence[str],
    models: Sequence[str | os.PathLike[str]],
    settings: EvalSettings | None = None,
    **kwargs: Any,
) -> EvalReport:
    """Evaluate ``models`` on ``tasks`` through the controller at ``controller_url``.

    Keyword arguments as :func:`evaluate_async`: ``indices`` (one list for every task, or per
    task), ``limit`` (the first N selected indices per task), ``base_url`` and ``api_key``
    (endpoint models; the key defaults to ``$OPENAI_API_KEY``), ``label`` (e.g. ``before_rl``,
    shown in tables and plots), ``progress`` (a tqdm bar on stderr).
    """
    return asyncio.run(evaluate_async(controller_url, tasks, models, settings, **kwargs))
