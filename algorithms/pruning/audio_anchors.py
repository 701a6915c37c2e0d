"""Audio token selection for Qwen2.5-Omni: dominant tokens, contextual anchors, anchor merging.

Audio tokens of Qwen2.5-Omni come at 25 per second (one per 40 ms, TMRoPE step 1); a native 2 s block
holds 50. The three parts follow the study notes (OmniZip-style audio compression, Tao et al., "OmniZip:
Audio-Guided Dynamic Token Compression for Fast Omnimodal Large Language Models", 2025, where
"dominant" audio tokens are chosen by audio-encoder attention and the rest is summarised by anchors):

1. :func:`dominant_tokens`: seed 003, "dominant_num = round((1 - rho_audio) * N)" (Python's ``round``), the tokens
   that receive the most attention inside the audio encoder (``rho_a`` = audio pruning ratio);
2. :func:`contextual_anchors`: seed 003, "在剩余 token 上按时间顺序分成 contextual_num = round(contextual_ratio * N)
   个桶；每个桶内用桶内平均相似度最大，选一个代表 token 作为 anchor". ``mode="uniform"`` (V3) cuts the remaining
   tokens, in time order, into equal buckets (sizes differ by at most one, longer buckets first) and takes each
   bucket's token with the highest mean cosine to the bucket's other tokens; ``mode="change"`` (V5, "音频非关键锚点
   选择变化大的作为 anchor") takes the remaining tokens that change most (largest ``1 - cos`` to the previous audio
   token); ``mode="change_buckets"`` is this package's earlier V5 (bucket medoids between the largest changes);
3. :func:`anchor_merge`: seed 003, "每个 Contextual anchor 选 top-g 个与该 Contextual anchor 最相似的 token 做 merge；
   合并权重 w = softmax(cos(token, anchor))，将被合并 token 的信息注入 anchor embedding，被合并 token 本身不保留":
   ``w`` is the softmax over the top-g cosines only; "inject into the anchor embedding" is read as OmniZip's own
   merge (``KD-TAO/OmniZip@66ef5d7f2b7201841505bb45ef6b5b4c5bf99ca8:omnizip/omnizip_core.py:omnizip``,
   ``new_anchor = (anchor_vec + merged_vec) / (1.0 + w.sum())``): ``(x_a + sum_j w_j x_j) / (1 + sum_j w_j)``,
   i.e. the mean of the anchor and the weighted merged tokens (``merge="omnizip"``, default). ``merge="convex"``
   keeps this package's earlier form ``softmax([1, cos_1, ..., cos_g])`` over anchor and merged tokens. A dropped
   token may be absorbed by several anchors (each anchor chooses independently, as the seed states).

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
    "dominant_num",
    "contextual_num",
    "change_scores",
    "ANCHOR_MODES",
    "MERGE_MODES",
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


def dominant_tokens(attention: Tensor, pruning_ratio: float, rounding: str = "python") -> Tensor:
    """Dominant audio tokens: the top ``dominant_num = round((1 - pruning_ratio) N)`` by received attention.

    Seed 003 (V2): "用音频编码器返回的 attn_logits 做 top-k，dominant_num = round((1 - rho_audio) * N)，直接置 keep=True"
    (top-k of the attn_logits the audio encoder returns; those tokens are kept). Which reduction of the encoder's
    attention ``attention`` holds is the caller's (``models/omni/qa.py``, docs/deviations.md).

    Args:
        attention: (N,) received attention or an (..., N, N) map (see :func:`received_attention`).
        pruning_ratio: ``rho_a`` in ``[0, 1]``, fraction of audio tokens removed.

    Returns:
        (dominant_num,) long, sorted ascending indices (ties: earlier token).

    Raises:
        ValueError: ``pruning_ratio`` outside ``[0, 1]`` or an unknown ``rounding``.
    """
    scores = received_attention(attention)
    if not 0.0 <= pruning_ratio <= 1.0:
        raise ValueError(f"pruning_ratio must be in [0, 1], got {pruning_ratio}")
    count = dominant_num(scores.numel(), pruning_ratio, rounding)
    return torch.sort(stable_topk(scores, count)).values.to(torch.long)


def dominant_num(num_tokens: int, pruning_ratio: float, rounding: str = "python") -> int:
    """Seed 003: ``dominant_num = round((1 - rho_audio) * N)``, Python's ``round`` (``rounding="half_up"``: the
    earlier half-up count). ``N = 25, rho = 0.5`` gives 12 (half-up: 13).

    Raises:
        ValueError: ``pruning_ratio`` outside ``[0, 1]`` or an unknown ``rounding``.
    """
    if not 0.0 <= pruning_ratio <= 1.0:
        raise ValueError(f"pruning_ratio must be in [0, 1], got {pruning_ratio}")
    return num_keep(num_tokens, 1.0 - pruning_ratio, rounding)


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


ANCHOR_MODES = ("uniform", "change", "change_buckets")
MERGE_MODES = ("omnizip", "convex")


def contextual_num(num_tokens: int, contextual_ratio: float, rounding: str = "python") -> int:
    """Seed 003: ``contextual_num = round(contextual_ratio * N)`` (``N`` = all audio tokens), Python's ``round``.

    Raises:
        ValueError: ``contextual_ratio`` outside ``[0, 1]`` or an unknown ``rounding``.
    """
    return num_keep(num_tokens, contextual_ratio, rounding)


def change_scores(tokens: Tensor) -> Tensor:
    """(N,) float32 change of each audio token: ``1 - cos(x_t, x_{t-1})`` with its previous token in time;
    token 0 (no previous token) gets 0."""
    n = tokens.shape[0]
    out = torch.zeros(n)
    if n > 1:
        xn = torch.nn.functional.normalize(tokens.float(), dim=-1)
        out[1:] = 1.0 - (xn[1:] * xn[:-1]).sum(dim=-1)
    return out


def contextual_anchors(tokens: Tensor, candidates: Tensor, num_anchors: int, mode: str = "uniform") -> Tensor:
    """Contextual anchors among the candidate (non-dominant) tokens.

    * ``"uniform"`` (V3): the candidates, in time order, are cut into ``B`` near-equal buckets (``numpy.array_split``
      sizes: the seed's "在剩余 token 上按时间顺序分成 contextual_num ... 个桶" gives no sizes); each bucket's anchor is its
      token ``i* = argmax_i rep(i)``, ``rep(i) = 1/(m-1) sum_{j != i} cos(x_i, x_j)`` (seed 003: "选择 rep(i) 最大的那个
      token 作为 anchor"; a 1-token bucket, where ``rep`` is undefined, is its own anchor);
    * ``"change"`` (V5): the ``B`` candidates with the largest :func:`change_scores` ("变化大的作为 anchor");
    * ``"change_buckets"``: this package's earlier V5: buckets cut before the ``B - 1`` largest changes between
      consecutive candidates, anchors as in ``"uniform"``.

    Args:
        tokens: (N, D) audio tokens.
        candidates: (M,) indices of the remaining tokens (any order; used in time order).
        num_anchors: B, clipped to ``[0, M]``; the seed's ``contextual_num``.
        mode: one of :data:`ANCHOR_MODES`.

    Returns:
        (B,) long, sorted ascending indices into ``tokens``. Ties go to the earlier token.

    Raises:
        ValueError: unknown ``mode`` or ``num_anchors < 0``.
    """
    if mode not in ANCHOR_MODES:
        raise ValueError(f"mode must be one of {ANCHOR_MODES}, got {mode!r}")
    if num_anchors < 0:
        raise ValueError(f"num_anchors must be >= 0, got {num_anchors}")
    cand = torch.sort(candidates.reshape(-1).to(torch.long)).values
    m = cand.numel()
    b = min(num_anchors, m)
    if b == 0:
        return torch.zeros(0, dtype=torch.long)
    if mode == "change":
        return torch.sort(cand[stable_topk(change_scores(tokens)[cand], b)]).values
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
        weights: (A, g + 1) float32, rows sum to 1, padding weight 0. With ``merge="omnizip"`` column 0 is
            ``1 / (1 + sum w)`` and column ``j`` is ``w_j / (1 + sum w)``, ``w = softmax(cos)`` over the absorbed.
        merge_weights: (A, g) float32, the seed's ``w = softmax(cos(token, anchor))`` over each anchor's absorbed
            tokens (padding 0; a row without absorbed tokens is all 0).
    """

    anchors: Tensor
    sources: Tensor
    weights: Tensor
    merge_weights: Tensor | None = None


def anchor_merge(
    tokens: Tensor, anchors: Tensor, dropped: Tensor, group_size: int, temperature: float = 1.0,
    merge: str = "omnizip",
) -> AnchorMerge:
    """Each anchor absorbs its top-``g`` most cosine-similar dropped tokens (seed 003, V3 "合并（aa-only）").

    ``w = softmax(cos(token, anchor) / temperature)`` over the absorbed tokens, and the anchor row becomes
    ``(x_a + sum_j w_j x_j) / (1 + sum_j w_j)`` (``merge="omnizip"``, OmniZip's ``new_anchor``; an anchor with
    nothing to absorb stays ``x_a``); ``merge="convex"``: ``softmax([1, cos_1, ..., cos_g] / temperature)`` over
    the anchor (cosine 1 with itself) and its absorbed tokens (this package's earlier form).

    Args:
        tokens: (N, D) audio tokens.
        anchors: (A,) indices of the anchors.
        dropped: (M,) indices of the dropped tokens the anchors may absorb.
        group_size: g >= 0, tokens absorbed per anchor (fewer if fewer are dropped).
        temperature: softmax temperature (> 0; the seed's is 1).
        merge: one of :data:`MERGE_MODES`.

    Returns:
        :class:`AnchorMerge` with anchors sorted ascending.

    Raises:
        ValueError: ``group_size < 0``, ``temperature <= 0`` or an unknown ``merge``.
    """
    if group_size < 0:
        raise ValueError(f"group_size must be >= 0, got {group_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if merge not in MERGE_MODES:
        raise ValueError(f"merge must be one of {MERGE_MODES}, got {merge!r}")
    anc = torch.sort(anchors.reshape(-1).to(torch.long)).values
    drop = torch.sort(dropped.reshape(-1).to(torch.long)).values
    a, g = anc.numel(), group_size
    sources = anc[:, None].repeat(1, g + 1)  # (A, g+1)
    cos = torch.full((a, g), float("-inf"))  # (A, g) cosines of the absorbed, -inf padding
    if a and drop.numel() and g:
        sim = cosine_matrix(tokens[anc], tokens[drop])  # (A, M)
        take = min(g, drop.numel())
        for r in range(a):
            top = stable_topk(sim[r], take)
            sources[r, 1 : take + 1] = drop[top]
            cos[r, :take] = sim[r, top]
    w = torch.nan_to_num(torch.softmax(cos / temperature, dim=1), nan=0.0)  # all -inf rows (nothing absorbed): 0
    if merge == "omnizip":
        denom = 1.0 + w.sum(dim=1, keepdim=True)  # (A, 1)
        weights = torch.cat([1.0 / denom, w / denom], dim=1)
    else:
        logits = torch.cat([torch.ones(a, 1), cos], dim=1)
        weights = torch.softmax(logits / temperature, dim=1)
    return AnchorMerge(anchors=anc, sources=sources, weights=weights, merge_weights=w)


def merge_tokens(tokens: Tensor, merge: AnchorMerge) -> Tensor:
    """Caller-side application of a merge plan: (N, D) tokens -> (A, D) merged anchor rows."""
    return (merge.weights.to(tokens.dtype)[..., None] * tokens[merge.sources]).sum(dim=1)
