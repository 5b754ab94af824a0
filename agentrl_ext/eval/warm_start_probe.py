"""What the warm start learnt, and how much room it leaves RL (one probe for every procedural task).

The warm start's demonstrator reads the environment but has no strategy (a task's
``feasible_action``: a move consistent with everything the environment said, chosen at random);
RL must add the choice. Two measurements say whether that split holds before RL starts:

- **the room** (:func:`measure_room`): the success of the demonstrator and of the expert (the
  optimal policy), both played on the held-out seeds through the controller. Their difference is
  what RL can add to a warm start that plays like its demonstrator.
- **the probe** (:func:`probe_moves`): the demonstrator's held-out episodes give the contexts (the
  conversation before each of its moves); the checkpoint samples its own move in each, and the
  task's ``is_feasible(messages, name, arguments)`` says whether it is consistent with what the
  environment said. Reported over the contexts after at least one environment answer (reading
  the environment) and at the opening, with the share that is the expert's move and the share
  that is no valid call.

    python -m agentrl_ext.eval.warm_start_probe CHECKPOINT --tasks guess --controller-url URL \\
        --careless-move feasible

(``URL``: a controller serving the tasks' held-out split, ``agentrl-envs up --split test``.)
``agentrl-train`` runs both after the warm start when ``agentrl.sft.probe_episodes`` > 0 and
prints them in ``report.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrl_ext.data.expert import (
    DEFAULT_CARELESS_MOVE,
    ExpertEpisode,
    expert_function,
    expert_policy,
    play_expert_episodes,
)

#: contexts ``[(messages, tools), ...]`` -> for each, the texts of its sampled next turns
Sampler = Callable[[Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]]]]], list[list[str]]]
#: ``(messages, name, arguments)`` -> consistent with all the environment said
FeasibleCheck = Callable[[list[dict[str, Any]], str, dict[str, Any]], bool]

__all__ = ["ProbeResult", "Room", "format_report", "measure_room", "probe_moves", "report_json", "run_probe"]


@dataclass
class Room:
    """Held-out success of a task's demonstrator and of its expert (the optimal policy)."""

    task: str
    episodes: int
    demonstrator: float
    expert: float

    @property
    def room(self) -> float:
        """What RL can add to a policy that plays like the demonstrator."""
        return self.expert - self.demonstrator


@dataclass
class ProbeResult:
    """A checkpoint's sampled moves in the demonstrator's held-out contexts of one task."""

    task: str
    #: contexts after at least one environment answer, and the shares of the sampled moves there
    contexts: int
    feasible: float
    expert: float
    invalid: float
    #: the same at the opening (no answer yet)
    opening_contexts: int
    opening_feasible: float
    opening_expert: float

    @property
    def all_feasible(self) -> float:
        """The share of consistent moves over every context, the opening's and the later ones
        (issue 47's bar for a warm start that reads: >= 80% on every task)."""
        total = self.contexts + self.opening_contexts
        return (
            (self.contexts * self.feasible + self.opening_contexts * self.opening_feasible) / total
            if total
            else 0.0
        )


async def _play(
    controller_url: str, task: str, indices: Sequence[Any], runs: int, epsilon: float, move: str, seed: int
) -> list[ExpertEpisode]:
    episodes: list[ExpertEpisode] = []
    for run in range(runs):
        episodes += await play_expert_episodes(
            controller_url, task, indices, epsilon=epsilon, seed=seed + run, move=move
        )
    return episodes


def measure_room(
    controller_url: str,
    task: str,
    indices: Sequence[Any],
    epsilon: float = 1.0,
    move: str = DEFAULT_CARELESS_MOVE,
    runs: int = 4,
    seed: int = 0,
) -> tuple[Room, list[ExpertEpisode]]:
    """Play the demonstrator (``epsilon``, ``move``: as ``agentrl.sft``) ``runs`` times on every
    index and the expert once; returns the room and the demonstrator's episodes."""
    demonstrated = asyncio.run(_play(controller_url, task, indices, runs, epsilon, move, seed))
    expert = asyncio.run(play_expert_episodes(controller_url, task, indices))
    room = Room(
        task,
        len(demonstrated),
        sum(e.won for e in demonstrated) / len(demonstrated),
        sum(e.won for e in expert) / len(expert),
    )
    return room, demonstrated


