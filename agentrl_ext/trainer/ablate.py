"""``agentrl-ablate`` (``make ablations``): AgentRL's ablations in miniature (its Table 6), one command.

Arms (``--arms``, default all three), each trained with RL from the same warm-start weights and
evaluated on the same held-out episodes:

- ``full``: the recipe as it is (task-normalized GRPO, cross-policy sampling);
- ``no_task_norm``: verl's ``grpo`` estimator instead (``algorithm.adv_estimator=grpo``);
- ``no_cross_policy``: no stale pool (``agentrl.cross_policy.enable=false``);
- ``single_task`` (AgentRL's Table 3: one model per task against the multi-task one): one run per
  task of the recipe, RL on that task alone for ``1 / n_tasks`` of the recipe's steps (the recipe
  interleaves the tasks round robin, so each single-task model gets as many RL episodes of its
  task as the multi-task model did), evaluated on its own task.

For every seed of ``--seeds`` (paired: seed k of every arm shares its data order, rollout and
routing seeds), one ``agentrl-train`` run per arm. The first run (``full``, first seed) also runs
the recipe's warm start and its evaluation before RL; the others start RL from its SFT weights.
A run whose ``eval/after_rl.json`` exists is not run again (re-run the command after a failure or
Ctrl-C: finished runs are kept). The time it expects is printed before the first run, and each
run's start and end with the time left.

Writes ``OUT/ablations.md`` and ``OUT/ablations.json``: per task, each arm's held-out success
(mean over seeds, 95% interval of the evaluation's binomial noise) and its paired difference to
``full`` (the mean over seeds of arm − full, with its interval, and each seed's difference).

    agentrl-ablate --seeds 1,2 --out outputs/ablations [-- extra agentrl-train overrides ...]
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl_ext import cli

ARMS: dict[str, tuple[str, ...]] = {
    "full": (),
    "no_task_norm": ("algorithm.adv_estimator=grpo",),
    "no_cross_policy": ("agentrl.cross_policy.enable=false",),
    "single_task": (),  # its overrides depend on the task: Plan.command
}
#: the arms not in the default ``--arms`` (Table 3's comparison, a separate question from Table 6's)
EXTRA_ARMS = ("single_task",)
#: the keys a seed sets, so that seed k of every arm sees the same data order, samples and routing
SEED_KEYS = (
    "data.seed",
    "actor_rollout_ref.rollout.seed",
    "actor_rollout_ref.actor.data_loader_seed",
    "agentrl.cross_policy.seed",
)
#: what one run costs on the 2-core machine, for the estimate printed up front (measured on the
#: main job, docs/learning_runs.md): start-up and evaluation, and an RL step
RUN_OVERHEAD_S = 240.0
RL_STEP_S = 8.0
WARM_START_S = 420.0
Z95 = 1.96


@dataclass(frozen=True)
class Run:
    """One ``agentrl-train`` run of the ablation."""

    arm: str
    seed: int
    folder: Path
    warm_start: bool
    #: the one task a ``single_task`` run trains and evaluates (None: the recipe's tasks)
    task: str | None = None

    @property
    def result(self) -> Path:
        return self.folder / "eval" / "after_rl.json"

    @property
    def timing(self) -> Path:
        """``{"took_s": ...}``, written when the run finishes: a resumed ablation's estimate and
        its table's wall time count the runs of earlier invocations too."""
        return self.folder / "ablate_run.json"

    def took_s(self) -> float | None:
        """The seconds this run took, if it finished with its time recorded."""
        try:
            return float(json.loads(self.timing.read_text())["took_s"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


@dataclass
class Plan:
    """The runs of an ablation, in order (the warm-starting run first)."""

    recipe: str
    arms: list[str]
    seeds: list[int]
    out: Path
    overrides: list[str] = field(default_factory=list)
    #: the recipe's tasks and RL steps (with the overrides), which ``single_task`` divides
    tasks: list[str] = field(default_factory=list)
    rl_steps: int = 0
    #: the tasks the recipe gives kwargs (``agentrl.envs.task_kwargs``): a ``single_task`` run
    #: drops the other tasks' (the environment stack refuses kwargs of tasks it does not start)
    kwargs_tasks: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ValueError(f"--arms {','.join(self.arms)}: choose from {','.join(ARMS)}")
        if "full" not in self.arms:
            raise ValueError("--arms must include full: every other arm is compared with it")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"--seeds {self.seeds}: give distinct seeds, e.g. 1,2")
        if "single_task" in self.arms and len(self.tasks) < 2:
            raise ValueError(
                f"--arms single_task needs a recipe of several tasks; agentrl.envs.tasks is {self.tasks}"
            )

    @property
    def single_task_steps(self) -> int:
        """RL steps of a ``single_task`` run: the recipe's share of steps per task (at least 1)."""
        return max(1, round(self.rl_steps / max(1, len(self.tasks))))

    @property
    def runs(self) -> list[Run]:
        arms = ["full", *[a for a in self.arms if a != "full"]]
        runs = []
        for seed in self.seeds:
            for arm in arms:
                if arm == "single_task":
                    runs += [
                        Run(arm, seed, self.out / f"single_task_{task}_seed{seed}", False, task)
                        for task in self.tasks
                    ]
                else:
                    warm = (arm, seed) == ("full", self.seeds[0])
                    runs.append(Run(arm, seed, self.out / f"{arm}_seed{seed}", warm_start=warm))
        return runs

    @property
    def warm_start_run(self) -> Run:
        return self.runs[0]

    def sft_weights(self) -> Path:
        """The warm start's last SFT checkpoint (HF layout) in the warm-starting run's folder."""
        found = sorted(
            (self.warm_start_run.folder / "sft").glob("global_step_*/huggingface"),
            key=lambda p: int(p.parent.name.rsplit("_", 1)[1]),
        )
        if not found:
            raise RuntimeError(
                f"no SFT checkpoint in {self.warm_start_run.folder / 'sft'}: the warm-starting run did not "
                "finish its warm start (its log says why)"
            )
        return found[-1].resolve()

    def command(self, run: Run) -> list[str]:
        """The ``agentrl-train`` command line of ``run``."""
        argv = [sys.executable, "-m", "agentrl_ext.trainer.main", "--config-name", self.recipe]
        argv += [f"trainer.default_local_dir={run.folder}", f"hydra.run.dir={run.folder / 'hydra'}"]
        argv += [f"{key}={run.seed}" for key in SEED_KEYS]
        if not run.warm_start:
            argv += [
                "agentrl.sft.enable=false",
                "agentrl.eval.before_rl=false",
                "agentrl.assets.build_tiny_model=false",
                f"actor_rollout_ref.model.path={self.sft_weights()}",
            ]
        argv += list(ARMS[run.arm]) + self.overrides
        if run.task is not None:
            argv += [f"~agentrl.envs.task_kwargs.{t}" for t in self.kwargs_tasks if t != run.task]
            argv += [
                f"agentrl.envs.tasks=[{run.task}]",
                f"agentrl.eval.tasks=[{run.task}]",
                f"trainer.total_training_steps={self.single_task_steps}",
            ]
        return argv

    def expected_s(self, run: Run) -> float:
        """What ``run`` is expected to take by the constants above (measured on 2 cores)."""
        steps = self.rl_steps if run.task is None else self.single_task_steps
        return RUN_OVERHEAD_S + RL_STEP_S * steps + (WARM_START_S if run.warm_start else 0.0)

    def took(self) -> dict[Run, float]:
        """The finished runs whose time is recorded (this invocation's and earlier ones'), in seconds."""
        times = {run: run.took_s() for run in self.runs if run.result.exists()}
        return {run: t for run, t in times.items() if t is not None}

    def estimate_s(self, took: dict[Run, float] | None = None) -> float:
        """What the runs left are expected to take. ``took``: finished runs and their seconds
        (default: those recorded, :meth:`took`); the constants are then scaled by how this machine
        compares with them (a shared machine's speed varies by 2x from day to day)."""
        scale = 1.0
        took = self.took() if took is None else took
        if took:
            scale = sum(took.values()) / sum(self.expected_s(r) for r in took)
        return scale * sum(self.expected_s(r) for r in self.runs if not r.result.exists())


# ---------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Cell:
    """One arm on one task: its success per seed (and the episodes behind each)."""

    rates: dict[int, float]
    episodes: dict[int, int]

    @property
    def mean(self) -> float:
        return sum(self.rates.values()) / len(self.rates)

    def variance(self, seed: int) -> float:
        p, n = self.rates[seed], self.episodes[seed]
        return p * (1 - p) / n if n else math.nan

    @property
    def interval(self) -> float:
        """95% half-width of the mean over seeds, from each evaluation's binomial noise."""
        return Z95 * math.sqrt(sum(self.variance(s) for s in self.rates)) / len(self.rates)


def paired_difference(arm: Cell, full: Cell) -> tuple[float, float, dict[int, float]]:
    """(mean over seeds of arm − full, its 95% half-width from the evaluations' noise, per seed)."""
    seeds = sorted(set(arm.rates) & set(full.rates))
    if not seeds:
        return math.nan, math.nan, {}
    per_seed = {s: arm.rates[s] - full.rates[s] for s in seeds}
    spread = math.sqrt(sum(arm.variance(s) + full.variance(s) for s in seeds)) / len(seeds)
    return sum(per_seed.values()) / len(seeds), Z95 * spread, per_seed


def collect(plan: Plan) -> dict[str, dict[str, Cell]]:
    """``{task: {arm: Cell}}`` from every finished run's held-out evaluation (episodes that failed
    outside the agent's control are left out of a rate, as in every table of ours)."""
    from agentrl_ext.eval.report import EvalReport

    cells: dict[str, dict[str, Cell]] = {}
    for run in plan.runs:
        if not run.result.exists():
            continue
        for task, summary in EvalReport.load(run.result).summary.items():
            cell = cells.setdefault(task, {}).setdefault(run.arm, Cell({}, {}))
            cell.rates[run.seed] = summary.success_rate_of_ran if summary.ran else math.nan
            cell.episodes[run.seed] = summary.ran
    return cells


def render(plan: Plan, cells: dict[str, dict[str, Cell]]) -> str:
    """The markdown table: per task and arm, held-out success and the paired difference to full."""
    arms = ["full", *[a for a in plan.arms if a != "full"]]
    lines = [
        f"Held-out success, mean of seeds {','.join(map(str, plan.seeds))} (± 95% interval of the "
        "evaluations' binomial noise); each arm's paired difference to full, per seed in brackets.",
        "",
        "| task | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for task in sorted(cells):
        row = [task]
        full = cells[task].get("full")
        for arm in arms:
            cell = cells[task].get(arm)
            if cell is None:
                row.append("-")
                continue
            text = f"{100 * cell.mean:.1f}% ± {100 * cell.interval:.1f}"
            if arm != "full" and full is not None:
                diff, half, per_seed = paired_difference(cell, full)
                seeds = ", ".join(f"{100 * d:+.1f}" for _s, d in sorted(per_seed.items()))
                text += f"; {100 * diff:+.1f} ± {100 * half:.1f} [{seeds}]"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def to_json(plan: Plan, cells: dict[str, dict[str, Cell]], took: dict[Run, float]) -> dict[str, Any]:
    """The table as JSON, with each run's recorded seconds and their sum (``wall_s``: runs of every
    invocation, whose time was recorded)."""
    out: dict[str, Any] = {
        "recipe": plan.recipe,
        "seeds": plan.seeds,
        "overrides": plan.overrides,
        "wall_s": sum(took.values()),
        "runs_s": {_name(run): seconds for run, seconds in took.items()},
    }
    out["tasks"] = {
        task: {
            arm: {
                "rates": cell.rates,
                "episodes": cell.episodes,
                "mean": cell.mean,
                "interval": cell.interval,
                **(
                    dict(
                        zip(
                            ("diff_to_full", "diff_interval", "diff_per_seed"),
                            paired_difference(cell, arms["full"]),
                            strict=True,
                        )
                    )
                    if arm != "full" and "full" in arms
                    else {}
                ),
            }
            for arm, cell in arms.items()
        }
        for task, arms in cells.items()
    }
    return out


# ---------------------------------------------------------------------------- the command


def _name(run: Run) -> str:
    return f"{run.arm}{'' if run.task is None else ' ' + run.task} seed {run.seed}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


def _recipe_shape(recipe: str, overrides: Sequence[str]) -> tuple[list[str], int, list[str]]:
    """The recipe's tasks, RL steps and the tasks it gives kwargs, with ``overrides``."""
    from hydra import compose, initialize_config_dir

    from agentrl_ext.trainer.main import recipes_dir

    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(config_name=recipe, overrides=[o for o in overrides if not o.startswith("hydra.")])
    return (
        [str(t) for t in config.agentrl.envs.tasks],
        int(config.trainer.total_training_steps or 0),
        [str(t) for t in (config.agentrl.envs.task_kwargs or {})],
    )


def main(argv: list[str] | None = None) -> int:
    """``agentrl-ablate``: run the plan (or print it with ``--dry-run``), then write the table."""
    parser = cli.parser("agentrl-ablate", __doc__)
    parser.add_argument("--recipe", default="cpu_multitask", help="the recipe every arm trains")
    parser.add_argument(
        "--arms",
        default=",".join(a for a in ARMS if a not in EXTRA_ARMS),
        help=f"comma-separated, of: {','.join(ARMS)} ({','.join(EXTRA_ARMS)} only when named)",
    )
    parser.add_argument("--seeds", default="1,2", help="comma-separated seeds, paired across arms")
    parser.add_argument(
        "--out", type=Path, default=Path("outputs/ablations"), help="run folders and the table"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the runs and their commands only")
    parser.add_argument("overrides", nargs="*", help="agentrl-train overrides for every run (after --)")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        tasks, steps, kwargs_tasks = _recipe_shape(args.recipe, args.overrides)
        plan = Plan(
            args.recipe,
            [a for a in args.arms.split(",") if a],
            seeds,
            args.out.resolve(),
            args.overrides,
            tasks=tasks,
            rl_steps=steps,
            kwargs_tasks=kwargs_tasks,
        )
    except ValueError as exc:
        parser.error(str(exc))
    runs = plan.runs
    single = (
        f", single-task runs {plan.single_task_steps} steps on one task" if "single_task" in plan.arms else ""
    )
    print(
        f"agentrl-ablate: {len(runs)} runs ({len(plan.arms)} arms x {len(seeds)} seeds, {steps} RL steps each{single}) "
        f"of {plan.recipe} in {plan.out}; expected about {_minutes(plan.estimate_s())} on 2 cores "
        f"({sum(r.result.exists() for r in runs)} already done)",
        flush=True,
    )
    if args.dry_run:
        for i, run in enumerate(runs, 1):
            weights = "" if run.warm_start else " (from the warm start's SFT weights)"
            print(f"[{i}/{len(runs)}] {_name(run)}{weights}: {run.folder}")
        return 0
    plan.out.mkdir(parents=True, exist_ok=True)
    for i, run in enumerate(runs, 1):
        if run.result.exists():
            print(f"[{i}/{len(runs)}] {_name(run)}: done before, kept ({run.result})", flush=True)
            continue
        run.folder.mkdir(parents=True, exist_ok=True)
        log = run.folder / "ablate.log"
        t0 = time.monotonic()
        print(f"[{i}/{len(runs)}] {_name(run)}: running (log {log}) ...", flush=True)
        with log.open("w") as sink:
            code = subprocess.call(plan.command(run), stdout=sink, stderr=subprocess.STDOUT)
        if code != 0 or not run.result.exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            print(
                f"agentrl-ablate: {_name(run)} failed (exit {code}); log {log}:\n{tail}",
                file=sys.stderr,
            )
            return 1
        took_s = time.monotonic() - t0
        run.timing.write_text(json.dumps({"took_s": took_s}))
        print(
            f"[{i}/{len(runs)}] {_name(run)}: done in {_minutes(took_s)}; "
            f"about {_minutes(plan.estimate_s())} left",
            flush=True,
        )
    cells = collect(plan)
    table = render(plan, cells)
    (plan.out / "ablations.md").write_text(table + "\n")
    (plan.out / "ablations.json").write_text(json.dumps(to_json(plan, cells, plan.took()), indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
