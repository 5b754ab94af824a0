"""The letters and digits tasks' entries in the task catalogue (:mod:`agentrl_ext.env.tasks`)."""

from agentrl_ext.env.tasks import TaskSpec

LETTERS = TaskSpec(name="letters", task_class="agentrl_ext.envs.letters.task:LettersTask")
DIGITS = TaskSpec(name="digits", task_class="agentrl_ext.envs.letters.task:DigitsTask")
