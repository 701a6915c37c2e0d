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

from datamodules.decode.display import DisplayError, autorotate_ops, matrix_of, swaps_axes
from datamodules.decode.errors import DecodeError, ffmpeg_log_unfolded, short_error


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
        timestamps_unusable: the pts are repeated or run backwards: frame index and the average rate stand in for
            them.
        pts_offset: added to the container's pts (minus the file's start time, in ``time_base`` units).
        display_matrix: the first frame's display matrix (9 int32, ``AV_FRAME_DATA_DISPLAYMATRIX``) or ``None``;
            the readers apply it as the CLI does (:mod:`datamodules.decode.display`).
        decoded_timeline: why ``pts`` are the decoder's output timestamps (empty: they are the packets' pts). Set
            where the packets' pts are not what the ffmpeg CLI's filter sees: packets without pts (AVI with
            reordered frames: DivX-style MPEG-4 ASP or H.264 with B-frames), or pts = dts on a stream the decoder
            reorders (an mp4 muxed with ``-video_track_timescale 1``). Then ``pts`` are, in the decoder's output
            order, the CLI's ``best_effort_timestamp`` (:func:`_decoder_timeline`), native index ``k`` is the
            ``k``-th frame the decoder outputs, and the ``pyav`` reader (decode order) reads them.
        damaged: (``decoded_timeline`` only) the timeline pass saw a frame marked corrupt or a refused packet.
        codec_family: the codec's name (``av1``; ``codec`` is the decoder's, e.g. ``libdav1d``).
        segments: (``decoded_timeline`` only) native indices where the frame size or pixel format changes: the CLI
            rebuilds its filter graph there (a new ``fps`` filter; frames of another size are scaled to the first
            frame's, :func:`algorithms.budget.sample_frames`).
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
    display_matrix: tuple[int, ...] | None = None
    decoded_timeline: str = ""
    damaged: bool = False
    codec_family: str = ""
    segments: tuple[int, ...] = ()


_MAX_REORDER = 16   # H.264/HEVC reorder depth at most 16 frames: pts further out of decode order run backwards
# containers whose stream may change its frame size at a key frame (concatenated MPEG-TS / PS segments, HLS
# captures, elementary streams): their key frames are decoded in the probe to see it (``_KeySizes``; measured on a
# 2-min 720p30 H.264 TS with a key frame every 2 s: probe 0.032 -> 0.064 s, about 0.5 ms per key frame)
SIZE_SCAN_FORMATS = frozenset({"mpegts", "mpeg", "mpegvideo", "h264", "hevc", "m4v", "flv"})


class _KeySizes:
    """The frame sizes of a stream's key frames, decoded alone (no other packet: an intra picture needs none) by a
    decoder of their own while the probe demuxes: a frame size change happens at a key frame, so a stream whose
    key frames all have one size has one size (issue 44 item 5: a change inside a span ``pyav_skip`` seeks over,
    e.g. 80x16 -> 160x32 -> 80x16, or in a file decord reads, went unseen and kept the one-filter plan).
    A key frame the decoder refuses is not counted (the readers report damaged data)."""

    def __init__(self, stream):
        import av

        self.sizes: list[tuple[int, int]] = []
        self.ctx = av.CodecContext.create(stream.codec_context.name, "r")
        self.ctx.extradata = stream.codec_context.extradata
        self.ctx.thread_count = 1

    def _take(self, frames) -> None:
        for f in frames:
            if (f.width, f.height) not in self.sizes:
                self.sizes.append((f.width, f.height))

    def add(self, packet) -> None:
        import av

        try:
            self._take(self.ctx.decode(packet))
        except av.error.FFmpegError:
            pass

    def change(self) -> str:
        """The reason for the decoder's timeline when the key frames have several sizes, else ``""``."""
        self.add(None)
        if len(self.sizes) < 2:
            return ""
        return ("the frame size changes mid-stream (key frames of "
                + ", ".join(f"{w}x{h}" for w, h in self.sizes[:4]) + ")")


def _ffmpeg_float(x: float) -> float:
    """A time as ffprobe prints it (``%f``: six decimals) and the seed's ``float(...)`` reads it back."""
    return float(f"{x:f}")


def _log_cause(logs) -> str:
    """The FFmpeg log lines of a failed open/demux (``moov atom not found``, ``partial file``, ...), one line."""
    seen: list[str] = []
    for _, _, msg in logs:
        m = " ".join(str(msg).split()).rstrip(".")      # (joined by "; " below: no ".;")
        if m and m not in seen:
            seen.append(m)
    return "; ".join(seen[-3:])


def probe_video(path: Path, timeline: str = "") -> VideoProbe:
    """The container's timing of the first video stream, as the ffmpeg CLI sees it (PyAV, no full decode).

    ``duration_s`` is ``format.duration`` and ``start_s`` the stream's ``start_time`` (seed 001 reads both from
    ``ffmpeg.probe``); the pts are offset by the file's start time, as the CLI offsets its input
    (``ts_offset = -ic->start_time``), and ``end_pts`` is the last frame's pts plus its packet duration (the
    decoder's ``last_frame_pts + last_frame_duration_est``, which the CLI sends to the filter as end of stream),
    else the last pts step, else one average frame period.

    ``timeline``: a reason to take the decoder's timeline (:func:`_decoder_timeline`: a full decode) whatever the
    packets say (a reader saw the frame size change). The packets are demuxed as the CLI demuxes them (PyAV's
    default ``genpts`` off): where they carry no pts, or pts = dts on a stream the decoder reorders, the timeline is
    the decoder's too (``decoded_timeline`` says why).

    Raises:
        DecodeError: the container cannot be opened (its FFmpeg log cause named: ``moov atom not found``, a truncated
            atom, ...), has no video stream or no video packet, or its data ends before its index (``partial
            file``: truncated); a display matrix that rotates by an angle other than a multiple of 90 degrees.
    """
    import av
    import av.logging

    av.logging.set_level(av.logging.WARNING)   # FFmpeg's log, for the causes below (restored to off at the end:
    try:                                        # a Python log callback from decoder threads can deadlock)
        with av.logging.Capture() as logs, ffmpeg_log_unfolded():
            try:
                container = av.open(str(path))
            except av.error.FFmpegError as e:
                cause = _log_cause(logs) or short_error(e)
                raise DecodeError(f"{path}: cannot read the container (truncated, corrupted or not a video file; "
                                  f"{cause})") from e
            with container:
                if not container.streams.video:
                    raise DecodeError(f"{path}: has no video stream (audio-only or not a video file)")
                container.flags = int(container.flags) & ~av.container.Flags.gen_pts.value   # the CLI's demuxing:
                stream = container.streams.video[0]                                     # no made-up pts
                packets, head = [], []
                keys = _KeySizes(stream) if (not timeline and SIZE_SCAN_FORMATS & set(
                    container.format.name.split(","))) else None
                try:
                    for p in container.demux(stream):
                        if p.size and not p.is_discard:
                            packets.append((p.pts, p.dts, p.duration or 0, bool(p.is_keyframe)))
                            if len(head) < 32:
                                head.append(p)   # decoded below for the display rotation
                            if keys is not None and p.is_keyframe:
                                keys.add(p)
                except av.error.FFmpegError as e:
                    cause = _log_cause(logs) or short_error(e)
                    raise DecodeError(f"{path}: cannot read the container (truncated or corrupted; {cause})") from e
                partial = [m for _, _, m in logs if "partial file" in str(m)]
                if partial:
                    raise DecodeError(f"{path}: cannot read the container (truncated: the data ends before the "
                                      f"packets its index lists; {_log_cause(logs)})")
                matrix, first_hw, out_pts = None, None, []
                # pts = dts everywhere: the whole head is decoded, to see whether the decoder reorders frames
                whole_head = len(packets) > 1 and all(q[0] == q[1] for q in packets)
                stream.thread_count = 1   # no decoder threads (the log callback is on)
                try:   # the display matrix is on the decoded frame (side data)
                    for p in [*head, None]:
                        frames = stream.codec_context.decode(p)
                        for f in frames:
                            if first_hw is None:
                                matrix, first_hw = matrix_of(f), (f.height, f.width)
                            out_pts.append(f.pts)
                        if first_hw is not None and (not whole_head or stream.codec_context.has_b_frames):
                            break
                except av.error.FFmpegError:
                    pass   # a bad frame is the reader's to report
                reorders = bool(getattr(stream.codec_context, "has_b_frames", 0)) or any(
                    b is not None and a is not None and b < a for a, b in zip(out_pts, out_pts[1:]))
                tb = stream.time_base
                cw, ch = stream.codec_context.width, stream.codec_context.height
                duration = container.duration
                file_start = container.start_time
                start = stream.start_time
                rate = stream.average_rate or stream.guessed_rate
                codec, pix_fmt = stream.codec_context.name, stream.codec_context.pix_fmt or ""
                family = getattr(stream.codec_context.codec, "canonical_name", "") or codec
                no_ts = bool(int(container.format.flags) & av.format.Flags.no_timestamps.value)
    except DecodeError:
        raise
    except av.error.FFmpegError as e:
        raise DecodeError(f"{path}: cannot read the container (truncated, corrupted or not a video file; "
                          f"{short_error(e)})") from e
    finally:
        av.logging.set_level(None)
    if not packets:
        raise DecodeError(f"{path}: video has no frames")
    try:
        ops = autorotate_ops(matrix)
    except DisplayError as e:
        raise DecodeError(f"{path}: {e}") from None
    if first_hw is not None:
        ch, cw = first_hw   # the first frame's size: the CLI's output size (autoscale)
    h, w = (cw, ch) if swaps_axes(ops) else (ch, cw)
    fps = float(rate) if rate else 0.0
    time_base = Fraction(tb.numerator, tb.denominator) if tb else Fraction(0)
    raw = [p[0] for p in packets]
    if not timeline and keys is not None:
        timeline = keys.change()
    if timeline:
        pass
    elif None in raw:
        timeline = "the packets carry no pts (decode order only: AVI with reordered frames, or an elementary stream)"
    elif len(raw) > 1 and all(p[0] == p[1] for p in packets) and reorders and \
            all(b > a for a, b in zip(raw, raw[1:])):   # (pts running backwards or repeated: unusable, below)
        timeline = "the packets carry pts = dts while the decoder reorders frames (B-frames)"
    if timeline and time_base > 0:
        off = 0 if file_start is None else _rescale_near(-file_start, Fraction(1, 1_000_000), time_base)
        pts, end_pts, keyframes, damaged, segments = _decoder_timeline(path, off, time_base, rate, no_ts)
        if not pts:
            raise DecodeError(f"{path}: video has no decodable frame")
        if duration is not None and duration > 0:
            duration_s = _ffmpeg_float(duration / 1_000_000)
        else:
            duration_s = _ffmpeg_float(float((end_pts - pts[0]) * time_base))
        start_s = _ffmpeg_float(float(start * tb)) if (start is not None and tb) else 0.0
        return VideoProbe(int(h), int(w), time_base, pts, int(end_pts), duration_s, start_s, fps, keyframes, False,
                          codec, pix_fmt, off, matrix, timeline, damaged, family, segments)
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
                      not usable, codec, pix_fmt, off if usable else 0, matrix, "", False, family)


