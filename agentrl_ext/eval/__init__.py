"""Evaluation through the controller (``agentrl-eval-run``) and run plots (``agentrl-plot``).

Library use (what the main job calls)::

    from agentrl_ext.eval import EvalSettings, evaluate, plot_run, render_comparison, render_table

    before = evaluate(controller_url, ["guess", "calc"], [sft_model_dir], EvalSettings(), label="before_rl")
    ...
    print(render_comparison([before, after]))
    plot_run(run_dir)
"""

from __future__ import annotations

from agentrl_ext.eval.plots import plot_run
from agentrl_ext.eval.report import EpisodeRecord, EvalReport, TaskSummary, render_comparison, render_table
from agentrl_ext.eval.runner import EvalSettings, evaluate, evaluate_async, parse_indices

__all__ = [
    "EpisodeRecord",
    "EvalReport",
    "EvalSettings",
    "TaskSummary",
    "evaluate",
    "evaluate_async",
    "parse_indices",
    "plot_run",
    "render_comparison",
    "render_table",
]
