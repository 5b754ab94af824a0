"""The ``dbbench`` task: AgentBench-FC's DBBench (SQL over per-episode tables), SQLite or MariaDB."""
