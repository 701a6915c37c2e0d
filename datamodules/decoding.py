"""Video decoding with decord, once per video, at the frame times the largest budget needs (DESIGN §3.1).

Large videos are decoded at a reduced size *inside the decoder* (decord's ``width``/``height``), so host memory
stays bounded: at most ``decode_max_side`` pixels on the long side (default 896 = 32 merged cells; the encode never
needs more than ``frame_grid(H, W, 256)`` = 16 cells per side for square frames, about 21 for 16:9).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from algorithms.budget import native_frame_indices, sample_times


class DecodeError(RuntimeError):
    """A video could not be opened or decoded; the message names the file."""


@dataclass
class DecodedVideo:
    """Frames of one video.

    Attributes:
        frames: (T, H, W, 3) uint8 RGB at the decode size.
        times_s: T frame times in seconds (from the native frame index and the container's average fps).
        info: ``duration_s, native_hw, decode_hw, n_frames, fps, sample_fps, fps_ok``.
    """

    frames: torch.Tensor
    times_s: list[float]
    info: dict = field(default_factory=dict)


def decode_size(height: int, width: int, max_side: int) -> tuple[int, int]:
    """Decode size keeping the aspect ratio with the long side ``<= max_side`` (even sizes; unchanged if smaller)."""
    scale = min(1.0, max_side / max(height, width))
    if scale >= 1.0:
        return height, width
    return max(2, 2 * round(height * scale / 2)), max(2, 2 * round(width * scale / 2))


def decode_video(path: str | Path, budget_tokens: int, decode_max_side: int = 896, base_fps: float = 1.0,
                 num_threads: int = 1) -> DecodedVideo:
    """Decode the frames the largest budget of a run needs.

    Args:
        path: video file.
        budget_tokens: the largest budget (sets the frame cap, :func:`algorithms.budget.sample_times`).
        decode_max_side: longest decoded side in pixels.

    Raises:
        DecodeError: missing, empty or unreadable file, no video stream, or no decodable frame (file named).
    """
    import decord

    path = Path(path)
    if not path.is_file():
        raise DecodeError(f"{path}: video file not found")
    if path.stat().st_size == 0:
        raise DecodeError(f"{path}: video file is empty (0 bytes)")
    try:
        probe = decord.VideoReader(str(path), num_threads=num_threads)
        num_native = len(probe)
        native_fps = float(probe.get_avg_fps())
        h, w = probe[0].shape[:2]
        del probe
    except Exception as e:  # decord raises DECORDError / RuntimeError for bad streams
        raise DecodeError(f"{path}: cannot open video ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from e
    if num_native < 1:
        raise DecodeError(f"{path}: video has no frames")
    fps_ok = math.isfinite(native_fps) and native_fps > 0
    if not fps_ok:
        native_fps = 1.0  # recorded as fps_ok = False
    duration_s = num_native / native_fps
    sample_fps, times = sample_times(duration_s, budget_tokens, base_fps)
    idx = native_frame_indices(times, native_fps, num_native)
    dh, dw = decode_size(h, w, decode_max_side)
    try:
        vr = decord.VideoReader(str(path), num_threads=num_threads, width=dw if (dh, dw) != (h, w) else -1,
                                height=dh if (dh, dw) != (h, w) else -1)
        frames = vr.get_batch(idx).asnumpy()
    except Exception as e:
        raise DecodeError(f"{path}: decoding {len(idx)} frames failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200]})") from e
    frames = np.ascontiguousarray(frames)
    if frames.ndim != 4 or frames.shape[0] != len(idx) or frames.shape[-1] != 3:
        raise DecodeError(f"{path}: decoder returned frames of shape {frames.shape}")
    real_times = [i / native_fps for i in idx]
    info = {"duration_s": round(duration_s, 3), "native_hw": [int(h), int(w)], "decode_hw": list(frames.shape[1:3]),
            "n_frames": len(idx), "fps": round(native_fps, 4), "sample_fps": round(sample_fps, 4), "fps_ok": fps_ok}
    return DecodedVideo(frames=torch.from_numpy(frames), times_s=real_times, info=info)
