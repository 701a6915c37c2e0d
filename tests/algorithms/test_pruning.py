"""Pruning functions on hand-made tensors; expected answers worked out by hand in the comments.

2-D unit vectors are written by their angle in degrees, so cosines are cos(angle difference).
"""

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from algorithms.pruning import (
    VARIANTS,
    AudioSpec,
    Variant,
    VideoSpec,
    DYCOKE_RELEASE_COMMIT,
    allocate_by_weight,
    anchor_merge,
    change_scores,
    contextual_num,
    dominant_num,
    dycoke_dpc_knn,
    dycoke_reached_retention,
    apply_variant,
    audio_block_retention,
    contextual_anchors,
    dominant_tokens,
    dpc_knn,
    dpc_knn_scores,
    dycoke_merging_ratio,
    dycoke_retention,
    dycoke_ttm,
    dycoke_ttm_num_kept,
    merge_tokens,
    num_keep,
    omnizip_allocate,
    received_attention,
    window_ttm,
    window_ttm_num_kept,
    window_ttm_tokens_per_frame,
)
from algorithms.pruning.dycoke import stable_topk


def vec(*deg):
    """(len(deg), 2) unit vectors at the given angles in degrees."""
    r = torch.tensor([math.radians(d) for d in deg], dtype=torch.float64)
    return torch.stack([torch.cos(r), torch.sin(r)], dim=1).float()


def frames(*frames_deg):
    """(T, N, 2) from T lists of N angles."""
    return torch.stack([vec(*f) for f in frames_deg])


# Six frames of 3 tokens used by the TTM tests.
F6 = frames([0, 0, 0], [10, 60, 30], [0, 90, 45], [80, 0, 20], [0, 0, 0], [50, 20, 5])


def test_helpers():
    # seed 003 writes round(...): Python's round, half to even
    assert num_keep(10, 0.3) == 3  # 0.3 * 10 = 3.0000000000000004
    assert num_keep(25, 0.5) == 12 and num_keep(25, 0.5, "half_up") == 13  # round(12.5) = 12
    assert num_keep(5, 0.5) == 2 and num_keep(5, 0.5, "half_up") == 3
    assert num_keep(6, 0.25) == 2  # round(1.5) = 2
    assert num_keep(7, 1.0) == 7 and num_keep(7, 0.0) == 0
    with pytest.raises(ValueError):
        num_keep(5, 1.5)
    with pytest.raises(ValueError):
        num_keep(5, 0.5, "up")
    # ties to the lower index, both directions
    assert stable_topk(torch.tensor([1.0, 3.0, 3.0, 2.0]), 2).tolist() == [1, 2]
    assert stable_topk(torch.tensor([2.0, 1.0, 1.0, 1.0]), 2, largest=False).tolist() == [1, 2]


