"""The display matrix as the ffmpeg CLI applies it (``-autorotate``, on by default): which transpose / flips its
filter graph inserts for a stream's display matrix, and the same pixel moves on decoded frames.

FFmpeg's rule (fftools/ffmpeg_filter.c ``configure_input_video_filter``, the same in ffplay; FFmpeg/FFmpeg
fftools/cmdutils.c ``get_rotation``; libavutil/display.c ``av_display_rotation_get`` / ``av_display_matrix_flip``):

* ``theta = -round(av_display_rotation_get(m))``, wrapped into ``[0, 360)`` (``theta -= 360 * floor(theta / 360 +
  0.9 / 360)``), where ``av_display_rotation_get`` is ``-atan2(m[1] / hypot(m[1], m[4]), m[0] / hypot(m[0], m[3]))``
  in degrees (the 16.16 fixed-point entries; NaN when a column is zero);
* ``|theta - 90| < 1``: ``transpose=cclock_flip`` when ``m[3] > 0`` (a plain transpose) else ``transpose=clock``;
* ``|theta - 180| < 1``: ``hflip`` when ``m[0] < 0``, then ``vflip`` when ``m[4] < 0``;
* ``|theta - 270| < 1``: ``transpose=clock_flip`` when ``m[3] < 0`` else ``transpose=cclock``;
* another angle: the ``rotate`` filter (arbitrary angle, black corners: not reproduced here, :class:`DisplayError`);
* ``|theta| < 1``: ``vflip`` when ``m[4] < 0``.

So a mirrored matrix (``-display_hflip``: ``m = diag(-1, 1)``, theta 180) is an ``hflip`` alone, where the rotation
angle alone (PyAV's ``frame.rotation``, -180) reads as a 180-degree turn: that turn is the flip on the other axis
(issue 44 item 3).
"""
from __future__ import annotations

import math
import struct

import numpy as np

IDENTITY = (65536, 0, 0, 0, 65536, 0, 0, 0, 1 << 30)


class DisplayError(ValueError):
    """A display matrix whose autorotation the readers do not reproduce (an angle not a multiple of 90)."""


def matrix_of(frame) -> tuple[int, ...] | None:
    """The ``AV_FRAME_DATA_DISPLAYMATRIX`` side data of a PyAV frame (9 int32), or ``None``."""
    try:
        for sd in frame.side_data:
            if "DISPLAYMATRIX" in str(sd.type):
                raw = bytes(sd)
                if len(raw) >= 36:
                    return tuple(struct.unpack("<9i", raw[:36]))
    except Exception:  # noqa: BLE001 - no side data API / unreadable entry: no matrix
        return None
    return None


def rotation_theta(m) -> float:
    """fftools' ``get_rotation``: the clockwise angle in ``[0, 360)`` (NaN for a degenerate matrix)."""
    a, b, c, d = (v / 65536.0 for v in (m[0], m[1], m[3], m[4]))
    s0, s1 = math.hypot(a, c), math.hypot(b, d)
    if s0 == 0.0 or s1 == 0.0:
        return float("nan")
    rot = -(math.atan2(b / s1, a / s0) * 180.0 / math.pi)   # av_display_rotation_get
    theta = -math.copysign(math.floor(abs(rot) + 0.5), rot)   # C round(): halves away from zero
    return theta - 360 * math.floor(theta / 360 + 0.9 / 360)


def autorotate_ops(m) -> tuple[str, ...]:
    """The filters the ffmpeg CLI inserts for display matrix ``m`` (``()`` for none / the identity), among
    ``cclock_flip``, ``clock``, ``clock_flip``, ``cclock`` (transpose directions), ``hflip``, ``vflip``.

    Raises:
        DisplayError: an angle other than 0/90/180/270 (FFmpeg's ``rotate`` filter).
    """
    if m is None:
        return ()
    theta = rotation_theta(m)
    if abs(theta - 90) < 1.0:
        return ("cclock_flip",) if m[3] > 0 else ("clock",)
    if abs(theta - 180) < 1.0:
        return (("hflip",) if m[0] < 0 else ()) + (("vflip",) if m[4] < 0 else ())
    if abs(theta - 270) < 1.0:
        return ("clock_flip",) if m[3] < 0 else ("cclock",)
    if abs(theta) > 1.0:
        raise DisplayError(f"the display matrix rotates by {theta:g} degrees, not a multiple of 90 (FFmpeg's "
                           f"rotate filter, not reproduced)")
    return ("vflip",) if m[4] < 0 else ()   # theta 0 (or a degenerate matrix: NaN, as FFmpeg's last branch)


def swaps_axes(ops) -> bool:
    """Whether ``ops`` transpose the frame (its displayed size is ``width x height``)."""
    return any(op in ("cclock_flip", "clock", "clock_flip", "cclock") for op in ops)


def mirrored(m) -> bool:
    """Whether ``m`` flips the picture (a negative determinant): more than a rotation."""
    return m is not None and (m[0] * m[4] - m[1] * m[3]) < 0


def apply_ops(x: np.ndarray, ops) -> np.ndarray:
    """``(H, W, C)`` -> the frame after FFmpeg's ``transpose`` / ``hflip`` / ``vflip`` filters ``ops`` (exact pixel
    moves: ``clock`` = 90 degrees clockwise, ``cclock`` counter-clockwise, ``cclock_flip`` the transpose,
    ``clock_flip`` the anti-transpose; ``hflip`` mirrors left-right, ``vflip`` top-bottom)."""
    for op in ops:
        if op == "clock":
            x = np.rot90(x, k=-1)
        elif op == "cclock":
            x = np.rot90(x, k=1)
        elif op == "cclock_flip":
            x = x.swapaxes(0, 1)
        elif op == "clock_flip":
            x = np.rot90(x, k=2).swapaxes(0, 1)
        elif op == "hflip":
            x = x[:, ::-1]
        elif op == "vflip":
            x = x[::-1]
    return np.ascontiguousarray(x) if ops else x
