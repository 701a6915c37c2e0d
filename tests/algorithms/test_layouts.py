"""Layout ablations (DESIGN §4): caps, plans of every variant, fill, short-video baseline, job parsing, reuse."""
import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from algorithms.budget import (K_ROWS, compression_order, frame_grid, make_plan, max_frames, plan_groups,
                              raw_frame_grid, subsample)
from algorithms.layouts import (
    VARIANTS, fill, fill_order, fill_v2, frame_cap, layout_video, parse_jobs, plan_variant, raw_rows_limit,
    same_llm_input, segment, substitute_frame, substitute_grid, training_change, variant_frames,
)
from algorithms.segmentation import frame_changes, group_variation, uniform_segment_count_lengths

ALL = list(VARIANTS)
SWAPS = ("sel_resize", "sel_merge", "mean_merge")


def feats_from_changes(changes):
    """Unit 2-D features whose consecutive 1 - cos equal ``changes`` (angles accumulate)."""
    ang = [0.0]
    for c in changes:
        ang.append(ang[-1] + math.acos(1 - c))
    a = torch.tensor(ang, dtype=torch.float64)
    return torch.stack([a.cos(), a.sin()], 1)


def random_feats(num_frames, seed, piecewise):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_frames, 6, generator=g)
    if piecewise:  # runs of identical frames: ties in changes and variations
        x = x[torch.div(torch.arange(num_frames), 3, rounding_mode="floor")]
    return x


def frame_mask(plan):
    """Per-frame True where the frame sits in a compressed group."""
    comp = set(plan.compressed)
    return [g in comp for g, n in enumerate(plan.seg_lens) for _ in range(n)]


def check_plan(plan, num_frames, budget):
    assert plan.vision_tokens <= budget
    assert sum(plan.seg_lens) == num_frames and all(1 <= n <= 8 for n in plan.seg_lens)
    assert list(plan.compressed) == sorted(set(plan.compressed))
    assert all(0 <= g < plan.n_groups for g in plan.compressed)
    n_raw = sum(n for g, n in enumerate(plan.seg_lens) if g not in set(plan.compressed))
    assert plan.n_raw_frames == n_raw
    assert plan.vision_tokens == n_raw * plan.raw_hw + plan.n_compressed * plan.k


# ------------------------------------------------------------------------------------------------ caps


@pytest.mark.parametrize("name, b1024, b4096", [
    ("rho16", 63, 255), ("qtf1", 16, 64), ("qtf2", 31, 127), ("low64", 16, 64),
    ("rho32", 32, 128), ("rho32nf", 32, 128), ("rho64", 16, 64), ("rho128", 8, 32), ("rho256", 4, 16),
    ("uni16", 63, 255), ("base", None, None), ("uni8", None, None), ("hivar", None, None), ("sel_merge", None, None),
])
def test_hand_computed_caps(name, b1024, b4096):
    assert frame_cap(name, 1024) == b1024 and frame_cap(name, 4096) == b4096


def test_caps_are_tight_for_pure_qbase():
    # rho16 at the cap: T // 4 + 1 = B // 64 groups fit (hybrid); one frame more would need forced8
    for b in (1024, 4096):
        cap = frame_cap("rho16", b)
        x = random_feats(cap + 1, 0, False)
        assert plan_groups(x[:cap], 256, b, 256).mode == "hybrid"
        assert plan_groups(x, 256, b, 256).mode == "forced8"
        for name, k in (("qtf1", 1), ("qtf2", 2)):
            cap = frame_cap(name, b)
            plan = plan_variant(name, random_feats(cap, 1, False), 256, b, 256, capped=True)
            assert plan.mode == "qbase" and plan.n_groups == b // 64 and plan.vision_tokens == b
            if k == 1:
                assert set(plan.seg_lens) == {1}
    assert frame_cap("rho256", 100) == 1  # never below one frame


def test_capped_frame_choice_is_linspace_of_the_decoded_frames():
    # seed 000 frame_indices: np.linspace(0, n_decoded - 1, cap, dtype=int) (truncation) over the decoded frames
    got, capped = variant_frames("rho32", 100, 1024)           # cap 32 < 100
    assert capped and got == [math.floor(i * 99 / 31) for i in range(32)]
    assert got[:4] == [0, 3, 6, 9] and got[-1] == 99            # rounding would give 0, 3, 6, 10
    assert subsample(100, 256) == got                           # the baseline (32 of 100) thins by the same rule
    # the cap compares with the decoded frames, not the budget's: 100 decoded at B = 256 (subsample: 32), rho32's
    # cap 8 < 100 -> 8 of the 100; base keeps subsample(100, 256)
    assert variant_frames("rho32", 100, 256) == ([math.floor(i * 99 / 7) for i in range(8)], True)
    assert variant_frames("base", 100, 256) == (subsample(100, 256), False)
    assert variant_frames("rho32", 20, 1024) == (list(range(20)), False)
    assert variant_frames("rho16", 100, 1024) == ([math.floor(i * 99 / 62) for i in range(63)], True)


