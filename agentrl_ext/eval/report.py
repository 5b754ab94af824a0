"""Evaluation results: one record per episode, a per-task summary, the JSON file and the tables.

What counts (the same rule as the agent loop's ``agentrl.agent_loop.success_reward``):

- **reward**: the environment's reward of an episode that ends ``completed``, else 0 (no
  ``incomplete_punishment`` at evaluation: the score is the task's own);
- **success**: the episode ends ``completed`` with reward ≥ the task's success threshold
  (default 1.0: for ``guess``, ``calc``, ``gridroom`` and DBBench, whose rewards are 0 or 1,
  success means solved; give a lower threshold for tasks with partial rewards, e.g. WebShop);
- **failed**: the episode could not be run to an end (environment or model endpoint
  unreachable, environment status ``task error`` / ``unknown``, prompt over the budget): it
  counts in ``episodes`` and ``failed``, and in success rate and mean reward as a 0.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

#: format of the results file (``EvalReport.to_dict``); bumped when a field changes meaning
REPORT_VERSION = 1


@dataclass
class EpisodeRecord:
    """One evaluated episode: ``run`` numbers the repetitions of the same (task, index)."""

    task: str
    index: Any
    run: int
    reward: float
    success: bool
    turns: int
    status: str
    error: str | None = None
    failed: bool = False
    #: the model that generated each assistant turn (cross-sample mode draws one per turn)
    models: list[str] = field(default_factory=list)
    #: the conversation: opening messages, assistant turns (with tool calls), tool answers; written
    #: to the episodes file (JSON Lines), not to the summary file
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: the episode record of the driver (``agentrl_ext.rollout.episode.Episode.to_dict``: every
    #: turn's action and answer, statuses, rewards, timings; token ids for local models), which
    #: ``agentrl-replay`` re-drives; episodes file only
    record: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        """What identifies the episode across runs of the command: (task, index, run)."""
        return self.task, json.dumps(self.index), self.run

    def to_json(self) -> str:
        """One line of the episodes file."""
        return json.dumps(asdict(self), default=str)


@dataclass
class TaskSummary:
    """Per-task figures over all runs of all indices."""

    episodes: int
    success_rate: float
    reward_mean: float
    turns_mean: float
    failed: int
    statuses: dict[str, int]
    success_threshold: float
    #: the benchmark the task's workers say they ran (e.g. ``dbbench-std``, ``kg-offline``), as
    #: their ``calculate_overall`` reports it; None for tasks that report none
    benchmark: str | None = None
    #: what a turn without a valid tool call did in this run (``feedback``: AgentBench-FC's message,
    #: the episode goes on; ``end``: reward 0), as the task's workers report it; None when not reported
    invalid_action_rule: str | None = None

    @property
    def ran(self) -> int:
        """Episodes that ran to an end (not ``failed``): the ones that say something about the agent."""
        return self.episodes - self.failed

    @property
    def success_rate_of_ran(self) -> float:
        """Success rate over the episodes that ran (NaN when none did): failed episodes apart."""
        return round(self.success_rate * self.episodes) / self.ran if self.ran else math.nan

    @classmethod
    def of(
        cls,
        records: Sequence[EpisodeRecord],
        success_threshold: float,
        task_card: Mapping[str, Any] | None = None,
    ) -> TaskSummary:
        """The figures of ``records``; ``task_card``: what the task's workers report of the run
        (``benchmark``, ``invalid_action_rule``; see :func:`agentrl_ext.eval.runner.task_cards`)."""
        n = len(records)
        card = task_card or {}
        return cls(
            episodes=n,
            success_rate=sum(r.success for r in records) / n if n else 0.0,
            reward_mean=sum(r.reward for r in records) / n if n else 0.0,
            turns_mean=sum(r.turns for r in records) / n if n else 0.0,
            failed=sum(r.failed for r in records),
            statuses=dict(sorted(Counter(r.status for r in records).items())),
            success_threshold=success_threshold,
            benchmark=card.get("benchmark"),
            invalid_action_rule=card.get("invalid_action_rule"),
        )


@dataclass
class EvalReport:
    """What :func:`agentrl_ext.eval.evaluate` returns and ``agentrl-eval-run`` writes as JSON."""

    label: str
    settings: dict[str, Any]
    episodes: list[EpisodeRecord]
    summary: dict[str, TaskSummary]
    #: each model's share of all assistant turns
    turn_share: dict[str, float]

    @classmethod
    def build(
        cls,
        label: str,
        settings: dict[str, Any],
        episodes: Sequence[EpisodeRecord],
        thresholds: Mapping[str, float],
        task_cards: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> EvalReport:
        """Summarize ``episodes`` per task (in the order tasks first appear) and per model;
        ``task_cards``: per task, what its workers report of the run (benchmark, invalid-action rule)."""
        cards = task_cards or {}
        by_task: dict[str, list[EpisodeRecord]] = defaultdict(list)
        for record in episodes:
            by_task[record.task].append(record)
        turns = Counter(m for r in episodes for m in r.models)
        total = sum(turns.values())
        return cls(
            label=label,
            settings=dict(settings),
            episodes=list(episodes),
            summary={t: TaskSummary.of(rs, thresholds[t], cards.get(t)) for t, rs in by_task.items()},
            turn_share={m: n / total for m, n in sorted(turns.items())} if total else {},
        )

    def rename_tasks(self, names: Mapping[str, str]) -> EvalReport:
        """Rename tasks in place (e.g. the held-out worker ``guess_test`` to ``guess``); returns self."""
        renamed = [names.get(t, t) for t in self.summary]
        if len(set(renamed)) != len(renamed):
            raise ValueError(f"renaming tasks {list(self.summary)} with {dict(names)} merges two of them")
        for record in self.episodes:
            record.task = names.get(record.task, record.task)
        self.summary = {names.get(t, t): s for t, s in self.summary.items()}
        if isinstance(self.settings.get("tasks"), list):
            self.settings["tasks"] = [names.get(t, t) for t in self.settings["tasks"]]
        return self

    def failure_summary(self, limit: int = 3) -> str | None:
        """One line on the episodes that failed for reasons outside the agent (unreachable model
        endpoint or environment, task errors), with the most common errors; None when none failed."""
        failed = [r for r in self.episodes if r.failed]
        if not failed:
            return None
        errors = Counter((r.error or r.status).splitlines()[0][:200] for r in failed).most_common(limit)
        per_task = Counter(r.task for r in failed)
        return (
            f"{len(failed)} of {len(self.episodes)} episodes failed, not by the agent's doing "
            f"({', '.join(f'{t}: {n}' for t, n in per_task.items())}); "
            + "; ".join(f"{n}x {e}" for e, n in errors)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "label": self.label,
            "settings": self.settings,
            "summary": {t: asdict(s) for t, s in self.summary.items()},
            "turn_share": self.turn_share,
            "episodes": [
                {k: v for k, v in asdict(r).items() if k not in ("messages", "record")} for r in self.episodes
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "report") -> EvalReport:
        if data.get("version") != REPORT_VERSION or "summary" not in data:
            raise ValueError(
                f"{source} is not an agentrl-eval-run results file of version {REPORT_VERSION} "
                f"(found version {data.get('version')!r}); re-run agentrl-eval-run to write one"
            )
        return cls(
            label=str(data.get("label", "")),
            settings=dict(data.get("settings", {})),
            episodes=[EpisodeRecord(**r) for r in data.get("episodes", [])],
            summary={t: TaskSummary(**s) for t, s in data["summary"].items()},
            turn_share=dict(data.get("turn_share", {})),
        )

    def save(self, path: str | Path) -> Path:
        """Write the JSON results file (parent folders are created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> EvalReport:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read evaluation results {path}: {exc}") from exc
        return cls.from_dict(data, source=str(path))


def episodes_path(summary_path: str | Path) -> Path:
    """The episodes file (JSON Lines, one :class:`EpisodeRecord` with its transcript a line) beside
    the summary file: ``eval/before_rl.json`` -> ``eval/before_rl.episodes.jsonl``."""
    path = Path(summary_path)
    return path.with_name(f"{path.stem}.episodes.jsonl")


def read_episodes(path: str | Path) -> dict[tuple[str, str, int], EpisodeRecord]:
    """The records of an episodes file by :attr:`EpisodeRecord.key` (a later line of the same
    episode wins: a resumed run appends); an unreadable last line (a run killed mid-write) is skipped."""
    records: dict[tuple[str, str, int], EpisodeRecord] = {}
    lines = Path(path).read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = EpisodeRecord(**json.loads(line))
        except (json.JSONDecodeError, TypeError) as exc:
            if number == len(lines):
                continue
            raise ValueError(f"{path}:{number} is not an episode record: {exc}") from None
        records[record.key] = record
    return records


def count_episode_files(
    paths: Sequence[Path], count: Callable[[Iterable[dict[str, Any]]], T]
) -> dict[str, T]:
    """``count`` of each episodes file's rows (plain dicts: a diagnostic reads only the fields it
    needs), by the path as given; raises FileNotFoundError naming a path that is not a file."""
    counts: dict[str, T] = {}
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (an evaluation's eval/*.episodes.jsonl)")
        with path.open() as lines:
            counts[str(path)] = count(json.loads(line) for line in lines if line.strip())
    return counts


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table; the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}%"


def _has_cards(reports: Sequence[EvalReport]) -> bool:
    return any(s.benchmark or s.invalid_action_rule for r in reports for s in r.summary.values())


def render_table(report: EvalReport) -> str:
    """The per-task table: episodes, success rate, mean reward, mean turns, failed, statuses; with
    the benchmark and invalid-action rule the workers reported, when any task reported them."""
    cards = _has_cards([report])
    header = ["task", *(["benchmark", "rule"] if cards else []), "episodes", "success", "reward", "turns"]
    header += ["failed", "statuses"]
    rows = [
        [
            task,
            *([s.benchmark or "-", s.invalid_action_rule or "-"] if cards else []),
            str(s.episodes),
            _percent(s.success_rate),
            f"{s.reward_mean:.3f}",
            f"{s.turns_mean:.2f}",
            str(s.failed),
            ", ".join(f"{status} {n}" for status, n in s.statuses.items()),
        ]
        for task, s in report.summary.items()
    ]
    text = _table(header, rows)
    if len(report.turn_share) > 1:
        text += "\nturn share: " + ", ".join(f"{m} {100 * v:.1f}%" for m, v in report.turn_share.items())
    return text


def rate_interval(summary: TaskSummary, z: float = 1.96) -> float:
    """Half-width of the 95% interval of ``summary.success_rate``, in rate units: the normal
    approximation for a binomial proportion, ``z * sqrt(p (1 - p) / n)``. NaN without episodes."""
    if not summary.episodes:
        return math.nan
    p = summary.success_rate
    return z * math.sqrt(p * (1 - p) / summary.episodes)


def change_interval(before: TaskSummary, after: TaskSummary, z: float = 1.96) -> float:
    """Half-width of the 95% interval of ``after.success_rate - before.success_rate``, in rate
    units: the normal approximation for two independent binomial proportions,
    ``z * sqrt(p0 (1 - p0) / n0 + p1 (1 - p1) / n1)``. NaN when either has no episodes."""
    return math.hypot(rate_interval(before, z), rate_interval(after, z))


def _caption(reports: Sequence[EvalReport]) -> str:
    """How each evaluation sampled: episodes per task and temperature (greedy at 0)."""
    parts = []
    for i, r in enumerate(reports):
        episodes = sorted({s.episodes for s in r.summary.values()})
        temperature = r.settings.get("temperature")
        sampling = ""
        if temperature is not None:
            sampling = ", greedy" if float(temperature) == 0 else f", temperature {temperature:g}"
        count = "/".join(str(n) for n in episodes)
        parts.append(f"{r.label or f'#{i}'}: {count} episodes per task{sampling}")
    return "; ".join(parts)


def render_comparison(reports: Sequence[EvalReport]) -> str:
    """Success rate per task side by side (e.g. before and after RL), with the change from the
    first and its 95% interval (:func:`change_interval`); a caption says how each was sampled."""
    if not reports:
        raise ValueError("render_comparison needs at least one evaluation report")
    tasks = list(dict.fromkeys(t for r in reports for t in r.summary))
    labels = [r.label or f"#{i}" for i, r in enumerate(reports)]
    header = ["task", *(f"{label} success" for label in labels)]
    if len(reports) > 1:
        header += ["change", "95% interval"]
    rows = []
    for task in tasks:
        rates = [r.summary[task].success_rate if task in r.summary else math.nan for r in reports]
        row = [task, *(_percent(x) for x in rates)]
        if len(reports) > 1:
            change = rates[-1] - rates[0]
            first, last = reports[0].summary.get(task), reports[-1].summary.get(task)
            interval = change_interval(first, last) if first is not None and last is not None else math.nan
            row.append("-" if math.isnan(change) else f"{100 * change:+.1f} pts")
            row.append("-" if math.isnan(interval) else f"±{100 * interval:.1f} pts")
        rows.append(row)
    return _table(header, rows) + "\n" + _caption(reports) + _card_differences(reports, labels)


def render_arms(reports: Sequence[EvalReport], labels: Sequence[str] | None = None) -> str:
    """The first report (e.g. before RL) and every later one (e.g. RL's arms from the same start)
    side by side: each later report's success, its change from the first and the change's 95%
    interval (:func:`change_interval`). ``labels`` replace the reports' own."""
    if len(reports) < 2:
        raise ValueError("render_arms needs a first report and at least one to compare with it")
    labels = list(labels) if labels else [r.label or f"#{i}" for i, r in enumerate(reports)]
    if len(labels) != len(reports):
        raise ValueError(f"render_arms: {len(labels)} labels for {len(reports)} reports")
    tasks = list(dict.fromkeys(t for r in reports for t in r.summary))
    header = ["task", f"{labels[0]} success"]
    for label in labels[1:]:
        header += [f"{label} success", f"{label} change"]
    rows = []
    for task in tasks:
        first = reports[0].summary.get(task)
        row = [task, _percent(first.success_rate) if first else "-"]
        for report in reports[1:]:
            later = report.summary.get(task)
            if later is None or first is None:
                row += [_percent(later.success_rate) if later else "-", "-"]
                continue
            change = later.success_rate - first.success_rate
            row += [
                _percent(later.success_rate),
                f"{100 * change:+.1f} ± {100 * change_interval(first, later):.1f} pts",
            ]
        rows.append(row)
    relabelled = [replace(r, label=label) for r, label in zip(reports, labels, strict=True)]
    return _table(header, rows) + "\n" + _caption(relabelled) + _card_differences(relabelled, labels)


def _card_differences(reports: Sequence[EvalReport], labels: Sequence[str]) -> str:
    """Lines naming each task whose benchmark or invalid-action rule differs between the reports
    (their success rates measure different things); empty when all agree."""
    notes = []
    for task in dict.fromkeys(t for r in reports for t in r.summary):
        for field_name, what in (("benchmark", "benchmark"), ("invalid_action_rule", "invalid-action rule")):
            values = [
                (label, getattr(r.summary[task], field_name))
                for label, r in zip(labels, reports, strict=True)
                if task in r.summary
            ]
            if len({v for _, v in values}) > 1:
                shown = ", ".join(f"{label} {v or 'not reported'}" for label, v in values)
                notes.append(
                    f"\nnote: {task} ran under different {what}s ({shown}): not the same measurement"
                )
    return "".join(notes)


def main(argv: list[str] | None = None) -> int:
    """``python -m agentrl_ext.eval.report FIRST.json LATER.json ... [--labels a,b,c] [--out F]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m agentrl_ext.eval.report",
        description="Evaluation results side by side: each later one's change from the first, with its 95% interval.",
    )
    parser.add_argument(
        "reports", nargs="+", type=Path, help="results JSON files (agentrl-eval-run --out, RUN/eval/*.json)"
    )
    parser.add_argument(
        "--labels", default="", help="comma-separated names, one per file (default: their own)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.reports if not p.is_file()]
    if missing or len(args.reports) < 2:
        parser.error(f"need at least two results files; missing: {', '.join(missing) or 'none'}")
    labels = [x for x in args.labels.split(",") if x] or None
    if labels is not None and len(labels) != len(args.reports):
        parser.error(f"--labels names {len(labels)} reports, but {len(args.reports)} files were given")
    table = render_arms([EvalReport.load(p) for p in args.reports], labels)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
