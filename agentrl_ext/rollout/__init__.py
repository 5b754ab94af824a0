"""Rollout side: the AgentRL agent loop (registered in verl) and cross-policy sampling."""
