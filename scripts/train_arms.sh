#!/usr/bin/env bash
# The main job and its control arm (make train-arms): RL with task-normalized GRPO (the recipe,
# `make train`) and RL with verl's own `grpo` (task normalization off), both from the same SFT
# weights, RL data and seeds, then one held-out table of both arms against the warm start.
#   scripts/train_arms.sh [overrides for both arms...]
# Run folders: $AGENTRL_RUN_DIR (default outputs/cpu_multitask) and ${AGENTRL_RUN_DIR}_grpo; the
# table: ${AGENTRL_RUN_DIR}/arms.md. The second arm skips the warm start and the evaluation before
# RL (the first arm's are the same), so it costs one RL stage and one evaluation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh train
RUN="${AGENTRL_RUN_DIR:-outputs/cpu_multitask}"
TRAIN=.venv/bin/agentrl-train
"$TRAIN" --config-name cpu_multitask trainer.default_local_dir="$RUN" "$@"
SFT="$(ls -d "$RUN"/sft/global_step_*/huggingface | sort -V | tail -1)"
"$TRAIN" --config-name cpu_multitask trainer.default_local_dir="${RUN}_grpo" \
  agentrl.sft.enable=false agentrl.eval.before_rl=false agentrl.assets.build_tiny_model=false \
  actor_rollout_ref.model.path="$(realpath "$SFT")" algorithm.adv_estimator=grpo "$@"
.venv/bin/python -m agentrl_ext.eval.report "$RUN/eval/before_rl.json" "$RUN/eval/after_rl.json" \
  "${RUN}_grpo/eval/after_rl.json" --labels before_rl,task_norm_grpo,grpo --out "$RUN/arms.md"
