"""Multiple-choice video QA data: one item per video carrying all its questions, decoded in DataLoader workers.

Resuming: before any decode, questions whose qid is already written for a job are dropped (the prediction writer
reports what is done), and videos with nothing left are skipped. The decode always targets the run's largest
budget, so a resumed run produces the same frames, and records, as an uninterrupted one.
"""
from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from lightning.pytorch import LightningDataModule
import torch
from torch.utils.data import DataLoader

# os.nice's range on Linux: 19 is the lowest priority
MAX_NICENESS = 19

from algorithms.errors import SettingError, check_int

from .benchmarks import AnnotationError, Question, canonical_loader_kwargs, load_benchmark, question_sha1
from .benchmarks.base import check_media_present, path_problem
from .decode.cpu_slots import CPU_SLOT_MPX, CPU_SLOT_THREADS, CPU_SLOTS, CpuSlots
from .decode import (DECODERS, MAX_REPLACED_FRAC, STRICT_FRAMES, NATIVE_DECODE_BYTES, auto_decode_threads,
                     auto_num_workers)
from .fork_context import fork_context
from .part_join import (DECODE_PART_MB, JoiningLoader, PartSampler, decode_parts, max_parts,
                        within_spare_workers)
from .sharding import CostBalancedSampler, estimate_cost
from .video_items import DECODE_TIMEOUT_S, VideoQADataset, VideoTask  # noqa: F401 - re-exported (defined apart)
from .worker_server import WORKER_PRELOAD  # noqa: F401 - re-exported: decode_worker_context's list
from .worker_watch import worker_init

FIRST_VIDEO_THREADS = 6         # data.first_video_threads: decoder threads of that CPU read (session 13, H100)
FIRST_VIDEO_PARTS = 1           # data.first_video_parts: that CPU read cut into this many parts (1: whole)
FIRST_VIDEO_CPU_MPX = 1000.0   # data.first_video_cpu_mpx: the rank's first video read on the CPU up to this many
                               # source megapixels (a 90 s 360p25 video: 518)

log = logging.getLogger(__name__)




def decode_worker_context(decoder: str, num_workers: int, cuda: bool, preload: tuple[str, ...] = (),
                          set_preload: bool = True):
    """How the DataLoader starts its decode workers: ``None`` (fork, the default) unless the run is on a CUDA machine.

    NVDEC in a worker needs a CUDA context of its own, and a forked child of a process that holds one cannot make
    it. Those workers were spawned: each started a fresh interpreter and imported torch, the decoders and the
    video processor (measured here: 3.0 s for ``datamodules.video_items`` and 1.6 s to unpickle the processor per
    worker, 8 of them at once, while the main process loads the model and compiles). They now come from a
    ``forkserver``: one clean process (no CUDA context) imports :data:`WORKER_PRELOAD` and ``preload`` once, and
    forks each worker from there (``bench/worker_start.py`` times both). The CPU decoders (``decoder: cpu``) on a
    CUDA machine come from the same server: a fork of the main process there waits for the background weight load
    and compilation (:mod:`models.videollama3.warm`: a fork while they hold a lock can hang the child), which started
    the workers 5.9 s after the loader on the H100 (2026-12-06) and made the first video wait 2.9 s, and it copies a
    process that holds a CUDA context and its threads.

    Args:
        decoder: ``data.decoder`` (``cpu`` | ``nvdec`` | ``auto``; any of them uses the server on CUDA).
        num_workers: DataLoader workers (0: decoding in the main process).
        cuda: whether this process has a CUDA device (NVDEC is only tried there; elsewhere workers are forked).
        preload: more modules for the server to import (the video processor's, which the pickled dataset holds).
        set_preload: ``False``: only say whether a fork server is used (the context, its preload list untouched).

    Returns:
        ``None`` or the ``forkserver`` context, its preload set (the server is process-wide: the list applies when
        it starts, :meth:`VideoQADataModule.setup` starts it early).
    """
    if num_workers == 0 or not cuda:
        return None
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    if set_preload:
        ctx.set_forkserver_preload(list(dict.fromkeys([*WORKER_PRELOAD, *preload])))
    return ctx


def _duration_s(task: VideoTask) -> float | None:
    """A numeric duration from the annotation when it has one (LongVideoBench ``duration``), else None."""
    for q in task.questions:
        for key in ("duration_s", "duration"):
            v = q.meta.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return float(v)
    return None


def nvdec_missing() -> str | None:
    """Why ``decoder=nvdec`` cannot run here for a reason the user fixes outside the run, or ``None``: PyNvVideoCodec
    not installed (``pip install -e '.[nvdec]'``), or no CUDA GPU in this process. Checked before
    ``datamodules.decode.nvdec`` is imported: its import-order guard would otherwise blame decord for a package that is
    simply not there (:func:`datamodules.decode.nvdec.available` gives the remaining reasons)."""
    import importlib.util

    if importlib.util.find_spec("PyNvVideoCodec") is None:
        return "PyNvVideoCodec is not installed (pip install -e '.[nvdec]')"
    if not torch.cuda.is_available():
        return "no CUDA GPU in this process (NVDEC decodes on the GPU)"
    return None


