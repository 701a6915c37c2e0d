"""Process clocks that need neither Lightning nor torch (a spawned DataLoader worker imports this too).

Times are seconds on ``CLOCK_BOOTTIME`` (one clock for every process of the machine), so a worker's decode window
and the main process's milestones can be put on one timeline (``timing_rank<r>.json``'s ``timeline_s``).
"""
from __future__ import annotations

import os
import time


def boot_s() -> float:
    """Now, in seconds after the machine booted (``CLOCK_BOOTTIME``; ``time.monotonic()`` where that clock is
    missing, which only orders events of one process)."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


def process_start_boot_s() -> float | None:
    """When this process started, in :func:`boot_s` seconds: ``/proc/self/stat``'s ``starttime`` (clock ticks after
    boot, field 22 of proc(5)); ``None`` where that is not available (not Linux, or a ``/proc`` without it)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")      # field 22, counted after the ")"
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def process_age_s() -> float | None:
    """Seconds since this process started (the interpreter's start, so imports and the CLI's set-up count); ``None``
    where the start time is not available."""
    start = process_start_boot_s()
    if start is None or not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    age = boot_s() - start
    return age if 0.0 <= age < 1e7 else None
