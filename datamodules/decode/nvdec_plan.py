"""The NVDEC reader's plan of a file (:mod:`datamodules.decode.nvdec` decodes it): whether NVDEC decodes it with the
CPU path's exact frames (:func:`nvdec_unsupported`, :func:`available`; the PyAV probe :func:`probe`), and how its
sampled frames are cut over NVDEC sessions (:func:`auto_sessions`, :func:`split_runs`, :func:`split_runs_at_periods`).

What falls back to the CPU (:func:`nvdec_unsupported` says why, per file): codecs NVDEC lacks (AV1 on the H200,
anything but H.264 / HEVC / VP9 / MPEG-4), MPEG-4 Part 2 (NVDEC decodes it, but that standard's IDCT is not
bit-exact: measured RGB mean 0.12 / max 8 from the CPU path's), pixel formats other than 8-bit 4:2:0 (4:4:4,
4:2:2, 10-bit: exact here only for ``yuv420p`` / ``yuvj420p``), odd sizes (PyNvVideoCodec 2.2.4's NV12 surface of
a 321x241 VP9 clip is 361 rows: the last chroma row is cut), display rotation (decord transposes before it
scales), sizes outside ``PyNvVideoCodec.GetDecoderCaps``' limits, no CUDA device, PyNvVideoCodec not importable,
or decord imported before it in the process (their FFmpeg libraries clash: import
:mod:`datamodules.decode.nvdec`, which imports this module, first).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datamodules.decode.errors import NvdecError


# PyNvVideoCodec's console logger (the Video Codec SDK's ``simplelogger``) takes its level from this variable
# (the names beside it in the 2.2.4 binary's strings: TRACE, DEBUG, WARN, ERROR, FATAL). Its WARN lines
# carry nothing a run acts on ("Container format is matroska,webm. , Seek accuracy may be impacted." once per
# session of a WebM file: 27 lines in session 19's 18-video pool; the frames are checked against the container's
# count and equal decord's either way), so a run sets ERROR unless the variable is already set.
NVC_LOG_ENV, NVC_LOG_LEVEL = "LOGGER_LEVEL", "ERROR"


def _import_nvc():
    """PyNvVideoCodec, or why it cannot be used in this process. It must be imported before decord: decord loads
    its FFmpeg 4.1 libraries ``RTLD_GLOBAL``, and PyNvVideoCodec's demuxer then binds to them and segfaults (seen
    on the H200 with PyNvVideoCodec 2.2.4 whichever way ``LD_BIND_NOW`` is set); imported first, both work.
    Sets :data:`NVC_LOG_ENV` to :data:`NVC_LOG_LEVEL` first where the environment has no value for it (so the
    decode workers, which inherit it, print no WARN lines; a user's own value is kept)."""
    os.environ.setdefault(NVC_LOG_ENV, NVC_LOG_LEVEL)
    try:
        import PyNvVideoCodec as nvc  # noqa: N813
        return nvc
    except Exception as e:  # noqa: BLE001 - no driver, no libnvcuvid, wrong wheel: all mean "not here"
        text = str(e).splitlines()[0] if str(e) else ""
        return f"PyNvVideoCodec import failed: {type(e).__name__}: {text}"


def _nvc_or_reason():
    """PyNvVideoCodec, or why not: not installed (said first: the import-order rule below is about a package that
    is there), decord imported before it (see :func:`_import_nvc`), or the import's own error."""
    import importlib.util

    if importlib.util.find_spec("PyNvVideoCodec") is None:
        return "PyNvVideoCodec is not installed (pip install -e '.[nvdec]')"
    if "decord" in sys.modules:
        return "decord was imported before PyNvVideoCodec in this process (their FFmpeg libraries clash)"
    return _import_nvc()


_NVC = _nvc_or_reason()

NVDEC_CODECS = ("h264", "hevc", "vp9", "mpeg4")   # FFmpeg codec names NVDEC decodes on the H200 (no AV1)
# of those, the ones whose decoding is bit-exact by the standard (MPEG-4 Part 2 allows any IEEE 1180-accurate IDCT:
# NVDEC's planes differ from FFmpeg's, RGB mean 0.12 / max 8 on a 640x360 clip, measured on the H200)
EXACT_CODECS = ("h264", "hevc", "vp9")
DEFAULT_SESSIONS = 4                              # NVDEC sessions per video (bench/workload.py measures 1..7)
MAX_SESSIONS = 8                                  # a long video's sessions (auto_sessions)
FRAMES_PER_SESSION = 250                          # sampled frames per session beyond DEFAULT_SESSIONS (auto)
MIN_SEGMENT_FRAMES = 16                           # sampled frames per session below which a video is not split


# ----------------------------------------------------------------------------------------------------------------
# probing: what the software decoder reports for the stream (what decord's filter graph sees)
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StreamProbe:
    """The first video stream as FFmpeg's software decoder reports it (PyAV, one frame decoded).

    Attributes:
        codec: FFmpeg codec name (``h264``, ``hevc``, ``vp9``, ``mpeg4``, ``av1`` ...).
        pix_fmt: the decoded frames' pixel format (``yuv420p``, ``yuvj420p``, ``yuv444p``, ``yuv420p10le`` ...).
        width, height: coded display size in pixels (before any rotation).
        rotation: display rotation in degrees (0 when none).
        colorspace, color_range: the first frame's ``AVColorSpace`` / ``AVColorRange``.
        frames: the container's frame count (0 when unknown).
    """

    codec: str
    pix_fmt: str
    width: int
    height: int
    rotation: int
    colorspace: int
    color_range: int
    frames: int


_PROBES: dict[tuple, StreamProbe] = {}   # (path, size, mtime_ns) -> probe: the check and the read share one
_PROBES_KEEP = 64
_CAPS: dict[tuple, tuple[dict | None, str | None]] = {}   # (gpu, codec, pix_fmt) -> (GetDecoderCaps, error)


def probe(path: str | Path) -> StreamProbe:
    """Probe ``path``'s first video stream. Raises :class:`NvdecError` (naming the file) when PyAV cannot read
    it or it has no video stream or no frame.

    The result is kept per (path, size, modification time) for the last :data:`_PROBES_KEEP` files, so that the
    capability check and the read of one video open and decode its first frame once (it was twice per video)."""
    try:
        st = os.stat(path)
        key = (str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    hit = _PROBES.get(key) if key else None
    if hit is not None:
        return hit
    p = _probe_uncached(path)
    if key:
        if len(_PROBES) >= _PROBES_KEEP:
            _PROBES.pop(next(iter(_PROBES)))
        _PROBES[key] = p
    return p


def _probe_uncached(path: str | Path) -> StreamProbe:
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise NvdecError(f"{path}: has no video stream")
            stream = container.streams.video[0]
            frame = next(container.decode(stream), None)
            if frame is None:
                raise NvdecError(f"{path}: no frame decodes")
            rotation = int(round(getattr(frame, "rotation", 0) or 0)) % 360
            return StreamProbe(stream.codec_context.name, frame.format.name, frame.width, frame.height, rotation,
                               int(frame.colorspace), int(frame.color_range), int(stream.frames or 0))
    except NvdecError:
        raise
    except Exception as e:  # noqa: BLE001 - PyAV's errors for unreadable files
        raise NvdecError(f"{path}: cannot probe ({type(e).__name__}: {e})") from e


def _reason_from_probe(p: StreamProbe) -> str | None:
    if p.codec not in NVDEC_CODECS:
        return f"codec {p.codec} (NVDEC here: {', '.join(NVDEC_CODECS)})"
    if p.codec not in EXACT_CODECS:
        return f"codec {p.codec}: its decoding is not bit-exact across decoders (IDCT tolerance), so NVDEC's frames " \
               "would differ from the CPU path's"
    if p.width % 2 or p.height % 2:
        return f"odd size {p.width}x{p.height} (PyNvVideoCodec's NV12 surface drops the last chroma row)"
    if p.pix_fmt not in ("yuv420p", "yuvj420p"):
        return f"pixel format {p.pix_fmt} (exact only for 8-bit 4:2:0)"
    if p.rotation:
        return f"display rotation {p.rotation} degrees (the CPU path transposes before it scales)"
    return None


def _nvc():
    """PyNvVideoCodec (imported when this module was), or why it is not usable here."""
    return _NVC


def nvdec_unsupported(path: str | Path, gpu_id: int = 0, device_checks: bool = True) -> str | None:
    """Why NVDEC cannot decode ``path`` with the CPU path's exact frames, or ``None`` when it can.

    Checks, in order: the stream (PyAV probe: codec among ``NVDEC_CODECS``, 8-bit 4:2:0, no display rotation),
    PyNvVideoCodec's import, a CUDA device, and ``PyNvVideoCodec.GetDecoderCaps(gpu, codec, chroma, bit depth)``
    (supported, ``width_min..width_max``, ``height_min..height_max``, ``mb_num_max`` macroblocks).
    ``device_checks=False`` stops after PyNvVideoCodec's import: the stream's reasons only, no CUDA call.

    Returns:
        a one-line reason (no file name: the caller records it next to the file), or ``None``.
    """
    try:
        p = probe(path)
    except NvdecError as e:
        return str(e)
    reason = _reason_from_probe(p)
    if reason:
        return reason
    nvc = _nvc()
    if isinstance(nvc, str):
        return nvc
    if not device_checks:   # the stream's reasons only: no CUDA call, no capability query
        return None
    import torch

    if not torch.cuda.is_available() or gpu_id >= torch.cuda.device_count():
        return f"no CUDA device {gpu_id}"
    # the decoder's limits depend on (GPU, codec, chroma format, bit depth) only, which (codec, pix_fmt) fix:
    # asked once per process (a demuxer opened on the first such file), not per video
    key = (gpu_id, p.codec, p.pix_fmt)
    if key not in _CAPS:
        try:
            dmx = nvc.CreateDemuxer(str(path))
            _CAPS[key] = (nvc.GetDecoderCaps(gpu_id, dmx.GetNvCodecId(), dmx.ChromaFormat(), dmx.BitDepth()), None)
        except Exception as e:  # noqa: BLE001
            _CAPS[key] = (None, f"NVDEC capability query failed: {type(e).__name__}: {e}")
    caps, failed = _CAPS[key]
    if failed:
        return failed
    w, h = p.width, p.height
    if not caps.get("supported"):
        return f"GetDecoderCaps: {p.codec} {p.pix_fmt} not supported on GPU {gpu_id}"
    mbs = ((w + 15) // 16) * ((h + 15) // 16)
    if not (caps["width_min"] <= w <= caps["width_max"] and caps["height_min"] <= h <= caps["height_max"]) \
            or mbs > caps["mb_num_max"]:
        return (f"size {w}x{h} outside NVDEC's {caps['width_min']}..{caps['width_max']} x "
                f"{caps['height_min']}..{caps['height_max']} (<= {caps['mb_num_max']} macroblocks)")
    return None

def available(gpu_id: int = 0) -> str | None:
    """Why this process cannot decode with NVDEC at all (PyNvVideoCodec's import, decord imported first, no CUDA
    device ``gpu_id``), or ``None``: ``data.decoder=nvdec`` stops with it before a run writes anything."""
    nvc = _nvc()
    if isinstance(nvc, str):
        return nvc
    import torch

    if not torch.cuda.is_available() or gpu_id >= torch.cuda.device_count():
        return f"no CUDA device {gpu_id}"
    return None


# ----------------------------------------------------------------------------------------------------------------
# the sessions: how a video's sampled frames are cut over NVDEC sessions
# ----------------------------------------------------------------------------------------------------------------

def auto_sessions(n_frames: int) -> int:
    """NVDEC sessions for a video with ``n_frames`` sampled frames: :data:`DEFAULT_SESSIONS`, and one more per
    :data:`FRAMES_PER_SESSION` frames beyond that, up to :data:`MAX_SESSIONS` (a 30-minute video's 1,859 frames at
    16k: 8). One 1080p video decoded at 406 / 760 / 1,240 / 1,892 source frames/s with 1 / 2 / 4 / 7 sessions on
    the H200, so a long video's latency falls with its sessions; a short one's frames would be cut too thin
    (:data:`MIN_SEGMENT_FRAMES`)."""
    return int(min(MAX_SESSIONS, max(DEFAULT_SESSIONS, -(-int(n_frames) // FRAMES_PER_SESSION))))


def split_runs(indices: list[int], sessions: int, min_frames: int = MIN_SEGMENT_FRAMES) -> list[list[int]]:
    """Ascending ``indices`` cut into at most ``sessions`` contiguous runs of at least ``min_frames`` each (fewer
    runs when there are fewer frames), as equal in length as possible."""
    n = len(indices)
    k = max(1, min(int(sessions), n // max(int(min_frames), 1)))
    bounds = [i * n // k for i in range(k + 1)]
    return [indices[bounds[i]: bounds[i + 1]] for i in range(k) if bounds[i + 1] > bounds[i]]


def split_runs_at_periods(indices: list[int], period: list[int], sessions: int,
                          min_frames: int = MIN_SEGMENT_FRAMES) -> list[list[int]]:
    """:func:`split_runs`, with each cut moved to the nearest start of an IDR period, so that no two runs need the
    same reference pictures (a packet-fed session decodes from its period's IDR): ``period[k]`` is the period of
    ``indices[k]``. Cuts that meet are merged (one period: one run). Where the periods are not non-decreasing
    along ``indices`` (not a closed-GOP stream), the plain :func:`split_runs` cuts.

    Raises:
        ValueError: ``period`` and ``indices`` differ in length.
    """
    if len(period) != len(indices):
        raise ValueError(f"{len(period)} periods for {len(indices)} indices")
    if any(b < a for a, b in zip(period, period[1:])):
        return split_runs(indices, sessions, min_frames)
    base = split_runs(indices, sessions, min_frames)
    starts = [k for k in range(1, len(indices)) if period[k] != period[k - 1]]
    if not starts:
        return [list(indices)] if indices else []
    cuts: list[int] = []
    for c in np.cumsum([len(r) for r in base[:-1]]).tolist():
        best = min(starts, key=lambda b: (abs(b - c), b))
        if not cuts or best > cuts[-1]:
            cuts.append(best)
    bounds = [0, *cuts, len(indices)]
    return [list(indices[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