class VideoQADataModule(LightningDataModule):
    """A benchmark's questions grouped by video.

    Args:
        benchmark: loader name (``videomme``, ``mlvu``, ``lvb``, ``worldsense``).
        root: benchmark root directory.
        loader_kwargs: extra arguments of the loader (e.g. ``{"parquet": ...}``).
        num_workers: DataLoader worker processes decoding videos; ``None``: this host's CPUs per GPU process, at
            least 2, at most 16 (:func:`datamodules.decode.auto_num_workers`).
        prefetch_factor: videos each worker decodes ahead.
        decode_max_side: longest decoded side (pixels) of a video whose native-size frames would exceed
            ``native_decode_bytes``.
        native_decode_bytes: the estimated frames (``n_est * h * w * 3`` bytes) up to which a video is decoded at
            its native size (seed 001's ``NATIVE_DECODE_BYTES = 2e9``); larger ones at ``decode_max_side``.
        short_clip_first_frame: keep the frame at 0 s of a clip shorter than one sampling step (seed 001 decodes
            none: an error record; deviation, off by default).
        strict_frames: ``false`` (default, seed 001: an error record only when ``ffmpeg.run`` exits non-zero or no
            frame comes back): a video with damaged packets is answered with the frames the decoder gives,
            concealed ones included, and its records list them (``video_info.frames_concealed``, positions in the
            sampled frames; :func:`datamodules.decode.decode_video`); a video NVDEC decoded is not checked
            (``video_info.concealment_checked: false``, docs/deviations.md). ``true`` (deviation): a concealed or
            missing sampled frame is unreadable, so the video is an error record unless ``max_replaced_frac``
            allows it; it needs the flags, so ``decoder: nvdec`` is refused and ``auto`` reads on the CPU.
        max_replaced_frac: with ``strict_frames``, 0 (default) makes any unreadable sampled frame an error record.
            Above 0 (deviation): a video whose batch decode fails (corrupt packets) keeps its readable frames, each
            unreadable sampled frame replaced by the nearest readable one (``meta.frames_replaced`` in its
            records), unless more than this fraction is unreadable (then an error record). Without
            ``strict_frames`` it applies only to frames no reader can give at all.
        decoder: ``cpu`` (default), ``nvdec`` or ``auto``: the reader that decodes the planned frames
            (:func:`datamodules.decode.resolve_decoder`; records carry ``video_info.decoder``). Frames NVDEC
            decodes are not checked for concealment (``video_info.concealment_checked: false``); ``cpu`` checks.
        in_order: deliver the decoded videos in the sampler's order (``True``), or each as soon as its worker has
            decoded it (``False``, the default: ``DataLoader(in_order=False)``), so that a short video is not held
            behind a long one that an earlier worker is still decoding. Records are keyed by question id, so the
            order changes no record, and resuming and the per-rank shards are the same either way.
        decode_threads: decoder threads per worker; ``None``: this host's CPUs shared among all decoders
            (:func:`datamodules.decode.auto_decode_threads`, workers x this host's ranks, at most 2 each).
        limit_videos: use only the first N videos (quick runs).
        hold_encoder_sizes: decode each video in chunks and hold its frames only at the sizes the vision encoder
            reads them (the module's ``frame_sizing()``: each budget's grid and the raw grid, resized by the
            processor's own resize as the chunk is decoded), so host memory per in-flight video is the encoder's
            pixels, not the decode (an hour of 1080p at B = 16384: ~0.3 GB instead of ~2.8 GB). The encoder's
            inputs are bit-identical on the CPU (the resize runs in the worker, on the CPU, as seed 001's processor
            does). ``False``, or a module without ``frame_sizing`` (the layout ablation): frames at the decode size.
        decode_part_mb: where the videos may be decoded by NVDEC in the workers (``decoder`` ``nvdec`` or ``auto``
            on a CUDA machine, ``num_workers`` >= 2), a file larger than this many MB is decoded as
            ``ceil(MB / decode_part_mb)`` parts (at most :func:`datamodules.part_join.max_parts`: half the workers,
            at least 2), each by its own worker, and joined in the main process before its step
            (:mod:`datamodules.part_join`): the NVDEC sessions of one process serialise, so one long video decoded by
            one worker bounded the feed. Such a run's workers hold one item each at a time (``prefetch_factor``
            is 1 there), so that no video waits in the queue of a worker busy with a long part. The joined frames,
            labels and ``video_info`` are the whole decode's (a video whose parts do not fit is decoded whole).
            ``0`` or ``null``: every video whole. Not applied with ``strict_frames`` or ``max_replaced_frac > 0``
            (their rules look across the whole video).
        first_video_cpu_mpx: with ``decoder: auto`` on a CUDA machine with PyNvVideoCodec and ``num_workers`` >= 1,
            the rank's first video (the cheapest of its run order) is read by the CPU reader, with
            ``first_video_threads`` decoder threads, when it has at most this many source megapixels (frames x
            width x height / 1e6, from the probe its worker makes anyway;
            :func:`datamodules.decode.video.source_megapixels`; ``0`` or ``null``: never). A worker's first NVDEC
            decode starts its CUDA context while every other worker starts its own and shares the engines: on the
            H100 (16 workers) the first video (90 s 360p, 518 Mpx) took 7.1-8.7 s from NVDEC against 3.3 s from the
            CPU, with the model waiting for it. The CPU reader is the reference NVDEC's frames are checked against,
            so its records are those of ``decoder: cpu`` (``video_info.decoder`` names the CPU reader,
            ``decoder_fallback`` says why).
        first_video_threads: decoder threads of that first video's CPU read (default 6; ``None``:
            ``decode_threads``' count, at least 2, as before session 13). FFmpeg's frame threading is bit-exact:
            only the speed changes. H100, 16 workers, with ``model.init_args.weight_reader: pinned``: the first
            video (90 s 360p) decoded in 3.4-3.8 s against 4.6-5.5 s with 2 threads (records identical).
        first_video_parts: that first video's CPU read cut into this many parts (at most ``num_workers``), each
            read by its own worker with ``first_video_threads`` threads and joined before its step as
            ``decode_part_mb``'s parts are (the same frames, labels and ``video_info``; a video whose parts do not
            fit is decoded whole). ``1`` (default): one worker reads it whole. The run's workers then hold one item
            each at a time, as with ``decode_part_mb``'s parts. Not applied with ``strict_frames`` or
            ``max_replaced_frac > 0``.
        decode_timeout_s: a video (or a part of one) whose decode has not ended after this many seconds is given up:
            its questions become error records naming the file and the setting, and the run goes on (``null``: no
            limit). The stuck decode is abandoned in a daemon thread of its worker (Python cannot stop it), so a
            decoder stuck on a file costs that video and a thread, not the run; a rerun tries the file again.
        pin_memory: the loader's pin-memory thread copies each decoded video's frames to page-locked memory in the
            main process (``DataLoader(pin_memory=True)``), so the step's copy to the GPU does not block the host.
            ``None`` (default): on CUDA. ``false``: not pinned (for A/B runs: the pinning runs beside the step in the
            main process). Records do not change.
        worker_niceness: each decode worker lowers its CPU priority by this much (``os.nice``, 0 to 19; 0, the
            default: unchanged), so that the rank's own process, which queues the GPU's work, is not starved of a
            core by the workers and their conversion threads. On the H100 (16 workers, 16 cores, session 10) the
            steps that ran while the 30-minute 1080p file was still decoding took 40-60 % longer than the same
            videos' steps in a run where decoding had ended (the CPUs 80-95 % busy, the SMs below 100 %). Records
            do not change.
        cpu_slots: with ``decoder: auto`` on a CUDA machine and ``num_workers`` >= 1, up to this many of the rank's
            workers at a time read a file (or a part) NVDEC would read with the CPU reader instead, on
            ``cpu_slot_threads`` decoder threads, when it has at most ``cpu_slot_mpx`` source megapixels
            (:mod:`datamodules.decode.cpu_slots`): the host's idle cores decode beside the engines. The records are
            the CPU reader's, which NVDEC's equal (``video_info.decoder`` names the reader). ``0`` (default): none.
            Each slot takes a worker from the engines while it reads, so raise ``num_workers`` by as many.
    """

    def __init__(self, benchmark: str = "videomme", root: str = "assets/demo_videomme",
                 loader_kwargs: dict | None = None, num_workers: int | None = 2, prefetch_factor: int = 2,
                 decode_max_side: int = 896, decode_threads: int | None = None, limit_videos: int | None = None,
                 native_decode_bytes: float = NATIVE_DECODE_BYTES, short_clip_first_frame: bool = False,
                 max_replaced_frac: float = MAX_REPLACED_FRAC, hold_encoder_sizes: bool = True,
                 decoder: str = "cpu", in_order: bool = False, strict_frames: bool = STRICT_FRAMES,
                 decode_part_mb: float | None = DECODE_PART_MB,
                 first_video_cpu_mpx: float | None = FIRST_VIDEO_CPU_MPX, worker_niceness: int = 0,
                 decode_timeout_s: float | None = DECODE_TIMEOUT_S, pin_memory: bool | None = None,
                 first_video_threads: int | None = FIRST_VIDEO_THREADS, first_video_parts: int = FIRST_VIDEO_PARTS,
                 cpu_slots: int = CPU_SLOTS, cpu_slot_threads: int = CPU_SLOT_THREADS,
                 cpu_slot_mpx: float = CPU_SLOT_MPX):
        super().__init__()
        check_int("data.cpu_slots", cpu_slots, 0)
        check_int("data.cpu_slot_threads", cpu_slot_threads, 1)
        if isinstance(cpu_slot_mpx, bool) or not isinstance(cpu_slot_mpx, (int, float)) \
                or not math.isfinite(cpu_slot_mpx) or cpu_slot_mpx <= 0:
            raise SettingError(f"data.cpu_slot_mpx must be a finite number > 0 (megapixels), got {cpu_slot_mpx!r}")
        self.cpu_slots, self.cpu_slot_threads, self.cpu_slot_mpx = cpu_slots, cpu_slot_threads, float(cpu_slot_mpx)
        check_int("data.first_video_parts", first_video_parts, 1)
        self.first_video_parts = first_video_parts
        check_int("data.first_video_threads", first_video_threads, 1, allow_none=True,
                  none_means="data.decode_threads' count, at least 2")
        self.first_video_threads = first_video_threads
        if pin_memory is not None and not isinstance(pin_memory, bool):
            raise SettingError(f"data.pin_memory must be true, false or null (pinned on CUDA), got {pin_memory!r}")
        self.pin_memory = pin_memory
        if decode_timeout_s is not None and (isinstance(decode_timeout_s, bool)
                                             or not isinstance(decode_timeout_s, (int, float))
                                             or not math.isfinite(decode_timeout_s) or decode_timeout_s <= 0):
            raise SettingError(f"data.decode_timeout_s must be a number of seconds > 0, or null for no limit, got "
                               f"{decode_timeout_s!r}")
        self.decode_timeout_s = decode_timeout_s
        check_int("data.worker_niceness", worker_niceness, 0)
        if worker_niceness > MAX_NICENESS:
            raise SettingError(f"data.worker_niceness={worker_niceness}: expected 0 to {MAX_NICENESS} (os.nice's range)")
        self.worker_niceness = worker_niceness
        for name, v, unit in (("decode_part_mb", decode_part_mb, "MB"),
                              ("first_video_cpu_mpx", first_video_cpu_mpx, "megapixels")):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0):
                raise SettingError(f"data.{name} must be a finite number >= 0 ({unit}) or null, got {v!r}")
        self.first_video_cpu_mpx = first_video_cpu_mpx
        self.decode_part_mb = decode_part_mb
        if not isinstance(strict_frames, bool):
            raise SettingError(f"data.strict_frames must be true or false, got {strict_frames!r}")
        self.strict_frames = strict_frames
        if not isinstance(in_order, bool):
            raise SettingError(f"data.in_order must be true or false, got {in_order!r}")
        self.in_order = in_order
        if decoder not in DECODERS:
            raise SettingError(f"data.decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
        if decoder == "nvdec" and strict_frames:   # the rule needs concealment flags; NVDEC's frames have none
            raise SettingError("data.strict_frames=true needs the decoder's concealment flags, which frames decoded "
                               "by NVDEC lack (docs/deviations.md): use data.decoder cpu (or auto, which then reads "
                               "every video on the CPU)")
        self.decoder = decoder
        if not isinstance(hold_encoder_sizes, bool):
            raise SettingError(f"data.hold_encoder_sizes must be true or false, got {hold_encoder_sizes!r}")
        self.hold_encoder_sizes = hold_encoder_sizes
        self.benchmark, self.root = benchmark, root
        self.loader_kwargs = loader_kwargs or {}
        self.num_workers, self.prefetch_factor = num_workers, prefetch_factor
        self.decode_max_side, self.limit_videos = decode_max_side, limit_videos
        check_int("data.decode_threads", decode_threads, 1, allow_none=True,
                  none_means="this host's CPUs shared among the decoders")
        check_int("data.num_workers", num_workers, 0, allow_none=True,
                  none_means="this host's CPUs per GPU process, 2 to 16")
        for name, value, low in (("prefetch_factor", prefetch_factor, 1), ("decode_max_side", decode_max_side, 2)):
            check_int(f"data.{name}", value, low)
        check_int("data.limit_videos", limit_videos, 1, allow_none=True, none_means="all videos")
        self.decode_threads = decode_threads
        if isinstance(native_decode_bytes, bool) or not isinstance(native_decode_bytes, (int, float)) \
                or not native_decode_bytes >= 0:
            raise SettingError(f"data.native_decode_bytes must be a number >= 0 (bytes), got {native_decode_bytes!r}")
        if not isinstance(short_clip_first_frame, bool):
            raise SettingError(f"data.short_clip_first_frame must be true or false, got {short_clip_first_frame!r}")
        self.native_decode_bytes, self.short_clip_first_frame = float(native_decode_bytes), short_clip_first_frame
        if isinstance(max_replaced_frac, bool) or not isinstance(max_replaced_frac, (int, float)) \
                or not 0 <= max_replaced_frac < 1:
            raise SettingError(f"data.max_replaced_frac must be a number in [0, 1), got {max_replaced_frac!r}")
        self.max_replaced_frac = float(max_replaced_frac)
        self.questions: list[Question] | None = None

    @property
    def workers(self) -> int:
        """The run's DataLoader workers: ``num_workers``, or where it is ``None``
        :func:`datamodules.decode.auto_num_workers` for this host's processes (the trainer's devices)."""
        if self.num_workers is not None:
            return self.num_workers
        procs = self.trainer.num_devices if self.trainer is not None else 1
        cached = getattr(self, "_auto_workers", None)    # (processes, workers): the mask and cgroup read once
        if cached is None or cached[0] != procs:
            cached = self._auto_workers = (procs, auto_num_workers(procs))
        return cached[1]

    # settings recorded in run.json only when they differ from these defaults (absent there = the default, compared)
    RECORD_DEFAULTS = {"max_replaced_frac": MAX_REPLACED_FRAC, "strict_frames": STRICT_FRAMES}

    def record_settings(self) -> dict:
        """Settings that determine a record (kept in the output folder's ``run.json``)."""
        return {"benchmark": self.benchmark, "root": str(Path(self.root).resolve()),
                "loader_kwargs": canonical_loader_kwargs(self.benchmark, self.loader_kwargs),
                "decode_max_side": self.decode_max_side,
                "native_decode_bytes": self.native_decode_bytes, "short_clip_first_frame": self.short_clip_first_frame,
                **({"max_replaced_frac": self.max_replaced_frac}
                   if self.max_replaced_frac != MAX_REPLACED_FRAC else {}),
                **({"strict_frames": self.strict_frames} if self.strict_frames != STRICT_FRAMES else {})}

    @staticmethod
    def canonical_settings(recorded: dict) -> dict:
        """A ``run.json``'s settings as :meth:`record_settings` writes them now: its ``loader_kwargs`` as the values
        the loader uses (:func:`datamodules.benchmarks.canonical_loader_kwargs`), so a folder written with ``{}``
        resumes with ``{video_dir: videos}`` (the same folder) and one written before the arguments were
        recorded that way still compares equal."""
        if "loader_kwargs" not in recorded:
            return recorded
        return {**recorded, "loader_kwargs": canonical_loader_kwargs(recorded.get("benchmark", "videomme"),
                                                                     recorded["loader_kwargs"])}

    def setup(self, stage: str | None = None) -> None:
        """Load the questions (once) and check, before any record is written, that the benchmark root exists
        and that most videos are there (:func:`datamodules.benchmarks.base.check_media_present`).

        Raises:
            SettingError: ``root`` does not exist or is not a folder; a ``video_dir`` / ``subtitle_dir`` that is
                absolute or has a ``..`` component; ``decoder=nvdec`` where NVDEC cannot run.
            AnnotationError: the annotation is malformed, empty or has duplicate qids; ``MediaMissingError`` (one)
                when more than half of the videos are missing or empty (0 bytes), naming the folder looked in.
        """
        if self.decoder == "nvdec":   # every video on NVDEC: this process must be able to use it at all
            why = nvdec_missing()
            if why is None:
                from datamodules.decode import nvdec

                why = nvdec.available()
            if why:
                raise SettingError(f"data.init_args.decoder=nvdec: {why}; use decoder cpu (or auto, which falls "
                                   "back to the CPU per file)")
        if self.questions is None:
            problem = path_problem(self.root, "folder")
            if problem is not None:   # said as what it is: a symbolic link loop is no "does not exist"
                raise SettingError(f"data.init_args.root={self.root}: the benchmark root "
                                   + ("does not exist" if problem == "not found" else f"is {problem}"))
            for key in ("video_dir", "subtitle_dir"):   # joined into every media path, which stays under root
                value = (self.loader_kwargs or {}).get(key)
                if isinstance(value, (str, Path)) and (Path(value).is_absolute() or ".." in Path(value).parts):
                    raise SettingError(f"data.init_args.loader_kwargs.{key}={value}: must be a folder inside the "
                                       f"benchmark root {self.root}, written relative to it; set "
                                       "data.init_args.root to the folder that holds it (or link it under the root)")
            qs = load_benchmark(self.benchmark, self.root, **self.loader_kwargs)
            if not qs:
                raise AnnotationError(f"{self.benchmark} at {self.root}: the annotation holds no questions"
                                      + (f" with loader_kwargs {self.loader_kwargs}" if self.loader_kwargs else ""))
            dup = [q for q, n in Counter(q.qid for q in qs).items() if n > 1]
            if dup:
                raise AnnotationError(f"{self.benchmark} at {self.root}: duplicate qid(s) {dup[:10]}")
            kw = f" with loader_kwargs {self.loader_kwargs}" if self.loader_kwargs else ""
            missing = check_media_present(qs, f"{self.benchmark} at {self.root}{kw}")
            if missing:
                log.warning("%s: %d of %d videos are missing (each gives error records), e.g. %s", self.benchmark,
                            len(missing), len({q.video_path for q in qs}), missing[0])
            self.questions = qs
        if stage == "predict":
            self._start_worker_server()

    def _worker_context(self):
        """This run's decode-worker context (:func:`decode_worker_context`), from the module's frame sizing (read
        once: its processor's module is preloaded by the fork server)."""
        module = self.trainer.lightning_module if self.trainer is not None else None
        if getattr(self, "_sizing_of", None) != id(module):
            sizing_of = getattr(module, "frame_sizing", None)
            self._sizing = sizing_of() if self.hold_encoder_sizes and sizing_of is not None else None
            self._sizing_of = id(module)
        processor = None if self._sizing is None else self._sizing.processor
        preload = () if processor is None else (getattr(processor, "processor_module", type(processor).__module__),)
        return decode_worker_context(self.decoder, self.workers, torch.cuda.is_available(), preload)

    def _start_worker_server(self) -> None:
        """Start the fork server now (it imports the workers' modules while the model loads), when this run's
        workers are started by one.

        The module's frame sizing is read here only when it can still change the server's preload list;
        otherwise (no fork server: the CPU path, ``decoder: cpu``, no workers; or a server already started by
        :func:`datamodules.worker_server.start_early`) it is read when the loader is built. Its video processor is
        read where it is first used (:class:`models.videollama3.frame_sizes.LazyVideoProcessor`: the workers)."""
        if self.trainer is None or decode_worker_context(self.decoder, self.workers, torch.cuda.is_available(),
                                                         set_preload=False) is None:
            return
        from .worker_server import started_early

        if not started_early() and self._worker_context() is None:
            return
        from multiprocessing import forkserver

        forkserver.ensure_running()

    def tasks(self, jobs: list[str], done: dict[str, set[str]] | None = None) -> list[VideoTask]:
        """Videos (in annotation order) with the jobs each question still needs; finished ones are dropped."""
        self.setup()
        done = done or {}
        by_video: dict[str, VideoTask] = {}
        for q in self.questions:
            todo = [j for j in jobs if q.qid not in done.get(j, ())]
            if not todo:
                continue
            task = by_video.get(q.video_path)
            if task is None:
                if self.limit_videos is not None and len(by_video) >= self.limit_videos:
                    continue
                task = by_video[q.video_path] = VideoTask(q.video_id, q.video_path, self.benchmark, [])
            task.questions.append(q)
            task.jobs[q.qid] = todo
        return list(by_video.values())

    def written_qids(self) -> dict[str, set[str]]:
        """``job -> qids`` the trainer's records writer already holds (``{}`` without one), once it is checked that
        those records answer the questions of the annotation now (:func:`annotation_changes`).

        Raises:
            AnnotationError: records of qids whose answer key or options differ now (at most 3 named, one line)."""
        done: dict[str, set[str]] = {}
        for cb in self.trainer.callbacks:
            if hasattr(cb, "done_qids"):
                done = cb.done_qids()
            if hasattr(cb, "written_keys") and self.questions:
                changed = annotation_changes(self.questions, cb.written_keys())
                if changed:
                    raise AnnotationError(
                        f"{getattr(cb, 'out_dir', 'the output folder')}: {len(changed)} question(s) answered there "
                        f"differ from the annotation now ({'; '.join(changed[:3])}{'; ...' if len(changed) > 3 else ''})"
                        ": those records answer other questions, and resuming would keep and score them. Use another "
                        "output folder, or delete those questions' records to answer them again")
        return done

    def _run_context(self) -> tuple[list[str], int, dict[str, set[str]]]:
        module = self.trainer.lightning_module if self.trainer is not None else None
        if module is None or not hasattr(module, "jobs"):
            raise RuntimeError("VideoQADataModule needs a LightningModule exposing `jobs` (name -> budget)")
        jobs: dict[str, int] = module.jobs
        done = self.written_qids()
        # the decode's budget: the largest job budget, or the module's own (the layout ablation decodes for 16384
        # tokens whatever its jobs' budgets, as seed 000's ``Videos(todo, 16384)``)
        decode_budget = getattr(module, "decode_budget", None) or max(jobs.values())
        return list(jobs), decode_budget, done

    def report_resume(self, jobs: list[str], done: dict[str, set[str]], tasks: list[VideoTask], n_this_rank: int
                      ) -> str | None:
        """Print (and return) how much of the run is already written, when anything is: ``N of M (job, question)
        records already written`` with M = this annotation's questions x the run's jobs (``limit_videos``
        applied), then what is left to run; ``None`` (silence) on a fresh run."""
        rank, world = self.trainer.global_rank, self.trainer.world_size
        questions = [q for t in self.tasks(jobs) for q in t.questions]   # the run's questions, nothing skipped
        total = len(questions) * len(jobs)
        n_done = sum(q.qid in done.get(j, ()) for q in questions for j in jobs)
        if not n_done and tasks:
            log.info("%s: rank %d/%d takes %d of %d videos to process", self.benchmark, rank, world, n_this_rank,
                     len(tasks))
            return None
        msg = f"[rank {rank}] {self.benchmark}: {n_done} of {total} (job, question) records already written"
        if not tasks:           # a resumed run with nothing left: say so (the progress bar shows no step)
            msg += ": nothing to run"
        else:
            msg += f"; {len(tasks)} video{'s' * (len(tasks) != 1)} left to run, {n_this_rank} on this rank"
        print(msg, flush=True)
        return msg

    def predict_dataloader(self) -> "DataLoader | JoiningLoader":
        """This rank's videos: done (job, qid) pairs removed first, then whole videos assigned to ranks by
        :class:`datamodules.sharding.CostBalancedSampler` (needs ``trainer.use_distributed_sampler: false`` when
        running on several processes, so Lightning does not shard a second time). Where long videos are decoded in
        parts (``decode_part_mb``), a :class:`datamodules.part_join.JoiningLoader` over the parts' loader: one item
        per video all the same."""
        jobs, max_budget, done = self._run_context()
        tasks = self.tasks(jobs, done)
        job_budget = self.trainer.lightning_module.jobs
        costs = [estimate_cost(_duration_s(t), t.video_path, sum(job_budget[j] for js in t.jobs.values() for j in js),
                               len(t.questions)) for t in tasks]
        world, rank = self.trainer.world_size, self.trainer.global_rank
        if world > 1 and self.trainer._accelerator_connector.use_distributed_sampler:
            raise RuntimeError("VideoQADataModule shards whole videos itself: set `trainer.use_distributed_sampler: "
                               "false` (Lightning would otherwise split this rank's share again)")
        sampler = CostBalancedSampler(costs, world, rank, self.workers)
        self.report_resume(jobs, done, tasks, len(sampler))
        if self.num_workers is None:   # what null chose, said once per run
            print(f"[rank {rank}] {self.benchmark}: {self.workers} decode workers (data.num_workers null: this "
                  f"host's CPUs per process, 2 to 16)", flush=True)
        parts = None
        if self._splits():   # a long video as parts over several workers (this rank's videos only are stat'ed)
            parts = [1] * len(tasks)
            mine = sorted(sampler.indices)
            counts = within_spare_workers(decode_parts([tasks[i].video_path for i in mine], self.decode_part_mb,
                                                       max_parts(self.workers)), self.workers)
            for i, k in zip(mine, counts):
                parts[i] = k
        crashed = self._decode_crashes(tasks)
        if parts is not None:   # a file that killed a worker before is decoded whole, in a process of its own
            parts = [1 if tasks[i].video_path in crashed else k for i, k in enumerate(parts)]
        threads = self.decode_threads
        if threads is None:
            threads = auto_decode_threads(self.workers, self.trainer.num_devices)
        context = self._worker_context()
        sizing = self._sizing
        cpu_task = first_video_on_cpu(self.decoder, self.workers, torch.cuda.is_available() and not self.strict_frames
                                      and nvdec_missing() is None, sampler.indices, self.first_video_cpu_mpx)
        if cpu_task is not None and parts is not None and parts[cpu_task] > 1:
            cpu_task = None    # a video big enough to split is no quick first video
        k_first = min(self.first_video_parts, self.workers)
        if cpu_task is not None and k_first > 1 and self._parts_allowed():
            parts = parts or [1] * len(tasks)      # its CPU read cut into parts, one worker each
            parts[cpu_task] = k_first
        if cpu_task is not None:
            cut = f" in {parts[cpu_task]} parts (data.first_video_parts)" if parts and parts[cpu_task] > 1 else ""
            print(f"[rank {rank}] {self.benchmark}: the first video ({tasks[cpu_task].video_id}) is read on the CPU"
                  f"{cut} if it has at most {self.first_video_cpu_mpx:g} source megapixels (data.first_video_cpu_mpx: "
                  f"sooner than a worker's first NVDEC decode)", flush=True)
        slots = self._cpu_slots_of_run(rank)
        ds = VideoQADataset(tasks, max_budget, self.decode_max_side, threads,
                            self.native_decode_bytes, self.short_clip_first_frame, self.max_replaced_frac, sizing,
                            self.decoder, self.strict_frames, parts if parts and max(parts) > 1 else None, cpu_task,
                            self.first_video_cpu_mpx or 0.0, self._decoding_dir(), crashed, self.decode_timeout_s,
                            self._main_mark(), cpu_task_threads=self.first_video_threads, cpu_slots=slots)
        # frames pinned (in the loader's pin-memory thread, off the GPU's path) when the run is on CUDA: the
        # module's copy to the device then does not block the host
        pin = self.pins_frames()
        marks = getattr(self.trainer.lightning_module, "timeline_marks", None)
        if isinstance(marks, dict):   # timeline_s: when Lightning had the loader (its workers start next)
            from callbacks.process_clock import process_age_s

            marks.setdefault("loader_built", process_age_s())
        if ds.parts is None:
            return video_loader(ds, sampler, self.workers, self.prefetch_factor, pin, context, self.in_order,
                                self.worker_niceness)
        n_split = sum(k > 1 for k in ds.parts) - (cpu_task is not None and ds.parts[cpu_task] > 1)
        if n_split:
            print(f"[rank {rank}] {self.benchmark}: {n_split} long video{'s' * (n_split != 1)} decoded in parts by "
                  f"several workers (data.decode_part_mb={self.decode_part_mb:g}; each worker holds one item at a "
                  "time)", flush=True)
        # one item per worker at a time (prefetch_factor 1): with in_order=False the loader then gives the next item
        # to a worker that holds none, so no video waits behind a long part in a busy worker's queue
        loader = video_loader(ds, PartSampler(sampler, ds), self.workers, 1, pin, context, self.in_order,
                              self.worker_niceness)
        return JoiningLoader(loader, ds, len(sampler))

    def _writer(self):
        """The trainer's records writer (the callback that keeps this output folder's resume state), or ``None``."""
        for cb in getattr(self.trainer, "callbacks", None) or []:
            if hasattr(cb, "decode_crashes") and hasattr(cb, "record_decode_crashes"):
                return cb
        return None

    def _decode_crashes(self, tasks: list[VideoTask]) -> set[str]:
        """The videos of ``tasks`` that killed a decode worker in an earlier run of this output folder (decoded now
        in a process of their own, :mod:`datamodules.decode.isolated`), as ``tasks`` spell them. A name in
        ``decode_crashes.txt`` matches its file however it is spelled (written by hand: relative to the working
        folder, spaces around it; the root given another way: ``..``, a link); a name of no video of this run is
        left out."""
        writer = self._writer()
        left = self._main_mark()
        if left is not None and writer is not None:   # this rank's last run died decoding in its main process
            try:
                video = Path(left).read_text(encoding="utf-8", errors="surrogateescape").strip()
            except OSError:
                video = ""
            if video:
                print(f"[rank {self.trainer.global_rank}] {self.benchmark}: the last run of this folder ended while "
                      f"decoding {video} in its main process (a decoder crash?); it is decoded in a process of its "
                      "own this time", flush=True)
                writer.record_decode_crashes([video])
            Path(left).unlink(missing_ok=True)
        names = writer.decode_crashes() if writer is not None else set()
        listed = set()
        for n in names:
            try:
                listed.add(os.path.realpath(n.strip()))
            except (ValueError, OSError):   # a damaged line (a NUL byte): names no file
                pass
        crashed = {t.video_path for t in tasks   # no path resolved (a stat per folder) when the file names none
                   if t.video_path in names or listed and os.path.realpath(t.video_path) in listed}
        if crashed:
            print(f"[rank {self.trainer.global_rank}] {self.benchmark}: {len(crashed)} video"
                  f"{'s' * (len(crashed) != 1)} that ended a decode process before decoded in a process of "
                  f"{'their' if len(crashed) != 1 else 'its'} own (a second crash gives error records)", flush=True)
        return crashed

    def on_exception(self, exception: BaseException) -> None:
        """A decode worker died (:func:`datamodules.video_items.dead_worker_pids`): the video it was decoding is kept
        in the output folder (``decode_crashes.txt``), so the rerun decodes it in a process of its own."""
        from .video_items import dead_worker_pids, videos_of_dead_workers

        videos = videos_of_dead_workers(dead_worker_pids(exception))
        writer = self._writer()
        if videos and writer is not None:
            writer.record_decode_crashes(videos)

    def pins_frames(self) -> bool:
        """Whether the loader pins the decoded frames (``data.pin_memory``): on a run on CUDA, unless set ``false``
        (pinned memory is of no use to a CPU run, so ``true`` there pins nothing either)."""
        strategy = getattr(self.trainer, "strategy", None)
        return strategy is not None and strategy.root_device.type == "cuda" and self.pin_memory is not False

    def _main_mark(self) -> str | None:
        """Without workers (the main process decodes), ``<out_dir>/decoding_rank<r>.txt``: the video this rank decodes
        now, left behind when a decoder crash ends the process, so the next run names it and decodes it in a process
        of its own (:meth:`_decode_crashes`); ``None`` with workers (their marks: :meth:`_decoding_dir`) or
        without a records writer."""
        writer = self._writer()
        if self.workers != 0 or writer is None or not hasattr(writer, "out_dir"):
            return None
        return str(Path(writer.out_dir) / f"decoding_rank{self.trainer.global_rank}.txt")

    def _cpu_slots_of_run(self, rank: int) -> CpuSlots | None:
        """``data.cpu_slots`` of this rank's workers, in its decoding folder, or ``None`` (no slots asked for, no
        workers, no folder, or no read NVDEC would do: ``decoder`` not ``auto``, ``strict_frames``, no CUDA or no
        PyNvVideoCodec). Says so once."""
        if not self.cpu_slots or self.decoder != "auto" or self.strict_frames or self.workers < 1:
            return None
        if not torch.cuda.is_available() or nvdec_missing() is not None:
            return None
        folder = self._decoding_dir()
        if folder is None:
            return None
        print(f"[rank {rank}] up to {self.cpu_slots} of the {self.workers} decode workers at a time read a file of at "
              f"most {self.cpu_slot_mpx:g} source megapixels on the CPU ({self.cpu_slot_threads} threads each; "
              "data.cpu_slots) instead of NVDEC: the same frames", flush=True)
        return CpuSlots(str(Path(folder, "cpu_slots")), self.cpu_slots, self.cpu_slot_threads, self.cpu_slot_mpx)

    def _decoding_dir(self) -> str | None:
        """A temporary folder where the decode workers name the video each is decoding
        (:data:`datamodules.video_items.DECODING_DIRS`: a worker that dies mid-decode is named with its video); removed
        at :meth:`teardown`. ``None`` without workers or where no folder can be made."""
        import shutil
        import tempfile
        import weakref

        from .video_items import DECODING_DIRS

        if self.workers == 0:
            return None
        if getattr(self, "_decoding", None) is None:
            try:
                self._decoding = tempfile.mkdtemp(prefix="tokenbudget-decoding-")
            except OSError:
                return None
            DECODING_DIRS.append(self._decoding)
            # a run stopped by an exception is not torn down: the folder goes when this object or the process does
            weakref.finalize(self, shutil.rmtree, self._decoding, True)
        return self._decoding

    def teardown(self, stage: str | None = None) -> None:
        import shutil

        from .video_items import DECODING_DIRS

        d, self._decoding = getattr(self, "_decoding", None), None
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)
            if d in DECODING_DIRS:
                DECODING_DIRS.remove(d)

    def _splits(self) -> bool:
        """Whether this run decodes long videos in parts (``decode_part_mb``'s conditions)."""
        return bool(self.decode_part_mb) and self.decoder != "cpu" and self.workers >= 2 \
            and torch.cuda.is_available() and self._parts_allowed()

    def _parts_allowed(self) -> bool:
        """Whether any video may be decoded in parts (``decode_part_mb``, ``first_video_parts``): not with
        ``strict_frames`` or ``max_replaced_frac > 0``, whose rules look across the whole video."""
        return not self.strict_frames and self.max_replaced_frac == 0


