"""Token bookkeeping of a multi-turn conversation, and the model's tool-call format.

Model tokens are kept exactly as generated (token-in, token-out: no re-tokenization
drift). Environment tokens are found by diffing two chat-template renderings: the
conversation up to the assistant turn, and the same plus the environment messages
and the next generation prompt. Everything the template adds around the model's
tokens (end-of-turn newline, role headers, tool-response wrappers) is masked out.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class TemplateNotPrefixStable(ValueError):
    """The chat template renders a conversation differently once messages are appended to it.

    Environment tokens are found by diffing two renderings, which needs the shorter one to be
    a prefix of the longer one. The agent loop ends such an episode as a counted failure.
    """


def render(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kwargs: Any
) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template."""
    ids = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True, **kwargs)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def parse_hermes_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split Qwen2.5/Hermes output into content and OpenAI ``tool_calls``.

    Unlike a lenient parser, a call whose JSON is malformed is kept (arguments as the raw
    string, name possibly empty) so that the environment can answer it with AgentRL's
    ``agent validation failed`` rather than silently seeing no call at all.
    """
    calls = []
    for raw in _HERMES_CALL.findall(text):
        name, arguments = "", raw.strip()
        try:
            obj = json.loads(raw)
            if isinstance(obj, dict):
                name = str(obj.get("name", ""))
                args = obj.get("arguments", {})
                arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        except json.JSONDecodeError:
            pass
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    content = _HERMES_CALL.sub("", text).strip()
    return content, calls


@dataclass
class Transcript:
    """The growing token sequence of one episode: prompt, then response with its loss mask."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_model_tokens(self, token_ids: list[int], log_probs: list[float] | None) -> None:
        self.response_ids += token_ids
        self.response_mask += [1] * len(token_ids)
        self.response_logprobs += list(log_probs) if log_probs else [0.0] * len(token_ids)

    def add_env_tokens(self, token_ids: list[int]) -> None:
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        self.response_logprobs += [0.0] * len(token_ids)


def env_token_ids(
    tokenizer: Any,
    history: list[dict[str, Any]],
    env_messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    generated: list[int],
    end_token_id: int | None,
) -> list[int]:
    """Tokens to append after the model's turn ``generated``: template glue plus env messages.

    ``history`` ends with the assistant message the model just produced. The result is
    everything between the end of the model's tokens and the start of its next turn.
    """
    before = render(tokenizer, history, tools)
    after = render(tokenizer, history + env_messages, tools, add_generation_prompt=True)
    if after[: len(before)] != before:
        pairs = enumerate(zip(before, after, strict=False))
        diverge = next((i for i, (a, b) in pairs if a != b), min(len(before), len(after)))
        raise TemplateNotPrefixStable(
            f"the chat template is not prefix-stable for this conversation: rendering it with the "
            f"{len(env_messages)} environment message(s) appended differs from rendering it without them "
            f"at token {diverge} of {len(before)}, so environment tokens cannot be diffed; use a chat template "
            "that renders every turn independently of the turns after it"
        )
    glue: list[int] = []
    if end_token_id is not None:
        if not generated or generated[-1] != end_token_id:
            glue.append(end_token_id)  # the model was cut off: close its turn
        last_end = max((i for i, t in enumerate(before) if t == end_token_id), default=None)
        if last_end is not None:
            glue += before[last_end + 1 :]
    return glue + after[len(before) :]
