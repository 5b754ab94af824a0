# The commands the README names.
.PHONY: setup setup-train train test test-fast lint format

setup:            ## create .venv with torch (CPU), verl 0.9.1 and agentrl_ext with every extra the tests use
	bash scripts/setup.sh

setup-train:      ## the same venv with only what the main job needs (agentrl_ext[train])
	bash scripts/setup.sh train

train: setup-train ## the main job: SFT warm start + multi-task AgentRL on CPU, held-out table before/after (cpu_multitask)
	.venv/bin/agentrl-train --config-name cpu_multitask

test:             ## the whole test suite, set-up included
	bash scripts/test.sh

test-fast: setup  ## everything but whole training runs
	bash scripts/test.sh -m "not slow"

lint: setup
	.venv/bin/ruff check setup.py agentrl_ext tests bench envs
	.venv/bin/ruff format --check setup.py agentrl_ext tests bench envs
	.venv/bin/mypy agentrl_ext

format: setup
	.venv/bin/ruff format setup.py agentrl_ext tests bench envs
	.venv/bin/ruff check --fix setup.py agentrl_ext tests bench envs
