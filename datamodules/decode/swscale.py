"""decord's YUV 4:2:0 -> RGB conversion, run by decord's own libswscale through ``ctypes``: the NVDEC reader's
conversion (:mod:`datamodules.decode.nvdec`), so that its frames are the CPU path's byte for byte.

What is exact, and why. H.264 / HEVC / VP9 / MPEG-4 decoding is bit-exact by the standards, so NVDEC's decoded
4:2:0 planes are the planes FFmpeg's software decoder gives (``tests/datamodules/test_nvdec.py`` checks that on
the GPU). Only the YUV -> RGB conversion (and the reduced-size scaling) could differ, and it is not re-implemented
here: the planes go through the *same* libswscale the CPU path runs, the copy bundled in decord 0.6.0's wheel
(FFmpeg 4.1, ``decord.libs/libswscale-*.so.5``), called through ``ctypes`` with the parameters decord's filter
graph gives it. decord converts with an ``avfilter`` graph ``buffer -> scale=W:H -> buffersink(rgb24)``
(dmlc/decord@d2e5619:src/video/ffmpeg/threaded_decoder.cc:FFMPEGThreadedDecoder::SetCodecContext and
src/video/ffmpeg/filter_graph.cc:FFMPEGFilterGraph::Init), so its one ``SwsContext`` is the one FFmpeg 4.1's
``vf_scale`` builds:

- ``config_props``: ``srcw/srch/src_format`` = the decoder's size and ``yuv420p`` (``yuvj420p`` for full-range
  JPEG-style streams), ``dstw/dsth/dst_format`` = the decode size and ``rgb24``, ``sws_flags`` = the filter's
  default ``flags="bilinear"``, ``src_v_chr_pos = 128`` ("MPEG-2 chroma positions are used by convention" for a
  ``yuv420p`` input);
- ``filter_frame``: with the filter's default ``in_color_matrix="auto"``, ``sws_setColorspaceDetails`` with
  ``sws_getCoefficients(frame colorspace)`` as both tables (a colorspace outside 1..10, or 8, is BT.470BG) and the
  source range from the frame's ``color_range`` when it is specified (else swscale's own default).

The frames are equal to decord's, byte for byte, on every clip tried (``tests/datamodules/test_nvdec.py``:
yuv420p at 642x362 / 1280x720 (BT.709-tagged) / 320x240, full-range yuvj420p, VP9; native and reduced decode
sizes), with the planes taken from PyAV's software decoder on the CPU, and from NVDEC on the GPU (``gpu`` cases;
on the H200 on 2026-12-02: H.264 642x362 / 1280x720 BT.709 / 1920x1080 / yuvj420p 320x240 and HEVC 854x480, 60
frames each, native and 0.6x sizes, 1 and 3 sessions: NVDEC's planes equal FFmpeg's and the RGB equals decord's,
0 pixels differ). The same frames come out of the ffmpeg binary (imageio-ffmpeg's 9.0.2) with ``-vf scale=W:H
-sws_flags bilinear -pix_fmt rgb24``, an independent check of the conversion.
"""
from __future__ import annotations

import ctypes
import glob
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from datamodules.decode.errors import NvdecError


# AVPixelFormat values of decord's FFmpeg 4.1 (libavutil/pixfmt.h; stable since FFmpeg 1.x)
AV_PIX_FMT = {"yuv420p": 0, "rgb24": 2, "yuvj420p": 12}
SWS_BILINEAR = 2                                  # libswscale/swscale.h
AVCOL_RANGE_UNSPECIFIED, AVCOL_RANGE_JPEG = 0, 2  # libavutil/pixfmt.h AVColorRange


