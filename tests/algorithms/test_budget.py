"""Rules of DESIGN §3.1-3.4: hand-computed cases and hypothesis properties of the plan invariants."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from algorithms.budget import (av_d2q, 
    compression_order, frame_grid, frame_token_cap, frame_tokens, max_frames,
    budget_fps, plan_groups, sample_frames, sample_rate, subsample, fps_filter_frames, thin_linspace,
)
from algorithms.segmentation import (
    adaptive_segment_count, adaptive_segment_lengths, frame_changes, group_variation, uniform_segment_lengths,
)


def feats_from_changes(changes):
    """Unit 2-D features whose consecutive 1 - cos equal ``changes`` (angles accumulate)."""
    ang = [0.0]
    for c in changes:
        ang.append(ang[-1] + math.acos(1 - c))
    a = torch.tensor(ang, dtype=torch.float64)
    return torch.stack([a.cos(), a.sin()], 1)


def test_max_frames_and_budget_too_small():
    assert max_frames(64) == 8 and max_frames(1024) == 128 and max_frames(16384) == 2048 and max_frames(127) == 8
    with pytest.raises(ValueError, match="smaller than one compressed group"):
        max_frames(63)
    with pytest.raises(ValueError, match="smaller than one compressed group"):
        plan_groups(torch.randn(2, 4), 16, 32, 16)


def test_sample_rate_seed_rule():
    # seed 001: fps = 1 if int(d) + 1 <= M else (M + 1) / d, M = B // 64 * 8
    assert sample_rate(10.52, 4096) == 1.0           # 11 <= 512
    assert sample_rate(30.0, 64) == 9 / 30            # 31 > 8
    assert sample_rate(97.5, 512) == 65 / 97.5        # 98 > 64
    assert sample_rate(7.9, 64) == 1.0 and sample_rate(8.0, 64) == 9 / 8   # int(7.9) + 1 = 8 <= 8; 9 > 8
    assert sample_rate(0.0, 256) == 1.0


def test_fps_filter_round_down_takes_the_last_frame_of_each_step():
    # 25 fps source, 10.52 s (263 frames, time base 1/25): q = floor(k / 25); output n is the last k with q <= n,
    # i.e. 25 n + 24, for n < floor(263 / 25) = 10
    one = Fraction(1)
    assert fps_filter_frames(list(range(263)), Fraction(1, 25), 263, one) == [25 * n + 24 for n in range(10)]
    # a step without a source frame repeats the previous one; the last frame is repeated up to the end
    assert fps_filter_frames([0, 5, 22], Fraction(1, 10), 40, one) == [1, 1, 2, 2]
    assert fps_filter_frames([0, 1, 2, 3], Fraction(1, 10), 4, one) == []       # shorter than one step: no frame
    # integer pts: 1.5 s at 2/3 fps (av_d2q(65 / 97.5) = 2/3) is exactly step 1, reached
    assert av_d2q(65 / 97.5) == Fraction(2, 3)
    assert fps_filter_frames([0, 15], Fraction(1, 10), 30, av_d2q(65 / 97.5)) == [0, 1]


def test_thin_linspace_truncates():
    assert thin_linspace(9, 8) == [0, 1, 2, 3, 4, 5, 6, 8]          # np.linspace(0, 8, 8, dtype=int)
    assert thin_linspace(65, 64) == [*range(63), 64]
    assert thin_linspace(5, 8) == [0, 1, 2, 3, 4]


def test_sample_frames_seed_cases():
    # 30 s at 8 fps, B=64: 0.3 fps, 9 grid frames; output n = last k with floor(0.3 k / 8) <= n = ceil(80 (n+1) / 3) - 1
    fps, src, ts = sample_frames(list(range(240)), Fraction(1, 8), 240, 30.0, 64)
    assert fps == 0.3 and src == [26, 53, 79, 106, 133, 159, 186, 239]
    assert ts == [j / 0.3 for j in [0, 1, 2, 3, 4, 5, 6, 8]]
    # 97.5 s at 2 fps, B=512: labels on the 2/3 fps grid (0, 1.5, 3.0, 4.5 ...), not the source frames' times
    fps, src, ts = sample_frames(list(range(195)), Fraction(1, 2), 195, 97.5, 512)
    assert ts[:4] == [0.0, 1.5, 3.0, 4.5] and len(ts) == 64 and ts[-2:] == [93.0, 96.0]
    assert src[:4] == [2, 5, 8, 11]
    # 10.52 s, B=4096: 10 frames (floor), labelled 0..9; ``start`` shifts the labels
    fps, src, ts = sample_frames(list(range(263)), Fraction(1, 25), 263, 10.52, 4096, start_s=0.5)
    assert len(src) == 10 and ts == [0.5 + j for j in range(10)]


def test_subsample_is_the_seeds_linspace_truncation():
    # seeds 001/000 thin with np.linspace(0, N - 1, M, dtype=int): step 39/31 = 1.258..., truncated
    assert subsample(10, 256) == list(range(10))                                  # 10 <= max_frames(256) = 32
    assert subsample(40, 256) == [math.floor(i * 39 / 31) for i in range(32)]
    assert subsample(40, 256)[:6] == [0, 1, 2, 3, 5, 6]                            # round() would give 0, 1, 3, 4, 5, 6
    assert subsample(9, 64) == [0, 1, 2, 3, 4, 5, 6, 8]                           # round() would give ..., 3, 5, 6, 7, 8
    assert subsample(9, 64) == np.linspace(0, 8, 8, dtype=int).tolist()
    assert subsample(1000, 1024) == np.linspace(0, 999, 128, dtype=int).tolist()
    with pytest.raises(ValueError, match="smaller than one compressed group"):
        subsample(10, 63)


def test_frame_grid_matches_transformers_smart_resize():
    from transformers.models.video_llama_3.video_processing_video_llama_3 import smart_resize

    for h, w in [(720, 1280), (240, 320), (1080, 1920), (100, 3000), (28, 28), (500, 499), (2160, 3840)]:
        for tok in [16, 64, 146, 256]:
            hh, ww = smart_resize(h, w, 28, min_pixels=16 * 784, max_pixels=tok * 784)
            assert frame_grid(h, w, tok) == (hh // 28, ww // 28)



def test_frame_grid_thin_frames_follow_the_processor():
    """Issue 44 item 4: a side under 14 px rounds to 0 in ``smart_resize`` (no ``max(28, ...)``), so the minimum-pixels
    path decides: 640x12 at 64 tokens is [3, 2, 60] patches from the processor itself, not (1, 23) cells."""
    import torch
    from transformers.models.video_llama_3.video_processing_video_llama_3 import (VideoLlama3VideoProcessor,
                                                                                  smart_resize)

    # by hand: 12x640 rounds to 0 x 644 px -> below 16 * 784 px: beta = sqrt(12544 / 7680) = 1.278,
    # ceil(12 * 1.278 / 28) = 1, ceil(640 * 1.278 / 28) = ceil(29.2) = 30
    assert frame_grid(12, 640, 64) == (1, 30)
    proc = VideoLlama3VideoProcessor()
    for h, w, tok in [(12, 640, 64), (10, 2000, 64), (10, 2000, 23), (13, 1000, 256), (640, 12, 16), (7, 1400, 8)]:
        hh, ww = smart_resize(h, w, 28, min_pixels=min(16, tok) * 784, max_pixels=tok * 784)
        assert frame_grid(h, w, tok) == (hh // 28, ww // 28), (h, w, tok)
        clip = torch.zeros(3, 3, h, w, dtype=torch.uint8)
        thw = proc(videos=[clip], do_sample_frames=False, use_token_compression=False, return_tensors="pt",
                   size={"shortest_edge": min(16, tok) * 784, "longest_edge": tok * 784 * 3})["video_grid_thw"]
        assert thw[0].tolist() == [3, 2 * (hh // 28), 2 * (ww // 28)]

def test_frame_tokens_hand_cases():
    # 14 frames, B=256: cap = 8*256 // 14 = 146; 720x1280 -> beta = sqrt(921600/114464)=2.8375 -> 9 x 16 = 144
    assert frame_token_cap(256, 14) == 146
    assert frame_grid(720, 1280, 146) == (9, 16)
    assert frame_tokens(720, 1280, 256, 14) == 144
    # B=1024, 14 frames: cap 256 -> 12 x 21 = 252
    assert frame_tokens(720, 1280, 1024, 14) == 252
    # small frame keeps its native grid rounded to 28 px: 240x320 -> 252x308 px -> 9 x 11 = 99
    assert frame_tokens(240, 320, 1024, 2) == 99
    # floor of 16 tokens for very many frames
    assert frame_token_cap(64, 8000) == 16


def test_plan_modes_hand_cases():
    ch = [0.01, 0.02, 0.5, 0.01, 0.01, 0.3, 0.01, 0.01, 0.02, 0.4, 0.005, 0.005, 0.005]  # 14 frames
    f = feats_from_changes(ch)
    # raw: 14 * 16 <= 256
    p = plan_groups(f, 16, 256, 16)
    assert p.mode == "raw" and p.vision_tokens == 224 and p.n_raw_frames == 14 and p.seg_lens == (1,) * 14
    # hybrid: n = 14 // 4 + 1 = 4 groups; 4*64 = 256 <= 512 < 14*144
    p = plan_groups(f, 144, 512, 144)
    assert p.mode == "hybrid" and p.n_groups == 4 and sum(p.seg_lens) == 14
    # the fork's cut: forced 8, then the 2 largest other changes: into frame 3 (0.5) and frame 10 (0.4)
    assert p.seg_lens == (3, 5, 2, 4)
    # variations: g0 (.01+.02)/2 = .015, g1 (.01+.01+.3+.01)/4 = .0825, g2 .02, g3 .005 -> g3, g0, g2, g1
    v = group_variation(frame_changes(f), list(p.seg_lens))
    assert compression_order(v, list(p.seg_lens)) == [3, 0, 2, 1]
    # ties: longer group first, then earlier; 1-frame groups (+inf) last; hivar reverses the variation order
    assert compression_order([0.1, 0.1, math.inf, 0.1], [2, 3, 1, 3]) == [1, 3, 0, 2]
    assert compression_order([0.1, 0.3, math.inf, 0.2], [2, 3, 1, 3], most_changing_first=True) == [1, 3, 0, 2]
    # all raw = 2016; compress g3 (4 frames): 2016 - 576 + 64 = 1504; g0 (3): 1504 - 432 + 64 = 1136;
    # g2 (2): 1136 - 288 + 64 = 912; g1 (5): 912 - 720 + 64 = 256 <= 512
    assert p.compressed == (0, 1, 2, 3) and p.vision_tokens == 256
    p = plan_groups(f, 144, 1200, 144)
    assert p.compressed == (0, 3) and p.vision_tokens == 1136 and p.n_raw_frames == 7
    # forced8: 4*64 = 256 > 128 -> groups of 8: [8, 6], 128 tokens
    p = plan_groups(f, 144, 128, 144)
    assert p.mode == "forced8" and p.seg_lens == (8, 6) and p.vision_tokens == 128
    p = plan_groups(f, 144, 256, 144, force_mode="all_compressed")
    assert p.mode == "all_compressed" and p.compressed == (0, 1, 2, 3) and p.seg_lens == (3, 5, 2, 4)
    with pytest.raises(ValueError, match="needs"):
        plan_groups(f, 144, 192, 144, force_mode="all_compressed")
    with pytest.raises(ValueError, match="subsample"):
        plan_groups(torch.randn(20, 3), 16, 128, 16)


@st.composite
def plan_inputs(draw):
    budget = draw(st.integers(64, 4096))
    t = draw(st.integers(1, max_frames(budget)))
    raw_hw = draw(st.integers(1, 256))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    ties = draw(st.booleans())
    feats = torch.randn(t, 4, generator=g, dtype=torch.float64)
    if ties:
        feats = feats.round()  # many equal changes and equal frames
    return feats, budget, raw_hw


@settings(max_examples=300, deadline=None)
@given(plan_inputs())
def test_plan_invariants(args):
    feats, budget, raw_hw = args
    t = feats.shape[0]
    p = plan_groups(feats, raw_hw, budget, raw_hw)
    assert p.vision_tokens <= budget
    assert sum(p.seg_lens) == t and all(1 <= n <= 8 for n in p.seg_lens)
    assert p.vision_tokens == p.n_raw_frames * raw_hw + 64 * p.n_compressed
    n = min(t // 4 + 1, t)
    if t * raw_hw <= budget:
        assert p.mode == "raw"
    elif n * 64 <= budget:
        assert p.mode == "hybrid" and p.n_groups == n
        ch = frame_changes(feats)
        v = group_variation(ch, list(p.seg_lens))
        order = compression_order(v, list(p.seg_lens))
        # least-varying first: the compressed set is a prefix of the order, and the prefix one shorter did not fit
        k = p.n_compressed
        assert set(order[:k]) == set(p.compressed)
        if k:
            prev = t * raw_hw + sum(64 - p.seg_lens[g] * raw_hw for g in order[: k - 1])
            assert prev > budget
    else:
        assert p.mode == "forced8" and list(p.seg_lens) == uniform_segment_lengths(t, 8)
        assert p.n_compressed == p.n_groups


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 200), st.integers(0, 2**31 - 1), st.booleans())
def test_adaptive_cuts_tile_with_forced_eights(t, seed, ties):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(t, 4, generator=g, dtype=torch.float64)
    if ties:
        f = f.round()
    lens = adaptive_segment_lengths(f)
    assert len(lens) == adaptive_segment_count(t) and sum(lens) == t and max(lens) <= 8
    cuts = set(torch.cumsum(torch.tensor(lens[:-1]), 0).tolist())
    assert set(range(8, t, 8)) <= cuts            # every forced cut is there


def test_budget_fps_is_the_seeds_record():
    # seed 001: fps = min(bd.FPS, len(idx) / max(info["duration"], 1e-6)); fps_ok = fps >= bd.MIN_FPS - 1e-6
    assert budget_fps(14, 14.0) == (1.0, True)
    assert budget_fps(1, 1.1992) == (round(1 / 1.1992, 4), True) == (0.8339, True)
    assert budget_fps(1, 1.999) == (0.5003, True)           # the lowest rate of an uncapped 1 fps decode
    assert budget_fps(32, 3600.0) == (0.0089, False)
    assert budget_fps(1, 2.0) == (0.5, True) and budget_fps(1, 2.0 + 4e-6) == (0.5, True)  # the seed's 1e-6 slack
    assert budget_fps(1, 2.1) == (0.4762, False)
    assert budget_fps(3, 0.0) == (1.0, True)                 # max(duration, 1e-6)
