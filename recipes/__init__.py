"""Hydra recipes, installed as ``agentrl_ext.recipes`` (``pkg://agentrl_ext.recipes``; see setup.py)."""
