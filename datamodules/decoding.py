"""Video decoding, once per video, of the frames the largest budget needs (DESIGN §3.1).

Three parts (:func:`decode_video`): (a) the plan: :func:`probe_video` demuxes the video stream with PyAV (integer
pts and time base, packet durations, ``format.duration``, ``start_time``; no decode beyond one frame) and
:func:`plan_decode` makes seed 001's frame choice from them exactly as FFmpeg's ``fps=fps:round=down`` does
(:func:`algorithms.budget.fps_filter_frames`, checked index by index against imageio-ffmpeg's binary in
``tests/datamodules/test_frame_identity.py``) and the decode size; (b) a reader from :data:`READERS` returns
``(n, dh, dw, 3)`` uint8 RGB for ascending native (presentation-order) indices. ``decoder=cpu`` picks one per file
(:func:`cpu_reader_for`): ``pyav_skip`` (PyAV, :func:`_pyav_skip_reader`: ``skip_frame=NONREF`` on packets that
are no sampled frame, seeking over spans that hold a key frame and no sampled frame) for H.264/HEVC 8-bit 4:2:0 at
native size, where its frames equal decord's bit for bit (``tests/datamodules/test_decode_paths.py``; 1.4-2.2x
faster on 720p/1080p H.264 High with B-frames, ``bench/decode_paths.py``; rotated videos come out exactly as the
CLI's, where decord resizes a mis-sized buffer); ``decord`` everywhere else (reduced sizes: its in-decoder scaler,
which PyAV's reformat does not reproduce, 1.6/255 mean apart; other codecs and pixel formats); ``pyav`` (decode
order) for files with unusable timestamps, where decord's pts seeking returns wrong frames. ``nvdec`` is
registered by ``datamodules/nvdec.py``; ``decoder=auto`` takes it per file where its ``supports(probe)`` allows;
(c) retries, the replacement rule and the encoder-size
holding below work on any reader; ``info["decoder"]`` names the reader used (``decord``, ``pyav_skip``, ``pyav``,
``nvdec``). PyAV (``av==18.1.0``) is used where decord cannot do the job: integer pts, packet durations and the
container duration (decord exposes float32 times only), the FFmpeg log that names why a file cannot be read and
which pictures the decoder concealed, ``skip_frame`` and seeking, and decoding in decode order. Videos are decoded at
native size (the processor resizes, as in training) while the seed's estimate ``n_est * h * w * 3`` stays within
``native_decode_bytes`` (2e9 bytes, seed 001's ``NATIVE_DECODE_BYTES``); larger ones at a reduced size *inside the
decoder* (decord's ``width``/``height``), at most ``decode_max_side`` pixels on the long side (default 896 = 32
merged cells), so host memory stays bounded (an hour of 1080p at B = 16384 is 2048 frames: 12.7 GB native,
2.8 GB reduced).

Held at the encoder's sizes (issue 25; ``sizing``, ``data.hold_encoder_sizes``, on for plain predict): the frames are
decoded as above but ``hold_chunk_bytes`` (64 MB of decode-size frames) at a time, and each chunk is resized right
away, by the checkpoint processor's own ``resize`` with the arguments ``BudgetedVideoLlama3.encode`` gives it, to
every grid some budget reads it at (:func:`algorithms.budget.encoder_grids`; smaller raw frames are re-encoded from
those grids' pixels, seed 001 ``reencode``); only those
pixels are kept (:class:`EncoderFrames`), and the encoder does not resize them again. The encoder's
``pixel_values`` are bit-identical to the decode-size path on the CPU (``tests/datamodules/test_hold_sizes.py``; the resize runs
in the worker on the CPU, where seed 001's processor runs too, rather than on the model's device). An hour of
1080p at B = 16384 (and 4096 + 16384): 2048 frames at one grid of 6 x 10 cells, 168 x 280 pixels, 0.29 GB instead
of 2.8 GB per item (``bench/hour_video_rss.py`` measures the peak RSS). A video whose encoder sizes would take no
fewer bytes than its decode (short videos the encoder upsamples) keeps the decode-size tensor.

Behaviour on unusual and broken media (issue 8; each case has a test in ``tests/datamodules/test_bad_media.py``). "Error"
means :class:`DecodeError` with the file named, which the dataset turns into one error record per (question, job)
of the video while the run goes on.

===============================  ==================================================================================
case                             behaviour
===============================  ==================================================================================
missing file / a directory       error ``video file not found`` / ``is not a regular file``
zero bytes                       error ``video file is empty (0 bytes)``
not a video / truncated before   error ``cannot read the container (truncated, corrupted or not a video file;
the index (mp4 ``moov`` lost)    <FFmpeg's cause>)``, e.g. ``moov atom not found``, ``STSZ atom truncated``
truncated after the index        error ``cannot read the container (truncated: the data ends before the packets
                                 its index lists; ... partial file)``
corrupted bytes mid-stream,      error ``decoding N frames failed (corrupted or truncated stream; ...)``, or
a concealed (damaged) IDR        ``cannot read the container``; a concealed picture: ``the decoder reported
                                 errors (concealed)`` (``pyav_skip``, from the log with one thread and from
                                 FFmpeg's corrupt-frame flag with any; decord's pass unflagged); seed 001: any
                                 decode error is an error record
                                 (``max_replaced_frac=0``, the default); above 0 unreadable sampled frames are
                                 replaced by the nearest readable one and listed (``frames_replaced``)
no video stream (audio only)     error ``has no video stream``
a single frame                   error ``no frame at 1 fps: the clip ... ends before the first sampling step``
                                 when it lasts less than one step (seed 001: no frame decoded, an error);
                                 ``short_clip_first_frame=True``: T = 1 at 0 s
shorter than one 1 fps step      the same (duration < 1 s: FFmpeg's fps filter emits no frame)
very long, tiny frames           decoded: capped at ``max_frames(B)`` frames (``np.linspace(..., dtype=int)`` of the
                                 grid frames; only those are decoded)
any frame rate (CFR or VFR)      frames as FFmpeg's ``fps`` filter with ``round=down`` picks them from the
                                 stream's integer pts (offset by the file's start time as the CLI does) at
                                 ``av_d2q(fps, INT_MAX)``, the end of stream at the last pts plus its packet
                                 duration (:func:`algorithms.budget.fps_filter_frames`); the rate from
                                 ``format.duration``; labels ``start_time + j / fps``; ``info["vfr"]`` records
                                 whether the timestamps deviate from ``index / avg fps``
pts all equal / run backwards    ``index / average rate`` (1 fps when unknown, ``fps_ok = False``), duration
                                 ``N / rate``, decoded in decode order (``pyav`` reader);
                                 ``info["timestamps_unusable"] = True``
missing / zero fps               timestamps if usable; ``fps_ok = False``
rotation metadata                decord applies the display rotation (frames upright, ``native_hw`` is the
                                 displayed size). decord 0.6 mis-sizes its output buffer for some small 90/270-
                                 rotated sizes; then the batch is decoded at a nearby width and resized back
odd dimensions                   decoded at the exact odd size
4:4:4, 10-bit                    decoded (converted to 8-bit RGB by decord's swscale)
mkv / webm / avi                 decoded (any container and codec decord's FFmpeg reads)
non-ASCII, spaces in the path    decoded (paths passed as UTF-8 strings)
4K / large                       native size while ``n_est * h * w * 3 <= native_decode_bytes`` (seed: 2e9), else
                                 at ``decode_max_side`` inside the decoder (bounded memory)
===============================  ==================================================================================

Not covered: a decoder that crashes the process (segfault) on a file takes the DataLoader worker down with it; an
external ffmpeg fallback is not used. Frames the decoder conceals (a corrupt IDR decoded without an error
return) are flagged on the ``pyav_skip`` reader (every sampled frame of a GOP whose decode logged an error fails
the read, then the replacement rule); decord reports no per-frame error, so on its files they pass. A video stream that
starts a whole output step after the file's start (audio first): the CLI's ``-f rawvideo`` output sync may add
frames at the start that the filter rule alone does not (not tested).
"""
from __future__ import annotations

