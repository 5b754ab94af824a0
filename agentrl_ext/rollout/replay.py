"""``agentrl-replay``: re-drive a task with the actions of recorded episodes and check it answers the same.

    agentrl-replay outputs/records/records-host-123.jsonl              # through agentrl-envs up's controller
    agentrl-replay eval/sft.episodes.jsonl --controller-url http://127.0.0.1:5020/api --line 3
    agentrl-replay record.jsonl --launch --split test                  # start the record's task here

A record (an ``agentrl.records.dir`` file of training, an ``agentrl-eval-run`` episodes file, or
:meth:`~agentrl_ext.rollout.episode.Episode.to_dict` of any driven episode) holds the opening and
every turn's action and answer. Replay opens a new session of the same (task, index), sends the
recorded actions in order (through the same episode driver as training and evaluation) and
compares what comes back: the opening messages and tools, each answer's messages, status, reward
and end, and the episode's final status and reward. Exits 0 when every record matches; 1 naming
the first difference of each that does not (a task that is not deterministic, or a worker that
changed since the record); 2 on a usage error.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from agentrl_ext import cli
from agentrl_ext.env.client import ControllerClient, ControllerUnavailable, RetryPolicy, unreachable_message
from agentrl_ext.env.protocol import SampleStatus
from agentrl_ext.rollout.episode import Action, Episode, FailureKind, drive_episode, read_records

#: seconds a replay keeps retrying an unreachable controller
REPLAY_RETRY_S = 10.0


class ReplayActor:
    """Sends the recorded actions in order; with none left it stops (as a full context would)."""

    def __init__(self, record: Episode) -> None:
        self.actions = [t.action for t in record.turns]
        self._next = 0

    async def begin(self, episode: Episode) -> None:
        self._next = 0

    async def act(self, episode: Episode) -> Action | None:
        if self._next >= len(self.actions):
            return None
        self._next += 1
        return Action(dict(self.actions[self._next - 1]), policy="replay")

    async def observe(self, episode: Episode, messages: list[dict[str, Any]]) -> bool:
        return True


async def replay(client: ControllerClient, record: Episode) -> Episode:
    """A new session of ``record``'s (task, index) played with its actions."""
    turns = len(record.turns)
    # the record's own turn cap ended it: the same cap ends the replay; else one more call finds
    # the actions exhausted (and the session still running, as it was when the record ended)
    max_turns = turns if record.status is SampleStatus.TASK_LIMIT_REACHED else turns + 1
    replayed = await drive_episode(
        client, record.task, record.index, ReplayActor(record), max_turns=max(1, max_turns)
    )
    cause = replayed.exception.__cause__ if replayed.exception is not None else None
    if replayed.failure_kind is FailureKind.ENV_TRANSPORT and isinstance(cause, ControllerUnavailable):
        raise cause  # the controller is not there: say so rather than report a difference
    return replayed


def first_difference(recorded: Episode, replayed: Episode) -> str | None:
    """Where ``replayed`` first departs from ``recorded`` (what the environment said), or None."""
    checks: list[tuple[str, Any, Any]] = [
        ("opening messages", recorded.opening, replayed.opening),
        ("tools", recorded.tools, replayed.tools),
    ]
    for number, (old, new) in enumerate(zip(recorded.turns, replayed.turns, strict=False), 1):
        checks += [
            (f"turn {number} observation", old.observation, new.observation),
            (f"turn {number} status", old.status, new.status),
            (f"turn {number} reward", old.reward, new.reward),
            (f"turn {number} finish", old.finish, new.finish),
        ]
    checks.append(("number of turns", len(recorded.turns), len(replayed.turns)))
    if not recorded.failed or recorded.failure_kind is FailureKind.ENV_STATUS:
        # an episode the actor or the transport failed ended for reasons outside the task: only
        # what the task answered until then is compared
        checks += [
            ("final status", recorded.status.value, replayed.status.value),
            ("final reward", recorded.reward, replayed.reward),
        ]
    for name, old, new in checks:
        where = _diff(old, new)
        if where is not None:
            return f"{name}{where}"
    return None


def _diff(old: Any, new: Any, path: str = "") -> str | None:
    """The first place where two JSON values differ, with both values; None when equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            if key not in new or key not in old:
                return f"{path}[{key!r}]: recorded {_show(old.get(key))} != replayed {_show(new.get(key))}"
            inner = _diff(old[key], new[key], f"{path}[{key!r}]")
            if inner is not None:
                return inner
        return None
    if isinstance(old, list) and isinstance(new, list):
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            inner = _diff(a, b, f"{path}[{i}]")
            if inner is not None:
                return inner
        if len(old) != len(new):
            return f"{path}: recorded {len(old)} item(s) != replayed {len(new)}"
        return None
    if isinstance(old, float) or isinstance(new, float):
        if isinstance(old, (int, float)) and isinstance(new, (int, float)) and float(old) == float(new):
            return None
    elif old == new:
        return None
    return f"{path}: recorded {_show(old)} != replayed {_show(new)}"


def _show(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def replay_file(
    controller_url: str, path: str, lines: Sequence[int] | None = None
) -> list[tuple[int, Episode, str | None]]:
    """``(line, record, first difference or None)`` of each record of ``path`` (``lines``: only those)."""
    records = [(n, r) for n, r in read_records(path) if not lines or n in lines]
    if not records:
        raise ValueError(f"{path} holds no episode record{' on lines ' + str(list(lines)) if lines else ''}")
    results = []
    # a controller that is not there is said within seconds, not after a training-sized wait
    async with ControllerClient(controller_url, retry=RetryPolicy(deadline_s=REPLAY_RETRY_S)) as client:
        for number, record in records:
            replayed = await replay(client, record)
            results.append((number, record, first_difference(record, replayed)))
    return results


def build_parser() -> Any:
    p = cli.parser("agentrl-replay", __doc__)
    p.add_argument("record", help="a JSON Lines file of episode records (records file or episodes file)")
    cli.add_controller_url(p, help="the controller serving the record's task (agentrl-envs up serves it)")
    p.add_argument(
        "--line", type=int, action="append", help="replay only the record on this line (repeatable)"
    )
    p.add_argument(
        "--launch",
        action="store_true",
        help="start the records' tasks here (as agentrl-envs up would, on a free port) instead of --controller-url",
    )
    p.add_argument(
        "--split", default="train", choices=["train", "test"], help="with --launch: the tasks' split"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        tasks = sorted({r.task for n, r in read_records(args.record) if not args.line or n in args.line})
        if args.launch:
            from agentrl_ext.env.launcher import EnvStack, free_port

            with EnvStack(tasks=tasks, port=free_port(), split=args.split) as stack:
                results = asyncio.run(replay_file(stack.api, args.record, args.line))
        else:
            results = asyncio.run(replay_file(args.controller_url, args.record, args.line))
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    except ControllerUnavailable:
        parser.exit(1, f"agentrl-replay: {unreachable_message(args.controller_url)}\n")
    different = 0
    for number, record, difference in results:
        name = f"{args.record}:{number} {record.task}[{record.index}]"
        if difference is None:
            print(
                f"{name}: same ({len(record.turns)} turns, {record.status.value}, reward {record.reward:g})"
            )
        else:
            different += 1
            print(f"{name}: differs at {difference}")
    if different:
        print(f"agentrl-replay: {different} of {len(results)} record(s) replay differently", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
