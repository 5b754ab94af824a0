"""The ``webshop`` task: WebShop's text environment in 1000-product mode (AgentBench-FC tools)."""
