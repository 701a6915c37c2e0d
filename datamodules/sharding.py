"""Whole-video sharding across ranks, balanced by estimated cost (longest-processing-time first), and the order
each rank runs its share in (:func:`run_order`).

Each video goes to exactly one rank; the assignment depends only on the list of videos still to do and their
costs (not on timing), so every rank computes the same assignment without communicating. Done qids are removed
before the costs are computed, so a resumed run rebalances what is left.
"""
from __future__ import annotations

import heapq
import os
from collections.abc import Iterator, Sequence

from torch.utils.data import Sampler


def estimate_cost(duration_s: float | None, video_path: str, num_budgets_tokens: int, num_questions: int) -> float:
    """Relative cost of one video: ``duration × Σ budgets × questions`` (DESIGN: decode/encode grow with the
    duration, prefill with the budgets, answering with the questions). Without a known duration the file size in
    MB stands in for it (about 1 MB/minute at benchmark bit rates; only the ordering matters)."""
    if duration_s is None or duration_s <= 0:
        try:
            duration_s = max(os.path.getsize(video_path) / 1e6 * 60.0, 1.0)
        except (OSError, ValueError):   # missing, a name too long, a NUL byte: the decode's error record says so
            duration_s = 1.0
    return float(duration_s) * max(num_budgets_tokens, 1) * max(num_questions, 1)


def balanced_assignment(costs: Sequence[float], num_replicas: int) -> list[list[int]]:
    """Assign items to ``num_replicas`` bins, largest cost first, each to the currently lightest bin
    (ties: lower bin index; equal costs: lower item index first).

    Returns:
        per-bin item indices, each list in assignment order (largest first).
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    heap = [(0.0, r) for r in range(num_replicas)]
    bins: list[list[int]] = [[] for _ in range(num_replicas)]
    for i in order:
        load, r = heapq.heappop(heap)
        bins[r].append(i)
        heapq.heappush(heap, (load + costs[i], r))
    return bins


def run_order(indices: Sequence[int], costs: Sequence[float], workers: int = 1) -> list[int]:
    """The order one rank runs its videos in: the cheapest first, then the dearest and the cheapest left in turn
    (``c_0, c_{n-1}, c_1, c_{n-2}, ...`` over the rank's videos sorted by cost, ties by index), with the turn's
    phase flipped every other round of ``workers`` videos when ``workers`` is even.

    Why: the DataLoader workers decode the next videos while the GPU answers the current one, and decoding grows
    with the duration (every frame of a long H.264 video is decoded) far more than the GPU step does. Largest first
    runs all the hour-long videos back to back, when decoding cannot keep up (measured on the H200, 2026-12-02: the
    GPU waited 24 % of the long class), and makes the first answer wait for the longest decode. Alternating puts a
    short video's GPU step between long decodes, and the cheapest video first gives the first answer soonest.

    The DataLoader hands video ``k`` of the order to worker ``k % workers``. With an even worker count a plain
    alternation gives every dear video to the odd workers, so half the workers decode all the long videos: in
    ``bench/workload.py``'s simulation of the full Video-MME with per-worker decode rates (the saved H200 rows,
    2026-12-02) that run took 12.82 h on the CPU decoder and 0.89 h on NVDEC against 6.87 h / 0.58 h with the flip.
    So in rounds ``1, 3, 5, ...`` (slots ``r W .. r W + W - 1``) each pair of the alternation is swapped: every
    worker then gets dear and cheap videos in turn. An odd count flips by itself (``k % workers`` changes parity
    every round). The order changes no record (each video's work is independent) and depends only on the costs
    and ``workers``, as the assignment does.

    Args:
        indices: the rank's video indices (any order).
        costs: cost of every video, indexed by video index (:func:`estimate_cost`).
        workers: the DataLoader's ``num_workers`` (0 or 1: no flip).

    Returns:
        ``indices`` reordered (each once).
    """
    ranked = sorted(indices, key=lambda i: (costs[i], i))
    out, lo, hi = [], 0, len(ranked) - 1
    while lo <= hi:
        out.append(ranked[lo])
        lo += 1
        if lo <= hi:
            out.append(ranked[hi])
            hi -= 1
    if workers > 1 and workers % 2 == 0:
        for start in range(workers, len(out), 2 * workers):
            for p in range(start, min(start + workers, len(out)) - 1, 2):
                out[p], out[p + 1] = out[p + 1], out[p]
    return out


class CostBalancedSampler(Sampler[int]):
    """Yields this rank's video indices in :func:`run_order` (cheapest first, then dearest and cheapest in turn);
    the rank's share comes from :func:`balanced_assignment` (largest cost first to the lightest rank), so every
    index appears on exactly one rank and none repeats."""

    def __init__(self, costs: Sequence[float], num_replicas: int = 1, rank: int = 0, workers: int = 1):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside [0, {num_replicas})")
        self.indices = run_order(balanced_assignment(costs, num_replicas)[rank], costs, workers)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