import bisect
import math
import re
import os
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch

from algorithms.budget import CELL_PIXELS, encoder_grids, max_frames, sample_frames
from models.kernels import host_to_device


class DecodeError(RuntimeError):
    """A video could not be opened or decoded; the message names the file."""


@dataclass
class DecodedVideo:
    """Frames of one video.

    Attributes:
        frames: (T, H, W, 3) uint8 RGB at the decode size, upright (display rotation applied).
        times_s: T frame labels in seconds: the sampling grid ``j / sample_fps`` (seed 001
            ``ts = (start + np.arange(len(frames)) / fps)``), not the source frames' own times.
        info: ``duration_s, native_hw, decode_hw, n_frames, fps, sample_fps, fps_ok, vfr``.
    """

    frames: torch.Tensor
    times_s: list[float]
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EncoderSizing:
    """The sizes the vision encoder reads a run's frames at, and the processor that resizes them (a decode holds
    only those, :func:`decode_video` ``sizing``).

    Attributes:
        budgets: the run's budgets (vision tokens); ``max_tokens_per_frame``, ``raw_mode``, ``raw_max_tokens``: as
            in ``models.videollama3.prepare_budgets`` (:func:`algorithms.budget.encoder_grids`).
        processor: the checkpoint's ``VideoLlama3VideoProcessor``; its own ``resize`` makes the held frames.
    """

    budgets: tuple[int, ...]
    max_tokens_per_frame: int
    raw_mode: str
    raw_max_tokens: int
    processor: object

    def grids(self, num_frames: int, height: int, width: int) -> dict[tuple[int, int], tuple[list[int], int]]:
        """``{grid: (frame positions, token cap)}`` (:func:`algorithms.budget.encoder_grids`)."""
        return encoder_grids(height, width, num_frames, list(self.budgets), self.max_tokens_per_frame,
                             self.raw_mode, self.raw_max_tokens)

    def resize(self, frames: torch.Tensor, max_tokens: int) -> torch.Tensor:
        """``(n, H, W, 3)`` uint8 -> ``(n, 28 gh, 28 gw, 3)`` uint8: the processor's resize with the size arguments
        ``BudgetedVideoLlama3.encode`` gives it (so its later rescale/normalize sees the very same pixels;
        :func:`models.videollama3.frame_sizes.processor_resize`)."""
        from models.videollama3.frame_sizes import processor_resize

        return processor_resize(self.processor, frames, max_tokens)


class EncoderFrames:
    """A decoded video held only at the sizes its vision encodes read (:class:`EncoderSizing`), in place of the
    ``(T, H, W, 3)`` decode-size frames; ``models.videollama3.EncodeCache`` reads it through :meth:`at_grid`.

    Attributes:
        shape: ``(T, H, W, 3)``, the decode size (the geometry of every budget is computed from it).
        held: ``{(gh, gw): (frames (n, 28 gh, 28 gw, 3) uint8, their positions in 0..T-1, ascending)}``.
    """

    def __init__(self, shape, held: dict[tuple[int, int], tuple[torch.Tensor, list[int]]]):
        self.shape = torch.Size(shape)
        self.held = held

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t, _ in self.held.values())

    def to(self, *args, **kwargs) -> "EncoderFrames":
        return EncoderFrames(self.shape, {g: (t.to(*args, **kwargs), pos) for g, (t, pos) in self.held.items()})

    def pin_memory(self) -> "EncoderFrames":
        """The frames in page-locked host memory (called by the DataLoader's pin-memory thread when the loader pins):
        the copy to the GPU can then run without blocking the host (``to(device, non_blocking=True)``)."""
        return EncoderFrames(self.shape, {g: (t.pin_memory(), pos) for g, (t, pos) in self.held.items()})

    def at_grid(self, idx: list[int], grid: tuple[int, int]) -> torch.Tensor:
        """``(len(idx), 28 gh, 28 gw, 3)`` frames at positions ``idx`` resized for ``grid``.

        Raises:
            KeyError: the grid or a frame was not held (the sizing did not list it).
        """
        if grid not in self.held:
            raise KeyError(f"frames are held at grids {sorted(self.held)} only, not {grid}")
        t, pos = self.held[grid]
        where = {p: k for k, p in enumerate(pos)}
        missing = [i for i in idx if i not in where]
        if missing:
            raise KeyError(f"frames {missing[:5]} are not held at grid {grid}")
        # the index goes to the GPU from pinned memory: indexing with a host list copies it with a wait for the GPU
        return t[host_to_device(torch.tensor([where[i] for i in idx], dtype=torch.long), t.device)]

    def __getitem__(self, key):
        raise TypeError("EncoderFrames holds the frames at the encoder's sizes only: read them with at_grid")


