"""Test helpers shared by agentrl_ext's tests and by users' tests: fakes and tiny offline assets."""
