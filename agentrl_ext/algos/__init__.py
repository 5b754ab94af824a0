"""AgentRL's algorithms as verl components: tensor math plus verl registration.

No HTTP, no environment code here.
"""
