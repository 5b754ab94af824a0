"""A Qwen2.5-style chat template (hermes tool calls) for the tiny offline model.

The structure follows Qwen2.5-Instruct's template so that verl's ``hermes`` tool parser and its
tool agent loop treat the tiny model like a Qwen2.5 model:

- ``tools`` are listed in the system turn, one JSON object per line, inside ``<tools></tools>``;
- an assistant turn with ``tool_calls`` renders each as
  ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``;
- consecutive ``tool`` messages are grouped into one ``<|im_start|>user`` turn of
  ``<tool_response>`` blocks.

Two deliberate differences from Qwen2.5: the default system prompt does not claim to be Qwen, and
``arguments`` given as a JSON string (the OpenAI wire format) is written verbatim instead of being
JSON-encoded a second time (Qwen3's template does the same).

:data:`COMPACT_TOOLS_CHAT_TEMPLATE` is the same template with the tools written as one short line
each, ``name(param: type, ...): description`` (a parameter's ``enum`` as ``a|b|c``), and a one-line
instruction for the call format: a task's opening prompt takes about half the tokens. Meant for the
tiny model (``agentrl.assets.tiny_chat_template=compact``), whose every forward and update pays for
every prompt token; turns, tool calls and tool responses render exactly as in the Qwen2.5 form.

Every turn ends with ``<|im_end|>\\n``, so rendering a conversation is a prefix of rendering the
conversation extended by whole turns; the one exception is splitting a run of ``tool`` messages,
which the template groups into a single turn.
"""

from __future__ import annotations

__all__ = [
    "CHAT_TEMPLATES",
    "COMPACT_TOOLS_CHAT_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "QWEN25_STYLE_CHAT_TEMPLATE",
]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

_TOOLS_BLOCK = r"""    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}"""

_COMPACT_TOOLS_BLOCK = r"""    {{- "\nTools:" }}
    {%- for tool in tools %}
        {%- set f = tool.function if tool.function is defined else tool %}
        {{- "\n" + f.name + "(" }}
        {%- if f.parameters is defined and f.parameters.properties is defined %}
            {%- for pname, p in f.parameters.properties.items() %}
                {{- (", " if not loop.first else "") + pname + ": " }}
                {%- if p.enum is defined %}{{- p.enum | join("|") }}{%- else %}{{- p.type | default("any") }}{%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- ")" }}
        {%- if f.description is defined and f.description %}{{- ": " + f.description }}{%- endif %}
    {%- endfor %}
    {{- "\nCall one as <tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call><|im_end|>\n" }}"""


QWEN25_STYLE_CHAT_TEMPLATE = (
    r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- '"""
    + DEFAULT_SYSTEM_PROMPT
    + r"""' }}
    {%- endif %}
"""
    + _TOOLS_BLOCK
    + r"""
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\n"""
    + DEFAULT_SYSTEM_PROMPT
    + r"""<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""
)


#: the Qwen2.5 form with the compact tool list (module docstring)
COMPACT_TOOLS_CHAT_TEMPLATE = QWEN25_STYLE_CHAT_TEMPLATE.replace(_TOOLS_BLOCK, _COMPACT_TOOLS_BLOCK)
assert COMPACT_TOOLS_CHAT_TEMPLATE != QWEN25_STYLE_CHAT_TEMPLATE

#: the tiny model's chat templates by name (``agentrl.assets.tiny_chat_template``)
CHAT_TEMPLATES = {"qwen25": QWEN25_STYLE_CHAT_TEMPLATE, "compact": COMPACT_TOOLS_CHAT_TEMPLATE}
