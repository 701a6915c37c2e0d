"""Temporal token merging (TTM): DyCoke's released form, its retention formula, and our window variant.

Two functions select tokens that stay after temporal merging of consecutive frames (for Qwen2.5-Omni a
"frame" is one temporal patch: 2 video frames at 2 FPS = 1 s; for audio the caller chooses a frame of
``tokens_per_frame`` audio tokens, e.g. 25 = 1 s):

* :func:`dycoke_ttm` reproduces ``dycole_ttm`` of the authors' current release
  (``KD-TAO/DyCoke@dd7463498203479d0ff6f2d29c4e72928c0af244:llava/model/llava_arch.py:dycole_ttm``; paper: Tao et
  al., "DyCoke: Dynamic Compression of Tokens for Fast Video Large Language Models", CVPR 2025), including its
  edge behaviour and token order (see its docstring); the first commit's pair index is ``pair_indexing=
  "first_commit"``.
* :func:`window_ttm` is **our** variant from the study notes (not DyCoke): every window of 4 frames handled
  the same way, short tail windows included, a token count ``k`` per pruned frame.

Both return keep indices, never gathered tensors: "merging" in DyCoke's TTM is pruning of the tokens of a
frame that are most similar (position-wise) to the same position in its reference frame.

The module also hosts the small helpers shared by the pruning package (:func:`num_keep`,
:func:`stable_topk`, :func:`cosine_matrix`). Ties are always broken towards the earlier token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "num_keep",
    "stable_topk",
    "cosine_matrix",
    "dycoke_ttm",
    "dycoke_frames",
    "dycoke_ttm_num_kept",
    "dycoke_reached_retention",
    "dycoke_retention",
    "dycoke_merging_ratio",
    "window_ttm",
    "window_ttm_num_kept",
    "window_ttm_tokens_per_frame",
]


# ----------------------------------------------------------------------------------------------- helpers
ROUNDINGS = ("python", "half_up")


def num_keep(num_tokens: int, retention: float, rounding: str = "python") -> int:
    """Tokens kept out of ``num_tokens`` at ``retention``.

    ``rounding="python"`` (default) is Python's ``round(retention * num_tokens)`` (round half to even), as seed 003
    writes its counts: "dominant_num = round((1 - rho_audio) * N)", "contextual_num = round(contextual_ratio * N)";
    so ``num_keep(25, 0.5) == 12``. ``rounding="half_up"`` is ``floor(x + 0.5)`` with a 1e-9 guard against float
    noise (``num_keep(25, 0.5, "half_up") == 13``), the rounding this package used before (kept as a setting).

    Raises:
        ValueError: ``retention`` outside ``[0, 1]``, ``num_tokens < 0`` or an unknown ``rounding``.
    """
    if not 0.0 <= retention <= 1.0:
        raise ValueError(f"retention must be in [0, 1], got {retention}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if rounding == "python":
        return min(num_tokens, round(retention * num_tokens))
    if rounding == "half_up":
        return min(num_tokens, int(math.floor(retention * num_tokens + 0.5 + 1e-9)))
    raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")


def stable_topk(scores: Tensor, k: int, largest: bool = True) -> Tensor:
    """Indices of the ``k`` best entries of 1-D ``scores`` in rank order; ties go to the lower index.

    Unlike ``torch.topk`` (whose tie order is unspecified) the result is deterministic.
    ``k`` is clipped to ``[0, len(scores)]``.

    Raises:
        ValueError: ``scores`` is not 1-D.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D, got shape {tuple(scores.shape)}")
    k = max(0, min(int(k), scores.numel()))
    return torch.sort(scores, descending=largest, stable=True).indices[:k]


def cosine_matrix(x: Tensor, y: Tensor | None = None) -> Tensor:
    """Pairwise cosine similarity, float32. ``x``: (N, D), ``y``: (M, D) (default ``x``) -> (N, M).

    A zero vector has cosine 0 with everything (``F.normalize`` eps behaviour).
    """
    xn = F.normalize(x.float(), p=2, dim=-1)
    yn = xn if y is None else F.normalize(y.float(), p=2, dim=-1)
    return xn @ yn.T


