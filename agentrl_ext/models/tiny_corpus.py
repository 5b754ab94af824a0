"""Embedded training text for the tiny offline tokenizer.

The tiny model exists for tests, so its tokenizer only needs to be *plausible*: it should split
English, JSON and Qwen-style tool calls into multi-byte tokens, and it must be reproducible without
a network. The corpus below is short hand-written prose plus snippets generated from fixed tables,
so the text (and therefore the trained BPE merges) is identical on every machine.
"""

from __future__ import annotations

import itertools
import json

__all__ = ["corpus_lines"]

_PROSE = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
You are a helpful assistant. Answer the question of the user as well as you can.
The agent reads the task, thinks about the next step, and calls a tool when it needs information.
When the tool returns a result, the agent reads the response and decides what to do next.
If the answer is known, the agent writes the final answer and stops.
Reinforcement learning trains a policy to maximise the expected reward of its actions.
The reward is one when the answer is correct and zero when it is wrong.
Please find the weather in Paris today, and tell me whether I should take an umbrella.
What is the capital of France? The capital of France is Paris.
What is the sum of 17 and 25? The sum of 17 and 25 is 42.
Write a short function that returns the square of a number.
def square(x):
    return x * x
for i in range(10):
    print(i, square(i))
The database has a table of users with an id, a name and an email address.
SELECT name, email FROM users WHERE id = 7 ORDER BY name LIMIT 10;
The file was not found. Check the path and try again.
Error: permission denied while opening the file.
The search returned three results. The first result is the most relevant one.
Thank you! Is there anything else I can help you with?
I think the best next step is to list the files in the current directory.
The environment sends an observation, and the model answers with an action.
Each episode ends when the task is solved or when the turn limit is reached.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 3.14 2.718 -1 42 2024 2025.
The assistant should think step by step before it answers, and it should check its work.
Let me look at the documentation first. The function takes two arguments and returns a list.
The test failed because the expected value was different from the actual value.
Run the tests again after you change the code, and make sure that all of them pass.
The server is listening on port 8000. Send a request with the task id and the session id.
The controller starts a new session for each task and stops it when the episode is finished.
The worker executes the command in a container and returns the output and the exit code.
$ ls -la /home/user
$ cat README.md
$ python main.py --config config.yaml
$ git status
$ pip install numpy
import json
import os
from pathlib import Path
class Agent:
    def __init__(self, name: str) -> None:
        self.name = name
    def act(self, observation: str) -> str:
        return "search"
if __name__ == "__main__":
    main()
The training loop samples a batch of prompts, generates responses, computes rewards and updates the policy.
The advantage is the reward minus the mean reward of the group, divided by the standard deviation.
The loss is the negative log probability of the action times the advantage, clipped by the ratio.
The learning rate is small, and the gradient norm is clipped to one.
The model generates tokens one at a time until it produces the end of turn token.
A token is a piece of a word. The tokenizer turns text into a list of token ids.
The capital of Germany is Berlin. The capital of Japan is Tokyo. The capital of England is London.
It is sunny in Tokyo, cloudy in London, rainy in Paris, and snowy in Berlin.
The temperature is 21 degrees celsius, which is about 70 degrees fahrenheit.
Alice sent an email to Bob about the meeting on Monday morning at nine o'clock.
The order was shipped on Tuesday and it will arrive on Friday afternoon.
Please book a table for two people at seven in the evening.
Sorry, I could not find any results for your query. Could you give me more details?
The user wants to know the price of the product, so I will call the search tool.
The calculator returned 42, so the final answer is 42.
The file contains one hundred lines of text, and each line has a name and a number.
Open the browser, click the button, fill in the form and submit it.
The page shows a list of items with their prices and a link to each item.
The house is small, but the garden is large and full of flowers and trees.
In the morning she walks to the station, takes the train and reads a book.
Knowledge is power, and practice makes perfect. Good questions lead to good answers.
"""

_TOOLS: dict[str, dict[str, str]] = {
    "get_weather": {"city": "string", "unit": "string"},
    "search": {"query": "string", "top_k": "integer"},
    "calculator": {"expression": "string"},
    "read_file": {"path": "string"},
    "run_sql": {"query": "string"},
    "list_directory": {"path": "string"},
}

_VALUES: dict[str, list[object]] = {
    "city": ["Paris", "London", "Tokyo", "Berlin", "New York"],
    "unit": ["celsius", "fahrenheit"],
    "query": ["capital of France", "SELECT * FROM users", "weather today", "python list sort"],
    "top_k": [1, 3, 5],
    "expression": ["17 + 25", "3 * (4 + 5)", "2 ** 10", "100 / 7"],
    "path": ["/tmp/data.txt", "README.md", "src/main.py", "/home/user"],
}


def _tool_schema(name: str, params: dict[str, str]) -> dict[str, object]:
    """An OpenAI-style function schema, as a chat template renders it in the system prompt."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Call {name.replace('_', ' ')}.",
            "parameters": {
                "type": "object",
                "properties": {
                    key: {"type": kind, "description": f"The {key}."} for key, kind in params.items()
                },
                "required": list(params),
            },
        },
    }


def _tool_snippets() -> list[str]:
    """Tool schemas, tool calls and tool responses in the hermes / Qwen2.5 text layout."""
    lines = [json.dumps(_tool_schema(name, params)) for name, params in _TOOLS.items()]
    for name, params in _TOOLS.items():
        keys = list(params)
        for values in itertools.islice(itertools.product(*(_VALUES[k] for k in keys)), 6):
            arguments = dict(zip(keys, values, strict=True))
            call = json.dumps({"name": name, "arguments": arguments})
            lines.append(f"<tool_call>\n{call}\n</tool_call>")
            response = json.dumps({"result": f"{name} returned {values[0]}", "ok": True})
            lines.append(f"<tool_response>\n{response}\n</tool_response>")
    return lines


def _json_snippets() -> list[str]:
    """Small JSON documents of the kinds environments send back."""
    records = [
        {"id": i, "name": name, "score": round(0.25 * i, 2), "tags": ["a", "b"][: i % 3], "done": i % 2 == 0}
        for i, name in enumerate(["alice", "bob", "carol", "dave", "erin", "frank"])
    ]
    return [json.dumps(record) for record in records] + [json.dumps(records[:3], indent=2)]


def corpus_lines() -> list[str]:
    """Return the tokenizer training corpus, one document per item, in a fixed order."""
    return _PROSE.splitlines() + _tool_snippets() + _json_snippets()