# ------------------------------------------------------------------------------------------ DyCoke
def release_dycole_ttm(feature, n, merging_ratio, first_commit=False):
    """The TTM of KD-TAO/DyCoke (llava/model/llava_arch.py:dycole_ttm), transcribed loop by loop from the current
    release dd74634 (pair index i // 2) and, with ``first_commit``, from 26dc6f4 ((i - 2) // 2). Returns the
    concatenated kept tokens in the release's order."""
    num_frames = feature.shape[0] // n
    keep = int((1 - merging_ratio) * n)
    frame = [feature[t * n:(t + 1) * n] for t in range(num_frames)]
    sims = torch.stack([F.cosine_similarity(F.normalize(frame[i], p=2, dim=1), F.normalize(frame[i + 1], p=2, dim=1),
                                            dim=1) for i in range(0, num_frames - 1, 2)])
    out = []
    for i in range(0, num_frames - 1, 2):
        sim = sims[(i - 2) // 2] if first_commit else sims[i // 2]
        out += [frame[i], frame[i + 1][sim.topk(keep, largest=False).indices]]
    odd = torch.stack([F.cosine_similarity(frame[i], frame[i + 2], dim=1) for i in range(0, num_frames - 4, 4)])
    for i in range(0, num_frames - 4, 4):
        out[i] = frame[i]
        out[i + 2] = frame[i + 2][odd[i // 4].topk(keep, largest=False).indices]
    return torch.cat(out)


@pytest.mark.parametrize("num_frames", [6, 8, 9, 32])
@pytest.mark.parametrize("pair_indexing", ["release", "first_commit"])
def test_dycoke_equals_release_code(num_frames, pair_indexing):
    """Default = current release (dd74634); the first commit's indexing as an option; kept tokens, their order and
    count equal the transcribed release loops (random tokens: no similarity ties)."""
    assert DYCOKE_RELEASE_COMMIT.startswith("dd74634")
    torch.manual_seed(num_frames)
    n, ratio = 7, 0.7  # k = int(0.3 * 7) = 2
    tokens = torch.randn(num_frames * n + 3, 5)  # 3 trailing tokens fill no frame: dropped
    keep = dycoke_ttm(tokens, n, ratio, pair_indexing=pair_indexing)
    ref = release_dycole_ttm(tokens, n, ratio, first_commit=pair_indexing == "first_commit")
    assert torch.equal(tokens[keep], ref)
    assert len(keep) == dycoke_ttm_num_kept(len(tokens), n, ratio)
    assert torch.equal(dycoke_ttm(tokens, n, ratio, pair_indexing, order="time"), torch.sort(keep).values)
    if pair_indexing == "release":
        assert torch.equal(keep, dycoke_ttm(tokens, n, ratio))  # the default


def test_dycoke_release_hand_example():
    # K = 0.6, N = 3 -> k = int(0.4 * 3) = 1 token kept per pruned frame.
    # pair sims: s0 = cos(f0,f1) = [cos10, cos60, cos30]; s1 = cos(f2,f3) = [cos80, cos90, cos25];
    #            s2 = cos(f4,f5) = [cos50, cos20, cos5].
    # release index i // 2: frame 1 uses s0 -> least similar p1 -> flat 4; frame 3 uses s1 -> p1 -> 10;
    #   frame 5 uses s2 -> p0 -> 15. Step 2 (i in range(0, 2, 4) = [0]): frame 2 vs frame 0: [1, 0, cos45] -> p1 -> 7.
    keep = dycoke_ttm(F6.reshape(18, 2), 3, merging_ratio=0.6)
    assert keep.tolist() == [0, 1, 2, 4, 7, 10, 12, 13, 14, 15]
    assert keep.dtype == torch.long
    assert len(keep) == dycoke_ttm_num_kept(18, 3, 0.6) == 3 * (3 + 1) - 1 * (3 - 1)


def test_dycoke_first_commit_indexing():
    # first commit (i - 2) // 2: frame 1 uses s[-1] = s2 -> p0 (3); frame 3 uses s0 -> p1 (10); frame 5 s1 -> p1 (16)
    keep = dycoke_ttm(F6.reshape(18, 2), 3, merging_ratio=0.6, pair_indexing="first_commit")
    assert keep.tolist() == [0, 1, 2, 3, 7, 10, 12, 13, 14, 16]
    with pytest.raises(ValueError):
        dycoke_ttm(F6.reshape(18, 2), 3, 0.6, pair_indexing="fixed")


def test_dycoke_release_order_within_a_frame():
    # K = 0.3: k = int(0.7 * 3) = 2 of 3: frame 1 vs frame 0 (s0 = [cos10, cos60, cos30]) keeps p1 then p2 (ascending similarity) -> 4, 5
    keep = dycoke_ttm(F6[:2].reshape(6, 2), 3, merging_ratio=0.3)
    assert keep.tolist() == [0, 1, 2, 4, 5]
    f = frames([0, 0, 0], [60, 10, 30])  # s0 = [cos60, cos10, cos30]: p0 then p2
    assert dycoke_ttm(f.reshape(6, 2), 3, 0.3).tolist() == [0, 1, 2, 3, 5]
    f = frames([0, 0, 0], [10, 30, 60])  # s0 = [cos10, cos30, cos60]: p2 then p1, release order kept
    assert dycoke_ttm(f.reshape(6, 2), 3, 0.3).tolist() == [0, 1, 2, 5, 4]
    assert dycoke_ttm(f.reshape(6, 2), 3, 0.3, order="time").tolist() == [0, 1, 2, 4, 5]


def test_dycoke_four_frames_and_short_windows():
    # 4 frames: step 2 is range(0, 0, 4) = empty (the release raises there; we skip it), so frame 2 is whole.
    # frame 1 uses s0 -> p1 (4); frame 3 uses s1 = [cos80, cos90, cos25] -> p1 (10).
    keep = dycoke_ttm(F6[:4].reshape(12, 2), 3, 0.6)
    assert keep.tolist() == [0, 1, 2, 4, 6, 7, 8, 10]
    assert dycoke_ttm_num_kept(12, 3, 0.6) == 8
    # 3 frames (+1 trailing token): one pair; frame 1 uses s0 -> p1 (4); frame 2 and token 9 dropped.
    tokens = torch.cat([F6[:3].reshape(9, 2), vec(45)])
    assert dycoke_ttm(tokens, 3, 0.6).tolist() == [0, 1, 2, 4]
    assert dycoke_ttm_num_kept(10, 3, 0.6) == 4
    with pytest.raises(ValueError):
        dycoke_ttm(F6[:1].reshape(3, 2), 3, 0.6)


def test_dycoke_ties_go_to_earliest_position():
    same = frames([0, 0, 0], [0, 0, 0]).reshape(6, 2)  # all cosines 1
    assert dycoke_ttm(same, 3, 0.6).tolist() == [0, 1, 2, 3]


def test_dycoke_llava_ov_count_and_formula():
    # LLaVA-OV-7B in DyCoke: 32 frames x 196 tokens, K = 0.7 -> k = int(0.3 * 196) = 58,
    # 16 pairs * (196 + 58) - 7 windows * (196 - 58) = 4064 - 966 = 3098.
    assert dycoke_ttm_num_kept(32 * 196, 196, 0.7) == 3098
    torch.manual_seed(0)
    keep = dycoke_ttm(torch.randn(32 * 196, 8), 196, 0.7)
    assert len(keep) == 3098 and torch.equal(torch.sort(keep).values, torch.unique(keep))
    assert dycoke_retention(0.7) == pytest.approx(0.475)  # (1 + 3 * 0.3) / 4
    assert dycoke_retention(0.0) == 1.0 and dycoke_retention(1.0) == 0.25
    assert dycoke_merging_ratio(0.475) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        dycoke_merging_ratio(0.2)


def test_dycoke_reached_retention():
    # nominal 0.5 -> K = 2/3, k = int((1 - K) * 144) = 48; 8 frames: 4 pairs * 192 - 1 window * 96 = 672 of 1152
    assert dycoke_reached_retention(8 * 144, 144, dycoke_merging_ratio(0.5)) == 672 / 1152
    assert round(672 / 1152, 3) == 0.583
    # 64 patches (128 frames at 1 fps): 32 * 192 - 15 * 96 = 4704 of 9216
    assert dycoke_reached_retention(64 * 144, 144, dycoke_merging_ratio(0.5)) == 4704 / 9216


# -------------------------------------------------------------------------------------- window TTM
def test_window_ttm_hand_example():
    # windows [0..3], [4, 5]; k = 1.
    # f1 vs f0: [cos10, cos60, cos30] -> p1 (4); f2 vs f0: [1, 0, cos45] -> p1 (7);
    # f3 vs f2: diffs [80, 90, 25] -> p1 (10); f4 whole; f5 vs f4: [cos50, cos20, cos5] -> p0 (15).
    assert window_ttm(F6, 1).tolist() == [0, 1, 2, 4, 7, 10, 12, 13, 14, 15]
    assert window_ttm_num_kept(6, 3, 1) == 2 * 3 + 4 * 1
    # 4 frames: unlike the release, frame 2 is pruned against frame 0.
    assert window_ttm(F6[:4], 1).tolist() == [0, 1, 2, 4, 7, 10]
    # window of 3: f1 vs f0 (4), f2 vs f0 (7); window of 1: whole.
    assert window_ttm(F6[:3], 1).tolist() == [0, 1, 2, 4, 7]
    assert window_ttm_num_kept(3, 3, 1) == 5
    assert window_ttm(F6[:1], 1).tolist() == [0, 1, 2]
    # ties: identical frames keep the earliest positions
    assert window_ttm(frames([0, 0, 0], [0, 0, 0]), 2).tolist() == [0, 1, 2, 3, 4]
    assert window_ttm_tokens_per_frame(144, 0.5) == 48  # 144 * (2 - 1) / 3
    with pytest.raises(ValueError):
        window_ttm(F6, 4)


# ----------------------------------------------------------------------------------------- DPC-kNN
def test_dpc_knn_hand_example():
    # tokens at 0, 0, 60, 180 degrees; cosine distances: d01=0, d02=d12=0.5, d03=d13=2, d23=1.5.
    # k=1: rho = exp(-[0, 0, 0.5, 1.5]). Seed: denser = strictly higher rho, so t0 and t1 (tied densest) both
    # have no denser token -> delta = their largest distance 2; t2 -> 0.5; t3 -> min(2, 2, 1.5) = 1.5.
    x = vec(0, 0, 60, 180)
    rho, delta, score = dpc_knn_scores(x, k=1)
    assert rho.tolist() == pytest.approx([1.0, 1.0, math.exp(-0.5), math.exp(-1.5)], abs=1e-6)
    assert delta.tolist() == pytest.approx([2.0, 2.0, 0.5, 1.5], abs=1e-6)
    assert score.tolist() == pytest.approx([2.0, 2.0, 0.5 * math.exp(-0.5), 1.5 * math.exp(-1.5)], abs=1e-6)
    assert dpc_knn(x, 2, k=1).tolist() == [0, 1]
    assert dpc_knn(x, 3, k=1).tolist() == [0, 1, 3]
    assert dpc_knn(x, 4, k=1).tolist() == [0, 1, 2, 3]
    # ties="index" (earlier rule): t0 is the densest, t1's delta = d(t1, t0) = 0
    _, delta_i, _ = dpc_knn_scores(x, k=1, ties="index")
    assert delta_i.tolist() == pytest.approx([2.0, 0.0, 0.5, 1.5], abs=1e-6)
    assert dpc_knn(x, 2, k=1, ties="index").tolist() == [0, 3]
    # k larger than N - 1 is clipped: k=10 -> k=3, all the others: t3's neighbours at 2, 2, 1.5
    rho2, _, _ = dpc_knn_scores(x, k=10)
    assert rho2[3].item() == pytest.approx(math.exp(-(2 + 2 + 1.5) / 3), abs=1e-6)
    with pytest.raises(ValueError):
        dpc_knn_scores(x, ties="noise")


def test_dpc_knn_unique_densest_token():
    """Seed 003's rule with one densest token: tokens at 0, 10, 60, 180 degrees, k = 2. Cosine distances
    d01 = 1 - cos10 = .015192, d02 = .5, d03 = 2, d12 = 1 - cos50 = .357212, d13 = 1 - cos170 = 1.984808, d23 = 1.5.
    Two nearest: t0 (.015192, .5) -> mean .257596; t1 (.015192, .357212) -> .186202; t2 (.357212, .5) -> .428606;
    t3 (1.5, 1.984808) -> 1.742404; rho = exp(-mean) = .772907, .830106, .651416, .175099: t1 alone is densest, so
    "其 delta 设成它到任何其他点的最大距离": delta1 = d13 = 1.984808; t0 -> d01 = .015192 (only t1 is denser);
    t2 -> min(d02, d12) = .357212; t3 -> min(2, 1.984808, 1.5) = 1.5. score = delta * rho = .011742, 1.647600,
    .232694, .262648: topk 2 -> t1, t3; topk 3 adds t2."""
    x = vec(0, 10, 60, 180)
    rho, delta, score = dpc_knn_scores(x, k=2)
    assert rho.tolist() == pytest.approx([0.772907, 0.830106, 0.651416, 0.175099], abs=1e-5)
    assert delta.tolist() == pytest.approx([0.015192, 1.984808, 0.357212, 1.5], abs=1e-5)
    assert score.tolist() == pytest.approx([0.011742, 1.647600, 0.232694, 0.262648], abs=1e-5)
    assert dpc_knn(x, 2, k=2).tolist() == [1, 3]
    assert dpc_knn(x, 3, k=2).tolist() == [1, 2, 3]


def test_dpc_knn_counts_and_errors():
    torch.manual_seed(1)
    x = torch.randn(50, 8)
    keep = dpc_knn(x, 17)
    assert len(keep) == 17 and torch.equal(keep, torch.unique(keep))
    assert dpc_knn(x[:1], 1).tolist() == [0] and dpc_knn(x, 0).numel() == 0
    with pytest.raises(ValueError):
        dpc_knn(x, 51)


def test_v1_video_hand_example():
    """Seed 003 V1 on F6 (K = 0.6, k = 1): step 1 as the baseline (frames 1, 3, 5 keep 4, 10, 15), then the odd
    group of window 0, frames 0 (0, 0, 0 deg) and 2 (0, 90, 45 deg) = flat [0, 1, 2, 6, 7, 8], through DPC-kNN
    keeping the baseline's count N + k = 4; window 1's odd group is frame 4 alone (baseline keeps it whole).
    k = 5 neighbours (all others): distances 0 between the 0-deg tokens, 1 to 90 deg, 1 - cos45 = 0.2929 to 45 deg.
    rho(0 deg) = exp(-1.2929 / 5) = 0.7722, rho(90) = exp(-4.2929 / 5) = 0.4238, rho(45) = exp(-0.2929) = 0.7461.
    Seed ties: the four 0-deg tokens tie for the highest rho -> delta = max distance 1 -> score 0.7722 each;
    45 deg: 0.2929 * 0.7461 = 0.2185; 90 deg: 0.2929 * 0.4238 = 0.1241 -> keep the four 0-deg tokens 0, 1, 2, 6."""
    tokens = F6.reshape(18, 2)
    keep = dycoke_dpc_knn(tokens, 3, 0.6)
    assert keep.tolist() == [0, 1, 2, 4, 6, 10, 12, 13, 14, 15]
    assert len(keep) == len(dycoke_ttm(tokens, 3, 0.6))  # the baseline's count
    # ties="index": pool 0 densest (delta 1), pools 1-3 delta 0 -> keep 0, 8 (45 deg), 7 (90 deg), then 1
    assert dycoke_dpc_knn(tokens, 3, 0.6, ties="index").tolist() == [0, 1, 4, 7, 8, 10, 12, 13, 14, 15]


# ------------------------------------------------------------------------------------------- audio
def test_received_attention_and_dominant():
    attn = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.2, 0.2, 0.6]]] * 2)  # (H=2, 3, 3)
    assert received_attention(attn).tolist() == pytest.approx([0.7 / 3, 1.7 / 3, 0.6 / 3])
    # N = 5, rho_a = 0.6 -> round(0.4 * 5) = 2: 0.9 (idx 4), then the 0.5 tie goes to idx 1.
    assert dominant_tokens(torch.tensor([0.1, 0.5, 0.5, 0.2, 0.9]), 0.6).tolist() == [1, 4]
    assert dominant_tokens(torch.tensor([0.1, 0.5, 0.5, 0.2, 0.9]), 0.0).tolist() == [0, 1, 2, 3, 4]
    # seed: dominant_num = round((1 - rho_audio) * N): N = 25, rho = 0.5 -> round(12.5) = 12 (half-up: 13)
    assert dominant_num(25, 0.5) == 12 and dominant_num(25, 0.5, "half_up") == 13
    assert len(dominant_tokens(torch.arange(25.0), 0.5)) == 12
    assert contextual_num(400, 0.05) == 20 and contextual_num(50, 0.05) == 2  # round(2.5) = 2


