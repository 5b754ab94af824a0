"""The evaluation's uncertainty: 95% intervals of a success rate and of a change, in the table and the bars."""

from __future__ import annotations

import math

import pytest

from agentrl_ext.eval.plots import eval_figure
from agentrl_ext.eval.report import (
    EpisodeRecord,
    EvalReport,
    TaskSummary,
    change_interval,
    main,
    rate_interval,
    render_arms,
    render_comparison,
)


def _summary(successes: int, episodes: int) -> TaskSummary:
    rate = successes / episodes if episodes else 0.0
    return TaskSummary(episodes, rate, rate, 1.0, 0, {}, 1.0)


def test_change_interval_matches_the_two_proportion_normal_approximation():
    # 30/100 -> 50/200: 1.96 * sqrt(0.3*0.7/100 + 0.5*0.5/200) = 1.96 * sqrt(0.0021 + 0.00125)
    assert change_interval(_summary(30, 100), _summary(100, 200)) == pytest.approx(0.113443, abs=1e-6)
    # nothing varies at 0% or 100%: no width
    assert change_interval(_summary(0, 50), _summary(50, 50)) == 0.0
    assert math.isnan(change_interval(_summary(0, 0), _summary(3, 10)))


def _report(label: str, successes: list[bool], temperature: float) -> EvalReport:
    records = [EpisodeRecord("guess", i, 0, float(s), s, 3, "completed") for i, s in enumerate(successes)]
    return EvalReport.build(label, {"temperature": temperature}, records, {"guess": 1.0})


def test_comparison_shows_change_interval_and_sampling():
    before = _report("before_rl", [True] * 30 + [False] * 70, 0.7)
    after = _report("after_rl", [True] * 50 + [False] * 50, 0.7)
    table = render_comparison([before, after])
    lines = table.splitlines()
    assert lines[0].split() == [
        "task",
        "before_rl",
        "success",
        "after_rl",
        "success",
        "change",
        "95%",
        "interval",
    ]
    # 1.96 * sqrt(0.3*0.7/100 + 0.5*0.5/100) = 0.1329
    assert lines[2].split() == ["guess", "30.0%", "50.0%", "+20.0", "pts", "±13.3", "pts"]
    assert lines[3] == (
        "before_rl: 100 episodes per task, temperature 0.7; after_rl: 100 episodes per task, temperature 0.7"
    )
    greedy = render_comparison([_report("sft", [True, False], 0.0)])
    assert greedy.splitlines()[-1] == "sft: 2 episodes per task, greedy"


def test_arms_show_each_ones_change_from_the_first_on_cpu(tmp_path, capsys):
    before = _report("before_rl", [True] * 30 + [False] * 70, 0.7)
    norm = _report("after_rl", [True] * 50 + [False] * 50, 0.7)
    plain = _report("after_rl", [True] * 20 + [False] * 80, 0.7)
    table = render_arms([before, norm, plain], ["before_rl", "task_norm_grpo", "grpo"])
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["task", "before_rl", "success"]
    # 1.96 * sqrt(0.3*0.7/100 + 0.5*0.5/100) = 0.1329; 1.96 * sqrt(0.3*0.7/100 + 0.2*0.8/100) = 0.1192
    assert lines[2].split() == [
        "guess",
        "30.0%",
        "50.0%",
        "+20.0",
        "±",
        "13.3",
        "pts",
        "20.0%",
        "-10.0",
        "±",
        "11.9",
        "pts",
    ]
    assert "task_norm_grpo: 100 episodes" in lines[3] and "grpo: 100 episodes" in lines[3]
    with pytest.raises(ValueError, match="2 labels for 3 reports"):
        render_arms([before, norm, plain], ["a", "b"])
    paths = []
    for name, report in (("b", before), ("n", norm), ("p", plain)):
        paths.append(str(report.save(tmp_path / f"{name}.json")))
    assert (
        main([*paths, "--labels", "before_rl,task_norm_grpo,grpo", "--out", str(tmp_path / "arms.md")]) == 0
    )
    assert (tmp_path / "arms.md").read_text().strip() == table
    assert capsys.readouterr().out.strip() == table


def test_rate_interval_is_the_binomial_normal_approximation():
    # 1.96 * sqrt(0.3 * 0.7 / 100) = 1.96 * 0.0458258 = 0.0898185
    assert rate_interval(_summary(30, 100)) == pytest.approx(0.0898185, abs=1e-6)
    assert rate_interval(_summary(0, 40)) == 0.0
    assert math.isnan(rate_interval(_summary(0, 0)))


def test_eval_bars_carry_the_rate_intervals():
    before = _report("before_rl", [True] * 30 + [False] * 70, 0.7)
    after = _report("after_rl", [True] * 50 + [False] * 50, 0.7)
    ax = eval_figure([before, after]).axes[0]
    # one error bar per bar, spanning rate ± 1.96 * sqrt(p (1 - p) / n), in percent
    spans = []
    for container in ax.containers:
        if type(container).__name__ == "ErrorbarContainer":
            _line, _caps, (lines,) = container.lines
            spans += [(float(seg[0][1]), float(seg[1][1])) for seg in lines.get_segments()]
    # 1.96 * sqrt(0.3 * 0.7 / 100) = 8.98185; 1.96 * sqrt(0.25 / 100) = 9.8
    assert len(spans) == 2
    assert spans[0] == pytest.approx((30 - 8.98185, 30 + 8.98185), abs=1e-4)
    assert spans[1] == pytest.approx((50 - 9.8, 50 + 9.8), abs=1e-4)
