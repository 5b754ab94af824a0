"""``gridroom``: a 3x3 room; walk to the key, then through the door.

The agent, the key and the door stand on three different cells (``Random(index)``). Tool:
``move(direction)``, ``direction`` one of ``up down left right`` (cells are ``row,col``, row 0
at the top, col 0 at the left). Walking onto the key takes it; the door is locked (a cell one cannot enter) until then;
walking onto it with the key ends the sample ``completed``, reward 1. A move into the outer wall
or the locked door keeps the agent in place. Every answer restates the whole state, so a policy
needs no memory. ``max_turns`` (8) moves without the door end with ``task limit reached``,
reward 0; the shortest solution takes 2 to 7 moves (mean 4.0 over the 504 layouts). Train samples never repeat a test
sample's layout (504 layouts in all; see :mod:`envs.procedural`).

With ``show_moves`` every observation also names the directions that lead toward the goal (the
key, once taken the door) and the moves that are open (not the outer wall, not the locked door):
``You at 1,1. Key at 0,2 (up right). Door at 2,0. Open: up right down left.``, as text games list
the admissible commands; the open moves toward the goal come first. The right move is then
readable from the observation (a direction toward the current goal that is open, the first one
listed when any is), except where the locked door stands in the way and the agent must go round it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from agentrl_ext.env.protocol import SampleIndex, SampleStatus
from agentrl_ext.env.worker import SampleResult, Session, function_tool

from ..procedural import ProceduralTask, choice_argument

SIZE = 3
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
TOOLS = [function_tool("move", "Move up, down, left or right.", {"direction": {"type": "string"}})]

Cell = tuple[int, int]


@dataclass(frozen=True)
class Layout:
    """Where the agent starts, the key and the door are."""

    start: Cell
    key: Cell
    door: Cell


def make_layout(rng: random.Random) -> Layout:
    """Three different cells drawn from ``rng``."""
    cells = [(row, col) for row in range(SIZE) for col in range(SIZE)]
    start, key, door = rng.sample(cells, 3)
    return Layout(start, key, door)


def at(cell: Cell) -> str:
    """``row,col``."""
    return f"{cell[0]},{cell[1]}"


def toward(agent: Cell, goal: Cell) -> str:
    """The directions from ``agent`` toward ``goal``, the row's first: ``up right``, ``down``."""
    d_row, d_col = goal[0] - agent[0], goal[1] - agent[1]
    names = (["up"] if d_row < 0 else ["down"] if d_row > 0 else []) + (
        ["left"] if d_col < 0 else ["right"] if d_col > 0 else []
    )
    return " ".join(names)


def open_moves(agent: Cell, has_key: bool, layout: Layout) -> list[str]:
    """The moves that change the agent's cell: not into the outer wall, not into the locked door."""
    moves = []
    for name, (d_row, d_col) in MOVES.items():
        target = (agent[0] + d_row, agent[1] + d_col)
        if 0 <= target[0] < SIZE and 0 <= target[1] < SIZE and (has_key or target != layout.door):
            moves.append(name)
    return moves


def describe(agent: Cell, has_key: bool, layout: Layout, show_moves: bool = False) -> str:
    """The state in one line: the agent, the key (until taken) and the door; with ``show_moves``
    the directions toward the goal (the key, then the door) and the open moves."""
    ahead = toward(agent, layout.door if has_key else layout.key)
    goal = f" ({ahead})" if show_moves else ""
    if has_key:
        state = f"You at {at(agent)} with key. Door at {at(layout.door)}{goal}."
    else:
        state = f"You at {at(agent)}. Key at {at(layout.key)}{goal}. Door at {at(layout.door)}."
    if show_moves:
        moves, first = open_moves(agent, has_key, layout), ahead.split()
        # the open moves toward the goal first, in toward()'s order, then the others
        moves = [m for m in first if m in moves] + [m for m in moves if m not in first]
        state += " Open: " + " ".join(moves) + "."
    return state


def opening(layout: Layout, max_turns: int, show_moves: bool = False) -> str:
    """The user message that starts a sample."""
    return (
        f"3x3 room, cells row,col from 0,0 at top left. Get the key, then go to the door. "
        f"You have {max_turns} moves. {describe(layout.start, False, layout, show_moves)}"
    )


class GridRoomTask(ProceduralTask):
    """A 3x3 key-door room with move tools."""

    name = "gridroom"
    tools = TOOLS
    default_max_turns = 8
    disjoint_content = True

    def __init__(self, show_moves: bool = False, **kwargs: Any) -> None:
        if not isinstance(show_moves, bool):
            raise ValueError(f"GridRoomTask: show_moves must be true or false, got {show_moves!r}")
        self.show_moves = show_moves
        super().__init__(**kwargs)

    def content_key(self, index: int) -> Layout:
        return make_layout(random.Random(index))

    def layout(self, index: SampleIndex) -> Layout:
        """The layout of sample ``index``."""
        return make_layout(self.rng(index))

    async def start_sample(self, index: SampleIndex, session: Session) -> SampleResult:
        layout = self.layout(index)
        agent, has_key = layout.start, False
        session.inject({"role": "user", "content": opening(layout, self.max_turns, self.show_moves)})
        for turn in range(1, self.max_turns + 1):
            action = await session.action()
            call = action.tool_calls[0]
            d_row, d_col = MOVES[choice_argument(call, "direction", tuple(MOVES))]
            target = (agent[0] + d_row, agent[1] + d_col)
            if not (0 <= target[0] < SIZE and 0 <= target[1] < SIZE):
                event = "Wall. "
            elif target == layout.door and not has_key:
                event = "Locked. "
            elif target == layout.door:
                session.inject({"role": "tool", "tool_call_id": call.id, "content": "The door opens."})
                return SampleResult(SampleStatus.COMPLETED, reward=1.0, metrics={"moves": turn})
            else:
                agent = target
                event = "Got the key. " if agent == layout.key and not has_key else ""
                has_key = has_key or agent == layout.key
            session.report(0.0, has_key=has_key)
            session.inject(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": event + describe(agent, has_key, layout, self.show_moves),
                }
            )
        return SampleResult(SampleStatus.TASK_LIMIT_REACHED, reward=0.0, metrics={"moves": self.max_turns})