def test_contextual_anchors_uniform_hand_example():
    # 7 tokens, idx 4 dominant; candidates [0,1,2,3,5,6] -> 2 buckets [0,1,2], [3,5,6].
    # bucket 1 at 0, 60, 30 deg: mean cos to others 0.683, 0.683, 0.866 -> idx 2.
    # bucket 2 at 90, 90, 180 deg: 0.5, 0.5, 0 -> tie -> idx 3.
    x = vec(0, 60, 30, 90, 7, 90, 180)
    assert contextual_anchors(x, torch.tensor([6, 5, 3, 2, 1, 0]), 2).tolist() == [2, 3]
    # more anchors than candidates: every candidate is its own anchor
    assert contextual_anchors(x, torch.tensor([0, 5]), 4).tolist() == [0, 5]
    assert contextual_anchors(x, torch.tensor([0, 5]), 0).numel() == 0


def test_contextual_anchors_change_buckets_vs_uniform():
    # angles 0, 10, 90, 100, 100: largest consecutive change is 10 -> 90, so "change_buckets" buckets are
    # [0, 1] (tie -> idx 0) and [2, 3, 4] (means 0.985, 0.992, 0.992 -> idx 3).
    # "uniform" buckets are [0, 1, 2] (means 0.492, 0.579, 0.087 -> idx 1) and [3, 4] (tie -> idx 3).
    x = vec(0, 10, 90, 100, 100)
    cand = torch.arange(5)
    assert contextual_anchors(x, cand, 2, mode="change_buckets").tolist() == [0, 3]
    assert contextual_anchors(x, cand, 2, mode="uniform").tolist() == [1, 3]
    # "change": the tokens that change most from their previous token: 90 (1 - cos80 = 0.826), then 0 (no previous
    # token: 0) loses to 10 and 100 (1 - cos10 = 0.015 each, computed from vectors): the set {2} plus one of them
    assert change_scores(x).tolist() == pytest.approx([0, 1 - math.cos(math.radians(10)),
                                                       1 - math.cos(math.radians(80)), 1 - math.cos(math.radians(10)), 0],
                                                      abs=1e-6)
    assert contextual_anchors(x, cand, 1, mode="change").tolist() == [2]
    with pytest.raises(ValueError):
        contextual_anchors(x, cand, 2, mode="other")


