"""agentrl-plot: curves from a synthetic verl file-logger log, before/after bars from eval results."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from agentrl_ext.eval.plots import curves_of, main, plot_run, read_metrics_log
from agentrl_ext.eval.report import EpisodeRecord, EvalReport

TASKS = ("guess", "calc")


def _train_success(task: str, step: int) -> float:
    return min(1.0, step / 20) if task == "guess" else 0.5


def _write_run(run_dir) -> None:
    """Steps 1..20 of training metrics, validation at steps 0, 10, 20 (verl logs step 0 on its own line)."""
    lines = [{"step": 0, "data": {"val-aux/guess/success/mean@4": 0.1, "val-core/guess/reward/mean@4": 0.1}}]
    for step in range(1, 21):
        data: dict[str, float] = {"actor/grad_norm": 1.0}
        for task in TASKS:
            data[f"agentrl/task/{task}/success_rate"] = _train_success(task, step)
            data[f"agentrl/task/{task}/episode_reward_mean"] = _train_success(task, step) - 0.2
            data[f"agentrl/task/{task}/status/completed"] = 4.0
            data[f"agentrl/task/{task}/signal/informative_group_share"] = 0.5 if task == "guess" else 0.25
            data[f"agentrl/task/{task}/signal/adv_abs_mean"] = 0.8
            data[f"agentrl/task/{task}/signal/action_token_share"] = 0.6 if task == "guess" else 0.4
        data["agentrl/cross_policy/turn_share/stale"] = 0.25
        data["agentrl/cross_policy/kl/stale"] = 0.01 * step
        if step % 10 == 0:
            for task in TASKS:
                data[f"val-aux/{task}/success/mean@1"] = step / 40
                data[f"val-aux/{task}/success/mean@4"] = step / 20  # the largest K is the one drawn
                data[f"val-core/{task}/reward/mean@4"] = step / 20
        lines.append({"step": step, "data": data})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    for label, rate in (("before_rl", 0.25), ("after_rl", 0.75)):
        episodes = [
            EpisodeRecord(task, i, 0, float(i < 4 * rate), i < 4 * rate, 2, "completed")
            for task in TASKS
            for i in range(4)
        ]
        settings = {"started": "2026-01-01T00:00:0" + ("0" if label == "before_rl" else "1")}
        EvalReport.build(label, settings, episodes, {t: 1.0 for t in TASKS}).save(
            run_dir / "eval" / f"{label}.json"
        )


def test_metrics_log_series_on_cpu(tmp_path):
    _write_run(tmp_path)
    curves = curves_of(read_metrics_log(tmp_path / "metrics.jsonl"))
    assert curves.tasks("success") == ["calc", "guess"]
    assert curves.train["success"]["guess"] == [(s, _train_success("guess", s)) for s in range(1, 21)]
    assert curves.train["reward"]["calc"] == [(s, pytest.approx(0.3)) for s in range(1, 21)]
    assert curves.val["success"]["guess"] == [(0, 0.1), (10, 0.5), (20, 1.0)]  # mean@4, not mean@1
    assert curves.val["reward"]["guess"] == [(0, 0.1), (10, 0.5), (20, 1.0)]
    assert curves.val["success"]["calc"] == [(10, 0.5), (20, 1.0)]


def test_signal_series_per_task_and_the_stale_copy_on_cpu(tmp_path):
    from agentrl_ext.eval.plots import signal_series

    _write_run(tmp_path)
    series = signal_series(read_metrics_log(tmp_path / "metrics.jsonl"))
    assert series["informative_group_share"]["calc"] == [(s, 0.25) for s in range(1, 21)]
    assert series["action_token_share"]["guess"] == [(s, 0.6) for s in range(1, 21)]
    assert series["agentrl/cross_policy/kl/stale"][""][-1] == (20, pytest.approx(0.2))


def test_plot_run_writes_valid_pngs_on_cpu(tmp_path, capsys):
    _write_run(tmp_path)
    assert main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    names = {"success.png", "reward.png", "eval_success.png", "signal.png"}
    assert {p.rsplit("/", 1)[-1] for p in printed} == names
    for name in names:
        path = tmp_path / "plots" / name
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width > 300 and image.height > 200
            image.verify()


def test_eval_results_alone_and_empty_folder_on_cpu(tmp_path, capsys):
    _write_run(tmp_path)
    (tmp_path / "metrics.jsonl").unlink()
    assert [p.name for p in plot_run(tmp_path, tmp_path / "out")] == ["eval_success.png"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit):
        main([str(empty)])
    assert "no metrics log" in capsys.readouterr().err


def test_bad_metrics_line_is_named_on_cpu(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"step": 1, "data": {}}\n{"step": oops}\n')
    with pytest.raises(ValueError, match=r"m.jsonl:2 is not a metrics line"):
        plot_run(tmp_path)


def test_failed_episodes_are_drawn_apart_not_as_zero_on_cpu():
    """An evaluation whose guess episodes all failed (endpoint down) draws no guess bar, only the
    label 'all 4 failed'; calc, one failed of four and two solved, is drawn at 2/3 with its label."""
    from agentrl_ext.eval.plots import eval_figure

    guess = [
        EpisodeRecord("guess", i, 0, 0.0, False, 0, "task error", "ConnectionRefused", True) for i in range(4)
    ]
    calc = [
        EpisodeRecord("calc", 0, 0, 1.0, True, 2, "completed"),
        EpisodeRecord("calc", 1, 0, 1.0, True, 2, "completed"),
        EpisodeRecord("calc", 2, 0, 0.0, False, 2, "completed"),
        EpisodeRecord("calc", 3, 0, 0.0, False, 0, "task error", "ConnectionRefused", True),
    ]
    report = EvalReport.build("down", {}, guess + calc, {"guess": 1.0, "calc": 1.0})
    ax = eval_figure([report]).axes[0]
    from matplotlib.container import BarContainer

    (container,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    bars = dict(zip(["guess", "calc"], container, strict=True))  # the tasks in the order they first appear
    assert not bars["guess"].get_visible()
    assert bars["calc"].get_visible() and bars["calc"].get_height() == pytest.approx(100 * 2 / 3)
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["all 4 failed", "67 (1 failed)"]
