"""Do two decoding paths agree, given that their logits may differ by rounding? (issue 41, item 5)

On random weights the logits of the top tokens are nearly tied, so a greedy argmax can flip between two paths that
compute the same function with other kernels (another summation order, bf16 rounding). Comparing token ids alone
then reports a difference that is no defect, and a check that random weights can flip is no check. The rule here:

* the paths' logits, teacher-forced along the same tokens, must agree within ``tol`` (max absolute difference over
  the positions where both paths had the same prefix, up to and including the first position where their tokens
  differ);
* their tokens are compared only where the top-2 margin (top-1 logit minus top-2 logit) of both paths' logits
  exceeds ``tol``: a first differing token at a position whose margin is within ``tol`` is a near-tie flip, and the
  tokens after it are not compared (they follow different prefixes).

Legend: T generated positions, V vocabulary size. Logits are in the model's units (pre-softmax), float.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class TokenCheck:
    """Outcome of :func:`compare_paths`.

    Attributes:
        same: the paths agree under the rule above.
        exact: the token ids are identical.
        diverge_at: first position where the token ids differ (``None`` when identical).
        margin: the smaller top-2 margin of the two paths' logits at ``diverge_at`` (``None`` when identical).
        max_logit_diff: max absolute logit difference over the compared positions (``None`` without logits).
    """

    same: bool
    exact: bool
    diverge_at: int | None = None
    margin: float | None = None
    max_logit_diff: float | None = None

    def __str__(self) -> str:
        if self.exact and self.max_logit_diff is None:
            return "True"
        text = "True" if self.same else "False"
        if not self.exact:
            text += f"~{self.diverge_at}(m={self.margin:.3g})"
        if self.max_logit_diff is not None:
            text += f"(d={self.max_logit_diff:.3g})"
        return text


def first_divergence(p: Sequence[int], q: Sequence[int]) -> int | None:
    """First index where ``p`` and ``q`` differ (a shorter sequence differs at its end), ``None`` if equal."""
    for i, (a, b) in enumerate(zip(p, q)):
        if a != b:
            return i
    return None if len(p) == len(q) else min(len(p), len(q))


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit over the last axis: (..., V) -> (...), float32. Raises ``ValueError`` for V < 2."""
    if logits.shape[-1] < 2:
        raise ValueError(f"top2_margin: needs at least 2 logits on the last axis, got shape {tuple(logits.shape)}")
    top = logits.float().topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def compare_paths(tokens_p: Sequence[int], tokens_q: Sequence[int], logits_p: torch.Tensor | None,
                  logits_q: torch.Tensor | None, tol: float) -> TokenCheck:
    """Compare two greedy paths under the rule of this module.

    Args:
        tokens_p, tokens_q: the token ids each path generated (T_p, T_q).
        logits_p, logits_q: each path's logits teacher-forced along ``tokens_p`` (T_p, V): row ``t`` is the
            distribution of the token at ``t`` given ``tokens_p[:t]``; rows up to the first divergence are the ones
            both paths shared. ``None`` for both: token ids only (identical -> same; else not, margin unknown).
        tol: the tolerance in logit units, for the logit difference and the margin.

    Returns:
        :class:`TokenCheck`.

    Raises:
        ValueError: only one of the logits given, shapes that differ, fewer rows than the compared positions, or a
            negative ``tol``.
    """
    if tol < 0:
        raise ValueError(f"compare_paths: tol must be >= 0, got {tol}")
    at = first_divergence(tokens_p, tokens_q)
    if (logits_p is None) != (logits_q is None):
        raise ValueError("compare_paths: give both paths' logits or neither")
    if logits_p is None:
        return TokenCheck(same=at is None, exact=at is None, diverge_at=at)
    if logits_p.shape != logits_q.shape:
        raise ValueError(f"compare_paths: logits shapes differ: {tuple(logits_p.shape)} vs {tuple(logits_q.shape)}")
    upto = len(tokens_p) if at is None else at + 1           # positions with a shared prefix
    if logits_p.shape[0] < min(upto, len(tokens_p)):
        raise ValueError(f"compare_paths: {logits_p.shape[0]} logit rows for {upto} compared positions")
    rows = min(upto, logits_p.shape[0])
    diff = float((logits_p[:rows].float() - logits_q[:rows].float()).abs().max()) if rows else 0.0
    close = diff <= tol
    if at is None:
        return TokenCheck(same=close, exact=True, max_logit_diff=diff)
    if at >= logits_p.shape[0]:                              # one path stopped earlier: nothing to weigh it by
        return TokenCheck(same=False, exact=False, diverge_at=at, max_logit_diff=diff)
    margin = float(torch.minimum(top2_margin(logits_p[at]), top2_margin(logits_q[at])))
    return TokenCheck(same=close and margin <= tol, exact=False, diverge_at=at, margin=margin, max_logit_diff=diff)
