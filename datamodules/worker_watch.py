"""What each decode worker does first (the loader's ``worker_init_fn``): lower its CPU
priority (``data.worker_niceness``) and watch the process that started the run, so that a worker never outlives it.

Why the watch: a DataLoader worker checks that its parent is alive only between items (PyTorch's
``ManagerWatchdog``, which with the fork server watches the server rather than the run's process), so a worker in
the middle of a long video went on decoding for ~20 s after a run stopped by a second SIGTERM or killed outright
(the out-of-memory killer, ``kill -9``), holding CPUs, an NVDEC session and memory for a folder nobody reads
(seen in session 10, 2026-12-06). The watch is a daemon thread that checks every :data:`POLL_S` whether the run's
process still exists (a zombie counts as gone) and ends the worker with ``os._exit`` when it does not; while the
run's process lives it does nothing else. This module imports nothing but the standard library.
"""
from __future__ import annotations

import functools
import os
import threading
import time

POLL_S = 0.5      # how often a worker looks for the run's process (seconds)
EXIT_CODE = 3     # a worker's exit status when the run's process is gone


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux: its ``/proc/<pid>/stat`` state; elsewhere
    ``os.kill(pid, 0)`` alone). A process we may not signal exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return True
    # "pid (comm) S ...": the state follows the last ")" (the command name may hold spaces and parentheses)
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")


def watch_run_process(run_pid: int, poll_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that ends this process (``os._exit(EXIT_CODE)``) once process ``run_pid`` is gone
    (:func:`process_alive`), checking every ``poll_s`` seconds. Returns the thread."""
    def watch() -> None:
        while process_alive(run_pid):
            time.sleep(poll_s)
        os._exit(EXIT_CODE)

    thread = threading.Thread(target=watch, name=f"watch-run-{run_pid}", daemon=True)
    thread.start()
    return thread


def start_decode_worker(run_pid: int, niceness: int, worker_id: int) -> None:
    """A decode worker's ``worker_init_fn``: ``os.nice(niceness)`` first when ``niceness`` > 0 (before any
    thread starts, so the decoder and conversion threads inherit it), then :func:`watch_run_process` on ``run_pid`` (the
    process that built the loader). ``worker_id`` is the DataLoader's.

    Raises:
        OSError: (from ``os.nice``) where the process may not change its priority."""
    if niceness:
        os.nice(niceness)
    watch_run_process(run_pid)


def worker_init(num_workers: int, niceness: int = 0):
    """The ``worker_init_fn`` for a loader of ``num_workers`` workers built by this process:
    :func:`start_decode_worker` bound to this process's pid and ``niceness`` (picklable, for the fork server), or
    ``None`` without workers."""
    return functools.partial(start_decode_worker, os.getpid(), niceness) if num_workers > 0 else None
