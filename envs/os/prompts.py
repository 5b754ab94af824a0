"""What the agent sees in OS interaction: AgentBench-FC's tool schemas and messages, word for word.

The tool schemas are those of AgentBench's ``configs/tasks/os.yaml`` (a test compares them with
the installed file); the system prompt, the opening user message, the tool-output layout and
truncation, and the messages for unusable steps are those of AgentBench-FC's OS-interaction task
(THUDM/AgentBench @ 578c5e9, ``src/server/tasks/os_interaction/task.py``, Apache-2.0).
"""

from __future__ import annotations

from typing import Any

BASH_ACTION = "bash_action"
FINISH_ACTION = "finish_action"
ANSWER_ACTION = "answer_action"


def _tool(name: str, description: str, argument: str, argument_description: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {argument: {"type": "string", "description": argument_description}},
                "required": [argument],
                "additionalProperties": False,
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool(
        BASH_ACTION,
        "Execute bash code to perform an operation in the Linux environment.",
        "script",
        "The bash script to be executed.",
    ),
    _tool(
        FINISH_ACTION,
        "Indicate that the task has been finished or need some additional information to be finished.",
        "thought",
        "The thought or reason indicating the task is finished.",
    ),
    _tool(ANSWER_ACTION, "Provide the answer to the question.", "answer", "The answer to the question."),
]

SYSTEM_PROMPT = """You are an assistant that will act like a person. I will play the role of a Linux (Ubuntu) operating system.
Your goal is to implement the operations required by me or answer the questions proposed by me.
For each of your turns, you should first think about what you should do, and then call exactly one of the provided tools according to the situation.
If you think the output is too long, I will truncate it. The truncated output is not complete. You have to deal with the truncating problem by yourself.
Attention, your bash code should not contain any input operation. Once again, you should use one tool in each turn, and should not respond without function calling.
Note that if you think the task has been finished, or there is some message missing to completely complete the task, you should respond with calling the function "finish_action", as no additional information will be provided.
Also, note that if you have gotten the answer to the question, you should call the "answer_action" tool instead of simply writing your answer in your response.
Your answers should be exact and precise (for example, a single number), do not answer with full sentences or phrases.
Always use a tool provided instead of simply responding with content."""


def user_prompt(description: str) -> str:
    """The opening user message."""
    return f"Now, I will start a new problem in a new OS. My problem is:\n\n{description}"


OUTPUT_LIMIT = 800
"""Outputs longer than this many characters are cut to ``TRUNCATED_TO`` plus ``TRUNCATION_NOTE``."""
TRUNCATED_TO = 780
TRUNCATION_NOTE = "\n[truncated because the output is too long]"
EMPTY_OUTPUT = "The output of the OS is empty."


def os_output(text: str) -> str:
    """The tool message of a ``bash_action``: AgentBench's layout and truncation."""
    if len(text) > OUTPUT_LIMIT:
        text = text[:TRUNCATED_TO] + TRUNCATION_NOTE
    return f"The output of the OS:\n\n{text}" if text else EMPTY_OUTPUT


# Messages of the lenient invalid-action policy (``on_invalid_action="feedback"``), AgentBench's own.
NO_TOOL_CALL = "No executable tool calls found. Please call a tool instead"
UNKNOWN_TOOL = "Invalid function call. Please call a tool instead"
