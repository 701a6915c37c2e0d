"""Step 1 of a decode: what the container says about the video stream, read without decoding more than one frame.

:func:`probe_video` demuxes the video stream with PyAV (integer pts and time base, packet durations,
``format.duration``, ``start_time``, key frames, codec and pixel format) into a :class:`VideoProbe`, the input of
the frame choice (:mod:`datamodules.decode.plan`) and of the choice of reader (:func:`datamodules.decode.cpu.
cpu_reader_for`); :func:`is_variable_frame_rate` reads ``info["vfr"]`` from it. PyAV is used where decord cannot do
the job: integer pts, packet durations and the container duration (decord exposes float32 times only) and the
FFmpeg log that names why a file cannot be read.
"""
from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

import numpy as np

from datamodules.decode.errors import DecodeError, short_error


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
