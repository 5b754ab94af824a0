"""The ``alfworld`` task: AgentBench-FC's ALFWorld (TextWorld's PDDL engine, a process per game)."""
