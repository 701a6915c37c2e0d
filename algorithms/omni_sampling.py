"""Frame choice of Qwen2.5-Omni's ``qwen_omni_utils``, the sampling OmniZip's WorldSense evaluation runs (seed 003:7).

The reference chain:

* KD-TAO/OmniZip@9060291:eval/eval.py:evaluate_sample builds the user turn with ``{"type": "video", "video":
  video_path}`` (no ``fps``, ``max_frames`` or ``nframes`` in the element) and calls ``process_mm_info(conversation,
  use_audio_in_video=USE_AUDIO_IN_VIDEO)``, so the package's constants apply (``FPS = 2.0``, ``FPS_MIN_FRAMES = 4``,
  ``FPS_MAX_FRAMES = 768``, ``FRAME_FACTOR = 2``). OmniZip's README tells its users to edit ``FPS_MAX_FRAMES``
  (and ``VIDEO_MAX_PIXELS``) for their resources; seed 003:7 runs at "1 fps" with "最大帧数为 128 帧" (at most 128
  frames), "遵循 omnizip 中在 WorldSense 数据集上测试的配置参数".
* QwenLM/Qwen2.5-Omni@f8bf58c6:qwen-omni-utils/src/qwen_omni_utils/v2_5/vision_process.py:smart_nframes (the
  ``fps`` branch)::

      fps = ele.get("fps", FPS)
      min_frames = ceil_by_factor(ele.get("min_frames", FPS_MIN_FRAMES), FRAME_FACTOR)
      max_frames = floor_by_factor(ele.get("max_frames", min(FPS_MAX_FRAMES, total_frames)), FRAME_FACTOR)
      nframes = total_frames / video_fps * fps
      nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
      nframes = floor_by_factor(nframes, FRAME_FACTOR)
      if not (FRAME_FACTOR <= nframes and nframes <= total_frames):
          raise ValueError(f"nframes should in interval [{FRAME_FACTOR}, {total_frames}], but got {nframes}.")

* the same file, ``_read_video_decord`` (the backend ``get_video_reader_backend`` picks when decord is installed;
  ``_read_video_torchvision`` has the same two lines)::

      total_frames, video_fps = len(vr), vr.get_avg_fps()
      idx = torch.linspace(0, total_frames - 1, nframes).round().long().tolist()
      sample_fps = nframes / max(total_frames, 1e-6) * video_fps

  ``sample_fps`` is what ``process_vision_info(..., return_video_kwargs=True)`` hands to the processor (``{'fps':
  video_sample_fps_list}``), whose ``video_second_per_grid`` is ``temporal_patch_size / fps``.

PyPI's qwen-omni-utils 0.0.9 has the same lines (its ``calculate_video_frame_range`` gives ``(0, total_frames - 1,
total_frames)`` when the element has no ``video_start`` / ``video_end``). Setting ``max_frames`` in the element (seed 003's 128) and editing the constant give the same count: both cap at
``min(max_frames, total_frames)`` floored to even. Pure python/torch (``torch.linspace`` in float32, the release's
dtype, so the rounding is the release's bit for bit).
"""
from __future__ import annotations

import math

import torch

FRAME_FACTOR = 2
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768


def _ceil_by(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def _floor_by(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def qwen_omni_nframes(total_frames: int, video_fps: float, fps: float = FPS, min_frames: int = FPS_MIN_FRAMES,
                      max_frames: int | None = None) -> int:
    """``smart_nframes(ele, total_frames, video_fps)`` for an element with ``fps`` (and optional ``min_frames`` /
    ``max_frames``; ``None``: the release's ``min(FPS_MAX_FRAMES, total_frames)``), the lines quoted in the module
    docstring.

    Raises:
        ValueError: ``nframes`` outside ``[FRAME_FACTOR, total_frames]`` (the release's check and message, e.g. a
            1-frame video), or a ``video_fps`` that is not positive (the release divides by it).
    """
    if not video_fps > 0:
        raise ValueError(f"video_fps must be > 0 (the release divides by it), got {video_fps!r}")
    lo = _ceil_by(min_frames, FRAME_FACTOR)
    hi = _floor_by(max_frames if max_frames is not None else min(FPS_MAX_FRAMES, total_frames), FRAME_FACTOR)
    n = total_frames / video_fps * fps
    n = _floor_by(min(min(max(n, lo), hi), total_frames), FRAME_FACTOR)
    if not FRAME_FACTOR <= n <= total_frames:
        raise ValueError(f"nframes should in interval [{FRAME_FACTOR}, {total_frames}], but got {n}.")
    return n


def linspace_round_indices(total_frames: int, nframes: int) -> list[int]:
    """``torch.linspace(0, total_frames - 1, nframes).round().long().tolist()`` (``_read_video_decord``)."""
    return torch.linspace(0, total_frames - 1, nframes).round().long().tolist()


def qwen_omni_frame_indices(total_frames: int, video_fps: float, fps: float = FPS, min_frames: int = FPS_MIN_FRAMES,
                            max_frames: int | None = None) -> list[int]:
    """Source frame indices: :func:`linspace_round_indices` with ``nframes`` from :func:`qwen_omni_nframes`
    (``nframes`` is even, so ``nframes - 1`` is odd and no exact index is a half; float32 decides the rest)."""
    return linspace_round_indices(total_frames, qwen_omni_nframes(total_frames, video_fps, fps, min_frames, max_frames))


def qwen_omni_sample_fps(nframes: int, total_frames: int, video_fps: float) -> float:
    """``sample_fps = nframes / max(total_frames, 1e-6) * video_fps`` (``_read_video_decord``): the rate the
    processor is given, so one temporal patch of ``temporal_patch_size`` frames spans ``temporal_patch_size /
    sample_fps`` seconds of TMRoPE time."""
    return nframes / max(total_frames, 1e-6) * video_fps


def frame_times(indices: list[int], video_fps: float) -> list[float]:
    """Source times of the sampled frames, ``index / video_fps`` seconds (the frame's position in decord's
    constant-rate view of the stream, the view ``sample_fps`` is computed in)."""
    return [k / video_fps for k in indices]
