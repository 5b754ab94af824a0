"""AgentRL (multi-turn, multi-task agentic RL) as an extension of verl 0.9.1."""

__version__ = "0.1.0"
