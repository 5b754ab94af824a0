"""``alfworld``: AgentBench-FC's ALFWorld as a task worker.

The agent acts in a text household (TextWorld's PDDL engine with ALFWorld's games) by calling
``take_action(action)`` with one of the admissible commands it is shown; at most ``max_step``
(20) agent steps. The reward is the game's ``won`` (1 or 0). Everything the agent sees and every
rule follows AgentBench's ALFWorld task (see :mod:`.prompts` and :mod:`.actions`):

- the command is the first argument's value, stripped, lower-cased and cut at its first line;
  a command that is not admissible is replaced by the admissible command closest in BLEU (above
  0.01); ``put X in/on Y`` and ``move X to Y`` are the same command (the two grammars);
- only the agent's first tool call of a step is played;
- the same text three steps in a row (from the fourth step on) ends the episode:
  ``agent invalid action``, reward 0;
- the game won -> ``completed``, reward 1; ``max_step`` steps without winning ->
  ``task limit reached``, reward 0.

Invalid steps, with ``on_invalid_action="end"`` (for RL recipes that want it): no tool call,
arguments that are not a JSON object, or no string argument -> ``agent validation failed``; an
unknown tool -> ``agent invalid action``. With ``on_invalid_action="feedback"`` (the default: AgentBench-FC's own
behaviour) the agent gets AgentBench's message instead, the step counts, any tool name is
accepted, and, as in AgentBench, the episode's final status stays the last such problem's status
(``agent validation failed`` / ``agent invalid action``) even if the game is won later; the
reward is still the game's. A game process that fails or dies -> ``task error``; the worker
keeps serving.

    python -m agentrl_ext.env.worker agentrl_ext.envs.alfworld.task:ALFWorldTask \\
        --controller-url http://127.0.0.1:5020/api --task-kwargs '{"split": "new_std"}'
"""

from __future__ import annotations

import logging
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus, TaskOutput
from agentrl_ext.env.worker import InvalidAction, SampleResult, Session, Task
from agentrl_ext.env.worker.actions import AgentAction

from . import prompts
from .actions import resolve
from .data import Game, Split, load_split
from .engine import GameProcess, GameState, engine_missing

logger = logging.getLogger(__name__)

INVALID_ACTION_POLICIES = ("end", "feedback")
REPEAT_LIMIT = 3
"""AgentBench ends an episode whose last three actions are the same text (checked from step 4)."""


