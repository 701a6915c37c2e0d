"""The seeds' adaptive segmenter (algorithms/segmentation.py) against OnlineLong's ``adaptive_segment_lengths``.

Every expected cut below is worked out by hand from the fork's code (chicheng567/OnlineLong
``videollama3/model/compressor.py``, the stored version with ``TransformerDecoderFlatCompressor``):
``N = T // 4 + 1`` (at most T), forced cuts ``range(8, T, 8)``, the remaining ``N - 1 - len(forced)`` cuts at the
candidates (all other boundaries) of largest ``1 - cos``, taken in ``torch.argsort(-scores)`` order, then the
safety split. Boundary ``c`` means a cut before frame ``c``; ``diff[c - 1]`` is the change into frame ``c``.
"""
import math

import pytest
import torch

from algorithms.segmentation import adaptive_segment_count, adaptive_segment_lengths, frame_changes, group_variation
from tests.algorithms.test_budget import feats_from_changes as feats   # (T, 2) unit features with these consecutive 1 - cos


def test_count_is_the_forks():
    # max(1, min(T // 4 + 1, T)); T <= 1 -> 1; target 1 (qtf1) -> T; target 2 -> T // 2 + 1
    assert [adaptive_segment_count(t) for t in (1, 2, 3, 4, 7, 8, 9, 14, 17, 33)] == [1, 1, 1, 2, 2, 3, 3, 4, 5, 9]
    assert [adaptive_segment_count(t, 1, 8) for t in (1, 5, 9)] == [1, 5, 9]
    assert [adaptive_segment_count(t, 2, 8) for t in (2, 3, 9)] == [2, 2, 5]


def test_changes_are_float32_normalised_dot():
    f = torch.tensor([[3.0, 4.0], [3.0, 4.0], [0.0, 2.0]])
    ch = frame_changes(f)
    assert ch.dtype == torch.float32
    # normalize: (0.6, 0.8), (0.6, 0.8), (0, 1): 1 - 1 = 0 (float32 may leave ~1e-7), 1 - 0.8 = 0.2
    torch.testing.assert_close(ch, torch.tensor([0.0, 0.2]), rtol=0, atol=1e-6)


def test_t9_hand_cases():
    # N = 3, n_cuts 2, forced [8], one free cut among c = 1..7 (scores diff[0..6])
    assert adaptive_segment_lengths(feats([0.1, 0.1, 0.5, 0.1, 0.1, 0.9, 0.1, 0.1])) == [6, 2, 1]   # c = 6
    # the biggest change sits on the forced boundary 8 (diff[7]): it is not a candidate, the next one is
    assert adaptive_segment_lengths(feats([0.1, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.95])) == [2, 6, 1]   # c = 2
    # a tie between c = 3 and c = 6: argsort of 7 candidates on the CPU keeps index order -> c = 3
    assert adaptive_segment_lengths(feats([0.1, 0.1, 0.9, 0.1, 0.1, 0.9, 0.1, 0.1])) == [3, 5, 1]
    # all changes equal (identical frames): the first candidate, c = 1
    assert adaptive_segment_lengths(torch.ones(9, 4)) == [1, 7, 1]


def test_t17_hand_cases():
    # N = 5, n_cuts 4, forced [8, 16], two free cuts among 14 candidates
    ch = [0.1] * 16
    ch[3], ch[5], ch[11] = 0.8, 0.8, 0.8          # c = 4, 6, 12 tie at the top: index order -> 4, 6
    assert adaptive_segment_lengths(feats(ch)) == [4, 2, 2, 8, 1]
    ch[11] = 0.85                                  # c = 12 now largest, then the tie 4 / 6 -> 4
    assert adaptive_segment_lengths(feats(ch)) == [4, 4, 4, 4, 1]
    assert adaptive_segment_lengths(torch.ones(17, 4)) == [1, 1, 6, 8, 1]   # ties: c = 1, 2


def test_t33_hand_cases():
    # N = 9, n_cuts 8, forced [8, 16, 24, 32], four free cuts among 28 candidates
    ch = [0.05] * 32
    for c, v in ((3, 0.9), (12, 0.8), (20, 0.7), (27, 0.6), (5, 0.5)):
        ch[c - 1] = v
    assert adaptive_segment_lengths(feats(ch)) == [3, 5, 4, 4, 4, 4, 3, 5, 1]   # cuts 3, 12, 20, 27
    # all 28 scores equal: more than 16 elements, so the CPU argsort is not an insertion sort and equal scores
    # come out as torch.argsort(-torch.zeros(28)) orders them: [14, 27, 26, 25, ...] -> candidates 17, 31, 30, 29
    assert torch.argsort(-torch.zeros(28)).tolist()[:4] == [14, 27, 26, 25]
    assert adaptive_segment_lengths(torch.ones(33, 4)) == [8, 8, 1, 7, 5, 1, 1, 1, 1]


def test_short_and_small_force_every():
    assert adaptive_segment_lengths(torch.randn(1, 4)) == [1]
    assert adaptive_segment_lengths(torch.randn(3, 4)) == [3]          # N = 1
    # force_every = 2 < target: forced [2, 4, 6, 8] exceed n_cuts = 2; the two with the largest diff stay
    # (diff[3] = 0.9 -> 4, diff[7] = 0.8 -> 8), then the safety split puts back a cut every 2 frames
    ch = [0.1, 0.2, 0.1, 0.9, 0.1, 0.3, 0.1, 0.8]
    assert adaptive_segment_lengths(feats(ch), 4, 2) == [2, 2, 2, 2, 1]


def test_seed_call_and_checks():
    f = feats([0.1, 0.1, 0.5, 0.1, 0.1, 0.9, 0.1, 0.1])
    # seed 000: adaptive_segment_lengths(per_frame, tf, bd.FORCE_EVERY, 0.0, None, n_segments=n)
    assert adaptive_segment_lengths(f, 4, 8, 0.0, None, n_segments=adaptive_segment_count(9, 4, 8)) == [6, 2, 1]
    with pytest.raises(ValueError, match="n_segments=4"):
        adaptive_segment_lengths(f, 4, 8, n_segments=4)
    with pytest.raises(ValueError, match="Gumbel"):
        adaptive_segment_lengths(f, 4, 8, 0.5)


def test_group_variation_is_seed000s():
    ch = torch.tensor([0.25, 0.5, 0.125, 1.0])     # exact in float32
    assert group_variation(ch, [3, 1, 1]) == [0.375, math.inf, math.inf]
    assert group_variation(ch, [2, 3]) == [0.25, (0.125 + 1.0) / 2]
