"""A sandbox's resource use for E2B's metrics route: what the guest runs, and how its output is read."""

from __future__ import annotations

# What the guest reports for a metrics sample: memory (kB), two CPU samples 0.2 s apart,
# the CPU count and the root filesystem's use (bytes).
METRICS_SCRIPT = ("grep -E '^(MemTotal|MemAvailable|Cached):' /proc/meminfo; head -1 /proc/stat; sleep 0.2; "
                  "head -1 /proc/stat; echo ncpu $(nproc); df -P -B1 / | tail -1")


def guest_metrics(out: str) -> dict[str, float]:
    """``METRICS_SCRIPT``'s output: cpu_count, cpu_used_pct, mem_used/total/cache, disk_used/total.

    ValueError if ``out`` is not what the script prints (the guest is the tenant's: anything)."""
    kb: dict[str, int] = {}
    cpu: list[list[int]] = []
    figures: dict[str, float] = {}
    try:
        for line in out.splitlines():
            words = line.split()
            if not words:
                continue
            if words[0].endswith(":"):
                kb[words[0][:-1]] = int(words[1])
            elif words[0] == "cpu":
                cpu.append([int(w) for w in words[1:]])
            elif words[0] == "ncpu":
                figures["cpu_count"] = int(words[1])
            elif words[0].startswith("/"):  # df: device, size, used, available, use%, mount
                figures["disk_total"], figures["disk_used"] = int(words[1]), int(words[2])
        busy = [sum(c) - c[3] - (c[4] if len(c) > 4 else 0) for c in cpu]  # all but idle and iowait
        total = [sum(c) for c in cpu]
        figures["cpu_used_pct"] = round(100.0 * (busy[1] - busy[0]) / max(1, total[1] - total[0]), 2)
        figures["mem_total"] = kb["MemTotal"] * 1024
        figures["mem_used"] = (kb["MemTotal"] - kb["MemAvailable"]) * 1024
        figures["mem_cache"] = kb.get("Cached", 0) * 1024
    except (IndexError, KeyError) as exc:
        raise ValueError(f"not the metrics script's output: {exc!r}") from None
    missing = [name for name in ("cpu_count", "disk_total", "disk_used") if name not in figures]
    if missing:
        raise ValueError(f"not the metrics script's output: no {missing[0]}")
    return figures