def parse_move(text: str, tool_names: Sequence[str]) -> tuple[str, dict[str, Any]] | None:
    """The first tool call of a sampled turn, as the task worker reads it (None: no valid call)."""
    from agentrl_ext.env.worker.actions import parse_action
    from agentrl_ext.rollout.transcript import parse_hermes_tool_calls

    content, calls = parse_hermes_tool_calls(text)
    action = parse_action([{"role": "assistant", "content": content, "tool_calls": calls}], tool_names)
    if action.problem is not None or not action.tool_calls:
        return None
    call = action.tool_calls[0]
    return call.name, dict(call.arguments)


def _expert_move(messages: list[dict[str, Any]], task: str) -> tuple[str, dict[str, Any]]:
    call = expert_policy(task)(messages)["tool_calls"][0]["function"]
    return call["name"], json.loads(call["arguments"])


def probe_moves(
    sample: Sampler, task: str, episodes: Sequence[ExpertEpisode], max_contexts: int = 200
) -> ProbeResult:
    """Sample the checkpoint's move before each of the demonstrator's moves in ``episodes`` (at
    most ``max_contexts`` contexts after an answer and as many openings, in episode order) and
    check each."""
    feasible: FeasibleCheck | None = expert_function(task, "is_feasible")
    if feasible is None:
        raise ValueError(f"task {task!r}: its expert module has no is_feasible(messages, name, arguments)")
    contexts: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = []
    seen = {"opening": 0, "after": 0}
    for episode in episodes:
        for turn, message in enumerate(episode.messages):
            if message.get("role") != "assistant":
                continue
            history = list(episode.messages[:turn])
            where = "after" if any(m.get("role") == "tool" for m in history) else "opening"
            if seen[where] < max_contexts:
                seen[where] += 1
                contexts.append((where, history, list(episode.tools)))
    # samples, consistent, expert's, no valid call
    tally = {"opening": [0, 0, 0, 0], "after": [0, 0, 0, 0]}
    texts = sample([(history, tools) for _, history, tools in contexts]) if contexts else []
    for (where, history, tools), sampled in zip(contexts, texts, strict=True):
        names = [t["function"]["name"] for t in tools]
        expert = _expert_move(history, task)
        counts = tally[where]
        for text in sampled:
            move = parse_move(text, names)
            counts[0] += 1
            if move is None:
                counts[3] += 1
                continue
            counts[1] += feasible(history, *move)
            counts[2] += _same(move, expert)
    after, opening = tally["after"], tally["opening"]
    return ProbeResult(
        task,
        seen["after"],
        after[1] / max(after[0], 1),
        after[2] / max(after[0], 1),
        after[3] / max(after[0], 1),
        seen["opening"],
        opening[1] / max(opening[0], 1),
        opening[2] / max(opening[0], 1),
    )


def _same(move: tuple[str, dict[str, Any]], expert: tuple[str, dict[str, Any]]) -> bool:
    """The same call, arguments compared as the worker reads them (``"4"`` is 4, spaces aside)."""

    def norm(value: Any) -> Any:
        text = str(value).replace(" ", "")
        return int(text) if re.fullmatch(r"-?\d+", text) else text

    return move[0] == expert[0] and {k: norm(v) for k, v in move[1].items()} == {
        k: norm(v) for k, v in expert[1].items()
    }


