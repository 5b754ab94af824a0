"""agentrl-ablate: the plan (runs, their commands, resumption), the arms' overrides as real config
keys, and the paired table against figures worked out by hand."""

from __future__ import annotations

import math

import pytest
from hydra import compose, initialize_config_dir

from agentrl_ext.eval.report import EpisodeRecord, EvalReport
from agentrl_ext.trainer.ablate import ARMS, SEED_KEYS, Cell, Plan, collect, main, paired_difference, render
from agentrl_ext.trainer.main import recipes_dir


def _plan(tmp_path, arms=("full", "no_task_norm", "no_cross_policy"), seeds=(1, 2)):
    return Plan("cpu_multitask", list(arms), list(seeds), tmp_path, ["trainer.total_training_steps=3"])


def _fake_sft(plan: Plan) -> None:
    for step in (2, 10):  # the last checkpoint by step number, not by name
        (plan.warm_start_run.folder / "sft" / f"global_step_{step}" / "huggingface").mkdir(parents=True)


def test_runs_pair_every_arm_by_seed_and_warm_start_once_on_cpu(tmp_path):
    plan = _plan(tmp_path)
    runs = plan.runs
    assert [(r.arm, r.seed) for r in runs] == [
        ("full", 1), ("no_task_norm", 1), ("no_cross_policy", 1),
        ("full", 2), ("no_task_norm", 2), ("no_cross_policy", 2),
    ]  # fmt: skip
    assert [r.warm_start for r in runs] == [True] + [False] * 5
    _fake_sft(plan)
    first, later = plan.command(runs[0]), plan.command(runs[4])
    assert "agentrl.sft.enable=false" not in first and "actor_rollout_ref.model.path" not in " ".join(first)
    assert (
        f"actor_rollout_ref.model.path={tmp_path / 'full_seed1' / 'sft' / 'global_step_10' / 'huggingface'}"
        in later
    )
    assert (
        "algorithm.adv_estimator=grpo" in later
        and f"trainer.default_local_dir={tmp_path / 'no_task_norm_seed2'}" in later
    )
    assert [f"{key}=2" for key in SEED_KEYS] == [a for a in later if a.split("=")[0] in SEED_KEYS]
    assert later[-1] == "trainer.total_training_steps=3"  # the user's overrides come last, and win


def test_a_run_without_sft_weights_is_named_on_cpu(tmp_path):
    plan = _plan(tmp_path)
    with pytest.raises(RuntimeError, match="did not finish its warm start"):
        plan.command(plan.runs[1])


@pytest.mark.parametrize(
    ("arms", "seeds", "message"),
    [
        (["full", "no_ref"], [1], "choose from full,no_task_norm,no_cross_policy,single_task"),
        (["no_task_norm"], [1], "must include full"),
        (["full"], [1, 1], "distinct seeds"),
    ],
)
def test_bad_plans_are_named_on_cpu(tmp_path, arms, seeds, message):
    with pytest.raises(ValueError, match=message):
        Plan("cpu_multitask", arms, seeds, tmp_path)


def test_each_arms_overrides_change_what_the_arm_names_on_cpu():
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        full = compose(config_name="cpu_multitask", overrides=[f"{k}=7" for k in SEED_KEYS])
        no_norm = compose(config_name="cpu_multitask", overrides=list(ARMS["no_task_norm"]))
        no_cross = compose(config_name="cpu_multitask", overrides=list(ARMS["no_cross_policy"]))
    assert full.algorithm.adv_estimator == "task_norm_grpo" and full.agentrl.cross_policy.enable is True
    assert no_norm.algorithm.adv_estimator == "grpo" and no_norm.agentrl.cross_policy.enable is True
    assert (
        no_cross.algorithm.adv_estimator == "task_norm_grpo" and no_cross.agentrl.cross_policy.enable is False
    )
    assert full.data.seed == full.actor_rollout_ref.rollout.seed == full.agentrl.cross_policy.seed == 7


def test_paired_difference_by_hand_on_cpu():
    full = Cell({1: 0.5, 2: 0.8}, {1: 100, 2: 100})
    arm = Cell({1: 0.4, 2: 0.6}, {1: 100, 2: 100})
    diff, half, per_seed = paired_difference(arm, full)
    assert per_seed == {1: pytest.approx(-0.1), 2: pytest.approx(-0.2)}
    assert diff == pytest.approx(-0.15)
    # p(1-p)/n of each of the four evaluations: (0.24 + 0.24 + 0.25 + 0.16) / 100 = 0.0089
    assert half == pytest.approx(1.96 * math.sqrt(0.0089) / 2)
    assert full.interval == pytest.approx(1.96 * math.sqrt((0.25 + 0.16) / 100) / 2)


