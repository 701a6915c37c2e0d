"""CPU slots: the host's idle cores decode beside the NVDEC engines (``data.cpu_slots``, issue 41).

Why. With 16 NVDEC workers on a 16-core host the engines were 64 % busy and the CPUs 42 % (H100, session 8's
18-video pool, 10,685 source frames/s), while a full Video-MME needs ~14,000 source frames/s to keep the 2.15 s
step fed (session 17's projection). FFmpeg's software decoder through the CPU reader (``pyav_skip``: only the
packets the sampled frames need) decodes about 330-390 source megapixels per second on one core whatever the
frame size (the CPU machine, one thread: 360p 1,452, 720p 408, 1080p 186 source frames/s), so a few idle cores add
a share of the engines' rate without taking anything from them.

How. ``K`` slots shared by a run's decode workers (one rank's), each an advisory lock on a file
``<folder>/cpu_slot_<k>`` (``fcntl.flock``: taken without waiting, given back when the read ends or its process
dies, whatever killed it). A worker about to read a file on NVDEC first tries to take a free slot; with one, and
when the read's source megapixels are at most ``max_mpx`` (a long read on two threads would hold the run's end),
the CPU reader decodes it with ``threads`` decoder threads instead. The records are those of ``decoder: cpu``
(the CPU reader is the reference NVDEC's frames are checked against; ``video_info.decoder`` names the CPU reader
and ``decoder_fallback`` says :data:`ON_CPU_SLOT`): a change of who decodes, never of what is decoded.

Not on Windows (no ``fcntl``): :func:`CpuSlots.take` then never gives a slot.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no slot is ever taken
    fcntl = None

CPU_SLOTS = 0               # data.cpu_slots: off until measured on the GPU machine (bench/workload.py --paths hybrid)
CPU_SLOT_THREADS = 2        # data.cpu_slot_threads: decoder threads of a read in a slot
CPU_SLOT_MPX = 30000.0      # data.cpu_slot_mpx: at most this many source megapixels (~60 s on two threads)
# why a file NVDEC could decode was read on the CPU (``video_info.decoder_fallback``)
ON_CPU_SLOT = ("data.cpu_slots: a CPU slot was free, so the CPU reader decoded this file beside the NVDEC engines "
               "(the same frames)")


@dataclass(frozen=True)
class CpuSlots:
    """``count`` CPU slots in ``folder`` (created where missing), for reads of at most ``max_mpx`` source
    megapixels on ``threads`` decoder threads. Picklable (a DataLoader worker gets its copy)."""

    folder: str
    count: int
    threads: int = CPU_SLOT_THREADS
    max_mpx: float = CPU_SLOT_MPX

    def __post_init__(self):
        if int(self.count) < 0 or int(self.threads) < 1 or not self.max_mpx > 0:
            raise ValueError(f"CpuSlots: count >= 0, threads >= 1 and max_mpx > 0, got {self.count!r}, "
                             f"{self.threads!r}, {self.max_mpx!r}")

    @contextlib.contextmanager
    def take(self, megapixels: float) -> Iterator[bool]:
        """Within the ``with``: ``True`` and a slot held when one was free and ``megapixels`` (the read's source
        megapixels) are at most ``max_mpx``; ``False`` otherwise (nothing held). Never waits, never raises for a
        folder it cannot use (then ``False``)."""
        fd = None
        if fcntl is not None and self.count > 0 and megapixels <= self.max_mpx:
            fd = _lock_any(Path(self.folder), self.count)
        try:
            yield fd is not None
        finally:
            if fd is not None:
                os.close(fd)   # closing the file gives the lock back (and so does the process's end)


def _lock_any(folder: Path, count: int) -> int | None:
    """An open descriptor holding the lock of a free ``cpu_slot_<k>`` (``k < count``), or ``None``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    start = os.getpid() % count   # workers start their search at different slots
    for j in range(count):
        try:
            fd = os.open(folder / f"cpu_slot_{(start + j) % count}", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            os.close(fd)
    return None
