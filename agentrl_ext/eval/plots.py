"""Per-task learning curves and before/after bars from a run folder: :func:`plot_run`, ``agentrl-plot``.

A run folder holds what a training run writes:

- **metrics logs**: verl's file logger (``trainer.logger=[console,file]`` with
  ``VERL_FILE_LOGGER_PATH=RUN_DIR/metrics.jsonl``), one JSON line per step,
  ``{"step": N, "data": {metric: value}}``. Read here: the trainer's per-task
  ``agentrl/task/<task>/success_rate`` and ``.../episode_reward_mean`` (training episodes) and
  verl's validation ``val-aux/<task>/success/mean@K`` and ``val-core/<task>/reward/mean@K``
  (held-out episodes, the largest K). Lines of the same step are merged.
- **evaluation results**: ``agentrl-eval-run`` JSON files anywhere below the folder (e.g.
  ``eval/before_rl.json``, ``eval/after_rl.json``), ordered by when each evaluation started.

Written (in ``RUN_DIR/plots`` unless told otherwise): ``success.png`` and ``reward.png``, one
panel per task, training value per step (thin) with its moving average (thick) and the
validation points; ``eval_success.png``, the success rate per task of each evaluation as
grouped bars with the 95% interval of each rate; ``signal.png``, what each task feeds the update
per step (``agentrl/task/<task>/signal/...``: share of informative groups, mean |advantage|, share
of the action tokens) and the stale copy's share of turns and KL to the current policy. Episodes that failed outside the agent's
control (``failed``: an endpoint or environment down) are left out of a bar and counted in its
label; a task none of whose episodes ran has no bar, only the label ``all N failed``.
Matplotlib draws without pyplot (no global backend, Agg for PNG).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl_ext import cli
from agentrl_ext.eval.report import EvalReport, TaskSummary, rate_interval

logger = logging.getLogger(__name__)

_TRAIN = re.compile(r"^agentrl/task/(?P<task>[^/]+)/(?P<var>success_rate|episode_reward_mean)$")
_VAL = re.compile(r"^val-(?:core|aux)/(?P<task>[^/]+)/(?P<var>success|reward)/mean@(?P<k>\d+)$")
#: larger JSON files are not evaluation results (100,000 episodes take ~25 MB)
MAX_REPORT_BYTES = 64 << 20
_KIND = {"success_rate": "success", "episode_reward_mean": "reward", "success": "success", "reward": "reward"}


@dataclass
class Curves:
    """Per-task series ``{kind: {task: [(step, value), ...]}}``, kind ``success`` or ``reward``."""

    train: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=lambda: defaultdict(dict))
    val: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=lambda: defaultdict(dict))

    def tasks(self, kind: str) -> list[str]:
        return sorted(set(self.train.get(kind, {})) | set(self.val.get(kind, {})))


def read_metrics_log(path: str | Path) -> dict[int, dict[str, Any]]:
    """verl's file-logger JSONL as ``{step: metrics}`` (lines of one step merged, later values win)."""
    steps: dict[int, dict[str, Any]] = defaultdict(dict)
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            steps[int(row["step"])].update(row["data"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{path}:{number} is not a metrics line of verl's file logger "
                f'({{"step": N, "data": {{...}}}}): {exc}'
            ) from None
    return dict(sorted(steps.items()))


def curves_of(steps: dict[int, dict[str, Any]]) -> Curves:
    """The per-task training and validation series in a metrics log."""
    curves = Curves()
    best_k: dict[tuple[str, str], int] = {}
    for metrics in steps.values():
        for key in metrics:
            match = _VAL.match(key)
            if match:
                ident = (match["task"], _KIND[match["var"]])
                best_k[ident] = max(best_k.get(ident, 0), int(match["k"]))
    for step, metrics in steps.items():
        for key, value in metrics.items():
            if not isinstance(value, int | float) or math.isnan(float(value)):
                continue
            if match := _TRAIN.match(key):
                curves.train[_KIND[match["var"]]].setdefault(match["task"], []).append((step, float(value)))
            elif (match := _VAL.match(key)) and int(match["k"]) == best_k[
                (match["task"], _KIND[match["var"]])
            ]:
                curves.val[_KIND[match["var"]]].setdefault(match["task"], []).append((step, float(value)))
    return curves


def find_metrics_logs(run_dir: Path) -> list[Path]:
    """JSONL files below ``run_dir`` whose first line is a verl file-logger line."""
    found = []
    for path in sorted(run_dir.rglob("*.jsonl")):
        with path.open() as fh:
            first = fh.readline()
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row and isinstance(row.get("data"), dict):
            found.append(path)
    return found


def find_eval_reports(run_dir: Path) -> list[EvalReport]:
    """``agentrl-eval-run`` results below ``run_dir``, oldest evaluation first."""
    reports = []
    for path in sorted(run_dir.rglob("*.json")):
        if path.stat().st_size > MAX_REPORT_BYTES:  # e.g. a checkpoint's tokenizer.json
            continue
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or "episodes" not in data or "summary" not in data:
                continue
            report = EvalReport.from_dict(data, source=str(path))
        except (OSError, ValueError, TypeError):
            continue
        report.label = report.label or path.stem
        reports.append((str(report.settings.get("started", "")), str(path), report))
    return [r for *_, r in sorted(reports, key=lambda x: (x[0], x[1]))]


def _moving_average(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 3)
    return (n + cols - 1) // cols, cols


def plot_curves(curves: Curves, kind: str, path: Path, smooth: int = 5) -> Path | None:
    """One panel per task: training ``kind`` per step and its moving average, validation points."""
    from matplotlib.figure import Figure

    tasks = curves.tasks(kind)
    if not tasks:
        return None
    rows, cols = _grid(len(tasks))
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    title = "success rate" if kind == "success" else "mean reward"
    for ax, task in zip(axes.flat, tasks, strict=False):
        train = curves.train.get(kind, {}).get(task, [])
        val = curves.val.get(kind, {}).get(task, [])
        if train:
            x, y = zip(*train, strict=True)
            ax.plot(x, y, color="tab:blue", alpha=0.3, linewidth=1, label="training episodes")
            if smooth > 1 and len(y) > smooth:
                ax.plot(
                    x,
                    _moving_average(y, smooth),
                    color="tab:blue",
                    linewidth=2,
                    label=f"training, mean of {smooth}",
                )
        if val:
            x, y = zip(*val, strict=True)
            ax.plot(x, y, color="tab:orange", marker="o", linewidth=1.5, label="validation (held-out)")
        ax.set_title(task)
        ax.set_xlabel("step")
        ax.set_ylabel(title)
        if kind == "success":
            ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(tasks) :]:
        ax.set_visible(False)
    fig.suptitle(f"per-task {title}")
    fig.savefig(path, dpi=110)
    return path


