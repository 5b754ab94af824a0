"""One task per folder, installed as ``agentrl_ext.envs.<task>`` (see setup.py)."""
