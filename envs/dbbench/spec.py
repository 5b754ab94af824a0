"""DBBench's entry in the task catalogue (:mod:`agentrl_ext.env.tasks`)."""

from agentrl_ext.env.tasks import TaskSpec

SPEC = TaskSpec(
    name="dbbench",
    task_class="agentrl_ext.envs.dbbench.task:DBBenchTask",
    needs=("mariadb", "data"),
    splits={"train": {"split": "train"}, "test": {"split": "standard"}},
)