def test_anchor_merge_seed_weights_omnizip_injection():
    # anchor at 0 deg; dropped at 60, 90, 180 deg; g = 2 absorbs 60 (cos .5) and 90 (cos 0).
    # seed: w = softmax(cos(token, anchor)) over the absorbed = softmax([.5, 0]) = [.62246, .37754];
    # anchor row (x_a + sum w x) / (1 + sum w) = .5 (1, 0) + .31123 (.5, .86603) + .18877 (0, 1) = (.65562, .45831).
    x = vec(0, 60, 90, 180)
    m = anchor_merge(x, torch.tensor([0]), torch.tensor([3, 1, 2]), group_size=2)
    assert m.sources.tolist() == [[0, 1, 2]]
    assert m.merge_weights[0].tolist() == pytest.approx([0.62246, 0.37754], abs=1e-5)
    assert m.weights[0].tolist() == pytest.approx([0.5, 0.31123, 0.18877], abs=1e-5)
    assert merge_tokens(x, m)[0].tolist() == pytest.approx([0.65562, 0.45831], abs=1e-4)
    # fewer dropped tokens than g: padding repeats the anchor with weight 0; one absorbed token gets w = 1
    m = anchor_merge(x, torch.tensor([0, 3]), torch.tensor([1]), group_size=3)
    assert m.sources.tolist() == [[0, 1, 0, 0], [3, 1, 3, 3]]
    assert m.merge_weights.tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert m.weights.tolist() == [[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]
    # nothing to absorb: the anchor stays itself
    m = anchor_merge(x, torch.tensor([0]), torch.zeros(0, dtype=torch.long), group_size=2)
    assert m.weights.tolist() == [[1.0, 0.0, 0.0]] and torch.equal(merge_tokens(x, m), x[:1])
    with pytest.raises(ValueError):
        anchor_merge(x, torch.tensor([0]), torch.tensor([1]), 1, merge="mean")


def test_anchor_merge_convex_earlier_form():
    # merge="convex": w = softmax([1, .5, 0]) over the anchor and its absorbed = [.50648, .30719, .18632];
    # merged = .50648 (1, 0) + .30719 (.5, .866) + .18632 (0, 1) = (.66008, .45236).
    x = vec(0, 60, 90, 180)
    m = anchor_merge(x, torch.tensor([0]), torch.tensor([3, 1, 2]), group_size=2, merge="convex")
    assert m.weights[0].tolist() == pytest.approx([0.50648, 0.30719, 0.18632], abs=1e-5)
    assert merge_tokens(x, m)[0].tolist() == pytest.approx([0.66008, 0.45236], abs=1e-4)
    m = anchor_merge(x, torch.tensor([0, 3]), torch.tensor([1]), group_size=3, merge="convex")
    e = math.e
    assert m.weights[0].tolist() == pytest.approx([e / (e + e**0.5), e**0.5 / (e + e**0.5), 0, 0], abs=1e-6)
    assert m.weights[1, 1].item() == pytest.approx(e**-0.5 / (e + e**-0.5), abs=1e-6)  # cos(180, 60) = -0.5


# 10 audio tokens: dominant (even indices, attention 0.9 .. 0.5) at 45 deg; the others at 0, 20, 10, 100, 85 deg.
AUDIO10 = vec(45, 0, 45, 20, 45, 10, 45, 100, 45, 85)
ATTN10 = torch.tensor([0.9, 0.1, 0.8, 0.1, 0.7, 0.1, 0.6, 0.1, 0.5, 0.1])


@pytest.mark.parametrize("mode", ["uniform", "change"])
def test_v3_v5_audio_hand_example(mode):
    """r_a = 0.5, contextual_ratio = 0.2, g = 2 on AUDIO10: dominant_num = round(0.5 * 10) = 5 -> [0, 2, 4, 6, 8];
    contextual_num = round(0.2 * 10) = 2 anchors on top among [1, 3, 5, 7, 9] -> 7 kept.
    V3 (uniform buckets [1, 3, 5] and [7, 9]): rep = mean cos to the bucket's others: 1 -> (cos20 + cos10) / 2,
    3 -> same, 5 -> cos10 -> anchor 5; [7, 9] tie -> 7. Dropped [1, 3, 9]. Anchor 7 (100 deg): cos to 9 = cos15 =
    .96593, to 3 = cos80 = .17365 -> w = softmax([.96593, .17365]) = [.68832, .31168]; anchor 5 (10 deg) absorbs 1 and
    3 (cos10 each: w = .5, .5).
    V5 (highest change, 1 - cos to the previous token at 45 deg): 1: 1 - cos45 = .29289, 3: 1 - cos25 = .09369,
    5: 1 - cos35 = .18085, 7: 1 - cos55 = .42642, 9: 1 - cos40 = .23396 -> anchors 7, 1. Dropped [3, 5, 9].
    Anchor 1 (0 deg): cos to 5 = cos10 = .98481, to 3 = cos20 = .93969 -> w = [.51128, .48872]; anchor 7: 9, 3 as V3."""
    spec = Variant("hand", VideoSpec(), AudioSpec(method="dominant_anchor_merge", anchor_mode=mode,
                                                  contextual_ratio=0.2, group_size=2))
    res = apply_variant(spec, F6, AUDIO10, ATTN10, 0.5)
    m = res.audio_merge
    if mode == "uniform":
        assert res.audio_keep.tolist() == [0, 2, 4, 5, 6, 7, 8]
        assert m.anchors.tolist() == [5, 7]
        assert sorted(m.sources[0, 1:].tolist()) == [1, 3]
        assert m.merge_weights[0].tolist() == pytest.approx([0.5, 0.5], abs=1e-5)
    else:
        assert res.audio_keep.tolist() == [0, 1, 2, 4, 6, 7, 8]
        assert m.anchors.tolist() == [1, 7]
        assert m.sources[0].tolist() == [1, 5, 3]
        assert m.merge_weights[0].tolist() == pytest.approx([0.51128, 0.48872], abs=1e-5)
    assert m.sources[1].tolist() == [7, 9, 3]
    assert m.merge_weights[1].tolist() == pytest.approx([0.68832, 0.31168], abs=1e-5)
    assert m.weights[1].tolist() == pytest.approx([0.5, 0.34416, 0.15584], abs=1e-5)
    want = 0.5 * AUDIO10[7] + 0.34416 * AUDIO10[9] + 0.15584 * AUDIO10[3]
    assert merge_tokens(AUDIO10, m)[1].tolist() == pytest.approx(want.tolist(), abs=1e-4)


# ----------------------------------------------------------------------------------------- OmniZip
def test_audio_block_retention():
    # 120 audio tokens -> blocks of 50, 50, 20; keep 25 of block 0 and 10 of block 2.
    keep = torch.cat([torch.arange(25), torch.arange(100, 110)])
    assert audio_block_retention(keep, 120).tolist() == pytest.approx([0.5, 0.0, 0.5])
    assert audio_block_retention(keep, 120, num_blocks=4).tolist() == pytest.approx([0.5, 0.0, 0.5, 0.0])


def test_omnizip_allocation_hand_examples():
    sizes = torch.tensor([4, 4, 4, 4])
    audio = torch.tensor([1.0, 0.5, 0.5, 0.0])
    # c * w * n = [4c, 2c, 2c, 0] sums to 8c: budget 8 -> c = 1
    assert omnizip_allocate(sizes, audio, 8).tolist() == [4, 2, 2, 0]
    # budget 10: block 0 capped at 4, 4 + 4c = 10 -> c = 1.5 -> [4, 3, 3, 0]
    assert omnizip_allocate(sizes, audio, 10).tolist() == [4, 3, 3, 0]
    # budget 5: [2.5, 1.25, 1.25, 0] -> floors [2, 1, 1, 0], one more to the largest fraction (block 0)
    assert omnizip_allocate(sizes, audio, 5).tolist() == [3, 1, 1, 0]
    # all-zero audio -> uniform 1.5 each -> the two leftovers go to the earliest blocks
    assert omnizip_allocate(sizes, torch.zeros(4), 6).tolist() == [2, 2, 1, 1]
    # floor 0.25 -> block 3 keeps 1; 4c + 2 * 2c = 7 -> [3.5, 1.75, 1.75, 1] -> [3, 2, 2, 1]
    assert omnizip_allocate(sizes, audio, 8, min_retention=0.25).tolist() == [3, 2, 2, 1]
    # capacity bound (survivors of an earlier stage)
    assert allocate_by_weight(sizes, torch.ones(4), 12, capacity=torch.tensor([1, 4, 4, 4])).tolist() == [1, 4, 4, 3]
    with pytest.raises(ValueError):
        omnizip_allocate(sizes, audio, 2, min_retention=0.75)


# ---------------------------------------------------------------------------------------- variants
@pytest.fixture(scope="module")
def sample():
    """16 s synthetic sample: 16 temporal patches of 24 tokens, 400 audio tokens, random attention."""
    g = torch.Generator().manual_seed(0)
    video = torch.randn(16, 24, 16, generator=g)
    audio = torch.randn(400, 16, generator=g)
    attn = torch.softmax(torch.randn(2, 400, 400, generator=g), dim=-1)
    return video, audio, attn


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_keep_counts(sample, name):
    video, audio, attn = sample
    r = 0.5
    res = apply_variant(name, video, audio, attn, r)
    v = VARIANTS[name]
    for keep, total in ((res.video_keep, 16 * 24), (res.audio_keep, 400)):
        assert keep.dtype == torch.long and torch.equal(keep, torch.unique(keep))
        assert int(keep.min()) >= 0 and int(keep.max()) < total
    # baseline and V1 video keep DyCoke's count: 8 pairs * (24 + 8) - 3 windows * 16 = 208 (k = int(24 / 3) = 8)
    assert res.num_video == dycoke_ttm_num_kept(16 * 24, 24, dycoke_merging_ratio(r)) == 208
    assert res.video_block_counts is None
    if v.audio.method == "dycoke":
        assert res.num_audio == dycoke_ttm_num_kept(400, 25, dycoke_merging_ratio(r))
    elif v.audio.method == "dominant":
        assert res.num_audio == round(0.5 * 400) == 200
    else:  # dominant_num + contextual_num on top: 200 + round(0.05 * 400)
        assert res.num_audio == 200 + 20
    if v.audio.method == "dominant_anchor_merge":
        m = res.audio_merge
        assert len(m.anchors) == 20
        assert set(m.anchors.tolist()) <= set(res.audio_keep.tolist())
        assert torch.allclose(m.weights.sum(1), torch.ones(20))
        assert torch.allclose(m.merge_weights.sum(1), torch.ones(20))  # softmax over the g = 3 absorbed
        dropped = set(range(400)) - set(res.audio_keep.tolist())
        absorbed = m.sources[:, 1:][m.weights[:, 1:] > 0]
        assert set(absorbed.tolist()) <= dropped
        merged = merge_tokens(audio, m)
        expect = (m.weights[..., None] * audio[m.sources]).sum(1)
        assert torch.allclose(merged, expect)
    else:
        assert res.audio_merge is None


def test_variant_relations(sample):
    video, audio, attn = sample
    runs = {n: apply_variant(n, video, audio, attn, 0.5) for n in VARIANTS}
    assert torch.equal(runs["baseline"].video_keep, runs["v2"].video_keep)
    assert torch.equal(runs["v1"].video_keep, runs["v4"].video_keep)
    assert torch.equal(runs["v4"].video_keep, runs["v5"].video_keep)
    assert not torch.equal(runs["baseline"].video_keep, runs["v1"].video_keep)
    assert torch.equal(runs["v3"].audio_keep, runs["v4"].audio_keep)
    assert torch.equal(runs["v5"].audio_keep, runs["v6"].audio_keep)
    assert torch.equal(runs["baseline"].video_keep, runs["v6"].video_keep)
    # v5 differs from v4 only in its anchors: same dominant tokens
    assert not torch.equal(runs["v4"].audio_merge.anchors, runs["v5"].audio_merge.anchors)
    # separate retentions per modality
    res = apply_variant("v4", video, audio, attn, (0.3, 0.6))
    assert (res.num_video, res.num_audio) == (dycoke_ttm_num_kept(384, 24, dycoke_merging_ratio(0.3)), 240 + 20)


def test_variants_equal_their_parts_composed_by_hand(sample):
    """Each variant's keep indices equal the documented composition of the component functions, mapped back to
    the original token indices here (so a wrong index mapping inside ``apply_variant`` cannot pass)."""
    video, audio, attn = sample
    flat = video.reshape(16 * 24, 16)
    runs = {n: apply_variant(n, video, audio, attn, 0.5) for n in ("baseline", "v1", "v2", "v3", "v5")}
    K = dycoke_merging_ratio(0.5)
    # baseline: DyCoke TTM on the 16 patches of 24 tokens, and on audio cut into 1 s frames of 25 tokens
    assert torch.equal(runs["baseline"].video_keep, torch.sort(dycoke_ttm(flat, 24, K)).values)
    assert torch.equal(runs["baseline"].audio_keep, torch.sort(dycoke_ttm(audio, 25, K)).values)
    # v2: the 200 dominant audio tokens (pruning ratio 0.5)
    assert torch.equal(runs["v2"].audio_keep, dominant_tokens(received_attention(attn), 0.5))
    # v1: DyCoke step 1 frames (1-based 2, 4 of each window) + DPC-kNN on each window's odd group
    base = dycoke_ttm(flat, 24, K, order="time")
    frame = base // 24
    even = base[frame % 2 == 1].tolist()
    kept = list(even)
    for w in range(4):
        pool = torch.cat([torch.arange(24) + 24 * (4 * w), torch.arange(24) + 24 * (4 * w + 2)])
        count = int(((frame == 4 * w) | (frame == 4 * w + 2)).sum())  # baseline's count: 32, or 48 in window 3
        assert count == (48 if w == 3 else 32)
        kept += pool[dpc_knn(flat[pool], count, 5)].tolist()
    assert runs["v1"].video_keep.tolist() == sorted(kept)
    # v3 / v5: 200 dominant tokens + 20 anchors among the other 200, chosen by uniform buckets / highest change
    dominant = dominant_tokens(received_attention(attn), 0.5)
    rest = torch.tensor(sorted(set(range(400)) - set(dominant.tolist())))
    for name, mode in (("v3", "uniform"), ("v5", "change")):
        anchors = contextual_anchors(audio, rest, 20, mode)
        assert runs[name].audio_keep.tolist() == sorted(dominant.tolist() + anchors.tolist())
        dropped = torch.tensor(sorted(set(rest.tolist()) - set(anchors.tolist())))
        want = anchor_merge(audio, anchors, dropped, 3, 1.0)
        assert torch.equal(runs[name].audio_merge.sources, want.sources)
        assert torch.allclose(runs[name].audio_merge.weights, want.weights)
    assert torch.equal(contextual_anchors(audio, rest, 20, "change"),
                       torch.sort(rest[stable_topk(change_scores(audio)[rest], 20)]).values)


def test_earlier_behaviours_as_settings(sample):
    """The earlier V1 (TTM at r ** 0.5, then DPC-kNN per 2 s block to exactly round(r T N)) and the earlier anchor
    split stay reachable as settings."""
    video, audio, attn = sample
    old = Variant("v4_earlier", VideoSpec(ttm="dycoke", select="dpc_knn_blocks", dpc_ties="index"),
                  AudioSpec(method="dominant_anchor_merge", anchor_count="share", group_size=4, merge="convex",
                            rounding="half_up", anchor_mode="change_buckets"))
    res = apply_variant(old, video, audio, attn, 0.5)
    assert res.num_video == 192 and res.video_block_counts.tolist() == [24] * 8
    assert res.num_audio == 200 and len(res.audio_merge.anchors) == 50  # 150 dominant + 50 anchors
    assert torch.allclose(res.audio_merge.weights.sum(1), torch.ones(50))


def test_variant_audio_driven_allocation(sample):
    video, audio, attn = sample
    # audio attention concentrated in the first 4 s: dominant tokens all there -> more video there
    received = torch.cat([torch.linspace(2.0, 1.0, 100), torch.linspace(0.5, 0.1, 300)])
    spec = Variant("v2_alloc", VideoSpec(ttm="none", select="dpc_knn_blocks", allocation="audio"),
                   AudioSpec(method="dominant"))
    res = apply_variant(spec, video, audio, received, (0.25, 0.25))
    counts = res.video_block_counts.tolist()
    assert sum(counts) == res.num_video == 96
    assert counts[:2] == [48, 48] and sum(counts[2:]) == 0  # audio kept only in blocks 0 and 1


def test_variant_errors(sample):
    video, audio, attn = sample
    with pytest.raises(KeyError):
        apply_variant("v9", video, audio, attn, 0.5)
    with pytest.raises(ValueError):
        apply_variant("baseline", video, audio, attn, 0.2)  # DyCoke TTM cannot go below 0.25
    with pytest.raises(ValueError):
        apply_variant("v2", video, audio, None, 0.5)
    with pytest.raises(ValueError):
        VideoSpec(select="none", allocation="audio")
    with pytest.raises(ValueError):
        VideoSpec(ttm="none", select="dpc_knn_odd")
    with pytest.raises(ValueError):
        AudioSpec(merge="mean")


def test_pruning_is_pure():
    code = (
        "import sys, algorithms.pruning, algorithms.flops;"
        "bad = [m for m in ('transformers', 'lightning', 'pytorch_lightning') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