# ------------------------------------------------------------------------------------------------ every variant


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_decoded=st.integers(1, 400), budget=st.integers(64, 4200), raw_hw=st.integers(1, 256),
       group_rows=st.integers(1, 64), seed=st.integers(0, 2**16), piecewise=st.booleans())
def test_every_variant_respects_budget_and_tiles(num_decoded, budget, raw_hw, group_rows, seed, piecewise):
    x = random_feats(num_decoded, seed, piecewise)
    sub = subsample(num_decoded, budget)
    base = plan_groups(x[sub], 256, budget, raw_hw)
    for name, v in VARIANTS.items():
        keep, capped = variant_frames(v, num_decoded, budget)
        assert keep == sorted(set(keep)) and keep[0] == 0 and (len(keep) == 1 or keep[-1] == num_decoded - 1)
        assert capped == (v.cap is not None and num_decoded > frame_cap(v, budget))
        if capped:
            assert len(keep) == frame_cap(v, budget)
        else:
            assert keep == sub
        rhw = min(raw_hw, raw_rows_limit(v, capped, 256))
        rows = group_rows if name in SWAPS else None
        plan = plan_variant(v, x[keep], 256, budget, rhw, capped=capped, group_rows=rows)
        check_plan(plan, len(keep), budget)
        if name in SWAPS:  # the baseline plan with cheaper groups
            assert plan.k == group_rows and (plan.seg_lens, plan.compressed) == (base.seg_lens, base.compressed)
        if name == "base" or (v.cap is not None and not capped):
            assert plan == base   # seed: eff = v if capped or v["cap"] is None else BASE
        if capped and v.compress_group_frames:
            t = len(keep)
            assert plan.mode == "qbase" and plan.n_compressed == plan.n_groups
            assert plan.n_groups == min(t // v.compress_group_frames + 1, t)


def test_uncapped_uni16_is_the_baseline_while_uni8_cuts_uniformly():
    # 14 frames at B = 1024 with raw_hw 100: 1400 > 1024 -> hybrid with n = 14 // 4 + 1 = 4 groups
    x = random_feats(14, 5, False)
    grid = lambda m: (10, 10)  # noqa: E731
    frames, capped = variant_frames("uni16", 14, 1024)
    assert not capped                                          # cap 63 >= 14
    base = layout_video("base", x, 100, 1024, grid, 256, frames=frames, capped=False)
    u16 = layout_video("uni16", x, 100, 1024, grid, 256, frames=frames, capped=False)
    u8 = layout_video("uni8", x, 100, 1024, grid, 256, frames=frames, capped=False)
    assert u16.plan == base.plan and same_llm_input(u16, base)
    # np.round(np.linspace(0, 14, 5)) = 0, 4 (3.5 half to even), 7, 10 (10.5), 14
    assert u8.plan.seg_lens == (4, 3, 3, 4) and u8.plan.mode == "hybrid"
    assert uniform_segment_count_lengths(10, 3) == [3, 4, 3] and uniform_segment_count_lengths(6, 4) == [2, 1, 1, 2]


def test_capped_checks():
    x = random_feats(20, 0, False)
    with pytest.raises(ValueError, match="exceed"):
        plan_variant("rho64", x, 256, 1024, 64, capped=True)  # cap 16 < 20
    with pytest.raises(ValueError, match="no frame cap"):
        plan_variant("base", x, 256, 1024, 64, capped=True)
    with pytest.raises(ValueError, match="group_rows"):
        plan_variant("sel_merge", x, 256, 1024, 64, capped=False)


# ------------------------------------------------------------------------------------------------ grouping / order


def test_uniform_cut_and_hivar_order():
    # 12 frames, B=640, raw_hw=64: T*64 = 768 > 640 -> hybrid with n = 4 groups: the fork's forced cut before
    # frame 8, then the two largest other changes, into frames 2 and 5 (0.9 each)
    ch = [0.01, 0.9, 0.01, 0.01, 0.9, 0.2, 0.2, 0.01, 0.01, 0.01, 0.01]
    x = feats_from_changes(ch)
    base = plan_groups(x, 64, 640, 64)
    uni = plan_variant("uni8", x, 64, 640, 64, capped=False)
    assert base.mode == uni.mode == "hybrid" and uni.seg_lens == (3, 3, 3, 3) and base.n_groups == 4
    assert base.seg_lens == (2, 3, 3, 4)
    hiv = plan_variant("hivar", x, 64, 640, 64, capped=False)
    assert hiv.seg_lens == base.seg_lens
    var = group_variation(frame_changes(x), list(base.seg_lens))  # [0.01, 0.01, 0.2, 0.01]
    # need to free >= 128 rows: baseline compresses the longest calm group, the 4-frame g3 (768 - 256 + 64 = 576);
    # hivar the 3-frame 0.2 group (768 - 192 + 64 = 640)
    assert base.compressed == (3,) and hiv.compressed == (2,)
    assert var[2] == pytest.approx(0.2)


# ------------------------------------------------------------------------------------------------ fill


def test_hivar_scores_one_frame_groups_by_their_step():
    # the fork's cut (n = 12 // 4 + 1 = 4): forced 8, then the two largest other changes, into frames 2 and 3
    # -> adaptive groups (2, 1, 5, 4)
    ch = [0.01, 0.9, 0.8, 0.01, 0.01, 0.01, 0.7, 0.05, 0.05, 0.05, 0.05]
    x = feats_from_changes(ch)
    changes = frame_changes(x)
    assert segment(x, 4, "adaptive") == [2, 1, 5, 4]
    # seed training_change: the 1-frame group [2] scores diff[s - 1] = ch[1] = 0.9; g2 = (.01 * 3 + .7) / 4
    assert training_change(changes, [2, 1, 5, 4]) == pytest.approx([0.01, 0.9, 0.1825, 0.05], abs=1e-6)  # float32
    assert training_change(changes, [1, 11])[0] == pytest.approx(0.01)          # first frame: diff[0]
    # order (-change, -len, j) = 1, 2, 3, 0; B = 640, raw_hw 64 (768 rows raw): group 1 (saves 0) then group 2
    # (saves 256) -> 512; the earlier rule (+inf, compressed last) would compress group 2 alone
    hiv = plan_variant("hivar", x, 64, 640, 64, capped=False)
    assert hiv.seg_lens == (2, 1, 5, 4) and hiv.compressed == (1, 2) and hiv.vision_tokens == 512


def test_fill_hand_case():
    # groups of 3 frames with within-group variation 0.1, 0.5, 0.3
    ch = [0.1, 0.1, 0.9, 0.5, 0.5, 0.9, 0.3, 0.3]
    changes = frame_changes(feats_from_changes(ch))
    plan = make_plan("hybrid", [3, 3, 3], [0, 1, 2], 256, 48)  # 192 rows
    # seed order (-var, len, j) = 1, 2, 0; leftover 130: group 1 whole (272), group 2 its first
    # (322 - 272) // 48 = 1 frame (320), group 0: (322 - 320) // 48 = 0
    out = fill(plan, changes, 322)
    assert out.seg_lens == (3, 3, 1, 2) and out.compressed == (0, 3) and out.vision_tokens == 320
    assert out.mode == "hybrid" and out.n_raw_frames == 4
    out = fill(make_plan("hybrid", [3, 3, 3], [0, 1, 2], 256, 32), changes, 232)
    assert out.seg_lens == (3, 3, 3) and out.compressed == (0, 2) and out.vision_tokens == 224
    assert fill(plan, changes, 192) == plan
    # only hybrid plans change
    raw = make_plan("raw", [1] * 9, [], 256, 48)
    f8 = make_plan("forced8", [8, 1], [0, 1], 256, 48)
    assert fill(raw, changes, 10_000) is raw and fill(f8, changes, 10_000) is f8


def test_fill_single_frame_groups_first_and_the_plan_stays_hybrid():
    changes = frame_changes(feats_from_changes([0.5, 0.5, 0.9, 0.4]))
    plan = make_plan("hybrid", [3, 1, 1], [0, 1, 2], 256, 16)  # 192 rows
    out = fill(plan, changes, 10_000)   # 1-frame groups (var +inf) first, then group 0: all back
    assert out.mode == "hybrid" and out.seg_lens == (3, 1, 1) and out.compressed == () and out.vision_tokens == 80
    v2 = fill_v2(plan, changes, 10_000)    # the earlier rule returns a raw plan
    assert v2.mode == "raw" and v2.seg_lens == (1,) * 5 and v2.vision_tokens == 80


def test_fill_has_no_extra_pass():
    # raw_hw 16, [8, 2] both compressed (128 rows), B = 168; var 0.6 (8 frames), 0.01 (2 frames)
    changes = frame_changes(feats_from_changes([0.6] * 7 + [0.9, 0.01]))
    plan = make_plan("hybrid", [8, 2], [0, 1], 256, 16)
    # seed: group 0 first: 128 + 128 - 64 = 192 > 168 -> its first (168 - 128) // 16 = 2 frames (160); then
    # group 1 whole: 160 + 32 - 64 = 128
    out = fill(plan, changes, 168)
    assert out.seg_lens == (2, 6, 2) and out.compressed == (1,) and out.vision_tokens == 128
    # fill_v2 (rho<R>fv2) credits the cheap group first, so the 8-frame group comes back whole: raw, 160
    v2 = fill_v2(plan, changes, 168)
    assert v2.mode == "raw" and v2.vision_tokens == 160


@settings(max_examples=300, deadline=None)
@given(seg=st.lists(st.integers(1, 8), min_size=1, max_size=30), raw_hw=st.integers(1, 300),
       comp_seed=st.integers(0, 2**16), feat_seed=st.integers(0, 2**16), extra=st.integers(0, 3000),
       piecewise=st.booleans())
def test_fill_v2_properties(seg, raw_hw, comp_seed, feat_seed, extra, piecewise):
    g = torch.Generator().manual_seed(comp_seed)
    comp = [i for i in range(len(seg)) if torch.rand(1, generator=g).item() < 0.7]
    plan = make_plan("hybrid", seg, comp, 256, raw_hw)
    budget = plan.vision_tokens + extra
    assume(budget >= K_ROWS)
    changes = frame_changes(random_feats(sum(seg), feat_seed, piecewise))
    out = fill_v2(plan, changes, budget)
    check_plan(out, sum(seg), budget)
    before, after = frame_mask(plan), frame_mask(out)
    assert all(b or not a for a, b in zip(after, before))  # raw frames stay raw
    assert out.vision_tokens >= plan.vision_tokens or raw_hw < K_ROWS
    leftover = budget - out.vision_tokens
    order = [g for g in fill_order(group_variation(changes, seg), seg) if g in set(comp)]
    status = {}
    for gi, (a, b) in enumerate(plan.group_bounds()):
        if gi not in set(comp):
            continue
        back = [not m for m in after[a:b]]
        k = sum(back)
        assert back == [True] * k + [False] * (b - a - k)  # a group comes back from its first frame on
        status[gi] = "whole" if k == b - a else "none" if k == 0 else "partial"
        if status[gi] == "none":  # maximal: could not take even one frame at the end either
            assert leftover < (b - a) * raw_hw - K_ROWS
            if b - a > 1:
                assert leftover < raw_hw
    partial = [gi for gi in order if status[gi] == "partial"]
    assert len(partial) <= 1
    if partial:  # most-changing first: every group ahead of the partly returned one came back whole
        assert all(status[gi] == "whole" for gi in order[:order.index(partial[0])])
    if order and (seg[order[0]] * raw_hw - K_ROWS) <= extra:
        assert status[order[0]] == "whole"  # the most-changing group comes back first when it fits


@settings(max_examples=40, deadline=None)
@given(num_decoded=st.integers(1, 400), budget=st.integers(64, 4200), raw_hw=st.integers(1, 256),
       seed=st.integers(0, 2**16))
def test_rho_fill_only_adds_raw_frames(num_decoded, budget, raw_hw, seed):
    x = random_feats(num_decoded, seed, False)
    keep, capped = variant_frames("rho32", num_decoded, budget)
    nf = plan_variant("rho32nf", x[keep], 256, budget, raw_hw, capped=capped)
    f = plan_variant("rho32", x[keep], 256, budget, raw_hw, capped=capped)
    assert nf == plan_groups(x[keep], 256, budget, raw_hw)
    assert f.vision_tokens <= budget and f.n_raw_frames >= nf.n_raw_frames
    if not capped or nf.mode != "hybrid":
        assert f == nf


# ------------------------------------------------------------------------------------------------ swaps, reuse


def test_substitutes():
    assert substitute_grid("base", (16, 16)) is None
    assert substitute_grid("sel_merge", (16, 16)) == (8, 8) and substitute_grid("mean_merge", (6, 10)) == (6, 10)
    assert substitute_grid("mean_merge", (9, 16)) == (6, 10)          # exact values: test_substitute_grid_exact
    assert [substitute_frame(0, n) for n in (1, 2, 3, 4, 8)] == [0, 0, 1, 1, 3] and substitute_frame(5, 6) == 5


@pytest.mark.parametrize("encode_grid, expected", [
    # seed 000:1161 small = raw_frame_grid(hh, ww, SMALL = 64) of the encode's merged grid, the (gh, gw) grid as a
    # 28 gh x 28 gw image under max 64 cells (no minimum).
    # (9, 16) = 144 cells > 64: beta = sqrt(144 / 64) = 1.5; floor(9 / 1.5) = 6, floor(16 / 1.5) = floor(10.67) = 10
    ((9, 16), (6, 10)),
    # (6, 11) = 66 cells > 64: beta = sqrt(66 / 64) = 1.0155; floor(5.91) = 5, floor(10.83) = 10
    ((6, 11), (5, 10)),
    # (12, 21) = 252: beta = sqrt(3.9375) = 1.9843; floor(6.05) = 6, floor(10.58) = 10
    ((12, 21), (6, 10)),
    # 360 x 640 at cap 128 encodes at (8, 15) = 120 cells: beta = sqrt(120 / 64) = 1.3693; floor(5.84) = 5,
    # floor(10.95) = 10 -> 50 rows, where the native frame at 64 (the earlier sel_resize grid) is 6 x 10 = 60
    ((8, 15), (5, 10)),
    ((4, 4), (4, 4)),        # already <= 64 cells: unchanged (seed: no re-encode when raw_grid == (hh, ww))
    ((6, 10), (6, 10)),
])
def test_substitute_grid_exact(encode_grid, expected):
    """One substitute grid for the three swaps (seed 000:1161), hand-computed above and checked against
    transformers' own ``smart_resize`` (VideoLLaMA3's image processing, factor 28) of the 28 gh x 28 gw image."""
    from transformers.models.video_llama_3.image_processing_video_llama_3 import smart_resize

    for variant in SWAPS:
        assert substitute_grid(variant, encode_grid) == expected
    assert raw_frame_grid(*encode_grid, 64) == expected
    cell = 28
    h, w = smart_resize(encode_grid[0] * cell, encode_grid[1] * cell, factor=cell, min_pixels=cell ** 2,
                        max_pixels=64 * cell ** 2)
    assert (h // cell, w // cell) == expected


def test_raw_frame_grid_of_the_merged_grid():
    """Seed 000:1320 ``raw_frame_grid(*grid, raw_tokens or raw_max_tokens)``: of the encode's merged grid, so a
    raw frame is never larger than the encode's and keeps its grid when it fits."""
    assert raw_frame_grid(12, 21, 256) == (12, 21)             # 252 <= 256: the encode grid (no re-encode)
    # 252 > 24: beta = sqrt(252 / 24) = 3.2404; floor(12 / 3.2404) = 3, floor(21 / 3.2404) = floor(6.48) = 6
    assert raw_frame_grid(12, 21, 24) == (3, 6)
    # frame_grid(720, 1280, 64) = (6, 10) of the native frame; of the merged (9, 16) grid it is the same here
    assert raw_frame_grid(9, 16, 64) == frame_grid(720, 1280, 64) == (6, 10)
    with pytest.raises(ValueError, match="at least 1"):
        raw_frame_grid(0, 4, 64)


def test_swap_reuse_as_the_seed():
    """Seed 000 reuse: same seg_lens and compressed, and (comp == "qbase" or not plan.compressed)."""
    x = random_feats(60, 7, False)
    grid = lambda m: frame_grid(448, 448, m)  # noqa: E731  (16x16 = 256 rows)
    frames, capped = variant_frames("sel_merge", 60, 2048)
    base = layout_video("base", x, 256, 2048, grid, 256, frames=frames, capped=capped)
    swap = layout_video("sel_merge", x, 256, 2048, grid, 256, frames=frames, capped=capped, encode_grid=(16, 16))
    assert base.plan.n_compressed > 0 and swap.group_grid == (8, 8)
    assert swap.plan.seg_lens == base.plan.seg_lens and swap.plan.compressed == base.plan.compressed
    assert not same_llm_input(swap, base)  # compressed groups enter as raw-frame text
    # a raw-plan video (3 frames x 256 <= 2048): sel_* reuses base
    y = x[:3]
    base3 = layout_video("base", y, 256, 2048, grid, 256, frames=[0, 1, 2], capped=False)
    for name in SWAPS:
        sw = layout_video(name, y, 256, 2048, grid, 256, frames=[0, 1, 2], capped=False, encode_grid=(16, 16))
        assert base3.plan.mode == sw.plan.mode == "raw" and same_llm_input(sw, base3)
    # capped jobs never reuse; low64 on a capped video: raw frames at <= 64 rows, the baseline rule (all raw)
    frames, capped = variant_frames("low64", 120, 1024)
    low = layout_video("low64", torch.cat([x, x])[frames], 256, 1024, grid, 256, frames=frames, capped=capped)
    assert low.capped and low.raw_grid == (8, 8) and low.plan.mode == "raw" and low.stats()["capped"]
    assert not same_llm_input(low, low)


# ------------------------------------------------------------------------------------------------ jobs


def test_parse_jobs():
    assert parse_jobs("rho32:1024:4096,base:256") == [("rho32", 1024), ("rho32", 4096), ("base", 256)]
    assert parse_jobs(" qtf1:64 , low64:4096 ") == [("qtf1", 64), ("low64", 4096)]
    assert len(parse_jobs(",".join(f"{v}:1024" for v in VARIANTS))) == 19


@pytest.mark.parametrize("spec, match", [
    ("", "empty job list"),
    ("rho32", "'rho32': no budget"),
    ("rho33:1024", "'rho33:1024': unknown layout variant 'rho33'"),
    ("base:256,rho32:abc", "'rho32:abc': budget 'abc'"),
    ("rho32:-5", "'rho32:-5': budget '-5'"),
    ("rho32:1024:", "'rho32:1024:': budget ''"),
    ("rho32:32", "'rho32:32': budget 32 is smaller"),
    ("base:256,,rho32:512", "empty job token"),
    ("base:256,base:256", "'base:256': base:256 is listed twice"),
])
def test_parse_jobs_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_jobs(spec)


def test_registry_is_declarative():
    assert set(VARIANTS) == {"rho16", "rho32", "rho32nf", "rho64", "rho128", "rho256", "qtf1", "qtf2", "low64",
                             "sel_resize", "sel_merge", "mean_merge", "uni8", "uni16", "hivar", "base",
                             "rho32fv2", "rho64fv2", "rho128fv2"}
    assert all(v.name == k for k, v in VARIANTS.items())
    assert [n for n, v in VARIANTS.items() if v.fill and v.fill_rule == "seed"] == ["rho32", "rho64", "rho128"]
    assert [n for n, v in VARIANTS.items() if v.fill_rule == "v2"] == ["rho32fv2", "rho64fv2", "rho128fv2"]
    assert VARIANTS["qtf2"].compress_group_frames == 2 and VARIANTS["uni16"].cap == VARIANTS["rho16"].cap
    assert max_frames(1024) == 128 and compression_order([1.0], [2]) == [0]


def test_hivar_one_frame_video_scores_zero_where_the_seed_raises():
    # seed 000 training_change: diff = [] for one frame, and ``diff[0]`` raises IndexError; here 0.0 (docs/deviations.md row)
    assert training_change(torch.empty(0), [1]) == [0.0]
    assert training_change(torch.tensor([0.25, 0.5]), [1, 2]) == [0.25, 0.5]   # first frame: its step to the next


def test_low64_rows_whatever_the_run_cap():
    """Seed 000:1320 ``raw_grid = llm.hybrid_raw.raw_frame_grid(*grid, eff["raw_tokens"] or args.raw_max_tokens)``
    with 000:996 ``"low64": dict(BASE, cap=("rho", 64), raw_tokens=SMALL)``, ``SMALL = 64`` (000:984): a capped
    ``low64`` video's raw frames get 64 rows whether the run's cap is larger or smaller; an uncapped one plans as
    BASE (``raw_tokens=None``: the run's cap)."""
    for run_cap in (16, 63, 64, 256, 1024):
        assert raw_rows_limit("low64", True, run_cap) == 64
        assert raw_rows_limit("low64", False, run_cap) == run_cap
        assert raw_rows_limit("base", True, run_cap) == run_cap
    # the grid that follows (raw_frame_grid of a 16 x 16 merged encode grid): 8 x 8 at 64 rows, 4 x 4 at 16
    assert raw_frame_grid(16, 16, raw_rows_limit("low64", True, 16)) == (8, 8)
    assert raw_frame_grid(16, 16, raw_rows_limit("base", True, 16)) == (4, 4)