@lru_cache(maxsize=1)
def _libs():
    """``(libswscale, libavutil)`` of decord's wheel (the very copies ``import decord`` loads)."""
    import importlib.util

    spec = importlib.util.find_spec("decord")   # not imported here: see _import_nvc
    if spec is None or not spec.origin:
        raise NvdecError("decord is not installed: its libswscale is the CPU path's conversion")
    libdir = Path(spec.origin).resolve().parent.parent / "decord.libs"
    found = {name: sorted(glob.glob(str(libdir / f"{name}-*.so*"))) for name in ("libswscale", "libavutil")}
    if not all(found.values()):
        raise NvdecError(f"decord's bundled libswscale / libavutil not found in {libdir}")
    avutil = ctypes.CDLL(found["libavutil"][0])
    sws = ctypes.CDLL(found["libswscale"][0])
    ip = ctypes.POINTER(ctypes.c_int)
    vp4, ip4 = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int)
    sws.sws_alloc_context.restype = ctypes.c_void_p
    sws.sws_init_context.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    sws.sws_getCoefficients.restype = ip
    sws.sws_getCoefficients.argtypes = [ctypes.c_int]
    sws.sws_getColorspaceDetails.argtypes = [ctypes.c_void_p, ctypes.POINTER(ip), ip, ctypes.POINTER(ip), ip, ip,
                                             ip, ip]
    sws.sws_setColorspaceDetails.argtypes = [ctypes.c_void_p, ip, ctypes.c_int, ip, ctypes.c_int, ctypes.c_int,
                                             ctypes.c_int, ctypes.c_int]
    sws.sws_scale.argtypes = [ctypes.c_void_p, vp4, ip4, ctypes.c_int, ctypes.c_int, vp4, ip4]
    sws.sws_freeContext.argtypes = [ctypes.c_void_p]
    avutil.av_opt_set_int.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int]
    return sws, avutil