def _report(path, successes: dict[str, int], n: int = 10) -> None:
    episodes = [
        EpisodeRecord(task, i, 0, float(i < k), i < k, 2, "completed")
        for task, k in successes.items()
        for i in range(n)
    ]
    EvalReport.build("after_rl", {}, episodes, {t: 1.0 for t in successes}).save(path)


def test_collect_and_render_read_every_finished_run_on_cpu(tmp_path):
    plan = _plan(tmp_path, arms=("full", "no_task_norm"), seeds=(1, 2))
    for run, k in zip(plan.runs, (6, 5, 8, 6), strict=True):  # full 1, no_task_norm 1, full 2, no_task_norm 2
        run.result.parent.mkdir(parents=True)
        _report(run.result, {"guess": k})
    cells = collect(plan)
    assert cells["guess"]["full"].rates == {1: 0.6, 2: 0.8}
    assert cells["guess"]["no_task_norm"].rates == {1: 0.5, 2: 0.6}
    table = render(plan, cells)
    assert "| guess | 70.0% ±" in table and "; -15.0 ±" in table and "[-10.0, -20.0]" in table


def test_dry_run_prints_the_plan_and_its_time_on_cpu(tmp_path, capsys):
    assert (
        main(["--out", str(tmp_path), "--seeds", "3,4", "--dry-run", "--", "trainer.total_training_steps=5"])
        == 0
    )
    out = capsys.readouterr().out
    assert "6 runs (3 arms x 2 seeds, 5 RL steps each)" in out and "expected about" in out
    assert (
        "[1/6] full seed 3:" in out
        and "[6/6] no_cross_policy seed 4 (from the warm start's SFT weights)" in out
    )


def test_single_task_runs_one_model_per_task_on_its_share_of_steps_on_cpu(tmp_path):
    plan = Plan(
        "cpu_multitask",
        ["full", "single_task"],
        [1],
        tmp_path,
        ["x=1"],
        tasks=["guess", "calc", "gridroom"],
        rl_steps=45,
    )
    runs = plan.runs
    assert [(r.arm, r.task) for r in runs] == [
        ("full", None), ("single_task", "guess"), ("single_task", "calc"), ("single_task", "gridroom"),
    ]  # fmt: skip
    _fake_sft(plan)
    calc = plan.command(runs[2])
    # 45 steps of 16 prompts round robin over 3 tasks: 15 steps of calc alone spend as many calc episodes
    assert calc[-3:] == [
        "agentrl.envs.tasks=[calc]",
        "agentrl.eval.tasks=[calc]",
        "trainer.total_training_steps=15",
    ]
    assert f"trainer.default_local_dir={tmp_path / 'single_task_calc_seed1'}" in calc
    assert "agentrl.sft.enable=false" in calc
    # each single-task model fills its own task's column
    for run, k in zip(runs, (7, 6, 3, 5), strict=True):
        run.result.parent.mkdir(parents=True)
        _report(run.result, {"guess": k, "calc": k, "gridroom": k} if run.task is None else {run.task: k})
    cells = collect(plan)
    assert {task: cells[task]["single_task"].rates for task in cells} == {
        "guess": {1: 0.6}, "calc": {1: 0.3}, "gridroom": {1: 0.5},
    }  # fmt: skip
    assert "| calc | 70.0% ±" in render(plan, cells) and "; -40.0 ±" in render(plan, cells)
    with pytest.raises(ValueError, match="single_task needs a recipe of several tasks"):
        Plan("cpu_multitask", ["full", "single_task"], [1], tmp_path, tasks=["guess"], rl_steps=45)


