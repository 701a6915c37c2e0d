"""Density-peak clustering with k nearest neighbours (DPC-kNN) as a token selector ("centre + dispersed").

Follows the density-peak rule of Rodriguez & Laio (Science 2014) in the kNN form used for token
clustering (Du et al., DPC-KNN 2016; TCFormer, Zeng et al. CVPR 2022; PruneVid, Huang et al. 2024), with the
study's specific choices:

* distance ``d_ij = 1 - cos(x_i, x_j)`` (cosine distance);
* local density ``rho_i = exp(-mean_{j in kNN(i)} d_ij)``, the k nearest neighbours **excluding i itself**
  (``k`` clipped to ``N - 1``);
* ``delta_i = min_{j denser than i} d_ij``; the densest token gets its largest distance
  ``max_j d_ij``. "Denser" is a strict total order: higher ``rho``, ties broken towards the lower
  index (so exactly one token is the densest; TCFormer breaks ties with random noise instead);
* ``score_i = rho_i * delta_i``; the ``num_keep`` highest scores are kept (ties: lower index).

High-``rho`` high-``delta`` tokens are cluster centres of dense regions that are far from each other, so the
kept set covers the distinct content of the input.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .dycoke import cosine_matrix, stable_topk

__all__ = ["dpc_knn_scores", "dpc_knn"]


def dpc_knn_scores(tokens: Tensor, k: int = 5) -> tuple[Tensor, Tensor, Tensor]:
    """Density, distance-to-denser and score of each token.

    Args:
        tokens: (N, D) tokens.
        k: neighbours in the density estimate (``>= 1``; clipped to ``N - 1``).

    Returns:
        ``(rho, delta, score)``, each (N,) float32. For ``N == 1``: ``rho = 1``, ``delta = 0``.

    Raises:
        ValueError: ``tokens`` not 2-D or ``k < 1``.
    """
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
    # strict order: denser = higher rho, ties to the lower index
    order = torch.sort(rho, descending=True, stable=True).indices
    rank = torch.empty(n, dtype=torch.long)
    rank[order] = torch.arange(n)
    denser = rank[None, :] < rank[:, None]  # denser[i, j]: j is denser than i
    masked = torch.where(denser, dist, torch.full_like(dist, float("inf")))
    delta = masked.min(dim=1).values
    no_denser = ~denser.any(dim=1)
    delta[no_denser] = dist[no_denser].max(dim=1).values
    return rho, delta, rho * delta


def dpc_knn(tokens: Tensor, num_keep: int, k: int = 5) -> Tensor:
    """Keep the ``num_keep`` tokens with the highest density-peak score ``rho * delta``.

    Args:
        tokens: (N, D) tokens (one selection pool, e.g. one 2 s block of video tokens).
        num_keep: tokens to keep, ``0 <= num_keep <= N``.
        k: neighbours for the density (see :func:`dpc_knn_scores`).

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
    _, _, score = dpc_knn_scores(tokens, k)
    return torch.sort(stable_topk(score, num_keep)).values.to(torch.long)
