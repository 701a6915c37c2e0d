"""Forked DataLoader workers that never free the parent's garbage.

A forked worker inherits the parent's heap, cyclic garbage not yet collected included: for example PyAV video
frames whose libswscale context owns a slice-thread pool (FFmpeg 7's swscale). If the worker's first garbage
collection frees one, ``sws_freeContext`` tears down that pool's condition variables, whose threads exist only in
the parent, and the worker blocks for ever in ``pthread_cond_destroy`` (seen in a test's EasyCom worker:
``_worker_loop -> manual_seed -> gc -> VideoFrame dealloc -> sws_freeContext -> avpriv_slicethread_free``; the
DataLoader then waits on it without end). :class:`CollectingForkContext` collects the parent's garbage right
before it forks (at most once per :data:`MIN_INTERVAL_S`, so a pool of 8 workers pays one collection), so no such
object crosses the fork.

A Ctrl-C (or SIGTERM) that arrives while that collection runs an object's ``__del__``, or while an at-fork hook runs
(:func:`models.videollama3.warm._wait_before_fork` waits there for the background weight load), is not raised by
Python but only reported ("Exception ignored in ..."): a run interrupted in that window went on to the end, or
ended in an unrelated error (found by a new-user trial, session 12). :func:`raising_lost_interrupts` catches such a
report around the collection and the fork and raises the interrupt itself afterwards, from the worker's
``start()``, so the run stops as on any Ctrl-C. This module imports nothing but the standard library.
"""
from __future__ import annotations

import contextlib
import gc
import multiprocessing.context as mpc
import sys
import time

MIN_INTERVAL_S = 1.0
_last_collect = float("-inf")


@contextlib.contextmanager
def raising_lost_interrupts():
    """Within the block, a ``KeyboardInterrupt`` (Ctrl-C, or the SIGTERM one of ``cli.Terminated``) that Python
    would only report through ``sys.unraisablehook`` (raised in a ``__del__`` or an at-fork hook) is kept, and the
    first one is raised when the block ends; other reports go to the previous hook as before."""
    lost: list[BaseException] = []
    previous = sys.unraisablehook

    def keep(report) -> None:
        if isinstance(report.exc_value, KeyboardInterrupt):
            lost.append(report.exc_value)
        else:
            previous(report)

    sys.unraisablehook = keep
    try:
        yield
    finally:
        if sys.unraisablehook is keep:
            sys.unraisablehook = previous
    if lost:
        raise lost[0]


def collect_before_fork() -> bool:
    """Run a full garbage collection unless one ran here within :data:`MIN_INTERVAL_S`; whether it ran."""
    global _last_collect
    now = time.monotonic()
    if now - _last_collect < MIN_INTERVAL_S:
        return False
    with raising_lost_interrupts():
        gc.collect()
    _last_collect = time.monotonic()
    return True


class _CollectingForkProcess(mpc.ForkProcess):
    @staticmethod
    def _Popen(process_obj):  # noqa: N802 - multiprocessing's name
        collect_before_fork()
        with raising_lost_interrupts():        # an interrupt during the at-fork hooks: raised after the fork
            return mpc.ForkProcess._Popen(process_obj)


class CollectingForkContext(mpc.ForkContext):
    """``multiprocessing``'s fork context whose processes collect the parent's garbage before forking (module
    docstring); give it to ``torch.utils.data.DataLoader(multiprocessing_context=...)``."""

    Process = _CollectingForkProcess


def fork_context() -> CollectingForkContext:
    """A :class:`CollectingForkContext`."""
    return CollectingForkContext()
