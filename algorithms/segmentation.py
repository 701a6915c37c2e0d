"""Cutting a frame sequence into groups: adaptive cuts at the largest changes, and uniform cuts.

Legend: T frames, D feature dim, G groups.

Pure torch; no lightning, no transformers, no I/O.
"""
from __future__ import annotations

import bisect
import math

import numpy as np
import torch

MAX_GROUP_FRAMES = 8  # a compressed group never spans more than 8 frames


def frame_changes(per_frame: torch.Tensor) -> torch.Tensor:
    """Change between consecutive frames, ``1 - cos(f_t, f_{t+1})``.

    Args:
        per_frame: (T, D) per-frame mean features.

    Returns:
        (T-1,) float64 tensor of changes in [0, 2].
    """
    if per_frame.ndim != 2:
        raise ValueError(f"per_frame must be (T, D), got shape {tuple(per_frame.shape)}")
    x = per_frame.detach().to(torch.float64)
    if x.shape[0] < 2:
        return x.new_zeros(0)
    cos = torch.nn.functional.cosine_similarity(x[:-1], x[1:], dim=-1, eps=1e-12)
    return 1.0 - cos


def adaptive_segment_count(num_frames: int) -> int:
    """Number of groups of the hybrid plan: ``n = T // 4 + 1``, never more than T (DESIGN §3.4)."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    return min(num_frames // 4 + 1, num_frames)


def _extra_cuts_needed(length: int, max_len: int) -> int:
    return math.ceil(length / max_len) - 1


def adaptive_segment_lengths(changes: torch.Tensor, num_segments: int, max_len: int = MAX_GROUP_FRAMES) -> list[int]:
    """Cut T frames into ``num_segments`` groups where consecutive frames change most.

    Rule: repeatedly place the next cut at the boundary of largest change (ties: earliest boundary) among those
    that still allow every group to end up ``<= max_len`` frames with the cuts that remain; stop at
    ``num_segments - 1`` cuts. When a high-change boundary is refused because of the length limit, it is
    reconsidered after later cuts change its group.

    Args:
        changes: (T-1,) change between frame t and t+1 (see :func:`frame_changes`).
        num_segments: G, the number of groups, ``1 <= G <= T``.
        max_len: the longest allowed group, in frames.

    Returns:
        G group lengths in time order; they sum to T and each is in ``[1, max_len]``.

    Raises:
        ValueError: G outside ``[ceil(T / max_len), T]`` (no tiling exists).
    """
    num_frames = int(changes.numel()) + 1
    if not math.ceil(num_frames / max_len) <= num_segments <= num_frames:
        raise ValueError(
            f"cannot cut {num_frames} frames into {num_segments} groups of at most {max_len} frames"
        )
    # boundary b sits between frame b and b+1 (cut after frame b); order: largest change first, then earliest
    vals = changes.detach().to(torch.float64).tolist()
    order = sorted(range(num_frames - 1), key=lambda b: (-vals[b], b))
    cuts: list[int] = []  # sorted cut positions as segment starts (b + 1)
    needed = _extra_cuts_needed(num_frames, max_len)
    remaining = num_segments - 1
    taken = [False] * (num_frames - 1)
    while remaining > 0:
        for b in order:
            if taken[b]:
                continue
            start = b + 1
            i = bisect.bisect_left(cuts, start)
            seg_lo = cuts[i - 1] if i > 0 else 0
            seg_hi = cuts[i] if i < len(cuts) else num_frames
            before = _extra_cuts_needed(seg_hi - seg_lo, max_len)
            after = _extra_cuts_needed(start - seg_lo, max_len) + _extra_cuts_needed(seg_hi - start, max_len)
            if needed - before + after <= remaining - 1:
                cuts.insert(i, start)
                taken[b] = True
                needed += after - before
                remaining -= 1
                break
        else:  # pragma: no cover - unreachable: a cut at max_len inside a long group is always feasible
            raise RuntimeError("adaptive segmentation found no feasible cut")
    bounds = [0, *cuts, num_frames]
    return [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]


def uniform_segment_lengths(num_frames: int, group_frames: int) -> list[int]:
    """Consecutive groups of ``group_frames`` frames, the last one shorter when T is not a multiple.

    Returns:
        ``ceil(T / group_frames)`` lengths summing to T.
    """
    if num_frames < 1 or group_frames < 1:
        raise ValueError(f"need num_frames >= 1 and group_frames >= 1, got {num_frames}, {group_frames}")
    full, rest = divmod(num_frames, group_frames)
    return [group_frames] * full + ([rest] if rest else [])


def uniform_segment_count_lengths(num_frames: int, num_segments: int) -> list[int]:
    """T frames cut into exactly ``num_segments`` groups at uniform positions, as seed 000 ``segment`` cuts them:
    ``bounds = np.round(np.linspace(0, T, n + 1)).astype(int)``, lengths ``np.diff(bounds)`` (numpy's ``round`` is
    half to even: T = 10, n = 3 gives bounds 0, 3, 7, 10 -> [3, 4, 3]; T = 6, n = 4 gives 0, 2, 3, 4, 6 ->
    [2, 1, 1, 2]).

    Used by the ``uni8`` / ``uni16`` ablations (same group count as the adaptive cut, uniform positions).

    Raises:
        ValueError: ``n`` outside ``[1, T]``.
    """
    if not 1 <= num_segments <= num_frames:
        raise ValueError(f"cannot cut {num_frames} frames into {num_segments} groups")
    bounds = np.round(np.linspace(0, num_frames, num_segments + 1)).astype(int)
    return [int(x) for x in np.diff(bounds)]


def group_variation(changes: torch.Tensor, seg_lens: list[int]) -> list[float]:
    """Within-group variation: mean change between consecutive frames inside each group (+inf for 1 frame).

    Args:
        changes: (T-1,) consecutive-frame changes.
        seg_lens: G group lengths summing to T.

    Returns:
        G floats.
    """
    out = []
    start = 0
    vals = changes.detach().to(device="cpu", dtype=torch.float64)   # one host copy, not one read per group
    for n in seg_lens:
        out.append(math.inf if n == 1 else float(vals[start:start + n - 1].mean()))
        start += n
    return out
