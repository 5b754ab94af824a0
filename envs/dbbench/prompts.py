"""What the agent sees in DBBench: AgentBench-FC's tool schemas and prompts, word for word.

The tool schemas are those of AgentBench's ``configs/tasks/dbbench.yaml`` (a test compares them
with the installed file); the system prompt and the user prompt layout are those of AgentBench's
DBBench task (THUDM/AgentBench @ 578c5e9, Apache-2.0), which speaks of MySQL whatever the backend.
"""

from __future__ import annotations

from typing import Any

EXECUTE_SQL = "execute_sql"
COMMIT_FINAL_ANSWER = "commit_final_answer"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": EXECUTE_SQL,
            "description": "Executes a given SQL statement on the database and returns the result.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "The SQL query to be executed."}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": COMMIT_FINAL_ANSWER,
            "description": "Commits the final answer after all operations are completed.",
            "parameters": {
                "type": "object",
                "properties": {
                    "answers": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "The list of final answers to commit.",
                    }
                },
                "required": ["answers"],
                "additionalProperties": False,
            },
        },
    },
]

SYSTEM_PROMPT = """I will ask you a question, then you should help me operate a MySQL database with SQL to answer the question.
You have to explain the problem and your solution to me and write down your thoughts.
After thinking and explaining thoroughly, every round you can choose to operate or to answer with the two specific tools provided.
If you should execute a SQL query, use the `execute_sql` function, Your SQL should be in one line.
Every time you can only execute one SQL statement. I will only execute the statement in the first SQL code block. Every time you write a SQL, I will execute it for you and give you the output.
If you are done operating, and you want to commit your final answer, then use the `commit_final_answer` function.
DO NOT use this tool unless you are sure about your answer. I expect an accurate and correct answer.
Your answer should be accurate. Your answer must be exactly the same as the correct answer.
If the question is about modifying the database, then after done operation, your answer field can be anything.
If your response cannot match any pattern I mentioned earlier, you will be judged as FAIL immediately.
You should always use the tools provided to submit your answer. Be careful not to write it in the content field.
Your input will be raw MySQL response, you have to deal with it by yourself."""


def user_prompt(entry: dict[str, Any]) -> str:
    """The opening user message: optional evidence, the table description, then the question."""
    text = ""
    if entry.get("evidence"):
        text += "Evidence about the question: " + entry["evidence"] + "\n"
    if entry.get("add_description"):
        text += "Additional table information about the question: " + entry["add_description"] + "\n"
    return text + "Question: " + entry["description"] + "\n"


# Messages of the lenient invalid-action policy (``on_invalid_action="feedback"``), AgentBench's own.
NO_TOOL_CALL = "Internal error: No tool calls found despite finish reason."
BAD_ARGUMENTS = "Error: Failed to parse tool call. Tool call format is incorrect."
UNKNOWN_TOOL = "Invalid function call. Please call a tool instead."
TIMED_OUT = "Error: SQL execution timed out."