def _least_similar(sim: Tensor, k: int) -> Tensor:
    """Sorted positions of the ``k`` smallest similarities (ties: earlier position first)."""
    return torch.sort(stable_topk(sim, k, largest=False)).values


# ------------------------------------------------------------------------------------------------ DyCoke
DYCOKE_REPO = "KD-TAO/DyCoke"
DYCOKE_RELEASE_COMMIT = "dd7463498203479d0ff6f2d29c4e72928c0af244"  # current release (HEAD of main, 2025-11-22)
DYCOKE_FIX_COMMIT = "35cc532c16f74a04b3f653c3bf50f59d8e505154"      # "Update ttm code" (2025-03-01): i // 2
DYCOKE_FIRST_COMMIT = "26dc6f4ffa825b9ee4d8a2f11dee9a9ebe31a294"    # "first commit" (2024-12-19): (i - 2) // 2
PAIR_INDEXINGS = ("release", "first_commit")
TOKEN_ORDERS = ("release", "time")


def dycoke_ttm(
    tokens: Tensor,
    tokens_per_frame: int,
    merging_ratio: float = 0.7,
    pair_indexing: str = "release",
    order: str = "release",
) -> Tensor:
    """DyCoke token temporal merging (TTM), as released in ``KD-TAO/DyCoke``.

    Follows ``KD-TAO/DyCoke@dd7463498203479d0ff6f2d29c4e72928c0af244:llava/model/llava_arch.py:dycole_ttm`` (the
    current release; its TTM is unchanged since ``35cc532``, "Update ttm code"). With ``F = L // N`` full frames
    and ``k = int((1 - merging_ratio) * N)`` (the release's ``int(merging_ratio * num_tokens_per_frame)`` after
    ``merging_ratio = 1 - merging_ratio``):

    1. ``for i in range(0, num_frames - 1, 2)``: frame ``i`` is kept whole, frame ``i + 1`` keeps the ``k`` tokens
       of ``similarities[i // 2].topk(k, largest=False)``, the least cosine-similar, position by position, to
       frame ``i``;
    2. ``for i in range(0, num_frames - 4, 4)``: frame ``i + 2`` is replaced by its ``k`` tokens least similar to
       frame ``i`` (``odd_similarities[i // 4]``); frame ``i`` stays whole.

    ``pair_indexing="first_commit"`` reproduces the first commit (``26dc6f4``, up to ``43bd0cc``):
    ``similarities[(i - 2) // 2]``, so frame ``2j + 1`` is ranked with pair ``j - 1`` and frame 1 with the last
    pair (Python index ``-1``).

    Edge behaviour of the release, reproduced: the last window never gets step 2 (``range(0, F - 4, 4)`` stops
    one window early, e.g. with ``F = 32`` frame 30 stays whole); with ``F`` odd the last frame is dropped, and
    the ``L - F * N`` trailing tokens that fill no frame are dropped (only paired frames are concatenated). The
    release raises on ``F <= 4`` (``torch.stack`` of an empty list); here step 2 is empty there, and ``F < 2``
    raises.

    Seed 003 runs this release ("DyCoke，但是只使用其 TTM 模块，同时用在 V/A 上") and writes what it computes: "奇数帧全保留；
    偶数帧按与前一帧逐位置余弦相似度，保留最不相似的 k 个 token。对每 4 帧中的第 3 帧（索引 i+2 ），再按与第 1 帧（索引 i ）逐位置
    余弦相似度，保留最不相似的 k 个 token。" (odd frames kept whole; each even frame keeps its k tokens least cosine-similar,
    position by position, to the previous frame; the 3rd frame of each 4 (index i+2) keeps its k tokens least similar to
    the 1st (index i)). The seed gives no value for k. Read literally, two of the release's edges above depart from
    that text: an unpaired last frame (``F`` odd) is dropped, not "kept whole", and with ``F`` a multiple of 4 the
    last window's 3rd frame (index ``F - 2``) is not re-pruned; :func:`window_ttm` is the literal reading (a setting,
    ``ttm="window"``).

    Order: ``order="release"`` (default) returns the indices in the release's concatenation order: frame by frame,
    a pruned frame's tokens in ``topk(largest=False)`` order (most dissimilar first), so
    ``tokens[dycoke_ttm(tokens, ...)]`` is the release's output. ``order="time"`` sorts them. Ties (equal
    similarities, where ``torch.topk``'s order is unspecified) go to the earlier position.

    Args:
        tokens: (L, D) tokens in time order, frame after frame (``L = T * N`` for video).
        tokens_per_frame: N, tokens per frame (temporal patch for Qwen2.5-Omni video).
        merging_ratio: DyCoke's ``K`` in ``[0, 1]``: fraction of a pruned frame's tokens removed.
        pair_indexing: ``"release"`` (``i // 2``) or ``"first_commit"`` (``(i - 2) // 2``).
        order: ``"release"`` or ``"time"``.

    Returns:
        (L_kept,) long indices into ``tokens``; ``L_kept == dycoke_ttm_num_kept(L, N, merging_ratio)``.

    Raises:
        ValueError: ``tokens`` not 2-D, ``tokens_per_frame < 1``, ``merging_ratio`` outside ``[0, 1]``, an unknown
            ``pair_indexing`` / ``order``, or fewer than 2 full frames.
    """
    if order not in TOKEN_ORDERS:
        raise ValueError(f"order must be one of {TOKEN_ORDERS}, got {order!r}")
    kept = dycoke_frames(tokens, tokens_per_frame, merging_ratio, pair_indexing)
    n = tokens_per_frame
    out = torch.cat([kept[t] + t * n for t in sorted(kept)]).to(torch.long)
    return torch.sort(out).values if order == "time" else out


