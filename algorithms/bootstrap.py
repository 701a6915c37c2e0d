"""Paired bootstrap confidence intervals for accuracies and accuracy differences (pure: numpy only, no I/O).

Percentile bootstrap (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13): resample the questions
with replacement ``n_resamples`` times, take the statistic of each resample and report the ``(1 - level) / 2`` and
``(1 + level) / 2`` quantiles (numpy's default linear interpolation). For a difference between two budgets or
variants the resample is *paired*: the same resampled questions are scored in both (Koehn, "Statistical
significance tests for machine translation evaluation", EMNLP 2004), so question difficulty cancels out.

Seeding: the resample indices come from ``numpy.random.default_rng(seed)``, so the same inputs and seed give the same
interval on every machine and re-score.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95
DEFAULT_SEED = 0


def _check(n_resamples: int, level: float) -> None:
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples!r}: expected an integer >= 1")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r}: expected a value in (0, 1)")


def _indices(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, n) question indices drawn with replacement from ``default_rng(seed)``."""
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def bootstrap_interval(scores: Sequence[float], n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                       seed: int = DEFAULT_SEED) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of per-question ``scores`` (1 correct / 0 wrong for an accuracy;
    fractions in [0, 1]).

    Args:
        scores: (N,) per-question scores.
        n_resamples / level / seed: resamples, coverage (0.95 = 95 %), generator seed.

    Returns:
        ``(low, high)``, or None when ``scores`` is empty.

    Raises:
        ValueError: ``n_resamples`` < 1 or ``level`` outside (0, 1).
    """
    _check(n_resamples, level)
    x = np.asarray(scores, dtype=np.float64)
    if x.size == 0:
        return None
    means = x[_indices(x.size, n_resamples, seed)].mean(axis=1)
    lo, hi = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def paired_bootstrap_difference(scores_a: Sequence[float], scores_b: Sequence[float],
                                n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                                seed: int = DEFAULT_SEED) -> dict | None:
    """Paired percentile bootstrap of ``mean(a) - mean(b)`` over the same questions (``scores_a[i]`` and
    ``scores_b[i]`` belong to question i).

    Returns:
        ``{"difference", "low", "high", "p_two_sided"}`` (``p_two_sided``: twice the smaller share of resampled
        differences on either side of 0, capped at 1: the bootstrap's two-sided test of "no difference"), or None
        when there is no question.

    Raises:
        ValueError: ``scores_a`` and ``scores_b`` differ in length, or bad ``n_resamples`` / ``level``.
    """
    _check(n_resamples, level)
    a, b = np.asarray(scores_a, dtype=np.float64), np.asarray(scores_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need the same questions: {a.size} vs {b.size} scores")
    if a.size == 0:
        return None
    d = a - b
    diffs = d[_indices(d.size, n_resamples, seed)].mean(axis=1)
    lo, hi = np.quantile(diffs, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    p = min(1.0, 2.0 * min(float((diffs <= 0).mean()), float((diffs >= 0).mean())))
    return {"difference": float(d.mean()), "low": float(lo), "high": float(hi), "p_two_sided": p}
