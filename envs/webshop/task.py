"""``webshop``: WebShop (1000-product mode) with AgentBench-FC's tools, as a task worker.

``source="agentbench"`` serves AgentBench's WebShop goals (its indices) on the user's own copy of
WebShop's full data instead (README: "AgentBench's WebShop on your own data"; labelled
``webshop-std`` only with WebShop's own Lucene search and spaCy type score).

The agent shops for the goal's instruction with ``search_action(keywords)`` and
``click_action(value)``; at most ``max_round`` (20) agent steps. The first call of a step runs as
WebShop's ``search[keywords]`` / ``click[value]`` (:mod:`.env`) and is answered with AgentBench's
tool message ``Action: ...\\n\\nObservation:\\n...\\n\\nAvailable Actions:\\n...``. ``Buy Now``
ends the episode: status ``completed``, reward = WebShop's purchase reward in [0, 1]
(:mod:`.reward`).

Statuses: ``completed`` after a purchase; ``task limit reached`` after ``max_round`` steps
without one (reward 0, the last call answered ``Task limit reached.``). A click on a value that
is not clickable, a search with empty keywords, or a click on ``search``: WebShop does nothing,
the tool message shows the same page, the episode goes on (``running``) and the step counts.
Invalid steps, with ``on_invalid_action="end"`` (for RL recipes that want it): no tool call,
arguments that are not a JSON object, or a call without an argument -> ``agent validation
failed``; an unknown tool -> ``agent invalid action``. With ``on_invalid_action="feedback"`` (the default)
(AgentBench's own behaviour) the agent gets AgentBench's message instead and the step counts.

    python -m agentrl_ext.env.worker agentrl_ext.envs.webshop.task:WebShopTask \\
        --controller-url http://127.0.0.1:5020/api --task-kwargs '{"split": "test"}'
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus, TaskOutput
from agentrl_ext.env.worker import InvalidAction, SampleResult, Session, Task
from agentrl_ext.env.worker.actions import AgentAction, ToolCall

from . import prompts
from .catalogue import load_catalogue, load_webshop_catalogue
from .env import Episode, Shop
from .goals import AGENTBENCH_SPLITS, Goal, agentbench_goals, split_goals
from .reward import spacy_title_nouns, title_words
from .search import LuceneProductSearch

logger = logging.getLogger(__name__)

INVALID_ACTION_POLICIES = ("end", "feedback")
SPLIT_ALIASES = {"std": "test", "standard": "test", "env_train": "train"}
SOURCES = ("offline", "agentbench")
SEARCHES = ("bm25", "lucene")
TITLE_NOUNS = ("tokens", "spacy")
AGENTBENCH_SPLIT_ALIASES = {"test": "std", "standard": "std", "train": "env_train"}


class WebShopTask(Task):
    """WebShop in 1000-product mode with AgentBench-FC's tools.

    Args:
        split: ``test`` (evaluation) or ``train`` (see :mod:`.goals`).
        data_dir: the data directory (default: ``$AGENTRL_DATA_DIR`` or the XDG default).
        seed: seeds the split, the goals' price bounds and range prices.
        test_fraction: share of the products (with goals) held out for ``test``.
        test_goals_per_product: synthetic goals per test product (all its human goals too).
        max_round: agent steps per episode (AgentBench-FC: 20).
        on_invalid_action: ``feedback`` (default: AgentBench-FC's rule, its message and the
            step counts against the round limit) or ``end`` (the step ends the episode; for RL
            recipes that want it); see the module docstring. ``calculate_overall`` records it.
        limit: serve only the first ``limit`` goals (smoke tests).
        source: ``offline`` (the vendored 1,000-product catalogue, our goals and split) or
            ``agentbench`` (AgentBench's WebShop goals on the user's own copy of WebShop's full
            data in ``webshop_data``; splits ``std``, ``dev``, ``env_train`` with AgentBench's
            indices); see the README, "AgentBench's WebShop on your own data".
        webshop_data: the folder with WebShop's ``items_shuffle.json``, ``items_ins_v2.json``,
            ``items_human_ins.json`` (source ``agentbench``).
        search: ``bm25`` (bm25s, our stand-in for Lucene) or ``lucene`` (WebShop's own
            Pyserini/Lucene index in ``lucene_index``; needs pyserini and Java).
        lucene_index: WebShop's Lucene index folder (``search_engine/indexes``), for ``lucene``.
        title_nouns: the type score's title words: ``tokens`` (plain words) or ``spacy``
            (WebShop's nouns by spaCy ``en_core_web_lg``; needs spaCy and the model).
    """

    name = "webshop"
    tools = prompts.TOOLS
    concurrency = 64

    def __init__(
        self,
        split: str = "test",
        data_dir: str | Path | None = None,
        seed: int = 0,
        test_fraction: float = 0.2,
        test_goals_per_product: int = 3,
        max_round: int = 20,
        on_invalid_action: str = "feedback",
        limit: int | None = None,
        source: str = "offline",
        webshop_data: str | Path | None = None,
        search: str = "bm25",
        lucene_index: str | Path | None = None,
        title_nouns: str = "tokens",
        **overrides: Any,
    ) -> None:
        super().__init__(**overrides)
        for setting, value, allowed in (
            ("source", source, SOURCES),
            ("search", search, SEARCHES),
            ("title_nouns", title_nouns, TITLE_NOUNS),
        ):
            if value not in allowed:
                raise ValueError(f"WebShopTask {setting}={value!r}; expected one of {allowed}")
        if on_invalid_action not in INVALID_ACTION_POLICIES:
            raise ValueError(
                f"WebShopTask on_invalid_action={on_invalid_action!r}; expected one of {INVALID_ACTION_POLICIES}"
            )
        if max_round < 1:
            raise ValueError(f"WebShopTask max_round must be >= 1, got {max_round}")
        self.source, self.search, self.title_nouns = source, search, title_nouns
        self.max_round = max_round
        self.on_invalid_action = on_invalid_action
        if source == "agentbench":
            if webshop_data is None:
                raise ValueError(
                    "WebShopTask source='agentbench' needs webshop_data, the folder with WebShop's full "
                    "items_shuffle.json, items_ins_v2.json and items_human_ins.json (not available offline; "
                    "see envs/webshop/README.md), or use source='offline'"
                )
            self.split = AGENTBENCH_SPLIT_ALIASES.get(split, split)
            if self.split not in AGENTBENCH_SPLITS:
                raise ValueError(
                    f"WebShopTask split={split!r} for source='agentbench'; expected one of {list(AGENTBENCH_SPLITS)}"
                )
            catalogue = load_webshop_catalogue(webshop_data, seed)
            every = agentbench_goals(catalogue, seed)
            wanted = AGENTBENCH_SPLITS[self.split]
            # AgentBench's sample index is the goal's position in WebShop's shuffled list
            self.indexed = {i: every[i] for i in wanted if i < len(every)}
            if not self.indexed:
                raise ValueError(
                    f"WebShopTask split={self.split!r} wants goals {wanted.start}..{wanted.stop - 1}, but "
                    f"{webshop_data} gives {len(every)} human goals: is it WebShop's full data?"
                )
        else:
            self.split = SPLIT_ALIASES.get(split, split)
            catalogue = load_catalogue(data_dir, seed)
            goals = split_goals(catalogue, self.split, seed, test_fraction, test_goals_per_product)
            self.indexed = dict(enumerate(goals))
        if limit is not None:
            self.indexed = dict(list(self.indexed.items())[:limit])
        self.goals: list[Goal] = list(self.indexed.values())
        engine = None
        if search == "lucene":
            if lucene_index is None:
                raise ValueError(
                    "WebShopTask search='lucene' needs lucene_index, WebShop's Lucene index folder "
                    "(search_engine/indexes, built by its run_indexing.sh from the same items_shuffle.json)"
                )
            engine = LuceneProductSearch(lucene_index, [p.asin for p in catalogue.products])
        self.shop = Shop(catalogue, engine, spacy_title_nouns() if title_nouns == "spacy" else title_words)
        logger.info(
            "webshop: %d %s goals over %d products (seed %d)",
            len(self.goals),
            self.split,
            len(catalogue.products),
            seed,
        )

    def get_indices(self) -> list[SampleIndex]:
        return list(self.indexed)

    def goal(self, index: SampleIndex) -> Goal:
        """The goal of sample ``index``; IndexError naming the range."""
        goal = self.indexed.get(int(index))
        if goal is None:
            first, last = min(self.indexed), max(self.indexed)
            raise IndexError(f"webshop index {index!r} out of range {first}..{last} of split {self.split!r}")
        return goal

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        goal = self.goal(index)
        episode = Episode(self.shop, goal)
        session.inject(
            {"role": "system", "content": prompts.SYSTEM_PROMPT},
            {
                "role": "user",
                "content": prompts.initial_message(episode.observation, episode.available_actions()),
            },
        )
        last: list[ToolCall] = []  # the calls of the latest step that ran
        for round_number in range(1, self.max_round + 1):
            action = await session.action(validate=self.on_invalid_action == "end")
            command = self._command(action)
            if command is None:  # only in "feedback" mode
                self._feedback(session, episode, action)
                continue
            last = action.tool_calls
            _, done = episode.step(command)
            if done:
                return self._result(episode, index, goal)
            if round_number < self.max_round:
                content = prompts.action_message(command, episode.observation, episode.available_actions())
                self._answer(session, last, content)
        if last:
            self._answer(session, last, prompts.TASK_LIMIT_REACHED)
        else:
            session.inject({"role": "user", "content": prompts.TASK_LIMIT_REACHED})
        return SampleResult(
            SampleStatus.TASK_LIMIT_REACHED,
            reward=0.0,
            metrics={"steps": self.max_round, **episode.counts},
            result={"reward": 0.0, "index": int(index), "kind": goal.kind, "goal_asin": goal.asin},
        )

    def _command(self, action: AgentAction) -> str | None:
        """WebShop's action text for the step's first call (its first argument value, as AgentBench
        takes it); None when the step cannot run ("feedback" mode only, else InvalidAction)."""
        if action.problem is not None or not action.tool_calls:
            return None
        call = action.tool_calls[0]
        if not call.arguments:
            if self.on_invalid_action == "feedback":
                return None
            wanted = "keywords" if call.name == prompts.SEARCH_ACTION else "value"
            raise InvalidAction(
                SampleStatus.AGENT_VALIDATION_FAILED, f"tool call {call.name!r} has no {wanted!r} argument"
            )
        value = next(iter(call.arguments.values()))
        verb = "search" if call.name == prompts.SEARCH_ACTION else "click"
        return f"{verb}[{value}]"

    @staticmethod
    def _answer(session: Session, calls: list[ToolCall], content: str) -> None:
        """Answer the step's first call with ``content`` and any further call with NOT_EXECUTED."""
        first, *others = calls
        session.inject({"role": "tool", "tool_call_id": first.id, "content": content})
        for other in others:
            session.inject({"role": "tool", "tool_call_id": other.id, "content": prompts.NOT_EXECUTED})

    def _feedback(self, session: Session, episode: Episode, action: AgentAction) -> None:
        """AgentBench's answers to a step it cannot run (``on_invalid_action="feedback"``); each
        call is answered by a tool message so that the history stays valid OpenAI format."""
        observation = episode.observation
        if not action.tool_calls:
            observation = prompts.NO_TOOL_CALL
        for call in action.tool_calls:
            session.inject({"role": "tool", "tool_call_id": call.id, "content": prompts.NO_VALID_TOOL_CALL})
        session.inject(
            {"role": "user", "content": prompts.observation_message(observation, episode.available_actions())}
        )

    def _result(self, episode: Episode, index: SampleIndex, goal: Goal) -> SampleResult:
        assert episode.reward is not None
        parts = episode.reward
        return SampleResult(
            SampleStatus.COMPLETED,
            reward=parts.reward,
            metrics={**parts.metrics(), **episode.counts, "success": float(parts.reward == 1.0)},
            result={
                "reward": parts.reward,
                "index": int(index),
                "kind": goal.kind,
                "goal_asin": goal.asin,
                "asin": episode.asin,
                "options": dict(episode.options),
            },
        )

    @property
    def benchmark(self) -> str:
        """What this worker runs, as results should name it: ``webshop-offline`` (the 1,000-product
        catalogue, mostly synthetic goals, BM25), which is not AgentBench's ``webshop-std``. With
        ``source="agentbench"``: ``webshop-std`` (``webshop-dev``, ``webshop-env_train``) only with
        WebShop's own search (Lucene) and type score (spaCy nouns); with a stand-in for either,
        ``webshop-full-<split>-`` and what stands in (``bm25``, ``nospacy``)."""
        if self.source == "agentbench":
            stand_ins = [
                name
                for name, used in (
                    ("bm25", self.search != "lucene"),
                    ("nospacy", self.title_nouns != "spacy"),
                )
                if used
            ]
            if not stand_ins:
                return f"webshop-{self.split}"
            return f"webshop-full-{self.split}-" + "-".join(stand_ins)
        return "webshop-offline" if self.split == "test" else f"webshop-offline-{self.split}"

    def calculate_overall(self, results: list[TaskOutput]) -> dict[str, Any]:
        """The default summary plus AgentBench's mean ``reward`` and the share scoring 1."""
        overall = super().calculate_overall(results)
        rewards = [float(r.result.get("reward", 0.0)) for r in results if isinstance(r.result, dict)]
        overall["reward"] = sum(rewards) / len(rewards) if rewards else 0.0
        overall["success_rate"] = sum(r == 1.0 for r in rewards) / len(rewards) if rewards else 0.0
        kinds = Counter(str(r.result.get("kind")) for r in results if isinstance(r.result, dict))
        overall["goals_by_kind"] = dict(kinds)
        overall["invalid_action_rule"] = self.on_invalid_action
        overall["benchmark"] = self.benchmark
        return overall
