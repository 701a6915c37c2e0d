"""Cutting a frame sequence into groups: the seeds' adaptive segmenter and uniform cuts.

Legend: T frames, D feature dim, G groups.

The adaptive segmenter is the one seeds 000/001 import (``from videollama3.model.compressor import
adaptive_segment_count, adaptive_segment_lengths``): chicheng567/OnlineLong, ``videollama3/model/compressor.py``,
the stored version that defines ``TransformerDecoderFlatCompressor`` with ``adaptive_segmentation`` (search-index
file id 69454226840; the repository's mirrored branches hold only older versions without it). Pure torch; no
lightning, no transformers, no I/O.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

MAX_GROUP_FRAMES = 8  # a compressed group never spans more than 8 frames
FORCE_EVERY = 8       # the fork's ``segment_force_every`` default: a forced cut every 8 frames
TARGET_FRAMES = 4     # the fork's ``segment_target_frames`` default: N = T // 4 + 1 groups


def frame_changes(per_frame: torch.Tensor) -> torch.Tensor:
    """Change between consecutive frames, the fork's ``diff``.

    Follows OnlineLong ``adaptive_segment_lengths``::

        f = torch.nn.functional.normalize(per_frame_feat.float(), dim=-1)
        diff = 1.0 - (f[1:] * f[:-1]).sum(-1)                     # (T-1,)

    (float32, on the features' device; seed 000's ``group_variation`` / ``training_change`` compute the same).

    Args:
        per_frame: (T, D) per-frame mean features.

    Returns:
        (T-1,) float32 tensor, ``diff[i] = 1 - cos(f_i, f_{i+1})``.

    Raises:
        ValueError: ``per_frame`` is not 2-D.
    """
    if per_frame.ndim != 2:
        raise ValueError(f"per_frame must be (T, D), got shape {tuple(per_frame.shape)}")
    f = F.normalize(per_frame.detach().float(), dim=-1)
    return 1.0 - (f[1:] * f[:-1]).sum(-1)


def adaptive_segment_count(num_frames: int, target_frames: int = TARGET_FRAMES,
                           force_every: int = FORCE_EVERY) -> int:
    """Number of groups of the adaptive cut, as OnlineLong's ``adaptive_segment_count``.

    Follows: ``if n_frames <= 1: return 1`` / ``return max(1, min(n_frames // max(1, int(target_frames)) + 1,
    n_frames))``. ``force_every`` is accepted because seed 000 calls ``adaptive_segment_count(T, tf,
    bd.FORCE_EVERY)``; the stored fork version has no such parameter and the count does not depend on it.

    Raises:
        ValueError: ``num_frames < 1``.
    """
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    del force_every
    if num_frames <= 1:
        return 1
    return max(1, min(num_frames // max(1, int(target_frames)) + 1, num_frames))


def adaptive_segment_lengths(per_frame: torch.Tensor, target_frames: int = TARGET_FRAMES,
                             force_every: int = FORCE_EVERY, sample_tau: float = 0.0, generator=None, *,
                             n_segments: int | None = None) -> list[int]:
    """The fork's fixed-count, adaptively placed segmentation (OnlineLong ``adaptive_segment_lengths``).

    Its rule, followed line by line ("Boundaries = a forced cut every ``force_every`` frames + the remaining budget
    on the largest ``1 - cos(f_i, f_{i-1})`` positions"):

    * ``N = adaptive_segment_count(T, target_frames)``, ``n_cuts = N - 1``; ``T <= 1`` gives ``[T]`` (or ``[]``).
    * ``forced = range(force_every, T, force_every)``; ``budget = n_cuts - len(forced)``.
    * ``budget > 0``: candidates ``cand = [j + 1 for j in range(T - 1) if j + 1 not in forced]``, scores
      ``diff[c - 1]``, ``order = torch.argsort(-scores)``, and the first ``budget`` of that order become cuts.
      **Ties** are ``torch.argsort``'s (``stable=False``) order on the features' device, exactly as the fork
      computes it: on the CPU, up to 16 candidates come out in index order (an insertion sort); from 17 on the
      order of equal scores is the introsort's (tests pin T = 33 with all scores equal).
    * ``budget < 0`` (only when ``force_every`` is small): the ``n_cuts`` forced cuts with the largest diff
      (``sorted(forced, key=diff, reverse=True)[:n_cuts]``, a stable sort).
    * The safety split: no group longer than ``force_every`` (a cut added every ``force_every`` frames inside
      a longer one; with these defaults a no-op).

    Args:
        per_frame: (T, D) per-frame mean encoder features.
        target_frames: the fork's ``segment_target_frames`` (seed 000's ``tf``).
        force_every: the fork's ``segment_force_every``.
        sample_tau: must be 0: the fork's Gumbel-top-k draw is a training-time augmentation only.
        generator: unused (the fork's generator for the draw).
        n_segments: seed 000 passes ``n_segments=adaptive_segment_count(T, tf, FORCE_EVERY)``; the stored fork
            computes N itself, so a given value must equal it.

    Returns:
        Group lengths in time order, summing to T, each in ``[1, force_every]``.

    Raises:
        ValueError: ``sample_tau != 0``, or ``n_segments`` differs from the fork's count.
    """
    if sample_tau:
        raise ValueError("sample_tau > 0 is the fork's training-time Gumbel draw; inference cuts use sample_tau=0")
    del generator
    num_frames = int(per_frame.shape[0])
    if num_frames <= 1:
        return [num_frames] if num_frames == 1 else []
    n = adaptive_segment_count(num_frames, target_frames)
    if n_segments is not None and int(n_segments) != n:
        raise ValueError(f"n_segments={n_segments} but the fork's adaptive_segment_count({num_frames}, "
                         f"{target_frames}) is {n}")
    n_cuts = n - 1
    if n_cuts <= 0:
        return [num_frames]
    diff = frame_changes(per_frame)
    forced = list(range(force_every, num_frames, force_every))
    forced_set = set(forced)
    cuts = set(forced)
    budget = n_cuts - len(forced)
    if budget > 0:
        cand = [j + 1 for j in range(num_frames - 1) if (j + 1) not in forced_set]
        scores = diff[torch.tensor([c - 1 for c in cand], device=diff.device)]
        order = torch.argsort(-scores)
        for i in order[:budget].tolist():
            cuts.add(cand[i])
    elif budget < 0:
        vals = diff.tolist()
        cuts = set(sorted(forced, key=lambda c: vals[c - 1], reverse=True)[:n_cuts])
    fixed, prev = [], 0
    for c in sorted(cuts):
        while c - prev > force_every:
            prev += force_every
            fixed.append(prev)
        fixed.append(c)
        prev = c
    while num_frames - prev > force_every:
        prev += force_every
        fixed.append(prev)
    bounds = sorted(b for b in set(fixed) if 0 < b < num_frames)
    edges = [0, *bounds, num_frames]
    return [edges[i + 1] - edges[i] for i in range(len(edges) - 1)]


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

    As seed 000's ``group_variation`` ("bd.plan_groups' per-group variation (1-frame groups: +inf)")::

        var.append(sum(diff[s:s + L - 1]) / (L - 1) if L > 1 else math.inf)

    with ``diff`` the float32 :func:`frame_changes` read as Python floats.

    Args:
        changes: (T-1,) consecutive-frame changes.
        seg_lens: G group lengths summing to T.

    Returns:
        G floats.
    """
    diff = changes.detach().tolist()   # one host copy, not one read per group
    out, start = [], 0
    for n in seg_lens:
        out.append(sum(diff[start:start + n - 1]) / (n - 1) if n > 1 else math.inf)
        start += n
    return out
