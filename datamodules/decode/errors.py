"""What a video file can be, and what each kind gives: the decode room's errors and file checks.

:class:`DecodeError` (a file the CPU path cannot read: the record of each of its questions is an error) and
:class:`NvdecError` (a file NVDEC cannot decode exactly: the caller reads it on the CPU instead), :func:`short_error`
(one line of a decoder's message) and the checks every decode starts and ends with (:func:`_check_file`,
:func:`_check_shape`).

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
corrupted bytes mid-stream,      seed 001 (default, ``strict_frames=False``): answered as the ffmpeg CLI decodes
a concealed (damaged) IDR        it (refused packets skipped, concealed pictures kept, a missing sampled frame
                                 the last decoded one, or before the first decoded frame the first one), the
                                 positions listed (``frames_concealed``), on every reader (the PyAV readers flag
                                 in their own pass; decord's files are checked by ``concealed_frames``; a file
                                 decord cannot read through is read by ``pyav_sws`` / ``pyav_skip``).
                                 ``strict_frames=True``: error
                                 ``decoding N frames failed (corrupted or truncated stream; ...)`` or ``the
                                 decoder reported errors (concealed)``; with ``max_replaced_frac`` above 0
                                 unreadable sampled frames are replaced by the nearest readable one and listed
                                 (``frames_replaced``). A damaged container index: ``cannot read the container``
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
rotation metadata                the display matrix as the CLI's autorotation applies it, flips included
                                 (``display.py``; ``native_hw`` is the displayed size): at native size and for
                                 any mirrored matrix by ``pyav_skip``; at a reduced size decord applies a pure
                                 rotation (decord 0.6 mis-sizes its output buffer for some small 90/270-rotated
                                 sizes; then the batch is decoded at a nearby width and resized back). An angle
                                 other than a multiple of 90 degrees: error ``the display matrix rotates by ...``
packets without pts (AVI with    the CLI's timeline: every frame decoded once in the probe (PyAV, packets demuxed
B-frames: MPEG-4 ASP, H.264),    without ``genpts`` as the CLI demuxes), each frame's pts the decoder's
pts = dts with B-frames          best-effort timestamp (``probe._decoder_timeline``), native index = output
                                 order, read by ``pyav``; ``info["timestamps_from_decoder"]`` says why
frame size changes mid-stream    the CLI rebuilds its filter graph: a new ``fps`` filter per size (the old one's
                                 buffered frame lost, its CFR output sync fills the gap), frames scaled to the
                                 first size (bicubic, the CLI's autoscale); found when a reader decodes a frame
                                 of another size, then planned again on the decoder's timeline, or, in MPEG-TS /
                                 PS, FLV and elementary streams, by the probe decoding the key frames alone
                                 (``probe.SIZE_SCAN_FORMATS``: a change no reader decodes, e.g. inside a span
                                 ``pyav_skip`` seeks over, or at a reduced size, where decord scales every frame)
AV1 (no decoder in decord)       ``pyav_skip`` (PyAV's FFmpeg decodes it); ``decord_frame_count`` from PyAV
odd dimensions                   decoded at the exact odd size
4:4:4, 10-bit                    decoded (converted to 8-bit RGB by decord's swscale)
mkv / webm / avi                 decoded (any container and codec decord's FFmpeg reads)
non-ASCII, spaces in the path    decoded (paths passed as UTF-8 strings)
4K / large                       native size while ``n_est * h * w * 3 <= native_decode_bytes`` (seed: 2e9), else
                                 at ``decode_max_side`` inside the decoder (bounded memory)
===============================  ==================================================================================

Not covered: a frame size change in another container (mp4, mkv, webm, avi: not scanned, their key frames are
not decoded in the probe) inside a span ``pyav_skip`` seeks over or skips (no decoded frame shows it), or met by
decord (reduced sizes, other codecs), keeps the one-filter plan; an MPEG-2 stream's size change is not seen by the
key-frame scan (on a concatenated MPEG-2 TS its key frames decoded alone all came out at the first size); a decoder that crashes the process
(segfault) on a file takes the DataLoader worker down with it; an
external ffmpeg fallback is not used. A file whose first key frame the decoder refuses is an error where FFmpeg
answers it (no earlier frame to repeat; ``tests/datamodules/test_decode_paths.py``, xfail); a file with unusable
timestamps (PyAV in decode order) is an error on a refused packet (flagged, not read past); frames NVDEC itself
decodes are not checked for concealment (PyNvVideoCodec reports no decode status, damage inside slice data shows
in no demuxer signal, and a CPU check pass would cost the decode NVDEC saves): their records say
``concealment_checked: false``; its CPU fallback is checked, a packet whose NAL lengths contradict its size sends
the file to that fallback, and ``strict_frames`` reads every file on the CPU (docs/deviations.md). A video stream that
starts a whole output step after the file's start (audio first): the CLI's ``-f rawvideo`` output sync may add
frames at the start that the filter rule alone does not (not tested).
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

import numpy as np


class DecodeError(RuntimeError):
    """A video could not be opened or decoded; the message names the file."""


class FrameSizeChange(DecodeError):
    """The frame size changes mid-stream (a reader saw a frame of another size than the first): the ffmpeg CLI then
    rebuilds its filter graph, so the frame choice is made again on the decoder's timeline
    (:func:`datamodules.decode.probe.probe_video` with ``timeline``)."""


class NvdecError(RuntimeError):
    """NVDEC could not decode this file (the message names it); the caller decodes it on the CPU instead."""


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


@contextmanager
def ffmpeg_log_unfolded():
    """While reading FFmpeg's log (``av.logging.Capture``): every line, including one repeated back to back.

    PyAV folds a message that repeats the one before into a later "last message repeated N times" line (its
    ``skip_repeated`` default), so the second open of the same truncated file in a process logged nothing, and its
    error named PyAV's exception instead of FFmpeg's cause (``moov atom not found``); a decoder error repeated word
    for word on the next packet would likewise not be seen by the concealment check. The setting is restored after.
    """
    import av.logging

    before = av.logging.get_skip_repeated()
    av.logging.set_skip_repeated(False)
    try:
        yield
    finally:
        av.logging.set_skip_repeated(before)


def _open_error(path: Path, e: BaseException) -> DecodeError:
    msg = str(e)
    if "cannot find video stream" in msg:
        return DecodeError(f"{path}: has no video stream (audio-only or not a video file)")
    return DecodeError(f"{path}: cannot read the container (truncated, corrupted or not a video file; "
                       f"{short_error(e)})")


def _check_file(path: Path) -> None:
    if not path.exists():
        raise DecodeError(f"{path}: video file not found")
    if not path.is_file():
        raise DecodeError(f"{path}: is not a regular file")
    if path.stat().st_size == 0:
        raise DecodeError(f"{path}: video file is empty (0 bytes)")


def _check_shape(path: Path, frames: np.ndarray, n: int) -> np.ndarray:
    if frames.ndim != 4 or frames.shape[0] != n or frames.shape[-1] != 3:
        raise DecodeError(f"{path}: decoder returned frames of shape {frames.shape}")
    return frames