def auto_decode_threads(workers: int, local_processes: int = 1, cpus: int | None = None, cap: int = 2) -> int:
    """Decoder threads per video so that all decoders of a host share its CPUs without oversubscribing.

    decord decodes every frame up to the last sampled one (1 fps sampling of an H.264 stream with long GOPs is
    close to a full decode), so one decoder thread is the DataLoader's bottleneck on long videos; FFmpeg's frame
    threading is bit-exact, so more threads change only the speed.

    Args:
        workers: DataLoader workers per process (0 = decoding in the main process, counted as 1).
        local_processes: processes of this host (DDP ranks), each with ``workers`` decoders.
        cpus: CPUs this process may use (default: its affinity mask; when that mask is smaller than the host, the
            process is pinned to its own share, e.g. SLURM's per-task binding, and ``local_processes`` is ignored).
        cap: most threads per decoder (default 2: decord's threaded decoder fails on some streams above 2,
            dmlc/decord#246 and #314; :func:`decode_video` retries those with one thread).

    Returns:
        ``clip(cpus // (max(workers, 1) * local_processes), 1, cap)``.
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if cpus < (os.cpu_count() or cpus):   # pinned to a share of the host: the share is already per rank
            local_processes = 1
    return int(min(max(cpus // (max(workers, 1) * max(local_processes, 1)), 1), cap))


def decode_size(height: int, width: int, max_side: int) -> tuple[int, int]:
    """Decode size keeping the aspect ratio with the long side ``<= max_side`` (even sizes; unchanged if smaller)."""
    scale = min(1.0, max_side / max(height, width))
    if scale >= 1.0:
        return height, width
    return max(2, 2 * round(height * scale / 2)), max(2, 2 * round(width * scale / 2))


def decode_frame_size(height: int, width: int, n_est: int, native_decode_bytes: float = 2e9,
                      max_side: int = 896) -> tuple[int, int]:
    """Decode size of seed 001's ``decode_video``: ``if n_est * h * w * 3 <= NATIVE_DECODE_BYTES: dw, dh = w, h``,
    else ``bd.frame_size(h, w, tok)`` (not in the seed: the long side at most ``max_side``, :func:`decode_size`).

    Args:
        n_est: the seed's frame estimate, ``min(int(duration * fps) + 1, max_frames)``.

    Returns:
        ``(height, width)`` to decode at.
    """
    if n_est * height * width * 3 <= native_decode_bytes:
        return height, width
    return decode_size(height, width, max_side)


_DECORD_LOG_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\] \S+?\.(?:cc|cpp|h):\d+: ")
# FFmpeg error codes decord prints as numbers (libavutil/error.h FFERRTAG values)
_AVERROR_NAMES = {-1094995529: "AVERROR_INVALIDDATA: invalid data found when processing input",
                  -541478725: "AVERROR_EOF: end of file", -1414092869: "AVERROR_BUG", -11: "EAGAIN"}


def short_error(e: BaseException, limit: int = 400) -> str:
    """``"Type: message"`` on one line, for messages that name a file: decord's ``[hh:mm:ss] file.cc:N:`` log
    prefixes removed (so the cause, which comes last, is kept), FFmpeg error codes named, at most ``limit``
    characters (cut at a word, marked with ``…``)."""
    text = " ".join(str(e).split())
    text = _DECORD_LOG_PREFIX.sub("", text)
    for code, name in _AVERROR_NAMES.items():
        text = text.replace(f"({code} vs. 0)", f"({code} = {name})")
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " …"
    return f"{type(e).__name__}: {text}"


def _open_error(path: Path, e: BaseException) -> DecodeError:
    msg = str(e)
    if "cannot find video stream" in msg:
        return DecodeError(f"{path}: has no video stream (audio-only or not a video file)")
    return DecodeError(f"{path}: cannot read the container (truncated, corrupted or not a video file; "
                       f"{short_error(e)})")


class VideoProbe(NamedTuple):
    """What the frame choice needs, read from the container without decoding more than one frame (PyAV demuxes
    every packet of the video stream: integer pts, durations, key flags).

    Attributes:
        height, width: the displayed size (the display rotation applied, as decord and the ffmpeg CLI output it).
        time_base: the video stream's time base (s per pts unit), the fps filter's input time base.
        pts: presentation timestamps in presentation order (one per frame, native index ``k`` = ``pts[k]``), offset
            as the ffmpeg CLI offsets them (minus the file's ``start_time``: ``pts_offset`` added to the
            container's pts); ``index`` when the timestamps are unusable (then ``time_base`` is ``1 / average
            rate``).
        end_pts: the end of stream the CLI signals to the filter: last pts plus the last frame's duration.
        duration_s: ``format.duration`` (the container's duration, what seed 001 reads from ``ffmpeg.probe``).
        start_s: the video stream's ``start_time`` in seconds (seed 001's ``start``).
        fps: the stream's average frame rate (``avg_frame_rate``; 0 when unknown).
        keyframes: native indices of the key frames (ascending).
        timestamps_unusable: the pts are missing, repeated or run backwards: frame index and the average rate
            stand in for them.
    """

    height: int
    width: int
    time_base: Fraction
    pts: list[int]
    end_pts: int
    duration_s: float
    start_s: float
    fps: float
    keyframes: list[int]
    timestamps_unusable: bool
    codec: str
    pix_fmt: str
    pts_offset: int = 0


_MAX_REORDER = 16   # H.264/HEVC reorder depth at most 16 frames: pts further out of decode order run backwards


def _ffmpeg_float(x: float) -> float:
    """A time as ffprobe prints it (``%f``: six decimals) and the seed's ``float(...)`` reads it back."""
    return float(f"{x:f}")


def _log_cause(logs) -> str:
    """The FFmpeg log lines of a failed open/demux (``moov atom not found``, ``partial file``, ...), one line."""
    seen: list[str] = []
    for _, _, msg in logs:
        m = " ".join(str(msg).split())
        if m and m not in seen:
            seen.append(m)
    return "; ".join(seen[-3:])


def probe_video(path: Path) -> VideoProbe:
    """The container's timing of the first video stream, as the ffmpeg CLI sees it (PyAV, no full decode).

    ``duration_s`` is ``format.duration`` and ``start_s`` the stream's ``start_time`` (seed 001 reads both from
    ``ffmpeg.probe``); the pts are offset by the file's start time, as the CLI offsets its input
    (``ts_offset = -ic->start_time``), and ``end_pts`` is the last frame's pts plus its packet duration (the
    decoder's ``last_frame_pts + last_frame_duration_est``, which the CLI sends to the filter as end of stream),
    else the last pts step, else one average frame period.

    Raises:
        DecodeError: the container cannot be opened (its FFmpeg log cause named: ``moov atom not found``, a truncated
            atom, ...), has no video stream or no video packet, or its data ends before its index (``partial
            file``: truncated).
    """
    import av
    import av.logging

    av.logging.set_level(av.logging.WARNING)   # FFmpeg's log, for the causes below (restored to off at the end:
    try:                                        # a Python log callback from decoder threads can deadlock)
        with av.logging.Capture() as logs:
            try:
                container = av.open(str(path))
            except av.error.FFmpegError as e:
                cause = _log_cause(logs) or short_error(e)
                raise DecodeError(f"{path}: cannot read the container (truncated, corrupted or not a video file; "
                                  f"{cause})") from e
            with container:
                if not container.streams.video:
                    raise DecodeError(f"{path}: has no video stream (audio-only or not a video file)")
                stream = container.streams.video[0]
                packets, head = [], []
                try:
                    for p in container.demux(stream):
                        if p.size and not p.is_discard:
                            packets.append((p.pts, p.dts, p.duration or 0, bool(p.is_keyframe)))
                            if len(head) < 32:
                                head.append(p)   # decoded below for the display rotation
                except av.error.FFmpegError as e:
                    cause = _log_cause(logs) or short_error(e)
                    raise DecodeError(f"{path}: cannot read the container (truncated or corrupted; {cause})") from e
                partial = [m for _, _, m in logs if "partial file" in str(m)]
                if partial:
                    raise DecodeError(f"{path}: cannot read the container (truncated: the data ends before the "
                                      f"packets its index lists; {_log_cause(logs)})")
                rotation = 0
                stream.thread_count = 1   # one frame: no decoder threads (the log callback is on)
                try:   # the rotation is on the decoded frame (display matrix side data)
                    for p in [*head, None]:
                        frames = stream.codec_context.decode(p)
                        if frames:
                            rotation = int(getattr(frames[0], "rotation", 0) or 0)
                            break
                except av.error.FFmpegError:
                    pass   # a bad frame is the reader's to report
                tb = stream.time_base
                cw, ch = stream.codec_context.width, stream.codec_context.height
                duration = container.duration
                file_start = container.start_time
                start = stream.start_time
                rate = stream.average_rate or stream.guessed_rate
                codec, pix_fmt = stream.codec_context.name, stream.codec_context.pix_fmt or ""
    except DecodeError:
        raise
    except av.error.FFmpegError as e:
        raise DecodeError(f"{path}: cannot read the container (truncated, corrupted or not a video file; "
                          f"{short_error(e)})") from e
    finally:
        av.logging.set_level(None)
    if not packets:
        raise DecodeError(f"{path}: video has no frames")
    h, w = (cw, ch) if rotation % 180 else (ch, cw)
    fps = float(rate) if rate else 0.0
    time_base = Fraction(tb.numerator, tb.denominator) if tb else Fraction(0)
    raw = [p[0] for p in packets]
    order = sorted(range(len(raw)), key=lambda k: raw[k]) if None not in raw else []
    usable = bool(order) and time_base > 0 and (
        len(raw) == 1 or (len(set(raw)) == len(raw) and max(abs(r - k) for k, r in enumerate(order)) <= _MAX_REORDER))
    keyframes = sorted(r for r, k in enumerate(order) if packets[k][3]) if usable else \
        [k for k, p in enumerate(packets) if p[3]]
    if usable:
        off = 0 if file_start is None else _rescale_near(-file_start, Fraction(1, 1_000_000), time_base)
        pts = [raw[k] + off for k in order]
        last = order[-1]
        dur = packets[last][2]
        step = pts[-1] - pts[-2] if len(pts) > 1 else 0
        if not dur > 0 or (dur == 1 and step > 2):
            dur = step if step > 0 else (_rescale_near(1, 1 / Fraction(rate), time_base) if rate else 0)
        end_pts = pts[-1] + max(dur, 1)
    else:   # index / average rate (1 fps when unknown); the container's times derive from the broken pts
        if not fps > 0:
            fps = 0.0
        time_base = 1 / Fraction(rate) if fps > 0 else Fraction(1)
        pts = list(range(len(packets)))
        end_pts = len(packets)
        duration, start = None, None
    if duration is not None and duration > 0:
        duration_s = _ffmpeg_float(duration / 1_000_000)
    else:   # no container duration: the stream's end
        duration_s = _ffmpeg_float(float(end_pts * time_base))
    start_s = _ffmpeg_float(float(start * tb)) if (start is not None and tb) else 0.0
    return VideoProbe(int(h), int(w), time_base, pts, int(end_pts), duration_s, start_s, fps, keyframes,
                      not usable, codec, pix_fmt, off if usable else 0)


