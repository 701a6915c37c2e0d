"""Token pruning for video/omni LLMs: pure functions returning keep indices (and merge weights).

Modules: :mod:`.dycoke` (DyCoke TTM as in its current release + retention formula, our window TTM, shared helpers),
:mod:`.dpc_knn` (density-peak kNN selection), :mod:`.audio_anchors` (dominant tokens, contextual anchors,
softmax(cos) merging), :mod:`.omnizip` (audio-driven per-block video budgets), :mod:`.variants` (baseline,
V1..V6 and :func:`apply_variant`).
"""

from .audio_anchors import (AnchorMerge, anchor_merge, change_scores, contextual_anchors, contextual_num, dominant_num,
                            dominant_tokens, merge_tokens, received_attention)
from .dpc_knn import dpc_knn, dpc_knn_scores, dycoke_dpc_knn
from .dycoke import (
    DYCOKE_FIRST_COMMIT,
    DYCOKE_RELEASE_COMMIT,
    dycoke_frames,
    dycoke_merging_ratio,
    dycoke_reached_retention,
    dycoke_retention,
    dycoke_ttm,
    dycoke_ttm_num_kept,
    num_keep,
    window_ttm,
    window_ttm_num_kept,
    window_ttm_tokens_per_frame,
)
from .omnizip import allocate_by_weight, audio_block_retention, omnizip_allocate
from .variants import VARIANTS, AudioSpec, PruneResult, Variant, VideoSpec, apply_variant, get_variant, retention_floor

__all__ = [
    "AnchorMerge", "anchor_merge", "change_scores", "contextual_anchors", "contextual_num", "dominant_num",
    "dominant_tokens", "merge_tokens", "received_attention",
    "dpc_knn", "dpc_knn_scores", "dycoke_dpc_knn",
    "DYCOKE_FIRST_COMMIT", "DYCOKE_RELEASE_COMMIT", "dycoke_frames", "dycoke_reached_retention",
    "dycoke_merging_ratio", "dycoke_retention", "dycoke_ttm", "dycoke_ttm_num_kept", "num_keep",
    "window_ttm", "window_ttm_num_kept", "window_ttm_tokens_per_frame",
    "allocate_by_weight", "audio_block_retention", "omnizip_allocate",
    "VARIANTS", "AudioSpec", "PruneResult", "Variant", "VideoSpec", "apply_variant", "get_variant", "retention_floor",
]
