"""What the task latency benchmarks (``bench/*_latency.py``) share: percentiles and process memory.

The benchmarks run as scripts (``python bench/<task>_latency.py``), so this folder is on
``sys.path`` and they import it as ``latency_stats``.
"""

from __future__ import annotations

import statistics
from pathlib import Path


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (VmRSS), 0.0 when the kernel does not say."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentiles(values: list[float], digits: int = 2) -> dict[str, float]:
    """Count, mean, p50 and p95 of latencies in ms, rounded to ``digits``."""
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "mean_ms": round(statistics.fmean(ordered), digits),
        "p50_ms": round(ordered[len(ordered) // 2], digits),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], digits),
    }
