#!/usr/bin/env bash
# Idempotent set-up of the project venv: torch (CPU build on CPU hosts), verl 0.9.1 and
# agentrl_ext with its training and dev extras. Re-runs are fast (a stamp records the
# hash of setup.cfg and setup.py). Override the venv location with AGENTRL_VENV.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${AGENTRL_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_CPU_VERSION="2.13.0"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating venv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.agentrl-setup-$(cat setup.cfg setup.py | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && python -c "import agentrl_ext, verl, torch" 2>/dev/null; then
  echo "[setup] venv up to date ($VENV)"
  exit 0
fi

start=$(date +%s)
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "[setup] GPU host: torch comes with verl's GPU extra (see README, GPU notes)"
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
mapfile -t engine_sources < <(grep -oE '^\s+(jericho|fast-downward-textworld)==[^ ]+' setup.cfg | tr -d ' ')
echo "[setup] wheels of ${engine_sources[*]} (cache: $WHEELS)"
python -m pip wheel -q --no-deps --find-links "$WHEELS" --wheel-dir "$WHEELS" "${engine_sources[@]}"
echo "[setup] installing agentrl_ext[train,dev,webshop,kg,alfworld]"
python -m pip install -q --find-links "$WHEELS" -e ".[train,dev,webshop,kg,alfworld]"
rm -f "$VENV"/.agentrl-setup-*
touch "$stamp"
echo "[setup] done in $(( $(date +%s) - start ))s; venv size $(du -sh "$VENV" | cut -f1)"
