"""Density-peak clustering with k nearest neighbours (DPC-kNN) as a token selector ("centre + dispersed").

Follows the density-peak rule of Rodriguez & Laio (Science 2014) in the kNN form used for token
clustering (Du et al., DPC-KNN 2016; TCFormer, Zeng et al. CVPR 2022; PruneVid, Huang et al. 2024), with the
study's specific choices:

* distance ``d_ij = 1 - cos(x_i, x_j)`` (cosine distance), seed 003: "normed = normalize(tokens, dim=1)",
  "dist = 1 - normed @ normed.T" (here clipped at 0 and made exactly symmetric: the two differ by float rounding
  only);
* local density ``rho_i = exp(-mean_{j in kNN(i)} d_ij)``, the k nearest neighbours **excluding i itself**
  (``k`` clipped to ``N - 1``), seed 003: "dist.fill_diagonal_(inf) ：把自己到自己的距离设为无穷大，避免 kNN 时选到自己",
  "取每个点最近的 k 个邻居距离（kNN）", "rho = exp(- knn_dist.mean(dim=1))". The seed gives no value for k; the
  default 5 is OmniZip's ``dpcknn(..., k=5)`` (``KD-TAO/OmniZip@66ef5d7:omnizip/omnizip_core.py:omnizip_istm``);
* ``delta_i = min_{j denser than i} d_ij`` (seed 003: "对每个点 i，找所有rho 比它大的点 j，取 min dist[i,j]",
  "delta = delta_dist.min(dim=1).values"); a token with no denser token gets its largest distance
  ``max_j d_ij``. "Denser" is seed 003's ``higher_mask = rho.unsqueeze(0) > rho.unsqueeze(1)`` (strictly higher
  ``rho``; ``ties="seed"``, default), so tokens that tie for the highest density all get their largest distance
  ("最高密度点没有任何更高密度点 ... 其 delta 设成它到任何其他点的最大距离"). ``ties="index"`` (this package's earlier
  rule) makes it a strict total order, ties broken towards the lower index, so exactly one token is the densest;
* ``score_i = rho_i * delta_i``; the ``num_keep`` highest scores are kept (ties: lower index), seed 003:
  "score = delta * rho", "selected = topk(score, num_keep).indices" (``torch.topk`` leaves the order of ties open).

High-``rho`` high-``delta`` tokens are cluster centres of dense regions that are far from each other, so the
kept set covers the distinct content of the input.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .dycoke import cosine_matrix, dycoke_frames, stable_topk

__all__ = ["dpc_knn_scores", "dpc_knn", "dycoke_dpc_knn"]


DENSITY_TIES = ("seed", "index")


def dpc_knn_scores(tokens: Tensor, k: int = 5, ties: str = "seed") -> tuple[Tensor, Tensor, Tensor]:
    """Density, distance-to-denser and score of each token.

    Args:
        tokens: (N, D) tokens.
        k: neighbours in the density estimate (``>= 1``; clipped to ``N - 1``).
        ties: ``"seed"`` (denser = strictly higher ``rho``) or ``"index"`` (equal ``rho``: lower index is denser).

    Returns:
        ``(rho, delta, score)``, each (N,) float32. For ``N == 1``: ``rho = 1``, ``delta = 0``.

    Raises:
        ValueError: ``tokens`` not 2-D, ``k < 1`` or an unknown ``ties``.
    """
    if ties not in DENSITY_TIES:
        raise ValueError(f"ties must be one of {DENSITY_TIES}, got {ties!r}")
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (N, D), got shape {tuple(tokens.shape)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = tokens.shape[0]
    if n == 0:
        empty = torch.zeros(0)
        return empty, empty, empty
    dist = (1.0 - cosine_matrix(tokens)).clamp_min(0.0)  # (N, N)
    dist = 0.5 * (dist + dist.T)  # exact symmetry against float noise
    dist.fill_diagonal_(0.0)
    k_eff = min(k, n - 1)
    if k_eff == 0:
        rho = torch.ones(n)
    else:
        off = dist + torch.diag(torch.full((n,), float("inf")))  # exclude self from kNN
        knn = torch.sort(off, dim=1).values[:, :k_eff]  # (N, k)
        rho = torch.exp(-knn.mean(dim=1))
    if ties == "seed":
        denser = rho[None, :] > rho[:, None]  # denser[i, j]: rho_j > rho_i (seed's higher_mask)
    else:  # strict total order: denser = higher rho, ties to the lower index
        order = torch.sort(rho, descending=True, stable=True).indices
        rank = torch.empty(n, dtype=torch.long)
        rank[order] = torch.arange(n)
        denser = rank[None, :] < rank[:, None]
    masked = torch.where(denser, dist, torch.full_like(dist, float("inf")))
    delta = masked.min(dim=1).values
    no_denser = ~denser.any(dim=1)
    delta[no_denser] = dist[no_denser].max(dim=1).values
    return rho, delta, rho * delta


def dpc_knn(tokens: Tensor, num_keep: int, k: int = 5, ties: str = "seed") -> Tensor:
    """Keep the ``num_keep`` tokens with the highest density-peak score ``rho * delta``.

    Args:
        tokens: (N, D) tokens (one selection pool, e.g. one 2 s block of video tokens).
        num_keep: tokens to keep, ``0 <= num_keep <= N``.
        k: neighbours for the density (see :func:`dpc_knn_scores`).
        ties: density ties (see :func:`dpc_knn_scores`).

    Returns:
        (num_keep,) long, sorted ascending indices into ``tokens``.

    Raises:
        ValueError: ``num_keep`` outside ``[0, N]`` (and the errors of :func:`dpc_knn_scores`).
    """
    n = tokens.shape[0]
    if not 0 <= num_keep <= n:
        raise ValueError(f"num_keep must be in [0, {n}], got {num_keep}")
    if num_keep == n:
        return torch.arange(n, dtype=torch.long)
    _, _, score = dpc_knn_scores(tokens, k, ties)
    return torch.sort(stable_topk(score, num_keep)).values.to(torch.long)  # seed: topk(score, num_keep)


def dycoke_dpc_knn(tokens: Tensor, tokens_per_frame: int, merging_ratio: float, pair_indexing: str = "release",
                   k: int = 5, ties: str = "seed") -> Tensor:
    """Seed 003 Version 1 video: DyCoke's first step, then DPC-kNN on the odd group of each 4-frame window.

    Seed 003: "类似的，4 帧一组，相邻帧逐位置计算余弦相似度，偶数帧保留最不相似的 k 个 token" (step 1: as the
    baseline, :func:`~algorithms.pruning.dycoke.dycoke_frames` step 1: frame ``i + 1`` of each pair keeps its ``k``
    tokens least similar to frame ``i``), then "第二步，对于奇数组，1，3 ... selected = topk(score, num_keep)": instead
    of DyCoke's frame ``i + 2`` pass, the odd group of window ``w`` (0-based frames ``4w`` and ``4w + 2`` among
    DyCoke's paired frames) goes through :func:`dpc_knn` as one pool.

    ``num_keep`` is not written in the seed; here it is the count the baseline keeps from the same group
    (``N + k`` where DyCoke's ``range(0, F - 4, 4)`` pass prunes frame ``4w + 2``, the whole group elsewhere), so
    V1 keeps exactly as many tokens as the baseline and differs only in which odd-group tokens it keeps.

    Args:
        tokens: (L, D) frames of ``tokens_per_frame`` tokens in time order.
        tokens_per_frame: N.
        merging_ratio: DyCoke's ``K``.
        pair_indexing: DyCoke's pair index (``"release"`` or ``"first_commit"``).
        k: neighbours of the DPC-kNN density.
        ties: density ties of :func:`dpc_knn_scores`.

    Returns:
        (dycoke_ttm_num_kept(L, N, K),) long, sorted ascending indices into ``tokens``.

    Raises:
        ValueError: see :func:`~algorithms.pruning.dycoke.dycoke_ttm`.
    """
    n = tokens_per_frame
    base = dycoke_frames(tokens, n, merging_ratio, pair_indexing)
    kept = []
    for t in sorted(base):
        if t % 4 in (1, 3):  # even group (1-based frames 2, 4): DyCoke's step 1
            kept.append(base[t] + t * n)
    for w0 in range(0, max(base) + 1, 4):
        group = [t for t in (w0, w0 + 2) if t in base]
        pool = torch.cat([torch.arange(n) + t * n for t in group])  # (|group| * N,)
        count = sum(base[t].numel() for t in group)
        kept.append(pool[dpc_knn(tokens[pool], count, k, ties)])
    return torch.sort(torch.cat(kept)).values.to(torch.long)