class ALFWorldTask(Task):
    """AgentBench-FC ALFWorld.

    Args:
        split: ``new_std`` (109 games, evaluation; aliases ``std``, ``test``), ``dev`` (20),
            ``standard`` (50) or ``train`` (AgentBench's ``train_valid``: the 2,714 vendored games).
        data_dir: the data directory (default: ``$AGENTRL_DATA_DIR`` or the XDG default).
        max_step: agent steps per episode (AgentBench-FC: 20).
        on_invalid_action: ``feedback`` (default: AgentBench-FC's rule, its message and the
            step counts against the round limit) or ``end`` (the step ends the episode; for RL
            recipes that want it); see the module docstring. ``calculate_overall`` records it.
        fuzzy_match: map a non-admissible command to the closest admissible one by BLEU, as
            AgentBench does (``False``: only exact commands and the put/move wording).
        limit: serve only the first ``limit`` games (smoke tests).
    """

    name = "alfworld"
    tools = prompts.TOOLS
    concurrency = 16  # AgentBench's alfworld.yaml
    step_time_limit_s = 120.0  # a game process that hangs -> task error

    def __init__(
        self,
        split: str = "new_std",
        data_dir: str | Path | None = None,
        max_step: int = 20,
        on_invalid_action: str = "feedback",
        fuzzy_match: bool = True,
        limit: int | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(**overrides)
        if on_invalid_action not in INVALID_ACTION_POLICIES:
            raise ValueError(
                f"ALFWorldTask on_invalid_action={on_invalid_action!r}; expected one of {INVALID_ACTION_POLICIES}"
            )
        if max_step < 1:
            raise ValueError(f"ALFWorldTask max_step must be >= 1, got {max_step}")
        if limit is not None and limit < 1:
            raise ValueError(f"ALFWorldTask limit must be >= 1 or None, got {limit}")
        missing = engine_missing()
        if missing is not None:
            raise RuntimeError(f"ALFWorldTask: {missing}")
        self.max_step = max_step
        self.on_invalid_action = on_invalid_action
        self.fuzzy_match = fuzzy_match
        self.split: Split = load_split(split, data_dir)
        # importing alfworld creates $ALFWORLD_DATA (default ~/.cache/alfworld); AgentBench points it here
        os.environ.setdefault("ALFWORLD_DATA", str(self.split.root))
        indices = self.split.indices
        self._indices = indices[:limit] if limit is not None else indices

    async def setup(self) -> None:
        logger.info("alfworld: %d %s games from %s", len(self._indices), self.split.name, self.split.root)

    def get_indices(self) -> list[SampleIndex]:
        return list(self._indices)

    def game(self, index: SampleIndex) -> Game:
        """The game of sample ``index`` (IndexError naming the split when there is none)."""
        try:
            position = int(index)
        except (TypeError, ValueError):
            raise IndexError(f"alfworld index {index!r} is not an integer") from None
        return self.split.game(position)

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        game = self.game(index)
        engine, state = await GameProcess.open(game.file)
        try:
            return await self._play(game, engine, state, session)
        finally:
            engine.close()

    async def _play(
        self, game: Game, engine: GameProcess, state: GameState, session: Session
    ) -> SampleResult:
        session.inject(
            {"role": "system", "content": prompts.SYSTEM_PROMPT},
            {"role": "user", "content": prompts.user_prompt(state.feedback, state.admissible)},
        )
        status = SampleStatus.COMPLETED  # AgentBench's finish_reason: "feedback" problems change it
        texts: list[str] = []  # the agent's action texts of the steps played
        matched: Counter[str] = Counter()
        log: list[dict[str, Any]] = []

        def result(final: SampleStatus, won: bool) -> SampleResult:
            return SampleResult(
                final,
                reward=1.0 if won else 0.0,
                metrics={
                    "won": int(won),
                    "steps": len(texts),
                    **{f"matched_{k}": v for k, v in matched.items()},
                },
                result={
                    "result": int(won),
                    "index": game.index,
                    "game": game.path,
                    "task_type": game.task_type,
                    "log": log,
                },
            )

        for _ in range(self.max_step):
            action = await session.action(validate=self.on_invalid_action == "end")
            problem = self._problem(action)
            if problem is not None:  # only in "feedback" mode
                status, message = problem
                session.inject({"role": "user", "content": message})
                continue
            call = action.tool_calls[0]
            text = next(iter(call.arguments.values()))
            resolved = resolve(text, state.admissible, self.fuzzy_match)
            matched[resolved.how.replace(" ", "_")] += 1
            state = await engine.step(resolved.command)
            session.inject(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": prompts.tool_reply(state.feedback, state.admissible),
                }
            )
            texts.append(text)
            log.append(
                {"round": len(log) + 1, "output": text, "action": resolved.command, "done": state.done}
            )
            if len(texts) > REPEAT_LIMIT and len(set(texts[-REPEAT_LIMIT:])) == 1:
                return result(SampleStatus.AGENT_INVALID_ACTION, False)
            if state.done:
                return result(status, state.won)
        return result(SampleStatus.TASK_LIMIT_REACHED, False)

    def _problem(self, action: AgentAction) -> tuple[SampleStatus, str] | None:
        """What is wrong with the step, as (status, AgentBench's message); raises in "end" mode."""
        if not action.tool_calls:
            if self.on_invalid_action == "end":  # not reached: session.action() raised already
                raise InvalidAction(SampleStatus.AGENT_VALIDATION_FAILED, "the agent's step has no tool call")
            return SampleStatus.AGENT_VALIDATION_FAILED, prompts.NO_TOOL_CALL
        arguments = action.tool_calls[0].arguments
        if arguments and isinstance(next(iter(arguments.values())), str):
            return None
        if self.on_invalid_action == "end":
            raise InvalidAction(
                SampleStatus.AGENT_VALIDATION_FAILED,
                f"tool call {action.tool_calls[0].name!r} needs a string 'action' argument, got {arguments!r}",
            )
        return SampleStatus.AGENT_INVALID_ACTION, prompts.BAD_TOOL_CALL

    @property
    def benchmark(self) -> str:
        """What this worker runs, as results should name it: ``alfworld-std`` on AgentBench's new_std."""
        return "alfworld-std" if self.split.name == "new_std" else f"alfworld-{self.split.name}"

    def calculate_overall(self, results: list[TaskOutput]) -> dict[str, Any]:
        """The default summary plus AgentBench's ``overall`` (total, pass, wrong, success_rate) and per task type."""
        overall = super().calculate_overall(results)
        by_type: dict[str, Counter[str]] = defaultdict(Counter)
        for output in results:
            result = output.result if isinstance(output.result, dict) else {}
            kind = str(result.get("task_type", "unknown"))
            by_type[kind]["total"] += 1
            by_type[kind]["pass"] += int(result.get("result", 0) == 1)
        total = sum(c["total"] for c in by_type.values())
        passed = sum(c["pass"] for c in by_type.values())
        overall["overall"] = {
            "total": total,
            "pass": passed,
            "wrong": total - passed,
            "success_rate": passed / total if total else 0.0,
        }
        overall["success_rate_by_type"] = {k: c["pass"] / c["total"] for k, c in sorted(by_type.items())}
        overall["invalid_action_rule"] = self.on_invalid_action
        overall["benchmark"] = self.benchmark
        return overall
