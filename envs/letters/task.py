"""``letters``: a multi-turn toy task with a dense reward, for CPU training runs and tests.

The agent is asked to write one letter (``alphabet[index % len(alphabet)]``) as often as
it can over ``turns`` turns. Every turn counts, tool call or not (``say(text)`` or plain
text), so even an untrained tiny model plays whole multi-turn episodes. The reward is
the share of the requested character in everything the agent wrote, in [0, 1]: dense,
so GRPO groups have reward variance from the first step.

``digits`` is the same game on digits: two tasks with different reward scales make a
small multi-task mix.
"""

from __future__ import annotations

from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import SampleResult, Session, Task, function_tool


class LettersTask(Task):
    """Write one character as often as possible, over several turns."""

    name = "letters"
    alphabet = "abcdefghij"
    tools = [function_tool("say", "Say a text.", {"text": {"type": "string", "description": "what to say"}})]
    concurrency = 64

    def __init__(self, num_indices: int = 64, turns: int = 3, **overrides: Any) -> None:
        super().__init__(**overrides)
        if num_indices < 1 or turns < 1:
            raise ValueError(
                f"{type(self).__name__} needs num_indices >= 1 and turns >= 1, got {num_indices}, {turns}"
            )
        self.num_indices = num_indices
        self.turns = turns

    def get_indices(self) -> list[SampleIndex]:
        return list(range(self.num_indices))

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        target = self.alphabet[int(index) % len(self.alphabet)]
        session.inject({"role": "user", "content": f"Write the character {target} as often as you can."})
        written = ""
        for turn in range(self.turns):
            action = await session.action(validate=False)
            written += (action.content or "") + "".join(
                str(c.arguments.get("text", "")) for c in action.tool_calls
            )
            reward = written.count(target) / len(written) if written else 0.0
            session.report(reward, chars=len(written))
            if turn + 1 < self.turns:
                session.inject({"role": "user", "content": f"Again: the character {target}."})
        return SampleResult(SampleStatus.COMPLETED, reward=reward, result={"chars": len(written)})


class DigitsTask(LettersTask):
    """The same game on digits."""

    name = "digits"
    alphabet = "0123456789"
