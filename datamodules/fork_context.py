"""Forked DataLoader workers that never free the parent's garbage.

A forked worker inherits the parent's heap, cyclic garbage not yet collected included: for example PyAV video
frames whose libswscale context owns a slice-thread pool (FFmpeg 7's swscale). If the worker's first garbage
collection frees one, ``sws_freeContext`` tears down that pool's condition variables, whose threads exist only in
the parent, and the worker blocks for ever in ``pthread_cond_destroy`` (seen in a test's EasyCom worker:
``_worker_loop -> manual_seed -> gc -> VideoFrame dealloc -> sws_freeContext -> avpriv_slicethread_free``; the
DataLoader then waits on it without end). :class:`CollectingForkContext` collects the parent's garbage right
before it forks (at most once per :data:`MIN_INTERVAL_S`, so a pool of 8 workers pays one collection), so no such
object crosses the fork. This module imports nothing but the standard library.
"""
from __future__ import annotations

import gc
import multiprocessing.context as mpc
import time

MIN_INTERVAL_S = 1.0
_last_collect = float("-inf")


def collect_before_fork() -> bool:
    """Run a full garbage collection unless one ran here within :data:`MIN_INTERVAL_S`; whether it ran."""
    global _last_collect
    now = time.monotonic()
    if now - _last_collect < MIN_INTERVAL_S:
        return False
    gc.collect()
    _last_collect = time.monotonic()
    return True


class _CollectingForkProcess(mpc.ForkProcess):
    @staticmethod
    def _Popen(process_obj):  # noqa: N802 - multiprocessing's name
        collect_before_fork()
        return mpc.ForkProcess._Popen(process_obj)


class CollectingForkContext(mpc.ForkContext):
    """``multiprocessing``'s fork context whose processes collect the parent's garbage before forking (module
    docstring); give it to ``torch.utils.data.DataLoader(multiprocessing_context=...)``."""

    Process = _CollectingForkProcess


def fork_context() -> CollectingForkContext:
    """A :class:`CollectingForkContext`."""
    return CollectingForkContext()
