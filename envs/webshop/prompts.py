"""What the agent sees in WebShop: AgentBench-FC's tool schemas, system prompt and message layout.

The tool schemas are those of AgentBench's ``configs/tasks/webshop.yaml`` (a test compares them
with the installed file); the system prompt and the layout of the observation messages are those
of AgentBench's WebShop task (THUDM/AgentBench @ 578c5e9, ``src/server/tasks/webshop/task.py``,
Apache-2.0).
"""

from __future__ import annotations

from typing import Any

SEARCH_ACTION = "search_action"
CLICK_ACTION = "click_action"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": SEARCH_ACTION,
            "description": "Use search functionality with specified keywords.",
            "parameters": {
                "type": "object",
                "properties": {
                    "keywords": {
                        "type": "string",
                        "description": "The keywords to use in the search function.",
                    }
                },
                "required": ["keywords"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": CLICK_ACTION,
            "description": "Click a button or link with a specified value.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {
                        "type": "string",
                        "description": "The value to click from the list of available actions.",
                    }
                },
                "required": ["value"],
                "additionalProperties": False,
            },
        },
    },
]

# AgentBench's `prompt_with_max_turn`, including its leading and trailing newline.
SYSTEM_PROMPT = """
You are web shopping.
I will give you instructions about what to do.
You have to follow the instructions.
Every round I will give you an observation and a list of available actions,
you have to respond with calling a tool provided based on the state and instruction.
You can use search tool if search is available.
You can click one of the buttons in clickables.
If the action is not valid, perform nothing.
Keywords in search are up to you, but the value in click must be a value in the list of available actions.
Remember that your keywords in search should be carefully designed.
Your should first think about what to do, then call a tool correspondingly.
You should always use a tool, even if you have questions to confirm. You can use whatever tool is available and do not need permission from the user.
"""

# AgentBench's feedback texts (on_invalid_action="feedback").
NO_TOOL_CALL = "No executable tool calls found! You should call a tool instead."
NO_VALID_TOOL_CALL = "No valid tool call found from agent."
TASK_LIMIT_REACHED = "Task limit reached."
# Ours: AgentBench runs only the first call of a step and leaves the others unanswered, which
# OpenAI-format histories do not allow; each further call gets this answer.
NOT_EXECUTED = "Not executed: only the first tool call of a step is executed."


def initial_message(observation: str, available_actions: dict[str, Any]) -> str:
    """The first user message: the start page and what can be done there."""
    return f"The initial observation:\n{observation}\n\nAvailable Actions:\n{available_actions}"


def observation_message(observation: str, available_actions: dict[str, Any]) -> str:
    """A user message after a step that ran no action (feedback mode)."""
    return f"Observation:\n{observation}\n\nAvailable Actions:\n{available_actions}"


def action_message(action: str, observation: str, available_actions: dict[str, Any]) -> str:
    """The tool message answering an action (``search[...]`` / ``click[...]``)."""
    return f"Action: {action}\n\nObservation:\n{observation}\n\nAvailable Actions:\n{available_actions}"
