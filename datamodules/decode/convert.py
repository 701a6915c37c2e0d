"""The sampled frames' conversion to RGB on threads of their own (:class:`ConvertPool`), so that an NVDEC session
hands a decoded surface over and goes back to feeding its engine (:mod:`datamodules.decode.nvdec`)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from datamodules.decode.swscale import Yuv420ToRgb, nv12_planes


class ConvertPool:
    """The sampled frames' YUV -> RGB conversions (:class:`Yuv420ToRgb`, decord's swscale) on threads of their
    own, so that an NVDEC session hands a frame over and goes back to feeding its engine.

    Profiled on the H200 (``bench/device_decode.sh``, 8 copies of a 1080p H.264 video in flight, 4 sessions
    each): inline in the session, the conversion took 9 s of each video's 29 s wall (22 s of 27 s on a whole
    30-minute video), time in which that session fed nothing. Here each thread has its own converter (one
    ``SwsContext`` is not thread-safe), every frame is written to its own row of ``out`` (so the order of the
    threads changes nothing), and at most ``max_pending`` host surfaces wait (``put`` blocks beyond that, which
    bounds the host memory: an NV12 1080p surface is 3.1 MB).

    Args:
        make_convert: a new :class:`Yuv420ToRgb` for the stream (called once per thread).
        height, width: the decoded planes' size.
        out: ``(n, dh, dw, 3)`` uint8, written at the index given to :meth:`put`.
        threads: conversion threads.
        max_pending: surfaces handed over and not yet converted, at most.
    """

    def __init__(self, make_convert, height: int, width: int, out: np.ndarray, threads: int,
                 max_pending: int | None = None):
        self._make, self.height, self.width, self.out = make_convert, int(height), int(width), out
        self._pool = ThreadPoolExecutor(max(int(threads), 1), thread_name_prefix="nvdec-convert")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._converters: list[Yuv420ToRgb] = []
        self._slots = threading.BoundedSemaphore(max_pending or 4 * max(int(threads), 1))
        self._futures = []
        self.convert_s = 0.0

    def _convert(self, host: np.ndarray, index: int) -> None:
        try:
            t0 = time.perf_counter()
            conv = getattr(self._local, "conv", None)
            if conv is None:
                conv = self._local.conv = self._make()
                with self._lock:
                    self._converters.append(conv)
            y, u, v = nv12_planes(host, self.height, self.width)
            self.out[index] = conv(y, u, v)
            with self._lock:
                self.convert_s += time.perf_counter() - t0
        finally:
            self._slots.release()

    def put(self, host_nv12: np.ndarray, index: int) -> None:
        """Convert ``host_nv12`` (an NV12 surface on the host, owned by the pool from now on) into
        ``out[index]``; blocks while ``max_pending`` surfaces wait."""
        self._slots.acquire()
        try:
            self._futures.append(self._pool.submit(self._convert, host_nv12, index))
        except BaseException:
            self._slots.release()
            raise

    def finish(self) -> None:
        """Wait for every conversion; re-raises the first one's error. The pool can take no more frames."""
        try:
            for f in self._futures:
                f.result()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the threads (conversions not started are cancelled, running ones finish) and free each thread's
        ``SwsContext``; idempotent. :meth:`finish` calls it."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for c in self._converters:
                c.close()
            self._converters.clear()
