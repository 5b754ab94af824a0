"""The guess task's entry in the task catalogue (:mod:`agentrl_ext.env.tasks`)."""

from agentrl_ext.env.tasks import TaskSpec, train_and_test

SPEC = TaskSpec(
    name="guess",
    expert="agentrl_ext.envs.guess.expert:expert_action",
    **train_and_test("agentrl_ext.envs.guess.task:GuessTask"),
)
