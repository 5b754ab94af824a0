# The commands the README names.
.PHONY: setup train test test-fast lint format

setup:            ## create .venv with torch (CPU), verl 0.9.1 and agentrl_ext[train,dev]
	bash scripts/setup.sh

train: setup      ## the main job: GRPO on CPU with verl's trainer (cpu_smoke recipe)
	.venv/bin/agentrl-train --config-name cpu_smoke

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