def _rescale_near(ts: int, src: Fraction, dst: Fraction) -> int:
    """``av_rescale_q(ts, src, dst)`` (``AV_ROUND_NEAR_INF``: halves away from zero)."""
    x = Fraction(ts) * src / dst
    n = math.floor(abs(x) + Fraction(1, 2))
    return n if x >= 0 else -n


def is_variable_frame_rate(pts: list[int], time_base: Fraction, fps: float, tolerance_frames: float = 0.5) -> bool:
    """Whether the frame times ``pts * time_base`` (s, from the first) deviate from ``index / fps`` by more than
    ``tolerance_frames`` frame periods (1 ms slack)."""
    if len(pts) < 2 or not fps > 0:
        return len(pts) >= 2
    t = (np.asarray(pts, dtype=np.float64) - pts[0]) * float(time_base)
    return bool(np.abs(t - np.arange(len(t)) / fps).max(initial=0.0) > tolerance_frames / fps + 1e-3)


def _resize(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    y = torch.nn.functional.interpolate(x, size=(height, width), mode="bilinear", antialias=True,
                                        align_corners=False)
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def _frame_reader(path: Path, h: int, w: int, dh: int, dw: int, num_threads: int):
    """``read(idx) -> (len(idx), dh, dw, 3)`` frames at native indices ``idx`` from one decord reader (decoder-side
    resize when ``(dh, dw) != (h, w)``); the reader is opened on the first read."""
    import decord

    state: dict = {}

    def open_at(width: int, height: int):
        return decord.VideoReader(str(path), num_threads=num_threads, width=width, height=height)

    def read(idx: list[int]) -> np.ndarray:
        if "vr" in state:
            out = state["vr"].get_batch(idx).asnumpy()
            return _resize(out, dh, dw) if state["fixed"] else out
        same = (dh, dw) == (h, w)
        try:
            vr = open_at(-1 if same else dw, -1 if same else dh)
            out = vr.get_batch(idx).asnumpy()
            state.update(vr=vr, fixed=False)
            return out
        except Exception as e:  # noqa: BLE001
            if "size must exactly match" not in str(e):
                raise
            first = e
        # decord 0.6 mis-sizes the output buffer of some 90/270-degree rotated videos at some widths: decode at a
        # nearby width (still upright) and resize back to the intended size
        for width in (dw + 2, dw + 4, dw - 2, dw + 8, dw + 16):
            if width < 2:
                continue
            try:
                vr = open_at(width, dh)
                out = _resize(vr.get_batch(idx).asnumpy(), dh, dw)
                state.update(vr=vr, fixed=True)
                return out
            except Exception:  # noqa: BLE001
                continue
        raise first

    return read


def _read_frames(path: Path, idx: list[int], h: int, w: int, dh: int, dw: int, num_threads: int) -> np.ndarray:
    """``(T, dh, dw, 3)`` frames at native indices ``idx`` (decoder-side resize when ``(dh, dw) != (h, w)``)."""
    return _frame_reader(path, h, w, dh, dw, num_threads)(idx)


HOLD_CHUNK_BYTES = 64e6    # decode-size bytes per chunk when frames are held at the encoder's sizes
NATIVE_DECODE_BYTES = 2e9  # seed 001: "decode at native size (processor resizes, as in training) below this"
MAX_REPLACED_FRAC = 0.0    # seed 001: any decode error is an error record (above 0: the replacement rule)


_PACKET_RETRIES = 3


def _read_each(path: Path, idx: list[int], h: int, w: int, dh: int, dw: int, attempts: int = _PACKET_RETRIES,
               opener=None) -> list[np.ndarray | None]:
    """Each frame of ``idx`` read alone (one thread, a fresh reader each time); ``None`` where the decoder fails on
    it ``attempts`` times (decord's decoder thread sometimes reports an earlier packet's error on a later read)."""
    out: list[np.ndarray | None] = []
    for i in idx:
        frame = None
        for _ in range(attempts):
            try:
                frame = (opener(1)([i]) if opener is not None else _read_frames(path, [i], h, w, dh, dw, 1))[0]
                break
            except Exception:  # noqa: BLE001 - a corrupt packet: this frame only
                continue
        out.append(frame)
    return out


def replace_unreadable(frames: list[np.ndarray | None], idx: list[int]) -> tuple[list[np.ndarray], list[int]]:
    """Fill each ``None`` with the readable frame nearest in native index (the earlier one on a tie).

    Returns:
        ``(frames, replaced)``: the filled list and the positions that were replaced.

    Raises:
        ValueError: no frame is readable.
    """
    ok = [k for k, f in enumerate(frames) if f is not None]
    if not ok:
        raise ValueError("no readable frame")
    replaced = [k for k, f in enumerate(frames) if f is None]
    filled = list(frames)
    for k in replaced:
        src = min(ok, key=lambda j: (abs(idx[j] - idx[k]), idx[j]))
        filled[k] = frames[src]
    return filled, replaced


class DecodePlan(NamedTuple):
    """Which native frames a decode reads and at what size (:func:`plan_decode`).

    Attributes:
        idx: native indices (presentation order) of the T returned frames, non-decreasing (the fps filter repeats
            the last frame when the stream ends before the grid does).
        unique: ``sorted(set(idx))``, the frames a reader decodes.
        times_s: T labels, seed 001's ``ts = start + arange(N) / fps`` (thinned like the frames).
        sample_fps: the fps filter's rate (the float of :func:`algorithms.budget.sample_rate`).
        decode_hw: ``(dh, dw)``.
    """

    idx: list[int]
    unique: list[int]
    times_s: list[float]
    sample_fps: float
    decode_hw: tuple[int, int]


def plan_decode(path: Path, probe: VideoProbe, budget_tokens: int, base_fps: float = 1.0,
                native_decode_bytes: float = NATIVE_DECODE_BYTES, decode_max_side: int = 896,
                short_clip_first_frame: bool = False) -> DecodePlan:
    """Seed 001's frame choice and decode size on a probe (:func:`algorithms.budget.sample_frames`,
    :func:`decode_frame_size`).

    Raises:
        DecodeError: no frame at the sampling rate (the clip ends before the first step; seed 001's
            ``assert T > 0``) unless ``short_clip_first_frame``.
    """
    sample_fps, idx, times = sample_frames(probe.pts, probe.time_base, probe.end_pts, probe.duration_s,
                                           budget_tokens, probe.start_s, base_fps)
    if not idx:
        if not short_clip_first_frame:
            raise DecodeError(f"{path}: no frame at {sample_fps:g} fps: the clip ({probe.duration_s:.3f} s) ends "
                              f"before the first sampling step (set data.short_clip_first_frame to keep its first "
                              f"frame)")
        idx, times = [0], [probe.start_s]
    n_est = min(int(probe.duration_s * sample_fps) + 1, max_frames(budget_tokens))
    dh, dw = decode_frame_size(probe.height, probe.width, n_est, native_decode_bytes, decode_max_side)
    return DecodePlan(idx, sorted(set(idx)), times, sample_fps, (dh, dw))


# A reader: ``factory(path, probe, dh, dw, num_threads) -> read``, ``read(native indices ascending) -> (n, dh, dw, 3)``
# uint8 RGB, upright. ``datamodules/nvdec.py`` adds ``"nvdec"``; a factory may carry ``supports(probe) -> bool``
# (``auto`` then falls back to ``cpu`` per file for what it cannot decode).
ReaderFactory = Callable[[Path, VideoProbe, int, int, int], Callable[[list[int]], np.ndarray]]
READERS: dict[str, ReaderFactory] = {}
DECODERS = ("cpu", "nvdec", "auto")


def resolve_decoder(decoder: str, probe: VideoProbe | None = None, path: Path | None = None
                    ) -> tuple[str, str | None]:
    """The reader a ``decoder`` setting decodes a video with, and why it is not the one asked for.

    ``cpu``: the CPU reader; ``nvdec``: the NVDEC reader (an error when none is registered); ``auto``: ``nvdec``
    when registered, else ``cpu``. For ``nvdec`` and ``auto`` a video the NVDEC reader cannot decode exactly
    (its ``supports(probe, path)`` gives a reason: codec, 4:4:4 / 10-bit, odd size, rotation, decoder limits, no
    GPU) goes to the CPU, per file, with that reason.

    Returns:
        ``("cpu" | "nvdec", reason or None)``; the reason is recorded as ``video_info.decoder_fallback``.

    Raises:
        ValueError: an unknown setting, or ``nvdec`` with no NVDEC reader registered.
    """
    if decoder not in DECODERS:
        raise ValueError(f"data.decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    if decoder == "cpu":
        return "cpu", None
    nv = READERS.get("nvdec")
    if nv is None:
        if decoder == "nvdec":
            raise ValueError("data.decoder=nvdec: no NVDEC reader is registered (datamodules.nvdec not available: "
                             "needs PyNvVideoCodec and an NVIDIA GPU); use cpu or auto")
        return "cpu", None
    supports = getattr(nv, "supports", None)
    why = supports(probe, path) if (probe is not None and supports is not None) else None
    return ("cpu", why) if why else ("nvdec", None)


def _cpu_reader(path: Path, probe: VideoProbe, dh: int, dw: int, num_threads: int):
    """decord (:func:`_frame_reader`)."""
    return _frame_reader(path, probe.height, probe.width, dh, dw, num_threads)


READERS["decord"] = _cpu_reader

# where PyAV's skipping reader gives decord's very pixels (measured: bench/decode_paths.py, the equal column, and
# tests/datamodules/test_decode_paths.py): H.264 / HEVC (skip_frame=NONREF drops only unreferenced pictures),
# 8-bit 4:2:0 (swscale's rgb24 at native size equals decord's and the CLI's), at native size (a reduced size is
# decord's in-decoder scaler, which PyAV's reformat does not reproduce: mean 1.6/255 apart)
PYAV_SKIP_CODECS = ("h264", "hevc")
PYAV_SKIP_PIX_FMTS = ("yuv420p", "yuvj420p")


def cpu_reader_for(probe: VideoProbe, decode_hw: tuple[int, int]) -> str:
    """The CPU reader of a video: ``pyav`` (in decode order) when its timestamps are unusable; ``pyav_skip`` for
    H.264/HEVC 8-bit 4:2:0 at native size (exact, faster: it skips what no sampled frame needs); else
    ``decord``."""
    if probe.timestamps_unusable:
        return "pyav"
    if (probe.codec in PYAV_SKIP_CODECS and probe.pix_fmt in PYAV_SKIP_PIX_FMTS
            and tuple(decode_hw) == (probe.height, probe.width)):
        return "pyav_skip"
    return "decord"


def _pyav_reader(path: Path, probe: VideoProbe, dh: int, dw: int, num_threads: int):
    """``read(idx)`` with PyAV, decoding the stream in decode order from the start (the ffmpeg CLI's order; no
    seeking): the reader of files whose timestamps are unusable (``probe.timestamps_unusable``: native index =
    the decoder's output count), where decord's pts-based seeking returns wrong frames. RGB by
    ``to_ndarray(format="rgb24")`` at native size (swscale's yuv->rgb, equal to decord's and the CLI's
    ``-pix_fmt rgb24`` on the test clips); a reduced size goes through :func:`_resize` of the native frame (not
    decord's in-decoder scaler); the display rotation is applied (``frame.rotation``, counter-clockwise)."""
    import av

    def read(idx: list[int]) -> np.ndarray:
        want = {k: [] for k in idx}
        out: dict[int, np.ndarray] = {}
        last = max(idx)
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            stream.thread_count = max(1, num_threads)
            n = 0
            for frame in container.decode(stream):
                if n in want:
                    x = frame.to_ndarray(format="rgb24")
                    rot = int(getattr(frame, "rotation", 0) or 0) % 360
                    if rot:
                        x = np.ascontiguousarray(np.rot90(x, k=rot // 90))
                    out[n] = x
                n += 1
                if n > last:
                    break
        missing = [k for k in idx if k not in out]
        if missing:
            raise DecodeError(f"{path}: the decoder gave {n} frames, not frames {missing[:5]}")
        frames = np.stack([out[k] for k in idx])
        return frames if frames.shape[1:3] == (dh, dw) else _resize(frames, dh, dw)

    return read


READERS["pyav"] = _pyav_reader


def _pyav_skip_reader(path: Path, probe: VideoProbe, dh: int, dw: int, num_threads: int,
                      skip_nonref: bool = True, seek: bool = True):
    """``read(idx)`` with PyAV that decodes only what the sampled frames need (issue 31 §2), at native size.

    * ``seek``: where a key frame lies between the last frame decoded and the next sampled frame, the demuxer
      seeks to the key frame at or before that frame (``probe.keyframes``; the decoder is flushed) instead of
      decoding through;
    * ``skip_nonref``: every packet whose pts is not a sampled frame's is decoded with ``skip_frame = "NONREF"``
      (FFmpeg then drops the non-reference pictures no other frame predicts from; a sampled frame that is itself
      non-reference is decoded, with ``DEFAULT``);
    * frames are matched to native indices by their pts (``probe.pts`` minus ``probe.pts_offset``).

    H.264/HEVC decoding is exact whatever is skipped (the skipped pictures are not referenced), so the frames are
    the full decode's; RGB by ``to_ndarray(format="rgb24")`` (the same swscale conversion as decord and the ffmpeg
    CLI at native size); the display rotation applied. Raises ``DecodeError`` naming the frames it could not get.
    """
    import av
    import av.logging

    keyframes = probe.keyframes

    def _read(idx: list[int]) -> np.ndarray:
        off = probe.pts_offset
        raw = {probe.pts[k] - off: k for k in idx}
        out: dict[int, np.ndarray] = {}
        todo = sorted(set(idx))
        t = 0                                   # todo[t]: the next sampled frame not yet decoded

        def take(frame) -> None:
            n = raw.get(frame.pts)
            if frame.is_corrupt and frame.pts is not None:   # FFmpeg's AV_FRAME_FLAG_CORRUPT / decode_error_flags:
                at = bisect.bisect_left(probe.pts, frame.pts + off)   # seen with any decoder threads
                tainted.add(_next_key(keyframes, at) if keyframes else 0)
                causes.append(f"native frame {at} marked corrupt by the decoder")
            if n is not None and n not in out:
                x = frame.to_ndarray(format="rgb24")
                rot = int(getattr(frame, "rotation", 0) or 0) % 360
                out[n] = np.ascontiguousarray(np.rot90(x, k=rot // 90)) if rot else x

        tainted: set[int] = set()              # key frames of the GOPs whose decode logged an error
        causes: list[str] = []
        # the decoder's log is read with one decoder thread only: PyAV's Python log callback called from FFmpeg's
        # frame threads can deadlock, so with threads the log stays off; frames FFmpeg marks corrupt
        # (``Frame.is_corrupt``) taint their GOP with any thread count (take)
        watch = num_threads <= 1
        with av.open(str(path)) as container, av.logging.Capture() as logs:
            stream = container.streams.video[0]
            cc = stream.codec_context
            stream.thread_type = "AUTO"
            stream.thread_count = max(1, num_threads)
            if watch:
                av.logging.set_level(av.logging.WARNING)
            seen = len(logs)

            def check(at: int) -> None:   # decoder errors logged since the last packet: that packet's GOP
                nonlocal seen
                for _, _, msg in logs[seen:]:
                    if _CONCEALED.search(str(msg)):
                        tainted.add(_next_key(keyframes, at) if keyframes else 0)
                        causes.append(" ".join(str(msg).split()))
                seen = len(logs)
            fed = -1                            # highest native index of a packet sent to the decoder
            while t < len(todo):
                kf = _next_key(keyframes, todo[t]) if keyframes else 0
                if seek and kf > fed + 1:       # a whole span no sampled frame needs: seek over it
                    container.seek(probe.pts[kf] - off, stream=stream, backward=True, any_frame=False)
                    cc.flush_buffers()
                    fed = kf - 1
                ended = True
                for packet in container.demux(stream):
                    if not packet.size:         # the demuxer's final empty packet: drained below
                        continue
                    if packet.pts is not None:
                        fed = max(fed, bisect.bisect_left(probe.pts, packet.pts + off))
                    if skip_nonref:
                        cc.skip_frame = "DEFAULT" if packet.pts in raw else "NONREF"
                    for frame in cc.decode(packet):
                        take(frame)
                    check(fed)
                    while t < len(todo) and todo[t] in out:
                        t += 1
                    if t >= len(todo) or (seek and keyframes and _next_key(keyframes, todo[t]) > fed + 1):
                        ended = False
                        break
                if ended:                       # end of stream: drain the decoder
                    cc.skip_frame = "DEFAULT"
                    for frame in cc.decode(None):
                        take(frame)
                    while t < len(todo) and todo[t] in out:
                        t += 1
                    break
        av.logging.set_level(None)
        missing = [k for k in todo if k not in out]
        if missing:   # not a DecodeError: the caller's retries and replacement rule apply
            raise RuntimeError(f"the decoder gave no frame for native frames {missing[:5]}")
        concealed = [k for k in todo if keyframes and _next_key(keyframes, k) in tainted]
        if concealed:   # issue 35 item 4: frames decoded from a GOP the decoder reported errors in
            raise RuntimeError(f"the decoder reported errors (concealed) in the GOP of native frames "
                               f"{concealed[:5]}: {'; '.join(dict.fromkeys(causes))[:200]}")
        frames = np.stack([out[k] for k in idx])
        return frames if frames.shape[1:3] == (dh, dw) else _resize(frames, dh, dw)

    def read(idx: list[int]) -> np.ndarray:
        try:
            return _read(idx)
        finally:
            av.logging.set_level(None)

    return read


# FFmpeg decoder messages that mean a picture was decoded from damaged data (h264: "concealing N DC, N AC, N MV
# errors in I frame", "error while decoding MB", "Invalid NAL unit size", "corrupted macroblock", ...)
_CONCEALED = re.compile(r"conceal|error while decoding|corrupt|Invalid NAL|decode_slice_header error|"
                        r"no frame!|Invalid data|illegal", re.IGNORECASE)


def _next_key(keyframes: list[int], k: int) -> int:
    """The key frame at or before native frame ``k`` (0, the stream's start, when none is)."""
    j = bisect.bisect_right(keyframes, k) - 1
    return keyframes[j] if j >= 0 else 0


READERS["pyav_skip"] = _pyav_skip_reader


def decode_video(path: str | Path, budget_tokens: int, decode_max_side: int = 896, base_fps: float = 1.0,
                 num_threads: int = 1, native_decode_bytes: float = NATIVE_DECODE_BYTES,
                 short_clip_first_frame: bool = False,
                 max_replaced_frac: float = MAX_REPLACED_FRAC, sizing: EncoderSizing | None = None,
                 hold_chunk_bytes: float = HOLD_CHUNK_BYTES, decoder: str = "cpu") -> DecodedVideo:
    """Decode the frames the largest budget of a run needs, as seed 001's ``decode_video`` chooses them.

    Three steps: (a) the plan, :func:`probe_video` and :func:`plan_decode`: seed 001's ``duration =
    float(probe["format"]["duration"])`` picks the rate ``fps = bd.FPS if int(duration * bd.FPS) + 1 <=
    max_frames else (max_frames + 1) / duration``; the frames are those FFmpeg's ``fps=fps:round=down`` emits
    (:func:`algorithms.budget.fps_filter_frames` on the stream's integer pts, the rate ``av_d2q(fps, INT_MAX)``),
    thinned by ``np.linspace(0, len(frames) - 1, max_frames, dtype=int)`` and labelled ``ts = (start +
    np.arange(len(frames)) / fps)``; (b) a reader (:data:`READERS`) decodes those native frames; (c) the retries,
    replacement rule and encoder-size holding below work on any reader.

    Size (seed 001: ``if n_est * h * w * 3 <= NATIVE_DECODE_BYTES: dw, dh = w, h else: dh, dw =
    bd.frame_size(h, w, tok)``, with ``n_est = min(int(duration * fps) + 1, max_frames)``): native size when the
    estimated frames fit ``native_decode_bytes``, else the long side at most ``decode_max_side`` (``bd.frame_size``
    is not in the seed; this keeps the project's earlier reduced size).

    Args:
        path: video file.
        budget_tokens: the largest budget (sets the frame cap, :func:`algorithms.budget.sample_frames`).
        decode_max_side: longest decoded side in pixels when the native decode would exceed
            ``native_decode_bytes``.
        base_fps: sampling rate before the cap (1 fps in seed 001, ``bd.FPS``).
        num_threads: decoder threads. A decode that fails with several threads is retried with one: decord's
            threaded decoder fails on some streams that decode fine single-threaded ("Error sending packet",
            dmlc/decord#246 and #314); only a video that also fails with one thread is an error.
        native_decode_bytes: largest ``n_est * h * w * 3`` decoded at native size (seed: 2e9).
        short_clip_first_frame: a clip that ends before the first sampling step gives no frame in the seed (an
            error here, as there); ``True`` keeps its frame at 0 s instead (deviation, off by default).
        max_replaced_frac: 0 (default, seed 001: any decode error makes the video an error record). Above 0
            (deviation): when the batch read fails (corrupt packets), every sampled frame is re-read alone and
            each unreadable one is replaced by the nearest readable sampled frame (native index distance, the
            earlier on a tie), listed in ``info["frames_replaced"]`` (positions in the returned frames); the video
            is an error only when more than this fraction of its sampled frames is unreadable.
        sizing: ``None``: ``frames`` is the ``(T, H, W, 3)`` decode. Else the video is decoded in chunks of about
            ``hold_chunk_bytes`` (decode-size bytes) and each chunk is at once resized, by the processor's own
            resize, to every grid :meth:`EncoderSizing.grids` lists for its frames; ``frames`` is then an
            :class:`EncoderFrames` (the decode size never exists for all frames at once), unless those sizes take
            no fewer bytes than the decode (:func:`held_bytes`; small videos the encoder upsamples): then
            ``frames`` is the decode-size tensor as without ``sizing``. The frames are decoded
            exactly as without it (same decoder calls per frame, same fallbacks), so the encoder's inputs are the
            same: bit-identical on the CPU (``tests/datamodules/test_hold_sizes.py``).
        hold_chunk_bytes: decode-size bytes per chunk with ``sizing``.
        decoder: ``cpu`` (decord), ``nvdec`` or ``auto`` (:func:`resolve_decoder`); ``info["decoder"]`` records
            the reader that decoded the video.

    Raises:
        DecodeError: missing, empty, truncated, corrupted or unreadable file, no video stream, no frame at the
            sampling rate, or no decodable frame; the message starts with the file path.
        ValueError: a bad ``max_replaced_frac`` or ``decoder``.
    """
    if not 0.0 <= max_replaced_frac < 1.0:
        raise ValueError(f"max_replaced_frac must be in [0, 1), got {max_replaced_frac!r}")
    resolve_decoder(decoder)   # a bad setting fails before any file is read
    return _decode_video(Path(path), budget_tokens, decode_max_side, base_fps, num_threads, native_decode_bytes,
                         short_clip_first_frame, max_replaced_frac, sizing, hold_chunk_bytes, decoder)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise DecodeError(f"{path}: video file not found")
    if not path.is_file():
        raise DecodeError(f"{path}: is not a regular file")
    if path.stat().st_size == 0:
        raise DecodeError(f"{path}: video file is empty (0 bytes)")


def _decode_video(path: Path, budget_tokens: int, decode_max_side: int, base_fps: float, num_threads: int,
                  native_decode_bytes: float, short_clip_first_frame: bool,
                  max_replaced_frac: float = 0.0, sizing: EncoderSizing | None = None,
                  hold_chunk_bytes: float = HOLD_CHUNK_BYTES, decoder: str = "cpu") -> DecodedVideo:
    _check_file(path)
    probe = probe_video(path)
    plan = plan_decode(path, probe, budget_tokens, base_fps, native_decode_bytes, decode_max_side,
                       short_clip_first_frame)
    name, fallback = resolve_decoder(decoder, probe, path)
    if name == "cpu":
        name = cpu_reader_for(probe, plan.decode_hw)
    factory = READERS[name]
    h, w = probe.height, probe.width
    (dh, dw), idx, unique = plan.decode_hw, plan.idx, plan.unique
    made: list = []   # the readers opened (a reader may fall back to the CPU mid-file: ``read.fallback``)

    def open_reader(threads: int):
        made.append(factory(path, probe, dh, dw, threads))
        return made[-1]

    opener = (lambda threads: lambda ix: _read_frames(path, ix, h, w, dh, dw, threads)) if name == "decord" else \
        open_reader
    if getattr(factory, "whole_video", False):   # one read of every planned frame (NVDEC decodes the stream once)
        hold_chunk_bytes = max(hold_chunk_bytes, float(len(unique) * dh * dw * 3))
    grids = sizing.grids(len(idx), dh, dw) if sizing is not None else None
    if grids is None or held_bytes(grids) >= len(idx) * dh * dw * 3:   # holding would not save memory
        frames, replaced = _decode_unique(path, unique, h, w, dh, dw, num_threads, max_replaced_frac,
                                          opener=opener)
        if len(unique) != len(idx):
            pos = {k: i for i, k in enumerate(unique)}
            frames = np.ascontiguousarray(frames[[pos[k] for k in idx]])
        frames = torch.from_numpy(frames)
    else:
        frames, replaced = _decode_held(path, unique, idx, h, w, dh, dw, num_threads, max_replaced_frac, sizing,
                                        grids, hold_chunk_bytes, opener=opener,
                                        chunk_opener=None if name == "decord" else opener)
    fps_ok = probe.fps > 0
    vfr = (not probe.timestamps_unusable) and is_variable_frame_rate(probe.pts, probe.time_base, probe.fps)
    native_fps = probe.fps if (fps_ok and not vfr) else len(probe.pts) / probe.duration_s
    info = {"duration_s": round(probe.duration_s, 3), "native_hw": [int(h), int(w)], "decode_hw": [int(dh), int(dw)],
            "n_frames": len(idx), "fps": round(native_fps, 4), "sample_fps": round(plan.sample_fps, 4),
            "fps_ok": bool(fps_ok), "vfr": bool(vfr), "decoder": name}
    late = next((r.fallback for r in reversed(made) if getattr(r, "fallback", None)), None)
    if late:   # the NVDEC reader failed on this file and read it on the CPU
        info["decoder"], fallback = late
    if fallback:
        info["decoder_fallback"] = fallback
    if probe.timestamps_unusable:
        info["timestamps_unusable"] = True
    if replaced:   # positions in the returned frames whose native frame could not be read
        bad_native = {unique[k] for k in replaced}
        info["frames_replaced"] = [j for j, k in enumerate(idx) if k in bad_native]
    return DecodedVideo(frames=frames, times_s=plan.times_s, info=info)


def decord_frame_count(path: str | Path) -> tuple[int, float]:
    """``(len(vr), vr.get_avg_fps())`` of ``decord.VideoReader(path)``: the ``total_frames`` and ``video_fps`` that
    qwen_omni_utils' frame choice starts from (QwenLM/Qwen2.5-Omni@f8bf58c6:qwen-omni-utils/src/qwen_omni_utils/
    v2_5/vision_process.py:_read_video_decord, ``total_frames, video_fps = len(vr), vr.get_avg_fps()``; decord's
    count is the container's frame count, e.g. mp4's sample count, else its duration-times-rate estimate).

    Raises:
        DecodeError: the file is missing or decord cannot open it.
    """
    import decord

    path = Path(path)
    _check_file(path)
    try:
        vr = decord.VideoReader(str(path), num_threads=1)
        return len(vr), float(vr.get_avg_fps())
    except Exception as e:  # noqa: BLE001 - decord raises its own error type for every open failure
        raise _open_error(path, e) from e


def decode_at_indices(path: str | Path, indices: list[int], max_side: int = 896, num_threads: int = 1,
                      native_decode_bytes: float = NATIVE_DECODE_BYTES, max_replaced_frac: float = MAX_REPLACED_FRAC,
                      video_fps: float | None = None) -> DecodedVideo:
    """The frames at explicit native (presentation-order) indices ``indices``, as ``vr.get_batch(idx)`` reads them
    in qwen_omni_utils' ``_read_video_decord`` (the frame choice is the caller's, e.g.
    :func:`algorithms.omni_sampling.qwen_omni_frame_indices`).

    The reader is decord (:func:`_frame_reader`: the release's reader, with its rotation fix), or PyAV in decode
    order for a file whose timestamps are unusable (:func:`cpu_reader_for`'s rule: decord's seeking returns wrong
    frames there); the size as :func:`decode_frame_size` with ``n_est = len(indices)`` (native while the frames take
    at most ``native_decode_bytes``, else the long side at most ``max_side``, inside the decoder); the retry with
    one thread and ``max_replaced_frac`` as :func:`decode_video`. Repeated indices are decoded once.

    Args:
        video_fps: the rate the indices were chosen at: ``times_s = index / video_fps`` (``None``: the stream's
            average rate, ``avg_frame_rate``, which decord's ``get_avg_fps`` reads; 1 when unknown).

    Returns:
        :class:`DecodedVideo`; ``info``: ``duration_s`` (``format.duration``), ``native_hw``, ``decode_hw``,
        ``n_frames``, ``decoder``, ``frames_replaced`` when some frame was replaced, ``timestamps_unusable`` when
        set.

    Raises:
        DecodeError: as :func:`decode_video` (an index past the stream's last frame fails the read).
        ValueError: no index, a negative one, or a bad ``max_replaced_frac``.
    """
    if not indices or min(indices) < 0:
        raise ValueError(f"indices must be a non-empty list of frame indices >= 0, got {list(indices)[:8]}")
    if not 0.0 <= max_replaced_frac < 1.0:
        raise ValueError(f"max_replaced_frac must be in [0, 1), got {max_replaced_frac!r}")
    path = Path(path)
    _check_file(path)
    probe = probe_video(path)
    idx = [int(k) for k in indices]
    h, w = probe.height, probe.width
    dh, dw = decode_frame_size(h, w, len(idx), native_decode_bytes, max_side)
    name = "pyav" if probe.timestamps_unusable else "decord"
    unique = sorted(set(idx))
    opener = (lambda threads: lambda ix: _read_frames(path, ix, h, w, dh, dw, threads)) if name == "decord" else \
        (lambda threads: READERS[name](path, probe, dh, dw, threads))
    frames, replaced = _decode_unique(path, unique, h, w, dh, dw, num_threads, max_replaced_frac, opener=opener)
    if len(unique) != len(idx):
        pos = {k: i for i, k in enumerate(unique)}
        frames = np.ascontiguousarray(frames[[pos[k] for k in idx]])
    rate = video_fps if video_fps is not None else probe.fps
    times = [k / rate for k in idx] if rate and rate > 0 else [float(k) for k in idx]
    info = {"duration_s": round(probe.duration_s, 3), "native_hw": [int(h), int(w)], "decode_hw": [int(dh), int(dw)],
            "n_frames": len(idx), "decoder": name}
    if probe.timestamps_unusable:
        info["timestamps_unusable"] = True
    if replaced:
        bad_native = {unique[k] for k in replaced}
        info["frames_replaced"] = [j for j, k in enumerate(idx) if k in bad_native]
    return DecodedVideo(frames=torch.from_numpy(frames), times_s=times, info=info)


def _check_shape(path: Path, frames: np.ndarray, n: int) -> np.ndarray:
    if frames.ndim != 4 or frames.shape[0] != n or frames.shape[-1] != 3:
        raise DecodeError(f"{path}: decoder returned frames of shape {frames.shape}")
    return frames


def _decode_unique(path: Path, unique: list[int], h: int, w: int, dh: int, dw: int, num_threads: int,
                   max_replaced_frac: float, read=None, opener=None) -> tuple[np.ndarray, list[int]]:
    """``(frames (len(unique), dh, dw, 3), replaced positions)``: one batch read (``read(threads)`` gives the
    frames, default ``opener(threads)(unique)``, one reader call; without ``opener`` one decord call), retried
    with one thread, then (``max_replaced_frac > 0``) frame by frame with replacement."""
    if read is None:
        read = (lambda threads: opener(threads)(unique)) if opener is not None else \
            (lambda threads: _read_frames(path, unique, h, w, dh, dw, threads))
    replaced: list[int] = []
    try:
        try:
            frames = read(num_threads)
        except DecodeError:
            raise
        except Exception:
            if num_threads <= 1:
                raise
            frames = read(1)   # decord's threaded decoder failed: one thread
    except DecodeError:
        raise
    except Exception as e:
        each = _read_each(path, unique, h, w, dh, dw, opener=opener) if max_replaced_frac > 0 else []
        bad = sum(f is None for f in each)
        if not each or bad == len(each) or bad > max_replaced_frac * len(each):
            detail = f"; {bad} of {len(each)} frames unreadable alone, more than data.max_replaced_frac=" \
                     f"{max_replaced_frac:g}" if each else ""
            raise DecodeError(f"{path}: decoding {len(unique)} frames failed (corrupted or truncated stream; "
                              f"{short_error(e)}{detail})") from e
        filled, replaced = replace_unreadable(each, unique)
        frames = np.stack(filled)
    return _check_shape(path, np.ascontiguousarray(frames), len(unique)), replaced


def held_bytes(grids: dict[tuple[int, int], tuple[list[int], int]]) -> int:
    """Bytes of uint8 RGB frames held at the grids of :meth:`EncoderSizing.grids`: ``sum n * 28 gh * 28 gw * 3``."""
    return sum(len(pos) * (CELL_PIXELS * gh) * (CELL_PIXELS * gw) * 3 for (gh, gw), (pos, _) in grids.items())


def hold_chunk_frames(height: int, width: int, hold_chunk_bytes: float) -> int:
    """Frames per decode chunk when frames are held at the encoder's sizes: ``max(1, bytes // (h * w * 3))``."""
    return max(1, int(hold_chunk_bytes // (height * width * 3)))


def _decode_held(path: Path, unique: list[int], idx: list[int], h: int, w: int, dh: int, dw: int, num_threads: int,
                 max_replaced_frac: float, sizing: EncoderSizing, grids: dict, hold_chunk_bytes: float,
                 opener=None, chunk_opener=None) -> tuple[EncoderFrames, list[int]]:
    """The frames of :func:`_decode_unique`, decoded ``hold_chunk_frames`` at a time and each chunk resized to the
    grids that need its frames at once. A failing chunk falls back to :func:`_decode_unique` on the whole video
    (the same retries and replacements as without ``sizing``; the decode size is then held for all frames)."""
    where = {k: i for i, k in enumerate(unique)}
    src = [where[k] for k in idx]          # position j -> index in ``unique`` (non-decreasing)
    step = hold_chunk_frames(dh, dw, hold_chunk_bytes)
    parts: dict[tuple[int, int], list[torch.Tensor]] = {}

    def take(chunk: np.ndarray, lo: int) -> None:   # chunk = frames of unique[lo:lo + len(chunk)]
        x = torch.from_numpy(chunk)
        for g, (js, cap) in grids.items():
            sel = [src[j] - lo for j in js if lo <= src[j] < lo + len(chunk)]
            if sel:
                parts.setdefault(g, []).append(sizing.resize(x[sel], cap))

    def chunked(threads: int) -> np.ndarray:
        parts.clear()
        read = chunk_opener(threads) if chunk_opener is not None else _frame_reader(path, h, w, dh, dw, threads)
        for lo in range(0, len(unique), step):
            take(_check_shape(path, read(unique[lo:lo + step]), len(unique[lo:lo + step])), lo)
        return np.empty((len(unique), 0, 0, 3), np.uint8)   # done: nothing left to resize

    frames, replaced = _decode_unique(path, unique, h, w, dh, dw, num_threads, max_replaced_frac, read=chunked,
                                      opener=opener)
    if frames.shape[1] != 0:   # the frame-by-frame fallback returned the whole decode: resize it in chunks
        parts.clear()
        for lo in range(0, len(unique), step):
            take(frames[lo:lo + step], lo)
    held = {g: (torch.cat(parts[g]), js) for g, (js, _) in grids.items()}
    return EncoderFrames((len(idx), dh, dw, 3), held), replaced