def first_video_on_cpu(decoder: str, workers: int, nvdec_may_run: bool, order: Sequence[int],
                       max_mpx: float | None) -> int | None:
    """The task whose worker reads it on the CPU if it is small (``data.first_video_cpu_mpx``; the worker decides
    from its probe, :func:`datamodules.decode.decode_video` ``cpu_below_mpx``), or ``None``: the first of ``order``
    (the rank's run order) when ``decoder`` is ``auto``, NVDEC may run (``nvdec_may_run``: CUDA, PyNvVideoCodec, no
    ``strict_frames``), ``workers >= 1`` (the main process starts no worker context) and ``max_mpx > 0``.

    >>> first_video_on_cpu("auto", 16, True, [2, 0], 1000.0), first_video_on_cpu("nvdec", 16, True, [2, 0], 1000.0)
    (2, None)
    """
    if decoder != "auto" or not nvdec_may_run or workers < 1 or not order or not max_mpx or max_mpx <= 0:
        return None
    return order[0]


def annotation_changes(questions: Sequence[Question], written: dict[str, tuple]) -> list[str]:
    """What differs between the annotation's ``questions`` and the records already written for the same qids
    (``written``: ``qid -> (answer, options, where, video, question_sha1)``, :meth:`callbacks.jsonl_writer.
    JsonlPredictionWriter.written_keys`): one line per changed question, naming the qid, the field, both values and
    the record's file and line. The answer is compared always; the options, the video and the question's text (by
    :func:`datamodules.benchmarks.question_sha1`; records written before 2026-12-06 have none) where the record has
    them; a qid the annotation no longer has is not a change (a run of fewer videos or another benchmark split reads
    the same folder; the scores leave its records out).

    >>> q = Question("7-1", "7", "/v/7.mp4", "Q?", ["x", "y"], "B")
    >>> annotation_changes([q], {"7-1": ("B", ["x", "y"], "f line 1", "7", None)}), annotation_changes([q], {"7-1": ("A", None, "f line 2", None, None)})
    ([], ["7-1: answer 'A' there, 'B' now (f line 2)"])
    """
    out = []
    for q in questions:
        if q.qid not in written:
            continue
        answer, options, where, video, text_sha1 = written[q.qid]
        if answer != q.answer:
            out.append(f"{q.qid}: answer {answer!r} there, {q.answer!r} now ({where})")
        elif options is not None and list(options) != list(q.options):
            out.append(f"{q.qid}: options {options!r} there, {list(q.options)!r} now ({where})")
        elif video is not None and str(video) != str(q.video_id):
            out.append(f"{q.qid}: video {video!r} there, {q.video_id!r} now ({where})")
        elif text_sha1 is not None and text_sha1 != question_sha1(q.question):
            out.append(f"{q.qid}: question text changed (now {_short(q.question)!r}; sha1 {text_sha1} there, "
                       f"{question_sha1(q.question)} now) ({where})")
    return out


