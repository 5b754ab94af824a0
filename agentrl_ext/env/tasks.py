"""The task catalogue: every task that ``agentrl-envs``, ``agentrl-train`` and the expert data can
start, each described by its own package.

A task package (ours under ``envs/<task>/``, or a third party's) declares a :class:`TaskSpec` and
names it in the entry-point group ``agentrl_ext.tasks`` of its distribution::

    [options.entry_points]
    agentrl_ext.tasks =
        mytask = mypackage.mytask.spec:SPEC

:func:`task_specs` finds them all (one spec module each is imported, nothing else of the task), so a
task added by another package is started, listed and checked exactly as ours are.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, distributions
from typing import Any

ENTRY_POINT_GROUP = "agentrl_ext.tasks"
#: the splits a task is started on (``--split`` / ``agentrl.envs.split``)
SPLITS = ("train", "test")
#: the servers a task may need (``TaskSpec.needs``)
SERVICES = ("mariadb", "docker", "data")


@dataclass(frozen=True)
class TaskSpec:
    """What it takes to start one task."""

    name: str
    """The task's name (``agentrl.envs.tasks``, ``--tasks``, a dataset's ``data_source``)."""
    task_class: str
    """The Task class, ``module:Class``."""
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Task kwargs per split (``train`` / ``test``)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Task kwargs for every split."""
    needs: tuple[str, ...] = ()
    """Servers it needs: ``mariadb`` (scripts/mariadb.sh; passed as ``mariadb_url`` unless the
    kwargs say ``backend: sqlite``), ``docker`` (the engine, as ``DOCKER_HOST``), ``data`` (the
    benchmark data directory, :mod:`agentrl_ext.env.data_files`; mounted into its container)."""
    expert: str | None = None
    """Its scripted expert policy, ``module:function`` (``expert_action(messages)``), if it has one."""
    worker_cpus: float = 1.0
    """CPUs one worker needs (``placement: ray`` asks Ray for them; per-session containers have their own limits)."""
    worker_memory_mb: int = 512
    """Memory one worker needs, MiB (``placement: ray`` asks Ray for it)."""

    def __post_init__(self) -> None:
        if ":" not in self.task_class:
            raise ValueError(f"task {self.name!r}: task_class {self.task_class!r} must be 'module:Class'")
        if self.expert is not None and ":" not in self.expert:
            raise ValueError(f"task {self.name!r}: expert {self.expert!r} must be 'module:function'")
        if not (self.worker_cpus > 0 and self.worker_memory_mb > 0):
            raise ValueError(
                f"task {self.name!r}: worker_cpus={self.worker_cpus} and worker_memory_mb={self.worker_memory_mb} "
                "must be positive"
            )
        unknown = sorted(set(self.needs) - set(SERVICES)) + sorted(set(self.splits) - set(SPLITS))
        if unknown:
            raise ValueError(
                f"task {self.name!r}: unknown needs/splits {unknown}; needs are {SERVICES}, splits {SPLITS}"
            )

    def kwargs_for(self, split: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The kwargs the task is started with: the spec's, the split's, then ``overrides``."""
        if split not in SPLITS:
            raise ValueError(f"split {split!r}; expected one of {SPLITS}")
        return {**self.kwargs, **self.splits.get(split, {}), **(overrides or {})}


def train_and_test(task_class: str, **spec: Any) -> dict[str, Any]:
    """Spec fields of a task whose kwarg ``split`` is ``train`` / ``test`` as the launcher's."""
    return {
        "task_class": task_class,
        "splits": {"train": {"split": "train"}, "test": {"split": "test"}},
        **spec,
    }


@functools.cache
def task_specs() -> dict[str, TaskSpec]:
    """Every installed task, by name (entry-point group ``agentrl_ext.tasks``), in name order."""
    # every distribution's entries, not importlib's first-per-name: a stale ``*.egg-info`` left in a
    # checkout (found first when Python runs from there) must not hide the installed metadata
    points: dict[str, EntryPoint] = {}
    for dist in distributions():
        for point in dist.entry_points.select(group=ENTRY_POINT_GROUP):
            if points.setdefault(point.name, point).value != point.value:
                raise ValueError(
                    f"two installed packages declare task {point.name!r} ({ENTRY_POINT_GROUP}): "
                    f"{points[point.name].value} and {point.value}"
                )
    found: dict[str, TaskSpec] = {}
    for point in points.values():
        spec = point.load()
        if not isinstance(spec, TaskSpec):
            raise TypeError(
                f"entry point {point.name} = {point.value} in group {ENTRY_POINT_GROUP} is a "
                f"{type(spec).__name__}, not an agentrl_ext.env.tasks.TaskSpec"
            )
        if spec.name != point.name:
            raise ValueError(f"entry point {point.name} = {point.value} declares a spec named {spec.name!r}")
        found[spec.name] = spec
    if not found:
        raise LookupError(
            f"no task is installed (entry-point group {ENTRY_POINT_GROUP} is empty): agentrl_ext's "
            "metadata is missing; reinstall it (`pip install -e .` in the checkout, or `make setup`)"
        )
    return dict(sorted(found.items()))


def task_spec(name: str) -> TaskSpec:
    """The spec of task ``name``; ValueError listing the known tasks (and the closest) otherwise."""
    specs = task_specs()
    if name not in specs:
        close = difflib.get_close_matches(name, specs, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown task {name!r}{hint}; known tasks: {', '.join(specs)}")
    return specs[name]