def hf_sampler(
    checkpoint: str | Path,
    samples: int,
    temperature: float,
    max_tokens: int = 32,
    seed: int = 0,
    batch_rows: int = 256,
) -> Sampler:
    """Samples next turns from a local HF checkpoint, the whole distribution at ``temperature``
    (no top-k), ``samples`` per context; the contexts are left-padded into batches of at most
    ``batch_rows`` rows (one ``generate`` call each)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl_ext.rollout.transcript import render

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    torch.manual_seed(seed)
    decoding: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def sample(contexts: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]]]]) -> list[list[str]]:
        prompts = [render(tokenizer, m, t, add_generation_prompt=True) for m, t in contexts]
        rows = [ids for ids in prompts for _ in range(samples)]
        texts: list[str] = []
        for start in range(0, len(rows), batch_rows):
            chunk = rows[start : start + batch_rows]
            width = max(map(len, chunk))
            ids = torch.tensor([[pad] * (width - len(r)) + r for r in chunk])
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in chunk])
            with torch.no_grad():
                out = model.generate(
                    ids, attention_mask=mask, **decoding, max_new_tokens=max_tokens, pad_token_id=pad
                )
            texts += [str(tokenizer.decode(row[width:], skip_special_tokens=True)) for row in out]
        return [texts[i * samples : (i + 1) * samples] for i in range(len(contexts))]

    return sample


def run_probe(
    controller_url: str,
    checkpoint: str | Path,
    tasks: Sequence[str],
    indices: dict[str, list[Any]],
    noise: dict[str, float],
    moves: dict[str, str],
    runs: int = 4,
    samples: int = 2,
    temperature: float = 0.7,
    max_contexts: int = 200,
    seed: int = 0,
) -> tuple[list[Room], list[ProbeResult]]:
    """The room and the probe of every task in ``tasks`` that has a demonstrator with an
    ``is_feasible`` check (``noise``/``moves``: ``agentrl.sft.expert_noise``/``careless_move``)."""
    sampler = hf_sampler(checkpoint, samples, temperature, seed=seed)
    rooms, probes = [], []
    for task in tasks:
        move = moves.get(task, DEFAULT_CARELESS_MOVE)
        epsilon = float(noise.get(task, 0.0))
        room, episodes = measure_room(
            controller_url, task, indices[task], epsilon, move, runs=runs if epsilon else 1, seed=seed
        )
        rooms.append(room)
        if expert_function(task, "is_feasible") is not None:
            probes.append(probe_moves(sampler, task, episodes, max_contexts))
    return rooms, probes


def report_json(rooms: Sequence[Room], probes: Sequence[ProbeResult]) -> str:
    """Both tables as JSON text (``eval/warm_start_probe.json`` in a run folder)."""
    rows = [asdict(p) | {"all_feasible": p.all_feasible} for p in probes]
    return json.dumps({"rooms": [asdict(r) for r in rooms], "probes": rows}, indent=1)


def format_report(rooms: Sequence[Room], probes: Sequence[ProbeResult]) -> str:
    """Two markdown tables: the room per task, the probe per task."""
    lines = [
        "| task | demonstrator's success | expert's success | room for RL |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r.task} | {r.demonstrator:.1%} | {r.expert:.1%} | {100 * r.room:+.1f} pts |" for r in rooms
    ]
    lines += [
        "",
        "| task | contexts after an answer | consistent move | expert's move | no valid call "
        "| opening contexts | opening: consistent | opening: expert's | all contexts: consistent |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {p.task} | {p.contexts} | {p.feasible:.1%} | {p.expert:.1%} | {p.invalid:.1%} "
        f"| {p.opening_contexts} | {p.opening_feasible:.1%} | {p.opening_expert:.1%} | {p.all_feasible:.1%} |"
        for p in probes
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import httpx

    parser = argparse.ArgumentParser(
        prog="python -m agentrl_ext.eval.warm_start_probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("checkpoint", help="a local HF checkpoint folder")
    parser.add_argument("--tasks", required=True, help="comma-separated task names")
    parser.add_argument("--controller-url", required=True, help="a controller serving the held-out split")
    parser.add_argument(
        "--careless-move", default="feasible", help="the demonstrator's move (default feasible)"
    )
    parser.add_argument("--epsilon", type=float, default=1.0, help="its share of the moves (default 1.0)")
    parser.add_argument("--runs", type=int, default=4, help="demonstrator episodes per index (default 4)")
    parser.add_argument("--samples", type=int, default=2, help="sampled moves per context (default 2)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--limit", type=int, default=100, help="held-out indices per task (default 100)")
    parser.add_argument("--out", type=Path, default=None, help="JSON of both tables")
    args = parser.parse_args(argv)
    if not Path(args.checkpoint).is_dir():
        parser.error(f"checkpoint {args.checkpoint} is not a folder (a local HF checkpoint)")
    tasks = [t for t in args.tasks.split(",") if t]
    indices = {
        t: list(httpx.get(f"{args.controller_url}/get_indices", params={"name": t}, timeout=30).json())[
            : args.limit
        ]
        for t in tasks
    }
    rooms, probes = run_probe(
        args.controller_url,
        args.checkpoint,
        tasks,
        indices,
        {t: args.epsilon for t in tasks},
        {t: args.careless_move for t in tasks},
        runs=args.runs,
        samples=args.samples,
        temperature=args.temperature,
    )
    print(format_report(rooms, probes))
    if args.out is not None:
        args.out.write_text(report_json(rooms, probes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
