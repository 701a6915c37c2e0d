"""OmniZip-style audio-guided video budget allocation over native 2 s blocks.

OmniZip (Tao et al., "OmniZip: Audio-Guided Dynamic Token Compression for Fast Omnimodal Large Language
Models", 2025) sets each time window's video pruning from the audio retained in that window: windows whose
audio survived pruning more (more salient audio events) keep more video. Here the window is the
Qwen2.5-Omni native block of 2 s (50 audio tokens at 25/s; two temporal patches of video), and

    video_retention_b = clip(c * audio_retention_b, min_retention, capacity_b / n_b)

with the single scale ``c`` chosen so the kept video tokens sum to the global budget exactly
(renormalisation), fractional counts rounded by largest remainder (ties: earlier block).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["block_of_tokens", "audio_block_retention", "allocate_by_weight", "omnizip_allocate"]


def block_of_tokens(num_tokens: int, tokens_per_block: int) -> Tensor:
    """(num_tokens,) long: the native block index of each token laid out at ``tokens_per_block`` per block."""
    if tokens_per_block < 1:
        raise ValueError(f"tokens_per_block must be >= 1, got {tokens_per_block}")
    return torch.arange(num_tokens) // tokens_per_block


def audio_block_retention(
    audio_keep: Tensor, num_audio_tokens: int, audio_tokens_per_block: int = 50, num_blocks: int | None = None
) -> Tensor:
    """Fraction of each block's audio tokens that were kept, (B,) float64.

    Args:
        audio_keep: (K_a,) indices of kept audio tokens (merged anchors count as kept).
        num_audio_tokens: N_a, audio tokens before pruning (25 per second).
        audio_tokens_per_block: 50 for a 2 s block at 25 tokens/s.
        num_blocks: B; default ``ceil(N_a / audio_tokens_per_block)``. Blocks without audio get 0.

    Raises:
        ValueError: an index outside ``[0, N_a)``.
    """
    if audio_keep.numel() and (int(audio_keep.min()) < 0 or int(audio_keep.max()) >= num_audio_tokens):
        raise ValueError("audio_keep holds indices outside [0, num_audio_tokens)")
    nb = math.ceil(num_audio_tokens / audio_tokens_per_block) if num_blocks is None else num_blocks
    total = torch.bincount(block_of_tokens(num_audio_tokens, audio_tokens_per_block), minlength=nb)[:nb]
    kept = torch.bincount(audio_keep.reshape(-1).long() // audio_tokens_per_block, minlength=nb)[:nb]
    return torch.where(total > 0, kept.double() / total.clamp_min(1).double(), torch.zeros(nb, dtype=torch.float64))


def allocate_by_weight(
    sizes: Tensor, weights: Tensor, budget: int, min_retention: float = 0.0, capacity: Tensor | None = None
) -> Tensor:
    """Integer counts per block: ``clip(c * w_b * n_b, min_retention * n_b, cap_b)`` summing to ``budget``.

    Args:
        sizes: (B,) tokens per block ``n_b``.
        weights: (B,) non-negative weights (retention of each block is proportional to its weight);
            all-zero weights mean uniform.
        budget: total tokens to keep; clipped to ``sum(cap)``.
        min_retention: lower bound on each block's retention.
        capacity: (B,) upper bounds (default ``sizes``), e.g. the tokens left after an earlier stage.

    Returns:
        (B,) long counts, ``sum == min(budget, sum(cap))``, ``0 <= count_b <= cap_b``.

    Raises:
        ValueError: shape mismatch, negative weights or budget, or ``min_retention`` bounds that exceed
            the budget.
    """
    n = sizes.reshape(-1).double()
    w = weights.reshape(-1).double()
    if w.shape != n.shape:
        raise ValueError(f"sizes {tuple(n.shape)} and weights {tuple(w.shape)} differ")
    if (w < 0).any() or budget < 0:
        raise ValueError("weights and budget must be non-negative")
    cap = n.clone() if capacity is None else torch.minimum(capacity.reshape(-1).double(), n)
    if float(w.sum()) == 0.0:
        w = torch.ones_like(w)
    lo = torch.minimum(torch.ceil(min_retention * n - 1e-9), cap)
    budget = int(min(budget, int(cap.sum())))
    if float(lo.sum()) > budget:
        raise ValueError(f"min_retention={min_retention} needs {int(lo.sum())} tokens > budget {budget}")

    def total(c: float) -> float:
        return float(torch.clamp(c * w * n, min=lo, max=cap).sum())

    hi_c = 1.0
    while total(hi_c) < budget and hi_c < 1e30:
        hi_c *= 2.0
    lo_c = 0.0
    for _ in range(200):
        mid = 0.5 * (lo_c + hi_c)
        if total(mid) < budget:
            lo_c = mid
        else:
            hi_c = mid
    x = torch.clamp(hi_c * w * n, min=lo, max=cap)  # real-valued targets, sum >= budget (by a hair)
    counts = torch.minimum(torch.floor(x + 1e-9), cap)
    counts = torch.maximum(counts, lo)
    rem = budget - int(counts.sum())
    frac = x - counts
    while rem != 0:
        if rem > 0:
            room = counts < cap
            order = torch.sort(torch.where(room, frac, torch.full_like(frac, -math.inf)), descending=True, stable=True).indices
            step = min(rem, int(room.sum()))
            counts[order[:step]] += 1
            frac[order[:step]] -= 1.0
            rem -= step
        else:
            room = counts > lo
            order = torch.sort(torch.where(room, frac, torch.full_like(frac, math.inf)), stable=True).indices
            step = min(-rem, int(room.sum()))
            counts[order[:step]] -= 1
            frac[order[:step]] += 1.0
            rem += step
    return counts.to(torch.long)


def omnizip_allocate(
    video_tokens_per_block: Tensor,
    audio_retention_per_block: Tensor,
    video_budget: int,
    min_retention: float = 0.0,
    capacity: Tensor | None = None,
) -> Tensor:
    """Per-block video keep counts driven by audio retention, renormalised to ``video_budget``.

    Args:
        video_tokens_per_block: (B,) video tokens of each 2 s block (``2 * N`` for two temporal patches).
        audio_retention_per_block: (B,) kept fraction of each block's audio
            (:func:`audio_block_retention`); all zero means uniform allocation.
        video_budget: total video tokens to keep (e.g. ``num_keep(T * N, r_v)``).
        min_retention: floor on every block's video retention.
        capacity: (B,) optional per-block upper bounds (tokens surviving an earlier stage).

    Returns:
        (B,) long keep counts; blocks with higher audio retention keep proportionally more video,
        ``sum == min(video_budget, sum(capacity))``.

    Raises:
        ValueError: see :func:`allocate_by_weight`.
    """
    return allocate_by_weight(video_tokens_per_block, audio_retention_per_block, video_budget, min_retention, capacity)
