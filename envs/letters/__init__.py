"""The ``letters`` and ``digits`` tasks."""
