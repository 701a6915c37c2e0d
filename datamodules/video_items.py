"""The per-video work items of the QA job and the Dataset that decodes them (what a DataLoader worker runs).

Kept apart from :mod:`datamodules.videoqa` and free of Lightning: a worker started with ``spawn`` (the NVDEC
decoders, which need a CUDA context of their own) imports the module that defines the pickled dataset, and
importing Lightning there cost each of 8 workers seconds before its first decode (the first answer waited for it).
"""
from __future__ import annotations

import functools
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from torch.utils.data import Dataset

from callbacks.process_clock import boot_s, process_start_boot_s

from .benchmarks import Question
from .decode import MAX_REPLACED_FRAC, STRICT_FRAMES, NATIVE_DECODE_BYTES, DecodeError, EncoderSizing, decode_video
from .decode.cpu_slots import CpuSlots
from .decode.isolated import decode_isolated


# this process's folders where its DataLoader workers name the video each is decoding (``VideoQADataset``'s
# ``decoding_dir``): a worker killed mid-decode (a decoder crash, the out-of-memory killer) leaves its file behind
DECODING_DIRS: list[str] = []
_WORKER_DEATH = re.compile(r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (?:is killed by signal|exited unexpectedly)")


def dead_worker_pids(exc: BaseException | None) -> list[int]:
    """The pids torch names in ``exc`` or its chain when it reports DataLoader workers that died (``DataLoader worker
    (pid 123) is killed by signal: Segmentation fault.``, raised by its SIGCHLD handler in whatever the main process
    is doing; ``DataLoader worker (pid(s) 123, 456) exited unexpectedly`` from the loader's fetch), else ``[]``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        m = _WORKER_DEATH.search(str(exc)) if isinstance(exc, RuntimeError) else None
        if m:
            return [int(x) for x in re.findall(r"\d+", m.group(1))]
        exc = exc.__cause__ or exc.__context__
    return []


def videos_of_dead_workers(pids: list[int]) -> list[str]:
    """The videos that the workers ``pids`` (:func:`dead_worker_pids`) were decoding when they died, from their
    marks in :data:`DECODING_DIRS` (none for a worker that died between videos)."""
    out = []
    for d in DECODING_DIRS:
        for pid in pids:
            try:
                video = Path(d, str(pid)).read_text(encoding="utf-8", errors="surrogateescape")
            except OSError:
                continue
            if video and video not in out:
                out.append(video)
    return out


# data.decode_timeout_s's default: a decode that has not ended after this many seconds is given up (30 minutes; the
# 30-minute 1080p file of the workload-shaped set took 22 s in 8 NVDEC parts on the H100, session 10)
DECODE_TIMEOUT_S = 1800.0


class DecodeTimeout(Exception):
    """A video's decode did not end within ``data.decode_timeout_s`` (a decoder stuck on a file)."""


def call_with_timeout(fn, timeout_s: float | None, name: str = "decode"):
    """``fn()`` in a daemon thread of its own, waited for at most ``timeout_s`` seconds (``None``: in this thread,
    without a limit): its result, or its exception raised again here.

    A call that does not end in time is abandoned, not stopped (Python cannot stop a thread; a decoder's C code is
    not interruptible): the thread goes on in the background, a daemon, so the process can still exit, and whatever it
    returns later is dropped. So one stuck file costs its own video and a thread, not the run.

    Raises:
        DecodeTimeout: ``fn`` had not returned after ``timeout_s`` seconds.
        BaseException: whatever ``fn`` raised.
    """
    if timeout_s is None:
        return fn()
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise DecodeTimeout(f"did not end within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class DecodeWorkerDied(RuntimeError):
    """A DataLoader worker died mid-run (killed by a signal: a decoder crash on a file, the out-of-memory killer), which
    torch reports in the main process in whatever it is doing, e.g. answering another video; names the video the
    worker was decoding where known. The run stops (the loader cannot go on without the worker)."""


def worker_death_message(exc: BaseException, answering: str | None = None) -> str | None:
    """The one-line account of a DataLoader worker's death that ``exc`` reports (:func:`dead_worker_pids`), naming
    the video it was decoding where its mark says (:func:`videos_of_dead_workers`) and ``answering``, the video the
    main process had in hand (no error record is written for it); ``None`` when ``exc`` reports none."""
    pids = dead_worker_pids(exc)
    if not pids:
        return None
    videos = videos_of_dead_workers(pids)
    cause = (str(exc).strip().splitlines() or [""])[0][:300]
    note = f"; not a failure of {answering}, which this process was answering" if answering else ""
    if not videos:
        return (f"a decode worker died, not while decoding a video this run names ({type(exc).__name__}: {cause})"
                f"{note}. The run stops (the system's out-of-memory killer?): the records written before are safe, "
                "and a rerun resumes")
    return (f"a decode worker died while decoding {', '.join(videos)} ({type(exc).__name__}: {cause}){note}. A "
            "decoder crash on that file or the system's out-of-memory killer ends a worker, and the run stops: the "
            "records written before are safe, and a rerun resumes, decoding that file in a process of its own (the "
            "output folder's decode_crashes.txt names it), so that a second crash gives its questions error records "
            "and the run goes on")


@dataclass
class VideoTask:
    """One video and the (question, job) pairs still to answer on it."""

    video_id: str
    video_path: str
    benchmark: str
    questions: list[Question]
    jobs: dict[str, list[str]] = field(default_factory=dict)  # qid -> job names still to do


class VideoQADataset(Dataset):
    """Decodes each video once (for ``max_budget``) and returns a dict item; a failed decode yields an item with
    ``error`` set instead of frames, so the run records it and goes on.

    ``parts`` (one count per task, or ``None``: one each) makes task ``t`` ``parts[t]`` items, consecutive, each
    decoding part ``k`` of the planned frames (:func:`datamodules.decode.decode_video` ``part``) with ``part: (k, K)``
    and ``task: t`` in the item; :class:`datamodules.part_join.JoiningLoader` joins them. :meth:`items_of` gives a
    task's item indices, :meth:`whole_item` decodes a task whole (the join's way out when its parts do not fit).

    ``cpu_task``: the task whose decode (whole, or each of its parts) goes to the CPU reader where NVDEC would read it
    and the file has at most ``cpu_task_mpx`` source megapixels (:func:`datamodules.decode.decode_video`
    ``cpu_below_mpx``; ``cpu_task_threads`` decoder threads for each read, ``None``: ``decode_threads`` and at least
    2; :func:`datamodules.videoqa.first_video_on_cpu` picks it), ``None``: none.

    ``cpu_slots``: every other read NVDEC would do goes to the CPU reader while one of these slots is free
    (:func:`datamodules.decode.decode_video` ``cpu_slots``; not for a video decoded in a process of its own).

    ``error`` always starts with the video path: a :class:`~datamodules.decode.DecodeError` message as is (see
    :mod:`datamodules.decode.errors` for the per-case table), any other exception of the decoder (including
    ``MemoryError``) as ``"<path>: unexpected decode failure (<type>: <message>)"``. ``KeyboardInterrupt`` and
    ``SystemExit`` are not caught.
    """

    def __init__(self, tasks: list[VideoTask], max_budget: int, decode_max_side: int = 896, decode_threads: int = 1,
                 native_decode_bytes: float = NATIVE_DECODE_BYTES, short_clip_first_frame: bool = False,
                 max_replaced_frac: float = MAX_REPLACED_FRAC, sizing: EncoderSizing | None = None,
                 decoder: str = "cpu", strict_frames: bool = STRICT_FRAMES, parts: list[int] | None = None,
                 cpu_task: int | None = None, cpu_task_mpx: float = 1000.0, decoding_dir: str | None = None,
                 isolated: frozenset[str] | set[str] = frozenset(), decode_timeout_s: float | None = DECODE_TIMEOUT_S,
                 main_mark: str | None = None, cpu_task_threads: int | None = None,
                 cpu_slots: CpuSlots | None = None):
        self.cpu_slots = cpu_slots   # data.cpu_slots (None: none): idle cores read files NVDEC would
        self.cpu_task, self.cpu_task_mpx = cpu_task, cpu_task_mpx
        self.cpu_task_threads = cpu_task_threads   # None: max(decode_threads, 2)
        # decoding in the main process (no workers): the file naming the video it decodes now, left behind if a
        # decoder crash ends the process (the next run reads it: datamodules.videoqa.VideoQADataModule._decode_crashes)
        self.main_mark = main_mark
        self.decode_timeout_s = decode_timeout_s   # None: no limit (call_with_timeout)
        self.isolated = frozenset(isolated)   # videos decoded in a process of their own (datamodules.decode.isolated)
        self.decoding_dir = decoding_dir
        self.tasks, self.max_budget, self.decode_max_side = tasks, max_budget, decode_max_side
        if parts is not None and (len(parts) != len(tasks) or any(int(k) < 1 for k in parts)):
            raise ValueError(f"parts: one count >= 1 per task ({len(tasks)}), got {parts!r}")
        self.parts = [int(k) for k in parts] if parts is not None else None
        # item -> (task, part, parts); without parts, item i is task i
        self._items = [(t, k, n) for t, n in enumerate(self.parts) for k in range(n)] if self.parts else None
        self._first = None
        if self._items is not None:
            self._first = [0]
            for n in self.parts:
                self._first.append(self._first[-1] + n)
        self.strict_frames = strict_frames
        self.decoder = decoder
        self.sizing = sizing   # None: frames at the decode size; else held at the encoder's sizes only
        self.max_replaced_frac = max_replaced_frac
        self.decode_threads = decode_threads
        self.native_decode_bytes, self.short_clip_first_frame = native_decode_bytes, short_clip_first_frame

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else len(self.tasks)

    def items_of(self, task: int) -> list[int]:
        """The item indices of task ``task`` (its parts, in order; ``[task]`` without parts)."""
        if self._first is None:
            return [task]
        return list(range(self._first[task], self._first[task + 1]))

    def __getitem__(self, i: int) -> dict:
        if self._items is None:
            return self._decode(i, None)
        t, k, n = self._items[i]
        return self._decode(t, (k, n) if n > 1 else None)

    def _mark(self, video_path: str) -> "Path | None":
        """In a DataLoader worker with a ``decoding_dir``: write ``<decoding_dir>/<pid>`` naming the video it decodes
        now (removed when the decode returns), so the main process can name the video that killed a worker
        (:func:`videos_of_dead_workers`); in the main process (no workers) with a ``main_mark``, that file, which the
        next run reads if a decoder crash ended this process. ``None`` otherwise or where it cannot be written."""
        from torch.utils.data import get_worker_info

        if get_worker_info() is None:
            mark = Path(self.main_mark) if self.main_mark else None
        else:
            mark = Path(self.decoding_dir, str(os.getpid())) if self.decoding_dir is not None else None
        if mark is None:
            return None
        try:
            mark.write_text(video_path, encoding="utf-8", errors="surrogateescape")
        except OSError:
            return None
        return mark

    def _cpu_task_threads(self) -> int:
        """Decoder threads of ``cpu_task``'s CPU read: ``cpu_task_threads``, else ``decode_threads`` and at least 2."""
        n = self.cpu_task_threads
        return int(n) if n is not None else max(self.decode_threads, 2)

    def whole_item(self, task: int) -> dict:
        """Task ``task`` decoded whole (no part), as without ``parts``."""
        return self._decode(task, None)

    def _decode(self, i: int, part: tuple[int, int] | None) -> dict:
        task = self.tasks[i]
        item = {"video_id": task.video_id, "video_path": task.video_path, "benchmark": task.benchmark,
                "questions": [asdict(q) for q in task.questions], "jobs": task.jobs, "error": None}
        if part is not None:
            item.update(task=i, part=part)
        start, start_boot = time.perf_counter(), boot_s()
        if self.decoder != "cpu":   # registers READERS["nvdec"] in this process (a spawned worker starts without it)
            import datamodules.decode.nvdec  # noqa: F401
        on_cpu = i == self.cpu_task and self.decoder != "cpu"      # (each of its parts too: data.first_video_parts)
        mark = self._mark(task.video_path)
        # a file that killed a decode worker in an earlier run: decoded in a child process, whose crash costs only
        # this video's questions
        decode = decode_video
        slots = None if on_cpu else self.cpu_slots
        if task.video_path in self.isolated and part is None:   # its hand-over folder goes with the run's marks
            decode = functools.partial(decode_isolated, tmp_dir=self.decoding_dir)
            slots = None   # (its arguments travel as JSON)
        call = functools.partial(decode, task.video_path, self.max_budget, self.decode_max_side,
                                 num_threads=self._cpu_task_threads() if on_cpu else self.decode_threads,
                                 native_decode_bytes=self.native_decode_bytes,
                                 short_clip_first_frame=self.short_clip_first_frame,
                                 max_replaced_frac=self.max_replaced_frac, sizing=self.sizing,
                                 decoder=self.decoder, strict_frames=self.strict_frames, part=part,
                                 cpu_below_mpx=self.cpu_task_mpx if on_cpu else None, cpu_slots=slots)
        try:
            dec = call_with_timeout(call, self.decode_timeout_s, f"decode {task.video_id}")
            item.update(frames=dec.frames, times_s=dec.times_s, video_info=dec.info)
            if part is not None:
                item["part_bounds"] = dec.part
        except DecodeError as e:
            item["error"] = str(e)
        except DecodeTimeout:
            item["error"] = (f"{task.video_path}: the decode did not end within {self.decode_timeout_s:g} s "
                             "(data.decode_timeout_s) and was given up; its questions are error records and the run "
                             "goes on (a decoder stuck on this file? a rerun tries it again)")
        except Exception as e:  # noqa: BLE001 - any decoder failure must become an error record, not a crash
            first = (str(e).strip().splitlines() or [""])[0][:300]
            item["error"] = f"{task.video_path}: unexpected decode failure ({type(e).__name__}: {first})"
        finally:
            if mark is not None:
                try:
                    mark.unlink(missing_ok=True)
                except OSError:   # the temporary folder gone: nothing to name, nothing to stop for
                    pass
        item["decode_s"] = time.perf_counter() - start      # worker seconds (StageTimer reports their sum)
        item["decoded_unix"] = time.time()                  # when the worker finished (bench timelines)
        # the decode window and the worker's start on the machine's boot clock: StageTimer puts the first video's on
        # the main process's timeline (timeline_s: first_worker_start, first_decode_start / _end)
        item["decode_boot_s"] = (start_boot, boot_s())
        item["worker_start_boot_s"] = process_start_boot_s()
        return item
