"""The study's pruning variants as declarative descriptions, and the one function that applies them.

A :class:`Variant` says, per modality, which parts of ``algorithms.pruning`` run and with which settings;
:func:`apply_variant` runs it on one sample at a retention ratio and returns keep indices per modality
(plus the audio merge plan), never gathered tensors. Token layout (Qwen2.5-Omni thinker): video as
(T, N, D) with T temporal patches (2 frames at 2 FPS = 1 s each) of N merged tokens; audio (N_a, D) at 25
tokens/s; native blocks of 2 s = 2 temporal patches = 50 audio tokens. Kept tokens keep their original
TMRoPE positions (gather ``position_ids`` with the same indices).

Registered variants (:data:`VARIANTS`):

======== ================================================ ==============================================
name     video                                            audio
======== ================================================ ==============================================
baseline DyCoke TTM (release) at r_v                      DyCoke TTM (release), 1 s frames of 25 tokens
v1       TTM to r_v**0.5, then DPC-kNN per 2 s block to   as baseline
         exactly round(r_v * T * N)
v2       as baseline                                      dominant tokens, round(r_a * N_a)
v3       as baseline                                      dominant + uniform contextual anchors + merge
v4       as v1                                            as v3
v5       as v1                                            as v3 with change-based anchors
v6       as baseline                                      as v5
======== ================================================ ==============================================

Choices not fixed by the notes, stated here: the TTM stage of v1/v4/v5 takes the share ``r_v ** ttm_share``
(``ttm_share = 0.5``, floored at TTM's minimum 0.25) and density peaks do the rest; anchors take
``anchor_share = 0.25`` of the kept audio budget (dominant tokens the other 0.75), each absorbing
``group_size = 4`` dropped tokens; per-block video budgets are proportional to block size
(``allocation="uniform"``); ``allocation="audio"`` switches to OmniZip-style audio-driven budgets.
DyCoke TTM reaches retention ``r`` with ``K = 4 (1 - r) / 3`` (its formula), so it needs ``r >= 0.25`` and its
exact count is :func:`~algorithms.pruning.dycoke.dycoke_ttm_num_kept`, close to but not exactly ``r``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .audio_anchors import AnchorMerge, anchor_merge, contextual_anchors, received_attention
from .dpc_knn import dpc_knn
from .dycoke import (
    DYCOKE_MIN_RETENTION,
    dycoke_merging_ratio,
    dycoke_ttm,
    num_keep,
    stable_topk,
    window_ttm,
    window_ttm_tokens_per_frame,
)
from .omnizip import allocate_by_weight, audio_block_retention

__all__ = ["VideoSpec", "AudioSpec", "Variant", "VARIANTS", "PruneResult", "apply_variant", "get_variant",
           "retention_floor"]

TTM_METHODS = ("none", "dycoke", "window")
AUDIO_METHODS = ("none", "dycoke", "window", "dominant", "dominant_anchor_merge")


@dataclass(frozen=True)
class VideoSpec:
    """Video side of a variant.

    Attributes:
        ttm: ``"dycoke"`` (release), ``"window"`` (our variant) or ``"none"``.
        select: ``"none"`` (TTM alone sets the retention) or ``"dpc_knn"`` (density peaks per 2 s block on
            the TTM survivors, to exactly ``round(r_v * T * N)`` when enough survive).
        allocation: per-block budgets for the selection: ``"uniform"`` (proportional to block size) or
            ``"audio"`` (OmniZip: proportional to the block's kept audio fraction).
        ttm_share: with a selection stage, TTM runs at ``max(r_v ** ttm_share, 0.25)``.
        dpc_k: neighbours of the DPC-kNN density.
    """

    ttm: str = "dycoke"
    select: str = "none"
    allocation: str = "uniform"
    ttm_share: float = 0.5
    dpc_k: int = 5

    def __post_init__(self) -> None:
        if self.ttm not in TTM_METHODS:
            raise ValueError(f"video ttm must be one of {TTM_METHODS}, got {self.ttm!r}")
        if self.select not in ("none", "dpc_knn"):
            raise ValueError(f"video select must be 'none' or 'dpc_knn', got {self.select!r}")
        if self.allocation not in ("uniform", "audio"):
            raise ValueError(f"allocation must be 'uniform' or 'audio', got {self.allocation!r}")
        if self.allocation == "audio" and self.select == "none":
            raise ValueError("allocation='audio' needs a selection stage (select='dpc_knn')")


@dataclass(frozen=True)
class AudioSpec:
    """Audio side of a variant.

    Attributes:
        method: ``"dycoke"`` / ``"window"`` (TTM over 1 s audio frames), ``"dominant"``,
            ``"dominant_anchor_merge"`` or ``"none"``.
        anchor_mode: ``"uniform"`` buckets or ``"change"`` (V5) for the contextual anchors.
        anchor_share: fraction of the kept audio tokens that are anchors.
        group_size: dropped tokens each anchor absorbs (softmax(cos) weights).
        temperature: softmax temperature of the merge weights.
        frame_tokens: audio tokens per TTM frame (25 = 1 s).
    """

    method: str = "dycoke"
    anchor_mode: str = "uniform"
    anchor_share: float = 0.25
    group_size: int = 4
    temperature: float = 1.0
    frame_tokens: int = 25

    def __post_init__(self) -> None:
        if self.method not in AUDIO_METHODS:
            raise ValueError(f"audio method must be one of {AUDIO_METHODS}, got {self.method!r}")
        if self.anchor_mode not in ("uniform", "change"):
            raise ValueError(f"anchor_mode must be 'uniform' or 'change', got {self.anchor_mode!r}")
        if not 0.0 <= self.anchor_share <= 1.0:
            raise ValueError(f"anchor_share must be in [0, 1], got {self.anchor_share}")


@dataclass(frozen=True)
class Variant:
    """A named composition of pruning parts per modality (pure description, no state)."""

    name: str
    video: VideoSpec = field(default_factory=VideoSpec)
    audio: AudioSpec = field(default_factory=AudioSpec)
    description: str = ""


_V1_VIDEO = VideoSpec(ttm="dycoke", select="dpc_knn")
_V3_AUDIO = AudioSpec(method="dominant_anchor_merge", anchor_mode="uniform")
_V5_AUDIO = AudioSpec(method="dominant_anchor_merge", anchor_mode="change")

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("baseline", VideoSpec(), AudioSpec(), "DyCoke TTM on video and audio"),
        Variant("v1", _V1_VIDEO, AudioSpec(), "TTM + density peaks on video"),
        Variant("v2", VideoSpec(), AudioSpec(method="dominant"), "audio dominant tokens"),
        Variant("v3", VideoSpec(), _V3_AUDIO, "audio dominant + contextual anchors + merge"),
        Variant("v4", _V1_VIDEO, _V3_AUDIO, "V3 audio + V1 video"),
        Variant("v5", _V1_VIDEO, _V5_AUDIO, "V4 with change-based anchors"),
        Variant("v6", VideoSpec(), _V5_AUDIO, "V5 audio + baseline video"),
    )
}


def get_variant(name: str) -> Variant:
    """The registered variant ``name``. Raises ``KeyError`` listing the known names."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise KeyError(f"unknown variant {name!r}; known: {sorted(VARIANTS)}") from None


def retention_floor(variant: Variant | str) -> tuple[float, float]:
    """Lowest ``(video, audio)`` retention ``variant`` can reach: 0.25 where DyCoke TTM alone sets a modality's
    count (its ``K = 4 (1 - r) / 3``), else 0. A selection stage after TTM (v1/v4/v5 video) reaches any ratio,
    since its TTM runs at ``max(r ** ttm_share, 0.25)``.

    Raises:
        KeyError: unknown variant name.
    """
    v = get_variant(variant) if isinstance(variant, str) else variant
    video = DYCOKE_MIN_RETENTION if (v.video.ttm == "dycoke" and v.video.select == "none") else 0.0
    audio = DYCOKE_MIN_RETENTION if v.audio.method == "dycoke" else 0.0
    return video, audio


@dataclass(frozen=True)
class PruneResult:
    """Keep indices per modality.

    Attributes:
        video_keep: (K_v,) long, sorted indices into the flattened (T * N) video tokens.
        audio_keep: (K_a,) long, sorted indices into the N_a audio tokens.
        audio_merge: merge plan of the audio anchors (rows at ``audio_merge.anchors`` become
            ``merge_tokens(...)``), or ``None``.
        video_block_counts: (B,) long per-2 s-block video keep counts of the selection stage, or ``None``.
    """

    video_keep: Tensor
    audio_keep: Tensor
    audio_merge: AnchorMerge | None = None
    video_block_counts: Tensor | None = None

    @property
    def num_video(self) -> int:
        return int(self.video_keep.numel())

    @property
    def num_audio(self) -> int:
        return int(self.audio_keep.numel())


def _ttm_frames(tokens: Tensor, frame_tokens: int, retention: float, method: str) -> Tensor:
    """TTM over a flat (L, D) stream cut into frames of ``frame_tokens``; keep indices into L."""
    length = tokens.shape[0]
    if method == "none" or retention >= 1.0:
        return torch.arange(length)
    num_frames = length // frame_tokens
    if num_frames < 2:  # nothing to merge across time
        return torch.arange(length)
    if method == "dycoke":
        return dycoke_ttm(tokens, frame_tokens, dycoke_merging_ratio(retention))
    k = window_ttm_tokens_per_frame(frame_tokens, retention)
    body = window_ttm(tokens[: num_frames * frame_tokens].reshape(num_frames, frame_tokens, -1), k)
    tail = torch.arange(num_frames * frame_tokens, length)  # partial last frame kept whole
    return torch.cat([body, tail])


def _audio(spec: AudioSpec, tokens: Tensor, attention: Tensor | None, r_a: float) -> tuple[Tensor, AnchorMerge | None]:
    n_a = tokens.shape[0]
    if spec.method in ("none", "dycoke", "window"):
        return _ttm_frames(tokens, spec.frame_tokens, r_a, spec.method), None
    if attention is None:
        raise ValueError(f"audio method {spec.method!r} needs the audio encoder attention")
    scores = received_attention(attention)
    if scores.numel() != n_a:
        raise ValueError(f"audio attention covers {scores.numel()} tokens, audio has {n_a}")
    n_keep = num_keep(n_a, r_a)
    if spec.method == "dominant":
        return torch.sort(stable_topk(scores, n_keep)).values, None
    n_anchor = num_keep(n_keep, spec.anchor_share)
    dominant = stable_topk(scores, n_keep - n_anchor)
    is_dom = torch.zeros(n_a, dtype=torch.bool)
    is_dom[dominant] = True
    rest = torch.nonzero(~is_dom).flatten()
    anchors = contextual_anchors(tokens, rest, n_anchor, spec.anchor_mode)
    is_anchor = torch.zeros(n_a, dtype=torch.bool)
    is_anchor[anchors] = True
    dropped = torch.nonzero(~is_dom & ~is_anchor).flatten()
    merge = anchor_merge(tokens, anchors, dropped, spec.group_size, spec.temperature)
    return torch.sort(torch.cat([dominant, anchors])).values, merge


def _video(
    spec: VideoSpec, tokens: Tensor, r_v: float, audio_keep: Tensor, num_audio: int, patches_per_block: int,
    audio_tokens_per_block: int,
) -> tuple[Tensor, Tensor | None]:
    t, n, d = tokens.shape
    flat = tokens.reshape(t * n, d)
    if spec.select == "none":
        return _ttm_frames(flat, n, r_v, spec.ttm), None
    q = 1.0 if spec.ttm == "none" else min(1.0, max(r_v**spec.ttm_share, DYCOKE_MIN_RETENTION))
    survivors = _ttm_frames(flat, n, q, spec.ttm)  # sorted
    block = survivors // n // patches_per_block
    num_blocks = -(-t // patches_per_block)
    sizes = torch.bincount(torch.arange(t * n) // n // patches_per_block, minlength=num_blocks)
    capacity = torch.bincount(block, minlength=num_blocks)
    if spec.allocation == "audio":
        weights = audio_block_retention(audio_keep, num_audio, audio_tokens_per_block, num_blocks)
    else:
        weights = torch.ones(num_blocks, dtype=torch.float64)
    counts = allocate_by_weight(sizes, weights, num_keep(t * n, r_v), capacity=capacity)
    kept = []
    for b in range(num_blocks):
        pool = survivors[block == b]
        kept.append(pool[dpc_knn(flat[pool], int(counts[b]), spec.dpc_k)])
    return torch.sort(torch.cat(kept)).values, counts


def apply_variant(
    variant: Variant | str,
    video_tokens: Tensor,
    audio_tokens: Tensor,
    audio_attention: Tensor | None,
    retention: float | tuple[float, float],
    patches_per_block: int = 2,
    audio_tokens_per_block: int = 50,
) -> PruneResult:
    """Apply a variant to one sample and return keep indices per modality.

    Args:
        variant: a :class:`Variant` or a registered name (``baseline``, ``v1`` ... ``v6``).
        video_tokens: (T, N, D) video tokens, T temporal patches (1 s each at 2 FPS) of N tokens.
        audio_tokens: (N_a, D) audio tokens at 25 per second.
        audio_attention: (N_a,) received attention or an (..., N_a, N_a) audio-encoder attention map;
            needed by the dominant-token methods, else may be ``None``.
        retention: one ratio for both modalities or ``(r_video, r_audio)``, each in ``[0, 1]``.
        patches_per_block: temporal patches per native 2 s block (2).
        audio_tokens_per_block: audio tokens per native 2 s block (50).

    Returns:
        :class:`PruneResult`. Kept counts: selection stages keep exactly ``round(r * tokens)`` per
        modality; TTM-only stages keep their formula's count (DyCoke: ``dycoke_ttm_num_kept``).

    Raises:
        ValueError: bad shapes or retention, DyCoke TTM below retention 0.25, missing attention.
        KeyError: unknown variant name.
    """
    v = get_variant(variant) if isinstance(variant, str) else variant
    r_v, r_a = (retention, retention) if isinstance(retention, (int, float)) else retention
    for r in (r_v, r_a):
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"retention must be in [0, 1], got {retention}")
    if video_tokens.dim() != 3:
        raise ValueError(f"video_tokens must be (T, N, D), got shape {tuple(video_tokens.shape)}")
    if audio_tokens.dim() != 2:
        raise ValueError(f"audio_tokens must be (N_a, D), got shape {tuple(audio_tokens.shape)}")
    audio_keep, merge = _audio(v.audio, audio_tokens, audio_attention, float(r_a))
    video_keep, counts = _video(
        v.video, video_tokens, float(r_v), audio_keep, audio_tokens.shape[0], patches_per_block, audio_tokens_per_block
    )
    return PruneResult(video_keep.to(torch.long), audio_keep.to(torch.long), merge, counts)
