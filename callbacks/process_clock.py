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


_INTERPRETER_START: float | None = None   # set by mark_interpreter_start (the entry points), on the boot clock


def mark_interpreter_start() -> None:
    """Record this interpreter's start, called on the entry scripts' first lines (``evaluate.py``, ``train.py``):
    now, less the CPU time the process has used (the interpreter's own start-up before that line is CPU work),
    never before the process's start (:func:`process_start_boot_s`). A process keeps its id and its ``/proc`` start
    time across ``exec``, so when a shell runs ``a && b && python evaluate.py ...`` and ``exec``s the last command,
    ``/proc``'s start is the shell's, ``a`` and ``b`` included; this is the interpreter's. The first call wins."""
    global _INTERPRETER_START
    if _INTERPRETER_START is not None:
        return
    now, cpu = boot_s(), time.process_time()
    start = process_start_boot_s()
    _INTERPRETER_START = now - cpu if start is None else min(now, max(start, now - cpu))


def interpreter_start_boot_s() -> float | None:
    """When this interpreter started, in :func:`boot_s` seconds: :func:`mark_interpreter_start`'s mark when an entry
    script made one, else the process's ``/proc`` start (``None`` where that is not available)."""
    return _INTERPRETER_START if _INTERPRETER_START is not None else process_start_boot_s()


def process_age_s() -> float | None:
    """Seconds since this interpreter started (:func:`interpreter_start_boot_s`: imports and the CLI's set-up count,
    a shell's commands before it ``exec``'d the interpreter do not); ``None`` where the start time is not
    available."""
    start = interpreter_start_boot_s()
    if start is None or not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    age = boot_s() - start
    return age if 0.0 <= age < 1e7 else None


def age_at(perf_counter_s: float) -> float | None:
    """The moment ``perf_counter_s`` (a ``time.perf_counter()`` value of this process) as seconds after this
    interpreter started (:func:`process_age_s`'s clock); ``None`` where that clock is not available."""
    age = process_age_s()
    return None if age is None else age - (time.perf_counter() - perf_counter_s)
