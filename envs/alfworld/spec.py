"""ALFWorld's entry in the task catalogue (:mod:`agentrl_ext.env.tasks`)."""

from agentrl_ext.env.tasks import TaskSpec

SPEC = TaskSpec(
    name="alfworld",
    task_class="agentrl_ext.envs.alfworld.task:ALFWorldTask",
    needs=("data",),
    splits={"train": {"split": "train"}, "test": {"split": "new_std"}},
)
