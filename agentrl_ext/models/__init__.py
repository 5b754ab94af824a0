"""Tiny offline models for tests and smoke runs (see :mod:`agentrl_ext.models.tiny`)."""