SIGNALS = (
    ("informative_group_share", "share of informative groups"),
    ("adv_abs_mean", "mean |advantage| (action tokens)"),
    ("action_token_share", "share of the loss's action tokens"),
)
_SIGNAL = re.compile(r"^agentrl/task/(?P<task>[^/]+)/signal/(?P<var>[a-z_]+)$")
_CROSS = {
    "agentrl/cross_policy/turn_share/stale": "share of turns from the stale copy",
    "agentrl/cross_policy/kl/stale": "KL(stale copy ‖ current policy) per token",
}


def signal_series(steps: dict[int, dict[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{metric: {task or "": [(step, value), ...]}}`` of the per-task training signal
    (:mod:`agentrl_ext.algos.signal`) and of the stale pool's share and KL."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(dict)
    for step, metrics in sorted(steps.items()):
        for key, value in metrics.items():
            if not isinstance(value, int | float) or math.isnan(float(value)):
                continue
            if (match := _SIGNAL.match(key)) and match["var"] in dict(SIGNALS):
                out[match["var"]].setdefault(match["task"], []).append((step, float(value)))
            elif key in _CROSS:
                out[key].setdefault("", []).append((step, float(value)))
    return out


def plot_signal(steps: dict[int, dict[str, Any]], path: Path) -> Path | None:
    """What each task feeds the update per step (one panel per signal metric, a line per task),
    and the stale copy's share of turns and KL to the current policy when cross-policy sampling ran."""
    from matplotlib.figure import Figure

    series = signal_series(steps)
    panels = [(name, title) for name, title in SIGNALS if name in series]
    panels += [(key, title) for key, title in _CROSS.items() if key in series]
    if not panels:
        return None
    rows, cols = _grid(len(panels))
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (name, title) in zip(axes.flat, panels, strict=False):
        for task, points in sorted(series[name].items()):
            x, y = zip(*points, strict=True)
            ax.plot(x, y, linewidth=1.5, label=task or None)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if any(series[name]):
            ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle("training signal per task")
    fig.savefig(path, dpi=110)
    return path


def plot_eval_reports(reports: Sequence[EvalReport], path: Path) -> Path | None:
    """Grouped bars: success rate per task of each evaluation (e.g. before and after RL), with
    the 95% interval of each rate (:func:`agentrl_ext.eval.report.rate_interval`) as error bars."""
    if not reports:
        return None
    eval_figure(reports).savefig(path, dpi=110)
    return path


def eval_figure(reports: Sequence[EvalReport]) -> Any:
    """The figure of :func:`plot_eval_reports` (a matplotlib ``Figure``)."""
    from matplotlib.figure import Figure

    tasks = list(dict.fromkeys(t for r in reports for t in r.summary))
    width = 0.8 / len(reports)
    fig = Figure(
        figsize=(max(4.5, 1.3 * len(tasks) * max(1, len(reports) / 2) + 2), 3.6), layout="constrained"
    )
    ax = fig.subplots()
    for i, report in enumerate(reports):
        xs = [t + (i - (len(reports) - 1) / 2) * width for t in range(len(tasks))]
        # failed episodes (endpoint or environment down) say nothing about the agent: the bar is the
        # rate over the episodes that ran, and its label says how many failed; none ran: no bar
        summaries = [report.summary.get(t) for t in tasks]
        ys = [100 * s.success_rate_of_ran if s is not None else math.nan for s in summaries]
        errors = [100 * _interval_of_ran(s) if s is not None and s.ran else 0.0 for s in summaries]
        bars = ax.bar(
            xs,
            [0.0 if math.isnan(y) else y for y in ys],
            width * 0.95,
            yerr=errors,
            capsize=3,
            label=report.label or f"evaluation {i + 1}",
        )
        ax.bar_label(bars, labels=[_bar_label(s, y) for s, y in zip(summaries, ys, strict=True)], fontsize=7)
        for bar, y in zip(bars, ys, strict=True):
            if math.isnan(y):
                bar.set_visible(False)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 108)
    ax.set_title("held-out success per task")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def _interval_of_ran(summary: TaskSummary) -> float:
    """:func:`rate_interval` over the episodes that ran."""
    ran = TaskSummary(summary.ran, summary.success_rate_of_ran, 0.0, 0.0, 0, {}, summary.success_threshold)
    return rate_interval(ran)


def _bar_label(summary: TaskSummary | None, percent: float) -> str:
    if summary is None:
        return ""
    if not summary.ran:
        return f"all {summary.failed} failed"
    return f"{percent:.0f}" + (f" ({summary.failed} failed)" if summary.failed else "")


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None, smooth: int = 5) -> list[Path]:
    """Draw every plot the run folder has data for; returns the PNG paths written.

    Raises ValueError when the folder has neither a metrics log nor an evaluation result.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ValueError(f"run folder {run} does not exist")
    out = Path(out_dir) if out_dir is not None else run / "plots"
    logs, reports = find_metrics_logs(run), find_eval_reports(run)
    if not logs and not reports:
        raise ValueError(
            f"{run} holds no metrics log (a *.jsonl of verl's file logger: trainer.logger=[console,file] "
            "VERL_FILE_LOGGER_PATH=RUN_DIR/metrics.jsonl) and no agentrl-eval-run results (*.json)"
        )
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    steps: dict[int, dict[str, Any]] = {}
    for log in logs:  # several logs (e.g. a resumed run): later files win on the same step
        for step, metrics in read_metrics_log(log).items():
            steps.setdefault(step, {}).update(metrics)
    curves = curves_of(dict(sorted(steps.items())))
    for kind in ("success", "reward"):
        path = plot_curves(curves, kind, out / f"{kind}.png", smooth)
        if path is not None:
            written.append(path)
    path = plot_signal(steps, out / "signal.png")
    if path is not None:
        written.append(path)
    if logs and not curves.tasks("success") and not curves.tasks("reward"):
        logger.warning("metrics logs %s hold no per-task metrics (agentrl/task/<task>/...): no curves", logs)
    path = plot_eval_reports(reports, out / "eval_success.png")
    if path is not None:
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Console script ``agentrl-plot RUN_DIR``."""
    parser = cli.parser("agentrl-plot", __doc__)
    parser.add_argument("run_dir", help="a run folder: verl metrics JSONL and/or agentrl-eval-run JSON files")
    parser.add_argument("--out", help="the folder the PNGs go to (none: RUN_DIR/plots)")
    parser.add_argument(
        "--smooth", type=int, default=5, help="moving-average window of training curves (1: none)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        paths = plot_run(args.run_dir, args.out, smooth=args.smooth)
    except ValueError as exc:
        parser.error(str(exc))
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
