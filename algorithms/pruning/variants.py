"""The study's pruning variants as declarative descriptions, and the one function that applies them.

A :class:`Variant` says, per modality, which parts of ``algorithms.pruning`` run and with which settings;
:func:`apply_variant` runs it on one sample at a retention ratio and returns keep indices per modality
(plus the audio merge plan), never gathered tensors. Token layout (Qwen2.5-Omni thinker): video as
(T, N, D) with T temporal patches of N merged tokens; audio (N_a, D) at 25 tokens/s; native blocks of 2 s =
50 audio tokens. Kept tokens keep their original TMRoPE positions (gather ``position_ids`` with the same indices).

Registered variants (:data:`VARIANTS`), as seed 003 builds them:

======== ================================================ ==============================================
name     video                                            audio
======== ================================================ ==============================================
baseline DyCoke TTM (current release) at r_v              DyCoke TTM, 1 s frames of 25 tokens
v1       DyCoke step 1, then DPC-kNN on each window's     as baseline
         odd group (frames 1, 3), baseline's count
v2       as baseline                                      dominant tokens, round((1 - rho_a) N)
v3       as baseline                                      dominant + round(contextual_ratio N) uniform-bucket
                                                          anchors + top-g softmax(cos) merge
v4       as v1                                            as v3
v5       as v1                                            as v3, anchors = highest-change tokens
v6       as baseline                                      as v5
======== ================================================ ==============================================

Seed 003 lines followed: baseline "奇数帧全保留；偶数帧按与前一帧逐位置余弦相似度，保留最不相似的 k 个 token。对每 4 帧中
的第 3 帧（索引 i+2 ），再按与第 1 帧（索引 i ）逐位置余弦相似度，保留最不相似的 k 个 token" (DyCoke's TTM, "同时用在 V/A
上"); V1 "第二步，对于奇数组，1，3 ... selected = topk(score, num_keep)"; V2 "dominant_num = round((1 - rho_audio) *
N)，直接置 keep=True"; V3 "contextual_num = round(contextual_ratio * N) 个桶" on top of the dominant tokens; V4
"Version 3，但是视觉和 Version 1 一样"; V5 "Version 4, 但是音频非关键锚点选择变化大的作为 anchor"; V6 "Version 5，但是视觉和
baseline(DyCoke) 一样".

Choices the seed leaves open, stated here: the audio pruning ratio is ``rho_a = 1 - r_a``; ``contextual_ratio =
0.05`` and ``g = 3`` are OmniZip's defaults (``KD-TAO/OmniZip@66ef5d7:omnizip/omnizip_core.py:omnizip``), so V3-V6
keep ``round(r_a N) + round(0.05 N)`` audio tokens; V1's ``num_keep`` per odd group is the baseline's count for that
group (:func:`~algorithms.pruning.dpc_knn.dycoke_dpc_knn`). DyCoke TTM reaches nominal retention ``r`` with
``K = 4 (1 - r) / 3`` (its formula), so it needs ``r >= 0.25``; its exact count is
:func:`~algorithms.pruning.dycoke.dycoke_ttm_num_kept`, which can be well above ``r`` on short clips (0.583 at
``r = 0.5`` for 8 frames): callers report the reached retention.

Earlier behaviours kept as settings: ``VideoSpec(select="dpc_knn_blocks")`` (TTM at ``r ** ttm_share``, then
DPC-kNN per 2 s block to exactly ``round(r T N)``, optionally with OmniZip-style audio-driven block budgets),
``AudioSpec(anchor_count="share")`` (anchors take ``anchor_share`` of one ``round(r_a N)`` budget),
``anchor_mode="change_buckets"``, ``merge="convex"``, ``rounding="half_up"``, ``pair_indexing="first_commit"``,
``dpc_ties="index"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .audio_anchors import (ANCHOR_MODES, MERGE_MODES, AnchorMerge, anchor_merge, contextual_anchors, contextual_num,
                            dominant_num, received_attention)
from .dpc_knn import DENSITY_TIES, dpc_knn, dycoke_dpc_knn
from .dycoke import (
    DYCOKE_MIN_RETENTION,
    PAIR_INDEXINGS,
    ROUNDINGS,
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
SELECT_METHODS = ("none", "dpc_knn_odd", "dpc_knn_blocks")
AUDIO_METHODS = ("none", "dycoke", "window", "dominant", "dominant_anchor_merge")
ANCHOR_COUNTS = ("ratio", "share")


@dataclass(frozen=True)
class VideoSpec:
    """Video side of a variant.

    Attributes:
        ttm: ``"dycoke"`` (release), ``"window"`` (our variant) or ``"none"``.
        select: ``"none"`` (TTM alone sets the retention), ``"dpc_knn_odd"`` (seed 003 V1: DyCoke step 1, then
            DPC-kNN on each 4-frame window's odd group; needs ``ttm="dycoke"``) or ``"dpc_knn_blocks"`` (earlier V1:
            density peaks per 2 s block on the TTM survivors, to exactly ``round(r_v * T * N)`` when enough survive).
        allocation: per-block budgets of ``dpc_knn_blocks``: ``"uniform"`` (proportional to block size) or
            ``"audio"`` (OmniZip: proportional to the block's kept audio fraction).
        ttm_share: with ``dpc_knn_blocks``, TTM runs at ``max(r_v ** ttm_share, 0.25)``.
        dpc_k: neighbours of the DPC-kNN density.
        pair_indexing: DyCoke's pair index, ``"release"`` (current release, ``i // 2``) or ``"first_commit"``.
        rounding: ``round`` of the ``dpc_knn_blocks`` budget (``"python"`` or ``"half_up"``).
        dpc_ties: density ties of DPC-kNN, ``"seed"`` (strictly higher rho) or ``"index"`` (earlier).
    """

    ttm: str = "dycoke"
    select: str = "none"
    allocation: str = "uniform"
    ttm_share: float = 0.5
    dpc_k: int = 5
    pair_indexing: str = "release"
    rounding: str = "python"
    dpc_ties: str = "seed"

    def __post_init__(self) -> None:
        if self.dpc_ties not in DENSITY_TIES:
            raise ValueError(f"dpc_ties must be one of {DENSITY_TIES}, got {self.dpc_ties!r}")
        if self.ttm not in TTM_METHODS:
            raise ValueError(f"video ttm must be one of {TTM_METHODS}, got {self.ttm!r}")
        if self.select not in SELECT_METHODS:
            raise ValueError(f"video select must be one of {SELECT_METHODS}, got {self.select!r}")
        if self.select == "dpc_knn_odd" and self.ttm != "dycoke":
            raise ValueError("video select='dpc_knn_odd' (seed 003 V1) runs on DyCoke's step 1: needs ttm='dycoke'")
        if self.allocation not in ("uniform", "audio"):
            raise ValueError(f"allocation must be 'uniform' or 'audio', got {self.allocation!r}")
        if self.allocation == "audio" and self.select != "dpc_knn_blocks":
            raise ValueError("allocation='audio' needs the per-block selection stage (select='dpc_knn_blocks')")
        if self.pair_indexing not in PAIR_INDEXINGS:
            raise ValueError(f"pair_indexing must be one of {PAIR_INDEXINGS}, got {self.pair_indexing!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")


@dataclass(frozen=True)
class AudioSpec:
    """Audio side of a variant.

    Attributes:
        method: ``"dycoke"`` / ``"window"`` (TTM over 1 s audio frames), ``"dominant"``,
            ``"dominant_anchor_merge"`` or ``"none"``.
        anchor_mode: ``"uniform"`` (V3), ``"change"`` (V5) or ``"change_buckets"`` (earlier V5).
        anchor_count: ``"ratio"`` (seed: ``round(contextual_ratio * N)`` anchors on top of the dominant tokens) or
            ``"share"`` (earlier: ``anchor_share`` of one ``round(r_a * N)`` budget).
        contextual_ratio: the seed's ``contextual_ratio`` (0.05, OmniZip's default).
        anchor_share: with ``anchor_count="share"``, the anchors' fraction of the kept audio tokens.
        group_size: g, dropped tokens each anchor absorbs (3, OmniZip's default).
        temperature: softmax temperature of the merge weights.
        merge: ``"omnizip"`` (``(x_a + sum w x) / (1 + sum w)``) or ``"convex"`` (earlier).
        rounding: ``round`` of the counts (``"python"``, the seed's, or ``"half_up"``).
        frame_tokens: audio tokens per TTM frame (25 = 1 s).
        pair_indexing: DyCoke's pair index of the audio TTM.
    """

    method: str = "dycoke"
    anchor_mode: str = "uniform"
    anchor_count: str = "ratio"
    contextual_ratio: float = 0.05
    anchor_share: float = 0.25
    group_size: int = 3
    temperature: float = 1.0
    merge: str = "omnizip"
    rounding: str = "python"
    frame_tokens: int = 25
    pair_indexing: str = "release"

    def __post_init__(self) -> None:
        if self.method not in AUDIO_METHODS:
            raise ValueError(f"audio method must be one of {AUDIO_METHODS}, got {self.method!r}")
        if self.anchor_mode not in ANCHOR_MODES:
            raise ValueError(f"anchor_mode must be one of {ANCHOR_MODES}, got {self.anchor_mode!r}")
        if self.anchor_count not in ANCHOR_COUNTS:
            raise ValueError(f"anchor_count must be one of {ANCHOR_COUNTS}, got {self.anchor_count!r}")
        for name in ("contextual_ratio", "anchor_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.merge not in MERGE_MODES:
            raise ValueError(f"merge must be one of {MERGE_MODES}, got {self.merge!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        if self.pair_indexing not in PAIR_INDEXINGS:
            raise ValueError(f"pair_indexing must be one of {PAIR_INDEXINGS}, got {self.pair_indexing!r}")


@dataclass(frozen=True)
class Variant:
    """A named composition of pruning parts per modality (pure description, no state)."""

    name: str
    video: VideoSpec = field(default_factory=VideoSpec)
    audio: AudioSpec = field(default_factory=AudioSpec)
    description: str = ""


_V1_VIDEO = VideoSpec(ttm="dycoke", select="dpc_knn_odd")
_V3_AUDIO = AudioSpec(method="dominant_anchor_merge", anchor_mode="uniform")
_V5_AUDIO = AudioSpec(method="dominant_anchor_merge", anchor_mode="change")

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("baseline", VideoSpec(), AudioSpec(), "DyCoke TTM on video and audio"),
        Variant("v1", _V1_VIDEO, AudioSpec(), "DyCoke step 1 + density peaks on the odd frames"),
        Variant("v2", VideoSpec(), AudioSpec(method="dominant"), "audio dominant tokens"),
        Variant("v3", VideoSpec(), _V3_AUDIO, "audio dominant + contextual anchors + merge"),
        Variant("v4", _V1_VIDEO, _V3_AUDIO, "V3 audio + V1 video"),
        Variant("v5", _V1_VIDEO, _V5_AUDIO, "V4 with high-change anchors"),
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
    """Lowest ``(video, audio)`` retention ``variant`` can reach: 0.25 where DyCoke's count sets a modality's count
    (its ``K = 4 (1 - r) / 3``; V1's odd-group selection keeps the baseline's count too), else 0. The per-block
    selection ``dpc_knn_blocks`` reaches any ratio, since its TTM runs at ``max(r ** ttm_share, 0.25)``.

    Raises:
        KeyError: unknown variant name.
    """
    v = get_variant(variant) if isinstance(variant, str) else variant
    video = DYCOKE_MIN_RETENTION if (v.video.ttm == "dycoke" and v.video.select != "dpc_knn_blocks") else 0.0
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
        video_block_counts: (B,) long per-2 s-block video keep counts of ``dpc_knn_blocks``, or ``None``.
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


def _ttm_frames(tokens: Tensor, frame_tokens: int, retention: float, method: str,
                pair_indexing: str = "release") -> Tensor:
    """TTM over a flat (L, D) stream cut into frames of ``frame_tokens``; sorted keep indices into L."""
    length = tokens.shape[0]
    if method == "none" or retention >= 1.0:
        return torch.arange(length)
    num_frames = length // frame_tokens
    if num_frames < 2:  # nothing to merge across time
        return torch.arange(length)
    if method == "dycoke":
        return dycoke_ttm(tokens, frame_tokens, dycoke_merging_ratio(retention), pair_indexing, order="time")
    k = window_ttm_tokens_per_frame(frame_tokens, retention)
    body = window_ttm(tokens[: num_frames * frame_tokens].reshape(num_frames, frame_tokens, -1), k)
    tail = torch.arange(num_frames * frame_tokens, length)  # partial last frame kept whole
    return torch.cat([body, tail])


def _audio(spec: AudioSpec, tokens: Tensor, attention: Tensor | None, r_a: float) -> tuple[Tensor, AnchorMerge | None]:
    n_a = tokens.shape[0]
    if spec.method in ("none", "dycoke", "window"):
        return _ttm_frames(tokens, spec.frame_tokens, r_a, spec.method, spec.pair_indexing), None
    if attention is None:
        raise ValueError(f"audio method {spec.method!r} needs the audio encoder attention")
    scores = received_attention(attention)
    if scores.numel() != n_a:
        raise ValueError(f"audio attention covers {scores.numel()} tokens, audio has {n_a}")
    rho_a = 1.0 - r_a  # the seed's audio pruning ratio
    if spec.method == "dominant":
        return torch.sort(stable_topk(scores, dominant_num(n_a, rho_a, spec.rounding))).values, None
    if spec.anchor_count == "ratio":  # seed: dominant_num dominant tokens + contextual_num anchors on top
        n_dominant = dominant_num(n_a, rho_a, spec.rounding)
        n_anchor = contextual_num(n_a, spec.contextual_ratio, spec.rounding)
    else:  # earlier: one budget split between dominant tokens and anchors
        n_keep = num_keep(n_a, r_a, spec.rounding)
        n_anchor = num_keep(n_keep, spec.anchor_share, spec.rounding)
        n_dominant = n_keep - n_anchor
    dominant = stable_topk(scores, n_dominant)
    is_dom = torch.zeros(n_a, dtype=torch.bool)
    is_dom[dominant] = True
    rest = torch.nonzero(~is_dom).flatten()
    anchors = contextual_anchors(tokens, rest, n_anchor, spec.anchor_mode)
    is_anchor = torch.zeros(n_a, dtype=torch.bool)
    is_anchor[anchors] = True
    dropped = torch.nonzero(~is_dom & ~is_anchor).flatten()
    merge = anchor_merge(tokens, anchors, dropped, spec.group_size, spec.temperature, spec.merge)
    return torch.sort(torch.cat([dominant, anchors])).values, merge


def _video(
    spec: VideoSpec, tokens: Tensor, r_v: float, audio_keep: Tensor, num_audio: int, patches_per_block: int,
    audio_tokens_per_block: int,
) -> tuple[Tensor, Tensor | None]:
    t, n, d = tokens.shape
    flat = tokens.reshape(t * n, d)
    if spec.select == "none":
        return _ttm_frames(flat, n, r_v, spec.ttm, spec.pair_indexing), None
    if spec.select == "dpc_knn_odd":
        if r_v >= 1.0 or t < 2:
            return torch.arange(t * n), None
        return dycoke_dpc_knn(flat, n, dycoke_merging_ratio(r_v), spec.pair_indexing, spec.dpc_k, spec.dpc_ties), None
    q = 1.0 if spec.ttm == "none" else min(1.0, max(r_v**spec.ttm_share, DYCOKE_MIN_RETENTION))
    survivors = _ttm_frames(flat, n, q, spec.ttm, spec.pair_indexing)  # sorted
    block = survivors // n // patches_per_block
    num_blocks = -(-t // patches_per_block)
    sizes = torch.bincount(torch.arange(t * n) // n // patches_per_block, minlength=num_blocks)
    capacity = torch.bincount(block, minlength=num_blocks)
    if spec.allocation == "audio":
        weights = audio_block_retention(audio_keep, num_audio, audio_tokens_per_block, num_blocks)
    else:
        weights = torch.ones(num_blocks, dtype=torch.float64)
    counts = allocate_by_weight(sizes, weights, num_keep(t * n, r_v, spec.rounding), capacity=capacity)
    kept = []
    for b in range(num_blocks):
        pool = survivors[block == b]
        kept.append(pool[dpc_knn(flat[pool], int(counts[b]), spec.dpc_k, spec.dpc_ties)])
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
        :class:`PruneResult`. Kept counts: DyCoke-based video (baseline, V1) and audio keep
        ``dycoke_ttm_num_kept``; V2 ``round(r_a N_a)``; V3-V6 ``round(r_a N_a) + round(contextual_ratio N_a)``
        (Python's ``round``); ``dpc_knn_blocks`` exactly ``round(r_v T N)``.

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
