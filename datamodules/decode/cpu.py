"""Step 3 of a decode, on the CPU: the readers ``decoder=cpu`` picks from per file (:func:`cpu_reader_for`).

``pyav_skip`` (PyAV, :func:`datamodules.decode.pyav_skip._pyav_skip_reader`: ``skip_frame=NONREF`` on packets
that are no sampled frame, seeking over spans that hold a key frame and no sampled frame) for H.264/HEVC 8-bit
4:2:0 at native size, where its frames equal decord's bit for bit (``tests/datamodules/test_decode_paths.py``;
1.4-2.2x faster on 720p/1080p H.264 High with B-frames, ``bench/decode_paths.py``; rotated videos come out exactly
as the CLI's, where decord resizes a mis-sized buffer); ``pyav_sws`` (the same PyAV pass, converted by decord's own
libswscale, :mod:`datamodules.decode.swscale`) for H.264/HEVC/VP9 8-bit 4:2:0 without a display transform at the
sizes decord would otherwise read (reduced sizes; VP9 at native size): decord's frames byte for byte, with the
concealment flags of the same pass (issue 42: no second decode); ``decord`` (:func:`_frame_reader`) everywhere
else (other codecs and pixel formats, rotated reduced sizes), checked by
:func:`datamodules.decode.pyav_skip.concealed_frames`; ``pyav`` (:func:`_pyav_reader`, decode order) for files with
unusable timestamps, where decord's pts seeking returns wrong frames. PyAV (``av==18.1.0``) is used where decord
cannot do the job: the FFmpeg log that names which pictures the decoder concealed, ``skip_frame`` and seeking, and
decoding in decode order. decord is imported only when a reader reads (PyNvVideoCodec must be imported before it
in a process: :mod:`datamodules.decode.nvdec`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from datamodules.decode.display import apply_ops, autorotate_ops, mirrored, swaps_axes
from datamodules.decode.errors import DecodeError, FrameSizeChange
from datamodules.decode.probe import VideoProbe
from datamodules.decode.readers import READERS


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
# where PyAV's decode converted by decord's own libswscale gives decord's very pixels at any decode size
# (``pyav_sws``): codecs whose decoding is bit-exact by their standards (FFmpeg 4.1's decoder in decord and PyAV's
# give the same planes), 8-bit 4:2:0 (the formats :class:`datamodules.decode.swscale.Yuv420ToRgb` converts)
PYAV_SWS_CODECS = ("h264", "hevc", "vp9")


def cpu_reader_for(probe: VideoProbe, decode_hw: tuple[int, int]) -> str:
    """The CPU reader of a video:

    * ``pyav`` (in decode order) when its timestamps are unusable or are the decoder's (``probe.decoded_timeline``:
      AVI with B-frames, pts = dts with B-frames, a frame size that changes; decord's index there is not the
      CLI's: issue 44 item 2);
    * ``pyav_skip`` for H.264/HEVC 8-bit 4:2:0 at native size (exact, faster: it skips what no sampled frame
      needs), for a mirrored display matrix (decord applies the rotation angle only: issue 44 item 3), for any
      display transform at native size (decord's rotated frames can be resized back from a nearby width), and for
      a codec decord's FFmpeg 4.1 has no decoder for (AV1: :func:`decord_decodes`);
    * ``pyav_sws`` for H.264/HEVC/VP9 8-bit 4:2:0 without a display transform otherwise (reduced sizes, VP9 at
      native size): decord's frames, and the concealment flags from the same decode (:func:`pyav_sws_reads`);
    * else ``decord``."""
    if probe.timestamps_unusable or probe.decoded_timeline:
        return "pyav"
    if (probe.codec in PYAV_SKIP_CODECS and probe.pix_fmt in PYAV_SKIP_PIX_FMTS
            and tuple(decode_hw) == (probe.height, probe.width)):
        return "pyav_skip"
    if mirrored(probe.display_matrix) or not decord_decodes(probe.codec_family or probe.codec):
        return "pyav_skip"
    if probe.display_matrix is not None and tuple(decode_hw) == (probe.height, probe.width) and \
            autorotate_ops(probe.display_matrix):   # decord's rotated MPEG-4 at 64x48: 4.5/255 off the CLI's
        return "pyav_skip"
    return "pyav_sws" if pyav_sws_reads(probe) else "decord"


def pyav_sws_reads(probe: VideoProbe) -> bool:
    """Whether ``pyav_sws`` gives decord's frames for this file at any decode size: a codec of
    :data:`PYAV_SWS_CODECS` decord decodes, 8-bit 4:2:0, no display transform (decord's rotation is its own)."""
    if probe.codec not in PYAV_SWS_CODECS or probe.pix_fmt not in PYAV_SKIP_PIX_FMTS:
        return False
    try:
        if autorotate_ops(probe.display_matrix):
            return False
    except ValueError:   # an angle the CLI does not autorotate by: decord's own handling, as before
        return False
    return decord_decodes(probe.codec_family or probe.codec)


def decord_decodes(codec: str) -> bool:
    """Whether decord's bundled libavcodec (FFmpeg 4.1) has a decoder for ``codec`` (a codec name as FFmpeg's
    descriptors spell it: ``h264``, ``av1``): ``avcodec_descriptor_get_by_name`` then ``avcodec_find_decoder`` in
    that very library (``ctypes``; decord itself is not imported). ``True`` when the library cannot be asked."""
    return _decord_decoders().get(codec, True) if codec else True


_DECORD_CODECS: dict[str, bool] = {}


def _decord_decoders() -> dict:
    """A dict-like ``codec -> bool`` over decord's libavcodec (empty when it cannot be loaded)."""
    import ctypes
    import glob
    import importlib.util

    class _Ask(dict):
        def __init__(self, lib):
            super().__init__()
            self.lib = lib

        def get(self, name, default=None):
            if name not in _DECORD_CODECS:
                d = self.lib.avcodec_descriptor_get_by_name(name.encode())
                if not d:
                    _DECORD_CODECS[name] = False   # a codec FFmpeg 4.1 does not even name (vvc)
                else:
                    cid = ctypes.cast(d, ctypes.POINTER(ctypes.c_int))[0]   # AVCodecDescriptor.id comes first
                    _DECORD_CODECS[name] = bool(self.lib.avcodec_find_decoder(cid))
            return _DECORD_CODECS[name]

    lib = _DECORD_LIB.get("lib")
    if lib is None and "lib" not in _DECORD_LIB:
        _DECORD_LIB["lib"] = None
        try:
            spec = importlib.util.find_spec("decord")
            libdir = Path(spec.origin).resolve().parent.parent / "decord.libs"
            for dep in ("libavutil", "libswresample", "libz", "libbz2", "libvpx", "libx264"):
                for f in glob.glob(str(libdir / f"{dep}-*")):
                    ctypes.CDLL(f)   # its dependencies first (the wheel's libraries carry no search path)
            lib = ctypes.CDLL(glob.glob(str(libdir / "libavcodec-*"))[0])
            lib.avcodec_descriptor_get_by_name.restype = ctypes.c_void_p
            lib.avcodec_descriptor_get_by_name.argtypes = [ctypes.c_char_p]
            lib.avcodec_find_decoder.restype = ctypes.c_void_p
            lib.avcodec_find_decoder.argtypes = [ctypes.c_int]
            _DECORD_LIB["lib"] = lib
        except Exception:  # noqa: BLE001 - no decord wheel to ask: assume it decodes (its own error then says)
            lib = None
    return _Ask(lib) if lib is not None else {}


_DECORD_LIB: dict = {}


def _frame_to_rgb(probe: VideoProbe, resize_other_sizes: bool):
    """``frame -> (h, w, 3)`` uint8 RGB as the ffmpeg CLI outputs it: ``to_ndarray(format="rgb24")``, then the
    display matrix (:func:`datamodules.decode.display.autorotate_ops`: transposes and flips, issue 44 item 3).

    A frame of another size than the first (``probe.height`` x ``probe.width`` before the display transform): with
    ``resize_other_sizes`` it is scaled to the first size in the same swscale call as the conversion, bicubic
    (the CLI's output keeps the first frame's size: ``-autoscale``, on by default, inserts ``scale=W:H`` with the
    CLI's default ``flags=bicubic`` when its filter graph is rebuilt); without, :class:`FrameSizeChange`."""
    ops = autorotate_ops(probe.display_matrix)
    ch, cw = (probe.width, probe.height) if swaps_axes(ops) else (probe.height, probe.width)

    def rgb(frame) -> np.ndarray:
        if (frame.height, frame.width) != (ch, cw):
            if not resize_other_sizes:
                raise FrameSizeChange(f"the frame size changes mid-stream ({cw}x{ch} -> {frame.width}x"
                                      f"{frame.height})")
            x = frame.reformat(width=cw, height=ch, format="rgb24", interpolation="BICUBIC").to_ndarray()
        else:
            x = frame.to_ndarray(format="rgb24")
        return apply_ops(x, ops)
    return rgb


def _pyav_reader(path: Path, probe: VideoProbe, dh: int, dw: int, num_threads: int):
    """``read(idx)`` with PyAV, decoding the stream in decode order from the start (the ffmpeg CLI's order; no
    seeking): the reader of files whose timestamps are unusable (``probe.timestamps_unusable``: native index =
    the decoder's output count), where decord's pts-based seeking returns wrong frames. RGB by
    ``to_ndarray(format="rgb24")`` at native size (swscale's yuv->rgb, equal to decord's and the CLI's
    ``-pix_fmt rgb24`` on the test clips); a reduced size goes through :func:`_resize` of the native frame (not
    decord's in-decoder scaler); the display matrix is applied as the CLI applies it, flips included
    (:func:`_frame_to_rgb`), and a frame of another size than the first is scaled to it (the CLI's autoscale)."""
    import av

    rgb = _frame_to_rgb(probe, resize_other_sizes=True)

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
                    out[n] = rgb(frame)
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