def _short(text: str, most: int = 60) -> str:
    return text if len(text) <= most else text[:most - 3] + "..."


def video_loader(ds, sampler, num_workers: int, prefetch_factor: int, pin_memory: bool = False, context=None,
                 in_order: bool = False, worker_niceness: int = 0) -> DataLoader:
    """The predict loader of one rank: one item per video (``batch_size=None``), ``sampler``'s videos decoded by
    ``num_workers`` workers, ``prefetch_factor`` ahead each; with ``in_order=False`` an item is delivered as soon as
    its worker has it (``torch.utils.data.DataLoader(in_order=False)``), else in the sampler's order. Workers are
    started by ``context`` (the fork server where NVDEC may run), else forked after the parent's garbage is
    collected (:mod:`datamodules.fork_context`). Each worker starts with
    :func:`datamodules.worker_watch.start_decode_worker`: with ``worker_niceness`` > 0 it lowers its CPU priority by
    that much, and it ends itself once this process is gone (it would otherwise finish its video first)."""
    if context is None and num_workers > 0:
        context = fork_context()
    return DataLoader(ds, batch_size=None, sampler=sampler, num_workers=num_workers,
                      prefetch_factor=prefetch_factor if num_workers > 0 else None,
                      persistent_workers=False, pin_memory=pin_memory, multiprocessing_context=context,
                      in_order=in_order, worker_init_fn=worker_init(num_workers, worker_niceness))
