"""Frame choice of Qwen2.5-Omni's ``qwen_omni_utils`` (the sampling OmniZip's WorldSense evaluation runs, seed 003:7).

Reproduced from qwen-omni-utils 0.0.9 (PyPI; ``qwen_omni_utils/v2_5/vision_process.py``): ``smart_nframes`` (the
``fps`` branch) and ``_read_video_torchvision``'s ``idx = torch.linspace(0, total_frames - 1, nframes).round().long()``.
OmniZip's ``eval/eval.py`` (KD-TAO/OmniZip@9060291) calls ``process_mm_info`` with the package's defaults
(``FPS = 2.0``, ``FPS_MIN_FRAMES = 4``, ``FPS_MAX_FRAMES = 768``, ``FRAME_FACTOR = 2``); seed 003 runs it at 1 fps
with at most 128 frames (``fps=1``, ``max_frames=128`` in the video element).

Not yet used by the omni datamodule (it decodes with seed 001's FFmpeg-rate rule); a setting wiring it in is open.
Pure python/torch.
"""
from __future__ import annotations

import math

import torch

FRAME_FACTOR = 2
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768


def _round_by(number: float, factor: int) -> int:
    return round(number / factor) * factor


def _ceil_by(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def _floor_by(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def qwen_omni_nframes(total_frames: int, video_fps: float, fps: float = FPS, min_frames: int = FPS_MIN_FRAMES,
                      max_frames: int | None = None) -> int:
    """``smart_nframes(ele, total_frames, video_fps)`` for an element with ``fps`` (and optional ``min_frames`` /
    ``max_frames``)::

        min_frames = ceil_by_factor(ele.get("min_frames", FPS_MIN_FRAMES), FRAME_FACTOR)
        max_frames = floor_by_factor(ele.get("max_frames", min(FPS_MAX_FRAMES, total_frames)), FRAME_FACTOR)
        nframes = total_frames / video_fps * fps
        nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
        nframes = floor_by_factor(nframes, FRAME_FACTOR)

    Raises:
        ValueError: ``nframes`` outside ``[FRAME_FACTOR, total_frames]`` (the release's check, e.g. a 1-frame video).
    """
    lo = _ceil_by(min_frames, FRAME_FACTOR)
    hi = _floor_by(max_frames if max_frames is not None else min(FPS_MAX_FRAMES, total_frames), FRAME_FACTOR)
    n = total_frames / video_fps * fps
    n = _floor_by(min(min(max(n, lo), hi), total_frames), FRAME_FACTOR)
    if not FRAME_FACTOR <= n <= total_frames:
        raise ValueError(f"nframes should in interval [{FRAME_FACTOR}, {total_frames}], but got {n}.")
    return n


def qwen_omni_frame_indices(total_frames: int, video_fps: float, fps: float = FPS, min_frames: int = FPS_MIN_FRAMES,
                            max_frames: int | None = None) -> list[int]:
    """Source frame indices ``torch.linspace(0, total_frames - 1, nframes).round().long()`` with ``nframes`` from
    :func:`qwen_omni_nframes` (``nframes - 1`` is odd, so no index is an exact half)."""
    n = qwen_omni_nframes(total_frames, video_fps, fps, min_frames, max_frames)
    return torch.linspace(0, total_frames - 1, n).round().long().tolist()