def _decoder_timeline(path: Path, off: int, time_base: Fraction, rate, ts_unreliable: bool
                      ) -> tuple[list[int], int, list[int], bool, tuple[int, ...]]:
    """The timestamps the ffmpeg CLI gives the decoded frames, in the decoder's output order, by decoding the stream
    (PyAV, packets demuxed as the CLI demuxes them: no ``genpts``).

    Follows FFmpeg fftools/ffmpeg_dec.c (FFmpeg/FFmpeg@00caeba0): ``packet_decode`` (an ``AVFMT_NOTIMESTAMPS``
    format's packets lose pts and dts, ``DECODER_FLAG_TS_UNRELIABLE``), ``video_frame_process`` (``frame->pts =
    frame->best_effort_timestamp``; a frame without one is ``last_frame_pts + last_frame_duration_est``, 0 for the
    first) and ``video_duration_estimate``; the best-effort timestamp is libavcodec/decode.c ``guess_correct_pts``
    (the frame's reordered pts unless more of them than of the packets' dts ran backwards). The demuxer's
    ``ts_offset`` (``off``, minus the file's start time) is added first. Checked against the CLI's own ``showinfo``
    on AVI with MPEG-4 ASP / H.264 B-frames, pts = dts mp4, MJPEG AVI and a raw H.264 stream (equal, 1 and 4
    decoder threads).

    Returns:
        ``(pts, end_pts, keyframes, damaged, segments)``: per output frame its pts (``time_base`` units), the end
        of stream the CLI signals (last pts plus the last duration estimate), the output indices of key frames,
        whether a frame was marked corrupt or a packet refused, and the output indices where the frame size or
        pixel format changes (``ifilter_parameters_from_frame``: the CLI rebuilds its filter graph).
    """
    import av

    out: list[int] = []
    keys: list[int] = []
    segments: list[int] = []
    fmt: list = [None]
    damaged = False
    st = {"fp": 0, "fd": 0, "lp": None, "ld": None, "last": None, "est": 0}
    with av.open(str(path)) as container:
        container.flags = int(container.flags) & ~av.container.Flags.gen_pts.value
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        cc = stream.codec_context
        framerate = cc.framerate

        def on(frame) -> None:
            nonlocal damaged
            damaged = damaged or bool(frame.is_corrupt)
            p = None if (ts_unreliable or frame.pts is None) else frame.pts + off
            d = None if (ts_unreliable or frame.dts is None) else frame.dts + off
            if d is not None:   # guess_correct_pts
                st["fd"] += st["ld"] is not None and d <= st["ld"]
                st["ld"] = d
            elif p is not None:
                st["ld"] = p
            if p is not None:
                st["fp"] += st["lp"] is not None and p <= st["lp"]
                st["lp"] = p
            elif d is not None:
                st["lp"] = d
            pts = p if (p is not None and (st["fp"] <= st["fd"] or d is None)) else d
            last = st["last"]
            if pts is None:
                pts = 0 if last is None else last + st["est"]
            diff = pts - last if last is not None else -1   # video_duration_estimate
            dur = int(frame.duration or 0)
            codec_dur = 0
            if framerate:
                codec_dur = _rescale_near(2, 1 / (2 * Fraction(framerate)), time_base)
            if dur > 0 and not ts_unreliable and not (dur == 1 and diff > 2):
                est = dur
            elif codec_dur > 0 and ts_unreliable:
                est = codec_dur
            elif diff > 0:
                est = diff
            elif dur > 0:
                est = dur
            elif codec_dur > 0:
                est = codec_dur
            elif rate and _rescale_near(1, 1 / Fraction(rate), time_base) > 0:
                est = _rescale_near(1, 1 / Fraction(rate), time_base)
            else:
                est = max(st["est"], 1)
            st["last"], st["est"] = pts, est
            if frame.key_frame:
                keys.append(len(out))
            f = (frame.width, frame.height, frame.format.name)
            if fmt[0] is not None and f != fmt[0]:
                segments.append(len(out))
            fmt[0] = f
            out.append(int(pts))

        for packet in container.demux(stream):
            try:
                for frame in cc.decode(packet):
                    on(frame)
            except av.error.InvalidDataError:
                damaged = True
    end = (st["last"] + st["est"]) if st["last"] is not None else 0
    return out, int(end), keys, damaged, tuple(segments)


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