class Yuv420ToRgb:
    """decord's YUV 4:2:0 -> RGB24 conversion (and bilinear scaling), run by decord's own libswscale with the
    parameters FFmpeg 4.1's ``vf_scale`` gives it (see the module docstring).

    Args:
        width, height: the decoded planes' size (luma; chroma is ``ceil(w / 2) x ceil(h / 2)``).
        pix_fmt: ``"yuv420p"`` or ``"yuvj420p"`` (the software decoder's format for the stream).
        out_hw: ``(dh, dw)`` decode size (``(height, width)``: native).
        colorspace, color_range: the frame's ``AVColorSpace`` / ``AVColorRange`` values (as PyAV's
            ``VideoFrame.colorspace`` / ``color_range`` report them).

    Raises:
        NvdecError: another pixel format, or swscale refuses the sizes.
    """

    def __init__(self, width: int, height: int, pix_fmt: str, out_hw: tuple[int, int], colorspace: int,
                 color_range: int):
        if pix_fmt not in ("yuv420p", "yuvj420p"):
            raise NvdecError(f"pixel format {pix_fmt}: only 8-bit 4:2:0 (yuv420p / yuvj420p) is converted exactly")
        sws, avutil = _libs()
        self.width, self.height = int(width), int(height)
        self.dh, self.dw = int(out_hw[0]), int(out_hw[1])
        self._lock = threading.Lock()   # one SwsContext is not safe to run from two threads at once
        self._padded: dict = {}   # (plane, rows, width) -> its padded input buffer; "out": the output's (reused)
        ctx = sws.sws_alloc_context()
        opts = [("srcw", self.width), ("srch", self.height), ("src_format", AV_PIX_FMT[pix_fmt]),
                ("dstw", self.dw), ("dsth", self.dh), ("dst_format", AV_PIX_FMT["rgb24"]),
                ("sws_flags", SWS_BILINEAR), ("src_v_chr_pos", 128)]
        for key, value in opts:
            if avutil.av_opt_set_int(ctypes.c_void_p(ctx), key.encode(), value, 0) < 0:
                sws.sws_freeContext(ctx)
                raise NvdecError(f"swscale option {key}={value} refused")
        if sws.sws_init_context(ctx, None, None) < 0:
            sws.sws_freeContext(ctx)
            raise NvdecError(f"swscale refuses {pix_fmt} {width}x{height} -> rgb24 {self.dw}x{self.dh}")
        ip = ctypes.POINTER(ctypes.c_int)
        inv, table = ip(), ip()
        src_full, dst_full, bright, contrast, sat = (ctypes.c_int() for _ in range(5))
        sws.sws_getColorspaceDetails(ctx, ctypes.byref(inv), ctypes.byref(src_full), ctypes.byref(table),
                                     ctypes.byref(dst_full), ctypes.byref(bright), ctypes.byref(contrast),
                                     ctypes.byref(sat))
        cs = int(colorspace)
        coeffs = sws.sws_getCoefficients(cs if 1 <= cs <= 10 and cs != 8 else 5)   # vf_scale parse_yuv_type
        full = (int(color_range) == AVCOL_RANGE_JPEG) if int(color_range) != AVCOL_RANGE_UNSPECIFIED \
            else src_full.value
        sws.sws_setColorspaceDetails(ctx, coeffs, int(full), coeffs, dst_full.value, bright.value, contrast.value,
                                     sat.value)
        self._ctx = ctx

    def __call__(self, y: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``(height, >= width)``, 2 x ``(ceil(h/2), >= ceil(w/2))`` uint8 planes (any row stride) ->
        ``(dh, dw, 3)`` uint8 RGB."""
        planes = (y, u, v)
        ch, cw = (self.height + 1) // 2, (self.width + 1) // 2
        for p, (h, w) in zip(planes, ((self.height, self.width), (ch, cw), (ch, cw))):
            if p.dtype != np.uint8 or p.ndim != 2 or p.shape[0] < h or p.shape[1] < w:
                raise ValueError(f"plane {p.shape} {p.dtype}: expected uint8 of at least {h} x {w}")
        out_stride = (self.dw * 3 + 63) // 64 * 64 + 64
        sws, _ = _libs()
        with self._lock:   # (the padded buffers are this converter's, reused from call to call)
            if self._ctx is None:
                raise RuntimeError("Yuv420ToRgb is closed")
            # rows padded to 64 bytes + 64 slack: swscale's SIMD reads whole vectors past the last pixel of a row.
            # Each plane is copied straight from its (possibly strided: NV12's interleaved U, V) view into a
            # zeroed buffer kept per plane and size; only the pixels are rewritten, so the padding stays zero. (A
            # fresh buffer per frame cost a new zeroed mapping of its pages every call: 1080p, ~3x the swscale time)
            padded = []
            for k, (p, w) in enumerate(zip(planes, (self.width, cw, cw))):
                key = (k, p.shape[0], w)
                buf = self._padded.get(key)
                if buf is None:
                    buf = self._padded[key] = np.zeros((p.shape[0] + 1, (w + 63) // 64 * 64 + 64), np.uint8)
                buf[: p.shape[0], :w] = p[:, :w]
                padded.append(buf)
            src = (ctypes.c_void_p * 4)(*[b.ctypes.data for b in padded], None)
            src_stride = (ctypes.c_int * 4)(*[b.strides[0] for b in padded], 0)
            out = self._padded.get("out")
            if out is None:
                out = self._padded["out"] = np.empty((self.dh + 1, out_stride), np.uint8)
            dst = (ctypes.c_void_p * 4)(out.ctypes.data, None, None, None)
            dst_stride = (ctypes.c_int * 4)(out_stride, 0, 0, 0)
            rows = sws.sws_scale(self._ctx, src, src_stride, 0, self.height, dst, dst_stride)
            if rows != self.dh:
                raise NvdecError(f"swscale wrote {rows} of {self.dh} rows")
            return out[: self.dh, : self.dw * 3].reshape(self.dh, self.dw, 3).copy()   # (not a view of ``out``)

    def close(self) -> None:
        """Free the ``SwsContext`` and the buffers (idempotent); a later call raises ``RuntimeError``."""
        with self._lock:
            self._padded.clear()
            if self._ctx is not None:
                _libs()[0].sws_freeContext(self._ctx)
                self._ctx = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def nv12_planes(nv12: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split an NV12 surface ``(height + ceil(height/2), >= width)`` uint8 (luma rows, then interleaved UV rows)
    into ``(Y, U, V)`` planes of ``height x width`` and ``ceil(h/2) x ceil(w/2)``."""
    a = np.asarray(nv12)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    ch, cw = (height + 1) // 2, (width + 1) // 2
    if a.ndim != 2 or a.shape[0] < height + ch or a.shape[1] < 2 * cw:
        raise NvdecError(f"NV12 surface of shape {a.shape} does not hold {height} x {width}")
    y = a[:height, :width]
    uv = a[height: height + ch, : 2 * cw]
    return y, uv[:, 0::2], uv[:, 1::2]
