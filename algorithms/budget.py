"""Vision-token budgets: frame caps, decode sampling, per-frame token counts and the layout plan (DESIGN §3.1-3.4).

Legend: B budget (LLM vision rows per video), K rows per compressed group (64), T frames, D feature dim,
G groups, hw merged tokens per frame at the encode size, raw_hw rows per raw frame in the LLM input.

A *merged token* (or cell) is one 28×28 pixel area: a 2×2 block of 14-pixel ViT patches that VideoLLaMA3 merges
into one LLM row. Pure python/torch; no lightning, no transformers, no I/O (numpy where a seed's numpy call is reproduced).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from .segmentation import (
    FORCE_EVERY,
    MAX_GROUP_FRAMES,
    TARGET_FRAMES,
    adaptive_segment_count,
    adaptive_segment_lengths,
    frame_changes,
    group_variation,
    uniform_segment_lengths,
)

K_ROWS = 64                    # rows a compressed group becomes (qbase queries)
PATCH_SIZE = 14                # ViT patch side, pixels
MERGE_SIZE = 2                 # patches merged per side into one LLM row
CELL_PIXELS = PATCH_SIZE * MERGE_SIZE  # 28: side of one merged token, pixels
MAX_TOKENS_PER_FRAME = 256
MIN_TOKENS_PER_FRAME = 16
BASE_FPS = 1.0
# seed 001/000 record ``fps_ok=fps >= bd.MIN_FPS - 1e-6``; ``bd.MIN_FPS`` is not in the seeds. 0.5: the lowest rate a
# video decoded at the full 1 fps reaches (``floor(d) / d >= 1/2`` for d >= 1 s), so ``fps_ok`` is False exactly when
# a budget's frames are thinned below one per 2 s (README, deviations table)
MIN_FPS = 0.5

PlanMode = Literal["raw", "hybrid", "forced8", "all_compressed", "qbase"]


def max_frames(budget_tokens: int, k: int = K_ROWS) -> int:
    """Most frames a budget can carry: ``(B // K) * 8`` (every group compressed, 8 frames each).

    Raises:
        ValueError: ``B < K`` (not even one compressed group fits).
    """
    check_budget(budget_tokens, k)
    return (budget_tokens // k) * MAX_GROUP_FRAMES


def check_budget(budget_tokens: int, k: int = K_ROWS) -> None:
    """Raise ``ValueError`` when the budget cannot hold even one compressed group of K rows."""
    if budget_tokens < k:
        raise ValueError(f"budget of {budget_tokens} vision tokens is smaller than one compressed group ({k} rows)")


def sample_rate(duration_s: float, budget_tokens: int, base_fps: float = BASE_FPS, k: int = K_ROWS) -> float:
    """Decode sampling rate for the largest budget (seed 001, ``decode_video``).

    Follows ``fps = bd.FPS if int(duration * bd.FPS) + 1 <= max_frames else (max_frames + 1) / duration``
    with ``max_frames = (B // K) * 8`` (:func:`max_frames`).

    Args:
        duration_s: video duration in seconds.
        budget_tokens: the largest budget of the run.

    Returns:
        Frames per second (``base_fps``, or ``(M + 1) / duration`` when ``base_fps`` would give more than M frames).
    """
    cap = max_frames(budget_tokens, k)
    if int(duration_s * base_fps) + 1 <= cap:
        return base_fps
    return (cap + 1) / float(duration_s)


def fps_filter_frames(frame_times_s: list[float], end_s: float, fps: float) -> list[int]:
    """Source frame shown by each output frame of FFmpeg's ``fps=fps:round=down`` filter.

    FFmpeg libavfilter/vf_fps.c (``read_frame`` / ``write_frame`` / ``update_eof_pts``): every input time is
    rescaled to the output time base rounding down, ``q = floor(t * fps)``; output frame ``n`` (from ``q`` of the
    first frame up to, excluding, ``floor(end * fps)``, the rescaled end of stream) is the last input frame with
    ``q <= n`` (later frames with the same ``q`` replace earlier ones, the last one is repeated up to the end).

    Args:
        frame_times_s: presentation times of the source frames (s, increasing, relative to the stream start).
        end_s: end of the stream (s): the last frame's time plus its duration.
        fps: the filter's rate (FFmpeg runs at ``av_d2q(fps, INT_MAX)``, a rational within 1e-9 of the float; the
            comparison below allows 1e-6 of a step, so an exact multiple of the step is not lost to float error).

    Returns:
        N source indices (non-decreasing), one per output frame; empty when the clip ends before the first output
        time step (``floor(end * fps) <= floor(t_0 * fps)``).
    """
    eps = 1e-6  # the times are floats of integer pts: an exact multiple of the step must not fall just below it
    rate = float(fps)

    def q(t: float) -> int:
        return math.floor(t * rate + eps)

    if not frame_times_s:
        return []
    qs = [q(t) for t in frame_times_s]
    out, src = [], 0
    for n in range(qs[0], q(end_s)):
        while src + 1 < len(qs) and qs[src + 1] <= n:
            src += 1
        out.append(src)
    return out


def thin_linspace(num_frames: int, num_keep: int) -> list[int]:
    """``num_keep`` of ``num_frames`` indices as seed 001 and 000 thin: ``np.linspace(0, N - 1, M, dtype=int)``
    (truncation toward zero, first and last included; all indices when ``N <= M``)."""
    if num_frames <= num_keep:
        return list(range(num_frames))
    return [int(i) for i in np.linspace(0, num_frames - 1, num_keep, dtype=int)]


def sample_frames(frame_times_s: list[float], end_s: float, duration_s: float, budget_tokens: int,
                  start_s: float = 0.0, base_fps: float = BASE_FPS, k: int = K_ROWS) -> tuple[float, list[int], list[float]]:
    """Which source frames the decode keeps and the time each is labelled with (seed 001, ``decode_video``).

    The rate of :func:`sample_rate`; the frames FFmpeg's ``fps`` filter with ``round=down`` emits at that rate
    (:func:`fps_filter_frames`); their times ``ts = (start + np.arange(len(frames)) / fps)`` (the sampling grid,
    not the source frames' own times); then, when more than M frames came out,
    ``idx = np.linspace(0, len(frames) - 1, max_frames, dtype=int)`` (:func:`thin_linspace`).

    Args:
        frame_times_s: source frame times relative to the stream start (s, increasing).
        end_s: end of the stream relative to its start (s).
        duration_s: the video's duration (s), which picks the rate.
        budget_tokens: the largest budget of the run.
        start_s: the stream's start time (added to the labels, ``start`` in the seed).

    Returns:
        ``(fps, source indices, times_s)``; the lists are empty when the clip is too short for one output frame.
    """
    fps = sample_rate(duration_s, budget_tokens, base_fps, k)
    src = fps_filter_frames(frame_times_s, end_s, fps)
    times = (start_s + np.arange(len(src)) / fps).tolist()
    keep = thin_linspace(len(src), max_frames(budget_tokens, k))
    return fps, [src[i] for i in keep], [float(times[i]) for i in keep]


def subsample(num_frames: int, budget_tokens: int, k: int = K_ROWS) -> list[int]:
    """Frames a budget uses out of the T decoded ones (seed 001 ``idx = bd.subsample(len(ts), b)``).

    The helper is not in the seeds; both seeds thin with ``np.linspace(0, N - 1, M, dtype=int)`` wherever they show
    code (001 ``decode_video``: ``idx = np.linspace(0, len(frames) - 1, max_frames, dtype=int)``; 000
    ``frame_indices``: ``np.linspace(0, n_decoded - 1, cap, dtype=int)``), so the same rule is used here
    (:func:`thin_linspace`): all T when ``T <= max_frames(B)``, else ``max_frames(B)`` indices, truncated toward zero,
    first and last included.

    Returns:
        ``min(T, max_frames(B))`` increasing, distinct indices into ``range(T)``.

    Raises:
        ValueError: ``B < K``.
    """
    return thin_linspace(num_frames, max_frames(budget_tokens, k))


def budget_fps(num_frames: int, duration_s: float, base_fps: float = BASE_FPS, min_fps: float = MIN_FPS,
               ) -> tuple[float, bool]:
    """A budget's frame rate and its ``fps_ok`` flag, as seed 001 records them per budget::

        fps = min(bd.FPS, len(idx) / max(info["duration"], 1e-6))
        binfo = dict(info, n_frames=len(idx), fps=round(fps, 4), fps_ok=fps >= bd.MIN_FPS - 1e-6)

    Args:
        num_frames: the budget's frames (``len(idx)``); duration_s: the video's duration (s).

    Returns:
        ``(round(fps, 4), fps >= min_fps - 1e-6)`` (the flag from the unrounded rate, as the seed).
    """
    fps = min(base_fps, num_frames / max(duration_s, 1e-6))
    return round(fps, 4), fps >= min_fps - 1e-6


def frame_grid(height: int, width: int, max_tokens: int, min_tokens: int = MIN_TOKENS_PER_FRAME) -> tuple[int, int]:
    """Merged-token grid ``(gh, gw)`` a ``height × width`` frame is resized to, keeping its aspect ratio.

    Follows VideoLLaMA3's ``smart_resize`` with ``factor = 28``, ``max_pixels = max_tokens * 28²`` and
    ``min_pixels = min(min_tokens, max_tokens) * 28²``: the frame keeps its size rounded to multiples of 28
    when that fits, else is scaled down (floor) to fit, or up (ceil) to reach the minimum.

    Returns:
        ``(gh, gw)`` with ``gh * gw <= max_tokens`` (when ``max_tokens >= 1``); the pixel size is ``28 gh × 28 gw``.
    """
    if height < 1 or width < 1:
        raise ValueError(f"frame size must be positive, got {height}x{width}")
    f = CELL_PIXELS
    max_px = max_tokens * f * f
    min_px = min(min_tokens, max_tokens) * f * f
    h_bar = max(f, round(height / f) * f)
    w_bar = max(f, round(width / f) * f)
    if h_bar * w_bar > max_px:
        beta = math.sqrt(height * width / max_px)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < min_px:
        beta = math.sqrt(min_px / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return h_bar // f, w_bar // f


def frame_token_cap(budget_tokens: int, num_frames: int, max_tokens_per_frame: int = MAX_TOKENS_PER_FRAME,
                    min_tokens: int = MIN_TOKENS_PER_FRAME) -> int:
    """Largest per-frame token count ``<= max_tokens_per_frame`` with ``T * tokens <= 8 * B``, at least ``min_tokens``."""
    return max(min_tokens, min(max_tokens_per_frame, (MAX_GROUP_FRAMES * budget_tokens) // max(num_frames, 1)))


def encoder_grids(height: int, width: int, num_frames: int, budgets: list[int], max_tokens_per_frame: int,
                  raw_mode: str, raw_max_tokens: int) -> dict[tuple[int, int], tuple[list[int], int]]:
    """Every (frame, grid) pair the vision encoder can be asked for on one decoded video, per grid.

    The geometry of ``models.videollama3.prepare_budgets`` for each budget: frames ``subsample(T, B)`` at
    ``frame_grid(H, W, frame_token_cap(B, T_b, max_tokens_per_frame))``; with ``raw_mode="phase3"`` and that grid
    above ``raw_max_tokens`` cells, the raw frames are re-encoded at ``frame_grid(H, W, raw_max_tokens)`` (which
    frames are raw depends on the plan, so all of the budget's frames are listed there too).

    Args:
        height, width: decoded frame size in pixels; num_frames: T decoded frames.

    Returns:
        ``{(gh, gw): (sorted frame positions, the token cap of the first budget asking for that grid)}``.

    Raises:
        ValueError: ``raw_mode`` is neither ``phase3`` nor ``orig``.
    """
    if raw_mode not in ("phase3", "orig"):
        raise ValueError(f"raw_mode must be 'phase3' or 'orig', got {raw_mode!r}")
    out: dict[tuple[int, int], tuple[set[int], int]] = {}
    for b in budgets:
        idx = subsample(num_frames, b)
        cap = frame_token_cap(b, len(idx), max_tokens_per_frame)
        grid = frame_grid(height, width, cap)
        wanted = [(grid, cap)]
        if raw_mode == "phase3" and grid[0] * grid[1] > raw_max_tokens:
            wanted.append((frame_grid(height, width, raw_max_tokens), raw_max_tokens))
        for g, c in wanted:
            out.setdefault(g, (set(), c))[0].update(idx)
    return {g: (sorted(s), c) for g, (s, c) in out.items()}


def frame_tokens(height: int, width: int, budget_tokens: int, num_frames: int,
                 max_tokens_per_frame: int = MAX_TOKENS_PER_FRAME, min_tokens: int = MIN_TOKENS_PER_FRAME) -> int:
    """Merged tokens per frame (``hw``) the vision encoder produces for a budget (DESIGN §3.3).

    The cap of :func:`frame_token_cap` turned into the aspect-preserving grid of :func:`frame_grid`;
    ``hw = gh * gw`` (at most the cap, fewer when the frame is small or the aspect ratio leaves cells unused).
    """
    gh, gw = frame_grid(height, width, frame_token_cap(budget_tokens, num_frames, max_tokens_per_frame, min_tokens),
                        min_tokens)
    return gh * gw


@dataclass(frozen=True)
class Plan:
    """Layout of one video's frames in the LLM input.

    Attributes:
        mode: ``raw`` | ``hybrid`` | ``forced8`` | ``all_compressed`` | ``qbase`` (layout ablations' ``qtf<k>``).
        seg_lens: group lengths in frames, in time order; they tile T exactly (raw mode: one group per frame).
        compressed: indices of the compressed groups (ascending).
        vision_tokens: exact LLM vision rows, ``n_raw_frames * raw_hw + len(compressed) * k`` (``<= B``).
        n_raw_frames: frames entering as raw rows.
        hw: merged tokens per frame at the encode size.
        raw_hw: rows per raw frame in the LLM input.
        k: rows per compressed group.
    """

    mode: PlanMode
    seg_lens: tuple[int, ...]
    compressed: tuple[int, ...]
    vision_tokens: int
    n_raw_frames: int
    hw: int
    raw_hw: int
    k: int = K_ROWS

    @property
    def num_frames(self) -> int:
        return sum(self.seg_lens)

    @property
    def n_groups(self) -> int:
        return len(self.seg_lens)

    @property
    def n_compressed(self) -> int:
        return len(self.compressed)

    def group_bounds(self) -> list[tuple[int, int]]:
        """``[start, end)`` frame range of each group."""
        out, s = [], 0
        for n in self.seg_lens:
            out.append((s, s + n))
            s += n
        return out

    def blocks(self) -> list[tuple[str, int, int]]:
        """LLM input blocks in time order: ``("raw", t, t + 1)`` per raw frame, ``("group", a, b)`` per compressed group."""
        comp = set(self.compressed)
        out: list[tuple[str, int, int]] = []
        for g, (a, b) in enumerate(self.group_bounds()):
            if g in comp:
                out.append(("group", a, b))
            else:
                out.extend(("raw", t, t + 1) for t in range(a, b))
        return out

    def stats(self) -> dict:
        """Record fields (DESIGN §3.8)."""
        return {"mode": self.mode, "hw": self.hw, "raw_hw": self.raw_hw, "n_groups": self.n_groups,
                "n_compressed": self.n_compressed, "n_raw_frames": self.n_raw_frames,
                "vision_tokens": self.vision_tokens, "seg_lens": list(self.seg_lens)}


def make_plan(mode: PlanMode, seg_lens: list[int], compressed: list[int] | set[int], hw: int, raw_hw: int,
              k: int = K_ROWS) -> Plan:
    """A :class:`Plan` with its derived counts computed from ``seg_lens`` and ``compressed``."""
    comp = tuple(sorted(compressed))
    n_raw = sum(n for g, n in enumerate(seg_lens) if g not in set(comp))
    return Plan(mode=mode, seg_lens=tuple(seg_lens), compressed=comp, vision_tokens=n_raw * raw_hw + len(comp) * k,
                n_raw_frames=n_raw, hw=hw, raw_hw=raw_hw, k=k)


def compression_order(variation: list[float], seg_lens: list[int], most_changing_first: bool = False) -> list[int]:
    """Order in which groups are compressed: least-varying first (1-frame groups, +inf, last);
    ties: longer group first, then earlier. ``most_changing_first`` reverses the variation order (``hivar``)."""
    sign = -1.0 if most_changing_first else 1.0

    def key(g: int):
        v = variation[g]
        return (sign * v if math.isfinite(v) else math.inf, -seg_lens[g], g)

    return sorted(range(len(seg_lens)), key=key)


def compress_until_fits(seg_lens: list[int], order: list[int], budget_tokens: int, raw_hw: int,
                        k: int = K_ROWS) -> set[int]:
    """Start from all frames raw and compress groups in ``order`` until ``raw rows + K * compressed <= B``.

    Returns:
        The compressed group indices (may still not fit if every group is compressed and ``G * K > B``).
    """
    cost = sum(seg_lens) * raw_hw
    compressed: set[int] = set()
    for g in order:
        if cost <= budget_tokens:
            break
        compressed.add(g)
        cost += k - seg_lens[g] * raw_hw
    return compressed


def plan_groups(per_frame: torch.Tensor, hw: int, budget_tokens: int, raw_hw: int,
                force_mode: PlanMode | None = None, k: int = K_ROWS) -> Plan:
    """Plan a video's layout under a vision-token budget (DESIGN §3.4).

    * ``raw``: ``T * raw_hw <= B``: every frame raw.
    * ``hybrid``: otherwise cut into ``n = min(T // 4 + 1, T)`` adaptive groups (cuts at the largest
      consecutive-frame changes, groups of at most 8 frames); if ``n * K <= B``, compress groups least-varying
      first (see :func:`compression_order`) until the cost fits.
    * ``forced8``: otherwise uniform groups of 8 frames (the last shorter), all compressed.
    * ``all_compressed`` (only as ``force_mode``): the adaptive groups, every one compressed.

    Args:
        per_frame: (T, D) per-frame mean features (any float dtype).
        hw: merged tokens per frame at the encode size (recorded).
        budget_tokens: B.
        raw_hw: LLM rows one raw frame costs.
        force_mode: force ``raw``, ``hybrid``, ``forced8`` or ``all_compressed`` instead of the rule.
        k: rows per compressed group.

    Returns:
        A :class:`Plan` with ``vision_tokens <= B``.

    Raises:
        ValueError: ``B < K``; ``T > max_frames(B)`` (subsample first); or a forced mode that cannot fit B.
    """
    check_budget(budget_tokens, k)
    num_frames = int(per_frame.shape[0])
    if num_frames < 1:
        raise ValueError("cannot plan a video with no frames")
    if num_frames > max_frames(budget_tokens, k):
        raise ValueError(f"{num_frames} frames exceed max_frames({budget_tokens}) = {max_frames(budget_tokens, k)}; "
                         "subsample() the frames for this budget first")
    changes = frame_changes(per_frame)
    n = adaptive_segment_count(num_frames, TARGET_FRAMES, FORCE_EVERY)
    fits_raw = num_frames * raw_hw <= budget_tokens
    fits_hybrid = n * k <= budget_tokens
    mode = force_mode or ("raw" if fits_raw else "hybrid" if fits_hybrid else "forced8")
    if mode == "raw":
        plan = make_plan("raw", [1] * num_frames, [], hw, raw_hw, k)
    elif mode in ("hybrid", "all_compressed"):
        seg = adaptive_segment_lengths(per_frame, TARGET_FRAMES, FORCE_EVERY, n_segments=n)
        if mode == "all_compressed":
            comp = set(range(len(seg)))
        else:
            comp = compress_until_fits(seg, compression_order(group_variation(changes, seg), seg), budget_tokens,
                                       raw_hw, k)
        plan = make_plan(mode, seg, comp, hw, raw_hw, k)
    elif mode == "forced8":
        seg = uniform_segment_lengths(num_frames, MAX_GROUP_FRAMES)
        plan = make_plan("forced8", seg, range(len(seg)), hw, raw_hw, k)
    else:
        raise ValueError(f"unknown plan mode {mode!r}")
    if plan.vision_tokens > budget_tokens:
        raise ValueError(f"{mode} plan of {num_frames} frames needs {plan.vision_tokens} vision tokens > budget "
                         f"{budget_tokens}")
    return plan
