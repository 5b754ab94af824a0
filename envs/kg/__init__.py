"""The ``kg`` task: AgentBench-FC's knowledge-graph tools on an offline graph (or a Freebase endpoint)."""