def dycoke_frames(tokens: Tensor, tokens_per_frame: int, merging_ratio: float,
                  pair_indexing: str = "release") -> dict[int, Tensor]:
    """Per-frame result of :func:`dycoke_ttm`: ``{frame t: (n_t,) long positions in frame t, release order}``.

    Frames the release drops (the last one when ``F`` is odd) are absent. Same arguments and errors as
    :func:`dycoke_ttm` (without ``order``).
    """
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (L, D), got shape {tuple(tokens.shape)}")
    if tokens_per_frame < 1:
        raise ValueError(f"tokens_per_frame must be >= 1, got {tokens_per_frame}")
    if not 0.0 <= merging_ratio <= 1.0:
        raise ValueError(f"merging_ratio must be in [0, 1], got {merging_ratio}")
    if pair_indexing not in PAIR_INDEXINGS:
        raise ValueError(f"pair_indexing must be one of {PAIR_INDEXINGS}, got {pair_indexing!r}")
    n = tokens_per_frame
    num_frames = tokens.shape[0] // n
    if num_frames < 2:
        raise ValueError(f"DyCoke TTM needs at least 2 full frames of {n} tokens, got {tokens.shape[0]} tokens")
    k = int((1 - merging_ratio) * n)
    frames = tokens[: num_frames * n].reshape(num_frames, n, -1).float()  # (F, N, D)
    whole = torch.arange(n)

    pair_starts = list(range(0, num_frames - 1, 2))
    pair_sims = [F.cosine_similarity(frames[i], frames[i + 1], dim=1) for i in pair_starts]  # each (N,)
    kept: dict[int, Tensor] = {}
    for i in pair_starts:
        sim = pair_sims[i // 2] if pair_indexing == "release" else pair_sims[(i - 2) // 2]
        kept[i] = whole
        kept[i + 1] = stable_topk(sim, k, largest=False)
    for i in range(0, num_frames - 4, 4):
        sim = F.cosine_similarity(frames[i], frames[i + 2], dim=1)  # (N,)
        kept[i] = whole
        kept[i + 2] = stable_topk(sim, k, largest=False)
    return kept


def dycoke_ttm_num_kept(num_tokens: int, tokens_per_frame: int, merging_ratio: float) -> int:
    """Exact token count :func:`dycoke_ttm` (and the release) keeps.

    With ``F = num_tokens // N``, ``P = F // 2`` pairs, ``W = len(range(0, F - 4, 4))`` re-pruned windows
    and ``k = int((1 - K) * N)``: ``kept = P * (N + k) - W * (N - k)``.
    Example: LLaVA-OV-7B, ``F = 32``, ``N = 196``, ``K = 0.7``: ``k = 58``, ``16 * 254 - 7 * 138 = 3098``.

    Raises:
        ValueError: fewer than 2 full frames, or ``merging_ratio`` outside ``[0, 1]``.
    """
    if not 0.0 <= merging_ratio <= 1.0:
        raise ValueError(f"merging_ratio must be in [0, 1], got {merging_ratio}")
    n = tokens_per_frame
    num_frames = num_tokens // n
    if num_frames < 2:
        raise ValueError(f"DyCoke TTM needs at least 2 full frames, got {num_frames}")
    k = int((1 - merging_ratio) * n)
    pairs = num_frames // 2
    windows = len(range(0, num_frames - 4, 4))
    return pairs * (n + k) - windows * (n - k)


def dycoke_reached_retention(num_tokens: int, tokens_per_frame: int, merging_ratio: float) -> float:
    """Retention DyCoke TTM actually reaches: ``dycoke_ttm_num_kept(L, N, K) / L``.

    It differs from the nominal ``1 - 3K/4`` (:func:`dycoke_retention`): e.g. 8 frames of 144 tokens at nominal
    retention 0.5 (``K = 2/3``, ``k = 48``): ``4 * (144 + 48) - 1 * (144 - 48) = 672`` of 1152 = 0.583.
    """
    if num_tokens <= 0:
        raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
    return dycoke_ttm_num_kept(num_tokens, tokens_per_frame, merging_ratio) / num_tokens


def dycoke_retention(merging_ratio: float) -> float:
    """DyCoke's TTM retention formula: ``(1 + 3 (1 - K)) / 4 = 1 - 3K/4``.

    In each window of 4 frames the first stays whole and the other three keep ``1 - K`` of their tokens
    (the paper's design; the release's exact count, with its integer rounding and edge windows, is
    :func:`dycoke_ttm_num_kept`). ``K = 0.7`` gives 0.475.

    Raises:
        ValueError: ``merging_ratio`` outside ``[0, 1]``.
    """
    if not 0.0 <= merging_ratio <= 1.0:
        raise ValueError(f"merging_ratio must be in [0, 1], got {merging_ratio}")
    return 1.0 - 0.75 * merging_ratio


DYCOKE_MIN_RETENTION = 0.25   # K = 4 (1 - r) / 3 merged tokens per frame pair can be at most 1


def dycoke_merging_ratio(retention: float) -> float:
    """Inverse of :func:`dycoke_retention`: ``K = 4 (1 - r) / 3``.

    Raises:
        ValueError: ``retention`` outside ``[0.25, 1]`` (TTM alone cannot go below a quarter).
    """
    if not DYCOKE_MIN_RETENTION - 1e-12 <= retention <= 1.0:
        raise ValueError(f"DyCoke TTM retention must be in [0.25, 1], got {retention}")
    return min(1.0, max(0.0, 4.0 * (1.0 - retention) / 3.0))


# --------------------------------------------------------------------------------------- our variant
def window_ttm(tokens: Tensor, num_keep_per_frame: int) -> Tensor:
    """Our TTM variant from the study notes (named apart from DyCoke's release).

    Seed 003's description read literally for every window: "长度为 4 帧的滑动窗口进行均匀采样，分为 O 组（1，3）和 E 组（2，4）
    ... 计算相邻组之间对应位置相似度（比如 1 和 2，3 和 4）... topk 保留余弦相似度更低的 token" (windows of 4 frames, odd
    group 1, 3 and even group 2, 4; frame 2 against 1 and 4 against 3, position by position; the least cosine-similar
    tokens are kept) and "第二步，对于未被剪枝的 O 组，组内进行剪枝，和上面一样逐位置比较，窗口内第一帧的 token 不剪，剪后面的"
    (step 2 inside the odd group: frame 1 untouched, frame 3 pruned against it); "奇数帧全保留" for a frame with no
    partner.

    Frames are cut into windows of 4 (the last may be shorter). In 1-based window terms: frames 1 and 3
    are first kept whole, frames 2 and 4 each keep their ``k`` tokens least cosine-similar, position by
    position, to the previous frame (1 and 3); then frame 3 keeps its ``k`` tokens least similar to
    frame 1. Short tail windows follow the same rule on the frames they have: length 1 -> frame whole;
    2 -> frame 2 vs 1; 3 -> frame 2 vs 1 and frame 3 vs 1. Every frame is accounted for (no frame
    dropped), references are the original (unpruned) tokens, ties go to the earlier position.

    Differences from :func:`dycoke_ttm`: each frame is ranked against its own reference (no
    off-by-one pair index), the last window is treated like the others, odd frame counts and single
    frames work, and ``k`` is a token count instead of ``int((1 - K) * N)``.

    Args:
        tokens: (T, N, D) tokens, T frames (temporal patches) of N tokens.
        num_keep_per_frame: k in ``[0, N]``, tokens kept in each pruned frame.

    Returns:
        (T*N_kept,) long, sorted ascending indices into ``tokens.reshape(T * N, D)``; count
        ``window_ttm_num_kept(T, N, k)``.

    Raises:
        ValueError: ``tokens`` not 3-D or ``k`` outside ``[0, N]``.
    """
    if tokens.dim() != 3:
        raise ValueError(f"tokens must be (T, N, D), got shape {tuple(tokens.shape)}")
    num_frames, n, _ = tokens.shape
    if not 0 <= num_keep_per_frame <= n:
        raise ValueError(f"num_keep_per_frame must be in [0, {n}], got {num_keep_per_frame}")
    frames = tokens.float()
    out = []
    for t in range(num_frames):
        pos = t % 4
        if pos == 0:
            local = torch.arange(n)
        else:
            ref = t - 2 if pos == 2 else t - 1  # 3rd frame (pos 2) vs 1st; 2nd/4th vs previous
            sim = F.cosine_similarity(frames[t], frames[ref], dim=1)  # (N,)
            local = _least_similar(sim, num_keep_per_frame)
        out.append(local + t * n)
    return torch.cat(out).to(torch.long) if out else torch.zeros(0, dtype=torch.long)


def window_ttm_num_kept(num_frames: int, tokens_per_frame: int, num_keep_per_frame: int) -> int:
    """Token count :func:`window_ttm` keeps: ``W N + (T - W) k`` with ``W = ceil(T / 4)`` whole frames."""
    whole = -(-num_frames // 4)
    return whole * tokens_per_frame + (num_frames - whole) * num_keep_per_frame


def window_ttm_tokens_per_frame(tokens_per_frame: int, retention: float) -> int:
    """``k`` for :func:`window_ttm` at a target retention: ``N (4 r - 1) / 3`` rounded half up (``floor(x + 0.5)``, not
    Python's half-to-even ``round``; the seed gives no rule for k), clipped to ``[0, N]``.

    Exact for long inputs with ``T`` a multiple of 4 up to the rounding of ``k``; ``r < 1/4`` gives 0.
    """
    if not 0.0 <= retention <= 1.0:
        raise ValueError(f"retention must be in [0, 1], got {retention}")
    k = math.floor(tokens_per_frame * (4.0 * retention - 1.0) / 3.0 + 0.5 + 1e-9)
    return max(0, min(tokens_per_frame, k))
