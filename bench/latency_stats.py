"""What the benchmarks share: percentiles, process memory and CPU time, the controller benchmarks' echo step.

The benchmarks run as scripts (``python bench/<task>_latency.py``), so this folder is on
``sys.path`` and they import it as ``latency_stats``.
"""

from __future__ import annotations

import os
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


#: the clock ticks /proc/<pid>/stat counts CPU time in
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: one assistant turn calling the echo task's tool (the controller benchmarks' workload)
ECHO_STEP = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": '{"text": "ping"}'}}
        ],
    }
]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values (nearest rank; nan when empty)."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
