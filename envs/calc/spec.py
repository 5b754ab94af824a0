"""The calc task's entry in the task catalogue (:mod:`agentrl_ext.env.tasks`)."""

from agentrl_ext.env.tasks import TaskSpec, train_and_test

SPEC = TaskSpec(
    name="calc",
    expert="agentrl_ext.envs.calc.expert:expert_action",
    **train_and_test("agentrl_ext.envs.calc.task:CalcTask"),
)
