"""Audio token selection for Qwen2.5-Omni: dominant tokens, contextual anchors, anchor merging.

Audio tokens of Qwen2.5-Omni come at 25 per second (one per 40 ms, TMRoPE step 1); a native 2 s block
holds 50. The three parts follow the study notes (OmniZip-style audio compression, Tao et al., "OmniZip:
Audio-Guided Dynamic Token Compression for Fast Omnimodal Large Language Models", 2025, where
"dominant" audio tokens are chosen by audio-encoder attention and the rest is summarised by anchors):

1. :func:`dominant_tokens`: the ``round((1 - rho_a) N)`` tokens that receive the most attention inside
   the audio encoder (``rho_a`` = audio pruning ratio);
2. :func:`contextual_anchors`: the remaining tokens, in time order, are cut into ``num_anchors``
   buckets; each bucket's anchor is the token with the highest mean cosine to the other tokens of its
   bucket (its medoid in cosine terms). ``mode="uniform"`` cuts equal buckets (sizes differ by at most
   one, longer buckets first); ``mode="change"`` (the notes' V5) cuts where consecutive remaining tokens
   change most (largest ``1 - cos``), so buckets follow acoustic events;
3. :func:`anchor_merge`: each anchor absorbs its top-``g`` most similar dropped tokens; the anchor row
   becomes ``sum_j w_j x_j`` over the anchor itself (cosine 1) and the absorbed tokens with
   ``w = softmax(cos / temperature)``. A dropped token may be absorbed by several anchors (each anchor
   chooses independently, as the notes state).

All ties go to the earlier token. Functions return indices and weights; :func:`merge_tokens` is the
caller-side gather that applies a merge.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .dycoke import cosine_matrix, num_keep, stable_topk

__all__ = [
    "received_attention",
    "dominant_tokens",
    "contextual_anchors",
    "AnchorMerge",
    "anchor_merge",
    "merge_tokens",
]


def received_attention(attention: Tensor) -> Tensor:
    """Attention each audio token receives, (N,).

    Args:
        attention: (N,) scores already reduced, or an attention map (..., N, N) with queries on the
            second-to-last and keys on the last axis (e.g. (H, N, N) of an encoder layer, rows summing to
            1); the map is averaged over every leading axis and over queries (column mean).

    Raises:
        ValueError: a map that is not square in its last two axes.
    """
    if attention.dim() == 1:
        return attention.float()
    if attention.shape[-1] != attention.shape[-2]:
        raise ValueError(f"attention map must be (..., N, N), got shape {tuple(attention.shape)}")
    return attention.float().reshape(-1, attention.shape[-2], attention.shape[-1]).mean(dim=(0, 1))


def dominant_tokens(attention: Tensor, pruning_ratio: float) -> Tensor:
    """Dominant audio tokens: the top ``round((1 - pruning_ratio) N)`` by received attention.

    Args:
        attention: (N,) received attention or an (..., N, N) map (see :func:`received_attention`).
        pruning_ratio: ``rho_a`` in ``[0, 1]``, fraction of audio tokens removed.

    Returns:
        (round((1 - rho_a) N),) long, sorted ascending indices (ties: earlier token).

    Raises:
        ValueError: ``pruning_ratio`` outside ``[0, 1]``.
    """
    scores = received_attention(attention)
    count = num_keep(scores.numel(), 1.0 - pruning_ratio) if 0.0 <= pruning_ratio <= 1.0 else -1
    if count < 0:
        raise ValueError(f"pruning_ratio must be in [0, 1], got {pruning_ratio}")
    return torch.sort(stable_topk(scores, count)).values.to(torch.long)


def _bucket_bounds_uniform(m: int, b: int) -> list[int]:
    """Start offsets of ``b`` near-equal buckets over ``m`` items (``numpy.array_split`` sizes)."""
    base, extra = divmod(m, b)
    starts, s = [], 0
    for i in range(b):
        starts.append(s)
        s += base + (1 if i < extra else 0)
    return starts


def _bucket_bounds_change(x: Tensor, b: int) -> list[int]:
    """Start offsets cutting ``x`` (M, D) before the ``b - 1`` largest consecutive changes."""
    m = x.shape[0]
    if b <= 1 or m <= 1:
        return [0]
    xn = torch.nn.functional.normalize(x.float(), dim=-1)
    change = 1.0 - (xn[1:] * xn[:-1]).sum(dim=-1)  # (M-1,), change[t] between items t and t+1
    cuts = stable_topk(change, b - 1) + 1
    return [0] + sorted(int(c) for c in cuts)


def contextual_anchors(tokens: Tensor, candidates: Tensor, num_anchors: int, mode: str = "uniform") -> Tensor:
    """One anchor per time-ordered bucket of the candidate (non-dominant) tokens.

    Args:
        tokens: (N, D) audio tokens.
        candidates: (M,) indices of the remaining tokens (any order; used in time order).
        num_anchors: buckets B, clipped to ``[0, M]``; the study uses ``round(ratio * N)``.
        mode: ``"uniform"`` (equal buckets) or ``"change"`` (cuts at the largest consecutive changes).

    Returns:
        (B,) long, sorted ascending indices into ``tokens``; the anchor of a bucket is its token with the
        highest mean cosine to the bucket's other tokens (a 1-token bucket is its own anchor).

    Raises:
        ValueError: unknown ``mode`` or ``num_anchors < 0``.
    """
    if mode not in ("uniform", "change"):
        raise ValueError(f"mode must be 'uniform' or 'change', got {mode!r}")
    if num_anchors < 0:
        raise ValueError(f"num_anchors must be >= 0, got {num_anchors}")
    cand = torch.sort(candidates.reshape(-1).to(torch.long)).values
    m = cand.numel()
    b = min(num_anchors, m)
    if b == 0:
        return torch.zeros(0, dtype=torch.long)
    x = tokens[cand]
    starts = _bucket_bounds_uniform(m, b) if mode == "uniform" else _bucket_bounds_change(x, b)
    ends = starts[1:] + [m]
    anchors = []
    for s, e in zip(starts, ends):
        size = e - s
        if size == 1:
            anchors.append(int(cand[s]))
            continue
        sim = cosine_matrix(x[s:e])  # (size, size)
        sim = 0.5 * (sim + sim.T)  # exact symmetry, so equal means tie exactly (-> earlier token)
        sim = sim.masked_fill(torch.eye(size, dtype=torch.bool), 0.0)
        mean_other = sim.sum(dim=1) / (size - 1)
        anchors.append(int(cand[s + int(stable_topk(mean_other, 1)[0])]))
    return torch.tensor(sorted(anchors), dtype=torch.long)


@dataclass(frozen=True)
class AnchorMerge:
    """Merge plan for kept anchors: ``merged[a] = sum_j weights[a, j] * tokens[sources[a, j]]``.

    Attributes:
        anchors: (A,) long, sorted indices of the anchor tokens (their positions are the merged rows').
        sources: (A, g + 1) long; column 0 is the anchor itself, columns 1.. the absorbed dropped tokens
            in decreasing similarity; padding (fewer than ``g`` dropped tokens) repeats the anchor.
        weights: (A, g + 1) float32, rows sum to 1, padding weight 0.
    """

    anchors: Tensor
    sources: Tensor
    weights: Tensor


def anchor_merge(
    tokens: Tensor, anchors: Tensor, dropped: Tensor, group_size: int, temperature: float = 1.0
) -> AnchorMerge:
    """Each anchor absorbs its top-``g`` most cosine-similar dropped tokens with softmax(cos) weights.

    Weights are ``softmax([1, cos_1, ..., cos_g] / temperature)`` over the anchor (cosine 1 with itself)
    and its absorbed tokens, so the merged row is a convex combination.

    Args:
        tokens: (N, D) audio tokens.
        anchors: (A,) indices of the anchors.
        dropped: (M,) indices of the dropped tokens the anchors may absorb.
        group_size: g >= 0, tokens absorbed per anchor (fewer if fewer are dropped).
        temperature: softmax temperature (> 0).

    Returns:
        :class:`AnchorMerge` with anchors sorted ascending.

    Raises:
        ValueError: ``group_size < 0`` or ``temperature <= 0``.
    """
    if group_size < 0:
        raise ValueError(f"group_size must be >= 0, got {group_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    anc = torch.sort(anchors.reshape(-1).to(torch.long)).values
    drop = torch.sort(dropped.reshape(-1).to(torch.long)).values
    a, g = anc.numel(), group_size
    sources = anc[:, None].repeat(1, g + 1)  # (A, g+1)
    logits = torch.full((a, g + 1), float("-inf"))
    logits[:, 0] = 1.0
    if a and drop.numel() and g:
        sim = cosine_matrix(tokens[anc], tokens[drop])  # (A, M)
        take = min(g, drop.numel())
        for r in range(a):
            top = stable_topk(sim[r], take)
            sources[r, 1 : take + 1] = drop[top]
            logits[r, 1 : take + 1] = sim[r, top]
    weights = torch.softmax(logits / temperature, dim=1)
    return AnchorMerge(anchors=anc, sources=sources, weights=weights)


def merge_tokens(tokens: Tensor, merge: AnchorMerge) -> Tensor:
    """Caller-side application of a merge plan: (N, D) tokens -> (A, D) merged anchor rows."""
    return (merge.weights.to(tokens.dtype)[..., None] * tokens[merge.sources]).sum(dim=1)