def test_dry_run_of_single_task_prints_each_tasks_run_on_cpu(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--seeds", "1", "--arms", "full,single_task", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 runs (2 arms x 1 seeds, 45 RL steps each, single-task runs 15 steps on one task)" in out
    assert "[3/4] single_task calc seed 1 (from the warm start's SFT weights)" in out


def test_the_estimate_follows_this_machines_pace_on_cpu(tmp_path):
    from agentrl_ext.trainer.ablate import RL_STEP_S, RUN_OVERHEAD_S, WARM_START_S

    plan = Plan("cpu_multitask", ["full", "no_task_norm"], [1, 2], tmp_path, tasks=["guess"], rl_steps=45)
    one = RUN_OVERHEAD_S + 45 * RL_STEP_S  # a run without the warm start, by the constants
    assert plan.estimate_s() == pytest.approx(4 * one + WARM_START_S)
    # the first run took twice its constants: the three left are expected at twice theirs too
    first = plan.runs[0]
    first.result.parent.mkdir(parents=True)
    first.result.write_text("{}")
    assert plan.estimate_s({first: 2 * (one + WARM_START_S)}) == pytest.approx(2 * 3 * one)


def test_a_resumed_ablation_paces_and_times_itself_by_the_runs_of_earlier_invocations_on_cpu(
    tmp_path, monkeypatch, capsys
):
    """Each finished run records its seconds; a re-run command's estimate scales by them, and the
    table's JSON sums them (a resumed ablation's own wall time would count only the runs left)."""
    import json
    import subprocess

    from agentrl_ext.trainer import ablate

    plan = Plan("cpu_multitask", ["full", "no_task_norm"], [1], tmp_path, tasks=["guess"], rl_steps=45)
    first, second = plan.runs
    first.result.parent.mkdir(parents=True)
    _report(first.result, {"guess": 7})
    first.timing.write_text(json.dumps({"took_s": 2 * plan.expected_s(first)}))
    # the kept run took twice its constants: the one left is expected at twice its own
    assert plan.estimate_s() == pytest.approx(2 * plan.expected_s(second))
    (tmp_path / "full_seed1" / "sft" / "global_step_4" / "huggingface").mkdir(parents=True)

    def fake_run(argv, stdout, stderr):  # the second run "trains": its evaluation appears
        second.result.parent.mkdir(parents=True)
        _report(second.result, {"guess": 6})
        return 0

    monkeypatch.setattr(ablate, "_recipe_shape", lambda recipe, overrides: (["guess"], 45, []))
    monkeypatch.setattr(subprocess, "call", fake_run)
    assert main(["--out", str(tmp_path), "--seeds", "1", "--arms", "full,no_task_norm"]) == 0
    out = capsys.readouterr().out
    assert f"about {round(2 * plan.expected_s(second) / 60)} min on 2 cores (1 already done)" in out
    recorded = json.loads(second.timing.read_text())["took_s"]
    assert 0 <= recorded < 60
    table = json.loads((tmp_path / "ablations.json").read_text())
    assert table["runs_s"] == {"full seed 1": 2 * plan.expected_s(first), "no_task_norm seed 1": recorded}
    assert table["wall_s"] == pytest.approx(2 * plan.expected_s(first) + recorded)


@pytest.mark.parametrize("task", ["guess", "calc", "gridroom"])
def test_a_single_task_runs_config_starts_only_its_task_on_cpu(tmp_path, task):
    """Each single-task run's command, composed by Hydra as agentrl-train composes it, asks the
    environment stack for its task alone and for no other task's kwargs (the stack refuses those:
    the first single-task ablation died on the recipe's guess kwargs in the calc run)."""
    from agentrl_ext.env.launcher.stack import EnvStack
    from agentrl_ext.trainer.ablate import _recipe_shape

    overrides = ["++agentrl.envs.task_kwargs.gridroom={show_moves: true}"]  # the recipe gives guess's
    tasks, steps, kwargs_tasks = _recipe_shape("cpu_multitask", overrides)
    assert sorted(kwargs_tasks) == ["gridroom", "guess"]
    plan = Plan(
        "cpu_multitask", ["full", "single_task"], [1], tmp_path, overrides, tasks, steps, kwargs_tasks
    )
    _fake_sft(plan)
    [run] = [r for r in plan.runs if r.task == task]
    argv = plan.command(run)
    hydra_overrides = argv[argv.index("--config-name") + 2 :]
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(
            config_name="cpu_multitask", overrides=[o for o in hydra_overrides if not o.startswith("hydra.")]
        )
    assert list(config.agentrl.envs.tasks) == [task] and list(config.agentrl.eval.tasks) == [task]
    kwargs = {k: dict(v) for k, v in config.agentrl.envs.task_kwargs.items()}
    guess = {"high": 3, "max_turns": 2, "show_range": True}  # cpu_multitask.yaml
    expected = {"guess": {"guess": guess}, "calc": {}, "gridroom": {"gridroom": {"show_moves": True}}}
    assert kwargs == expected[task]
    EnvStack(tasks=list(config.agentrl.envs.tasks), port=1, kwargs=kwargs)  # what refused the first run
