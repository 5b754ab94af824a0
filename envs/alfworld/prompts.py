"""What the agent sees in ALFWorld: AgentBench-FC's tool schema, instruction and message layout.

The tool schema is that of AgentBench's ``configs/tasks/alfworld.yaml`` (a test compares it with
the installed file); the instruction, the opening user message (``Here is your task. `` + the
game's intro without its banner + `` AVAILABLE ACTIONS: `` + one admissible command a line) and
the feedback messages follow AgentBench's ALFWorld task (THUDM/AgentBench @ 578c5e9, Apache-2.0).
AgentBench loads a few-shot file (``alfworld_multiturn_plan_first.json``) but its function-call
task never puts it into the conversation, so there is no few-shot example here either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TAKE_ACTION = "take_action"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": TAKE_ACTION,
            "description": "Take an action.",
            "parameters": {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "description": "The action you would like to take"}
                },
                "required": ["action"],
                "additionalProperties": False,
            },
        },
    }
]

# AgentBench's text, typos included ("complete) the task", "if the environment output").
SYSTEM_PROMPT = """Interact with a household to solve a task. Imagine you are an intelligent agent in a household environment and your target is to perform actions to complete) the task goal. At the beginning of your interactions, you will be given the detailed description of the current environment and your goal to accomplish. A tool will be provided for you to use to submit the action you want to take. This tool is the only tool you should and must take in order to operate any action in the environment. The way you perform action is to place the action chosen by you in the arguments field of your tool call. For each of your turn, you will be given a list of actions which you can choose one to perform in this turn. The action you would like to take should be offered in this format: "the name of your next action", and you should fill it in the argument field of your tool call. Note that you should always call a tool to operate an action from the given choices. After your each turn, the environment will give you immediate feedback based on which you plan your next few steps. if the environment output "Nothing happened", that means the previous action is invalid and you should try more options.
 Reminder:
1. the action must be chosen from the given available actions. Any actions except provided available actions will be regarded as illegal.
2. Always call the tool to hand in your next action and think when necessary."""

# Feedback of the lenient invalid-action policy (``on_invalid_action="feedback"``), AgentBench's own.
NO_TOOL_CALL = "No executable tool calls found. Please call a tool instead"
BAD_TOOL_CALL = "No valid tool calls found. Please call a tool instead."


def available_actions(commands: Sequence[str]) -> str:
    """`` AVAILABLE ACTIONS: `` and the admissible commands, one a line (AgentBench's suffix)."""
    return " AVAILABLE ACTIONS: " + "\n".join(commands) + "\n"


def intro_text(feedback: str) -> str:
    """The game's opening text without its first paragraph (the ``-= Welcome to TextWorld =-`` banner)."""
    return "\n".join(feedback.split("\n\n")[1:])


def user_prompt(feedback: str, commands: Sequence[str]) -> str:
    """The opening user message."""
    return "Here is your task. " + intro_text(feedback) + available_actions(commands)


def observation_text(feedback: str) -> str:
    """A step's feedback as the agent sees it: ``You arrive at loc N. `` is cut (AgentBench's ``process_ob``)."""
    if feedback.startswith("You arrive at loc "):
        return feedback[feedback.find(". ") + 2 :]
    return feedback


def tool_reply(feedback: str, commands: Sequence[str]) -> str:
    """The tool message after a step: the observation, then the admissible commands."""
    return observation_text(feedback) + available_actions(commands)
