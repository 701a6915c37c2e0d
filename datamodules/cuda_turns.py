"""Decode workers make their first CUDA calls one after another, in the order of their first videos (issue 41).

Why. In every CLI run on the workload-shaped set that sessions 12-14 recorded (19 runs, lent H100s), the 15 NVDEC
workers start their first jobs together and the NVDEC engines stay idle for 5.1-6.4 s after, while the CPUs are
28-39 % busy: the workers wait in the driver, one after another, for their first CUDA calls (a context each, the
decoder's capabilities). Which worker gets through first is the driver's draw, so the second video, which the
step needs first, waited 0.4-4.9 s for its frames after the first answer. With turns, worker ``k`` (the
DataLoader's id, whose first item is the loader's ``k``-th: PyTorch hands the first indices to the workers in turn)
makes those calls once workers ``0 .. k-1`` have made theirs or passed (a worker whose first video is read on the
CPU passes at once), or after :data:`WAIT_S` at most, so that the earliest videos get the engines first. Nothing
else changes: the same calls, the same context, the same frames.

``data.cuda_turns`` (:class:`datamodules.videoqa.VideoQADataModule`) switches it; the turn counter is a
``multiprocessing.Value`` of the workers' start method (:func:`make_counter`), handed to each worker by its
``worker_init_fn`` (:func:`datamodules.worker_watch.start_decode_worker`) and kept here (:func:`install`); the item
code asks for the turn before its first decode (:func:`take_turn`). Standard library only.
"""
from __future__ import annotations

import time

WAIT_S = 2.0        # the longest a worker waits for the workers before it (seconds)
POLL_S = 0.005

_TURNS = None       # this worker's counter (install), None in the main process or with turns off
_TAKEN = False      # whether this worker has had its turn


def make_counter(context):
    """The shared counter of one loader's workers: a ``Value("i", 0)`` of ``context`` (the workers' start method)."""
    return context.Value("i", 0)


def pending() -> bool:
    """Whether this worker has a counter and has not had its turn yet."""
    return _TURNS is not None and not _TAKEN


def install(counter) -> None:
    """Keep ``counter`` for this worker (called by its ``worker_init_fn``; ``None``: turns off)."""
    global _TURNS, _TAKEN
    _TURNS, _TAKEN = counter, False


def take_turn(rank: int, first_cuda_calls=None, wait_s: float = WAIT_S) -> float | None:
    """This worker's turn, once: wait until the workers ranked below ``rank`` have had theirs (at most ``wait_s``),
    run ``first_cuda_calls()`` (``None``: this worker's first video makes none, so it passes at once), then let
    the next worker go. Later calls, and calls without a counter installed, do nothing.

    Returns:
        the seconds waited for the earlier workers, or ``None`` when nothing was done.

    Raises:
        whatever ``first_cuda_calls`` raises (after the next worker was let go).
    """
    global _TAKEN
    if _TURNS is None or _TAKEN:
        return None
    _TAKEN = True
    waited = 0.0
    try:
        if first_cuda_calls is not None:
            t0 = time.perf_counter()
            deadline = t0 + wait_s
            while _TURNS.value < rank and time.perf_counter() < deadline:
                time.sleep(POLL_S)
            waited = time.perf_counter() - t0
            first_cuda_calls()
    finally:
        with _TURNS.get_lock():
            _TURNS.value = max(_TURNS.value, rank + 1)
    return waited
