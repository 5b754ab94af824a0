"""KG's entry in the task catalogue (:mod:`agentrl_ext.env.tasks`)."""

from agentrl_ext.env.tasks import TaskSpec, train_and_test

SPEC = TaskSpec(name="kg", **train_and_test("agentrl_ext.envs.kg.task:KGTask"))
