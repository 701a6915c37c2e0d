"""Pruning functions on hand-made tensors; expected answers worked out by hand in the comments.

2-D unit vectors are written by their angle in degrees, so cosines are cos(angle difference).
"""

import math
import subprocess
import sys

import pytest
import torch

from algorithms.pruning import (
    VARIANTS,
    AudioSpec,
    Variant,
    VideoSpec,
    allocate_by_weight,
    anchor_merge,
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
    assert num_keep(10, 0.3) == 3  # 0.3 * 10 = 3.0000000000000004
    assert num_keep(5, 0.5) == 3  # half up, not banker's
    assert num_keep(6, 0.25) == 2  # 1.5 -> 2
    assert num_keep(7, 1.0) == 7 and num_keep(7, 0.0) == 0
    with pytest.raises(ValueError):
        num_keep(5, 1.5)
    # ties to the lower index, both directions
    assert stable_topk(torch.tensor([1.0, 3.0, 3.0, 2.0]), 2).tolist() == [1, 2]
    assert stable_topk(torch.tensor([2.0, 1.0, 1.0, 1.0]), 2, largest=False).tolist() == [1, 2]


# ------------------------------------------------------------------------------------------ DyCoke
def test_dycoke_release_hand_example():
    # K = 0.6, N = 3 -> k = int(0.4 * 3) = 1 token kept per pruned frame.
    # pair sims: s0 = cos(f0,f1) = [cos10, cos60, cos30]; s1 = cos(f2,f3) = [cos80, cos90, cos25];
    #            s2 = cos(f4,f5) = [cos50, cos20, cos5].
    # release index (i-2)//2: frame 1 uses s[-1] = s2 -> least similar p0 -> flat 3;
    #   frame 3 uses s0 -> p1 -> 10; frame 5 uses s1 -> p1 -> 16.
    # step 2 (i in range(0, 2, 4) = [0]): frame 2 vs frame 0: [1, 0, cos45] -> p1 -> 7.
    # frames 0 and 4 whole.
    keep = dycoke_ttm(F6.reshape(18, 2), 3, merging_ratio=0.6)
    assert keep.tolist() == [0, 1, 2, 3, 7, 10, 12, 13, 14, 16]
    assert keep.dtype == torch.long
    assert len(keep) == dycoke_ttm_num_kept(18, 3, 0.6) == 3 * (3 + 1) - 1 * (3 - 1)


def test_dycoke_fixed_indexing():
    # each odd frame against its own pair: frame 1 s0 -> p1 (4); frame 3 s1 -> p1 (10); frame 5 s2 -> p0 (15)
    keep = dycoke_ttm(F6.reshape(18, 2), 3, merging_ratio=0.6, release_indexing=False)
    assert keep.tolist() == [0, 1, 2, 4, 7, 10, 12, 13, 14, 15]


def test_dycoke_four_frames_and_short_windows():
    # 4 frames: step 2 is range(0, 0, 4) = empty (the release raises there; we skip it), so frame 2 is whole.
    # frame 1 uses s[-1] = s1 = [cos80, cos90, cos25] -> p1 (4); frame 3 uses s0 -> p1 (10).
    keep = dycoke_ttm(F6[:4].reshape(12, 2), 3, 0.6)
    assert keep.tolist() == [0, 1, 2, 4, 6, 7, 8, 10]
    assert dycoke_ttm_num_kept(12, 3, 0.6) == 8
    # 3 frames (+1 trailing token): one pair; frame 1 uses s[-1] = s0 -> p1 (4); frame 2 and token 9 dropped.
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
    assert len(keep) == 3098 and torch.equal(keep, torch.unique(keep))
    assert dycoke_retention(0.7) == pytest.approx(0.475)  # (1 + 3 * 0.3) / 4
    assert dycoke_retention(0.0) == 1.0 and dycoke_retention(1.0) == 0.25
    assert dycoke_merging_ratio(0.475) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        dycoke_merging_ratio(0.2)


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
    # k=1: rho = exp(-[0, 0, 0.5, 1.5]); t0 and t1 tie on rho -> t0 (lower index) is the densest.
    # delta: t0 -> its largest distance 2; t1 -> d(t1,t0) = 0; t2 -> 0.5; t3 -> min(2, 2, 1.5) = 1.5.
    x = vec(0, 0, 60, 180)
    rho, delta, score = dpc_knn_scores(x, k=1)
    assert rho.tolist() == pytest.approx([1.0, 1.0, math.exp(-0.5), math.exp(-1.5)], abs=1e-6)
    assert delta.tolist() == pytest.approx([2.0, 0.0, 0.5, 1.5], abs=1e-6)
    # scores 2, 0, 0.3033, 0.3347
    assert score.tolist() == pytest.approx([2.0, 0.0, 0.5 * math.exp(-0.5), 1.5 * math.exp(-1.5)], abs=1e-6)
    assert dpc_knn(x, 2, k=1).tolist() == [0, 3]
    assert dpc_knn(x, 3, k=1).tolist() == [0, 2, 3]
    assert dpc_knn(x, 4, k=1).tolist() == [0, 1, 2, 3]
    # k larger than N - 1 is clipped: k=2 -> rho = exp(-[0.25, 0.25, 0.5, 1.75])
    rho2, _, _ = dpc_knn_scores(x, k=10)
    assert rho2[3].item() == pytest.approx(math.exp(-(2 + 2 + 1.5) / 3), abs=1e-6)


def test_dpc_knn_counts_and_errors():
    torch.manual_seed(1)
    x = torch.randn(50, 8)
    keep = dpc_knn(x, 17)
    assert len(keep) == 17 and torch.equal(keep, torch.unique(keep))
    assert dpc_knn(x[:1], 1).tolist() == [0] and dpc_knn(x, 0).numel() == 0
    with pytest.raises(ValueError):
        dpc_knn(x, 51)


# ------------------------------------------------------------------------------------------- audio
def test_received_attention_and_dominant():
    attn = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.2, 0.2, 0.6]]] * 2)  # (H=2, 3, 3)
    assert received_attention(attn).tolist() == pytest.approx([0.7 / 3, 1.7 / 3, 0.6 / 3])
    # N = 5, rho_a = 0.6 -> round(0.4 * 5) = 2: 0.9 (idx 4), then the 0.5 tie goes to idx 1.
    assert dominant_tokens(torch.tensor([0.1, 0.5, 0.5, 0.2, 0.9]), 0.6).tolist() == [1, 4]
    assert dominant_tokens(torch.tensor([0.1, 0.5, 0.5, 0.2, 0.9]), 0.0).tolist() == [0, 1, 2, 3, 4]


def test_contextual_anchors_uniform_hand_example():
    # 7 tokens, idx 4 dominant; candidates [0,1,2,3,5,6] -> 2 buckets [0,1,2], [3,5,6].
    # bucket 1 at 0, 60, 30 deg: mean cos to others 0.683, 0.683, 0.866 -> idx 2.
    # bucket 2 at 90, 90, 180 deg: 0.5, 0.5, 0 -> tie -> idx 3.
    x = vec(0, 60, 30, 90, 7, 90, 180)
    assert contextual_anchors(x, torch.tensor([6, 5, 3, 2, 1, 0]), 2).tolist() == [2, 3]
    # more anchors than candidates: every candidate is its own anchor
    assert contextual_anchors(x, torch.tensor([0, 5]), 4).tolist() == [0, 5]
    assert contextual_anchors(x, torch.tensor([0, 5]), 0).numel() == 0


def test_contextual_anchors_change_vs_uniform():
    # angles 0, 10, 90, 100, 100: largest consecutive change is 10 -> 90, so "change" buckets are
    # [0, 1] (tie -> idx 0) and [2, 3, 4] (means 0.985, 0.992, 0.992 -> idx 3).
    # "uniform" buckets are [0, 1, 2] (means 0.492, 0.579, 0.087 -> idx 1) and [3, 4] (tie -> idx 3).
    x = vec(0, 10, 90, 100, 100)
    cand = torch.arange(5)
    assert contextual_anchors(x, cand, 2, mode="change").tolist() == [0, 3]
    assert contextual_anchors(x, cand, 2, mode="uniform").tolist() == [1, 3]
    with pytest.raises(ValueError):
        contextual_anchors(x, cand, 2, mode="other")


def test_anchor_merge_softmax_weighted_sum():
    # anchor at 0 deg; dropped at 60, 90, 180 deg; g = 2 absorbs 60 (cos .5) and 90 (cos 0).
    # w = softmax([1, .5, 0]) = [.50648, .30719, .18632];
    # merged = .50648 (1, 0) + .30719 (.5, .866) + .18632 (0, 1) = (.66008, .45236).
    x = vec(0, 60, 90, 180)
    m = anchor_merge(x, torch.tensor([0]), torch.tensor([3, 1, 2]), group_size=2)
    assert m.sources.tolist() == [[0, 1, 2]]
    assert m.weights[0].tolist() == pytest.approx([0.50648, 0.30719, 0.18632], abs=1e-5)
    merged = merge_tokens(x, m)
    assert merged[0].tolist() == pytest.approx([0.66008, 0.45236], abs=1e-4)
    # fewer dropped tokens than g: padding repeats the anchor with weight 0
    m = anchor_merge(x, torch.tensor([0, 3]), torch.tensor([1]), group_size=3)
    assert m.sources.tolist() == [[0, 1, 0, 0], [3, 1, 3, 3]]
    e = math.e
    assert m.weights[0].tolist() == pytest.approx([e / (e + e**0.5), e**0.5 / (e + e**0.5), 0, 0], abs=1e-6)
    # anchor 3 (180 deg) vs token 1 (60 deg): cos = -0.5; both anchors absorb token 1
    assert m.weights[1, 1].item() == pytest.approx(e**-0.5 / (e + e**-0.5), abs=1e-6)
    assert torch.allclose(m.weights.sum(1), torch.ones(2))


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
    if v.video.select == "dpc_knn":
        assert res.num_video == num_keep(16 * 24, r) == 192
        assert res.video_block_counts.tolist() == [24] * 8  # uniform: 48 tokens per 2 s block, half kept
    else:
        assert res.num_video == dycoke_ttm_num_kept(16 * 24, 24, dycoke_merging_ratio(r))
    if v.audio.method == "dycoke":
        assert res.num_audio == dycoke_ttm_num_kept(400, 25, dycoke_merging_ratio(r))
    else:
        assert res.num_audio == num_keep(400, r) == 200
    if v.audio.method == "dominant_anchor_merge":
        m = res.audio_merge
        assert len(m.anchors) == num_keep(200, 0.25) == 50
        assert set(m.anchors.tolist()) <= set(res.audio_keep.tolist())
        assert torch.allclose(m.weights.sum(1), torch.ones(50))
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
    assert torch.equal(runs["v3"].audio_keep, runs["v4"].audio_keep)
    assert torch.equal(runs["v5"].audio_keep, runs["v6"].audio_keep)
    assert torch.equal(runs["baseline"].video_keep, runs["v6"].video_keep)
    # v5 differs from v4 only in its anchors: same dominant tokens
    assert not torch.equal(runs["v4"].audio_merge.anchors, runs["v5"].audio_merge.anchors)
    # separate retentions per modality
    res = apply_variant("v4", video, audio, attn, (0.3, 0.6))
    assert (res.num_video, res.num_audio) == (num_keep(384, 0.3), num_keep(400, 0.6))


def test_variants_equal_their_parts_composed_by_hand(sample):
    """Each variant's keep indices equal the documented composition of the component functions, mapped back to
    the original token indices here (so a wrong index mapping inside ``apply_variant`` cannot pass)."""
    video, audio, attn = sample
    flat = video.reshape(16 * 24, 16)
    runs = {n: apply_variant(n, video, audio, attn, 0.5) for n in ("baseline", "v1", "v2", "v3", "v5")}
    # baseline: DyCoke TTM on the 16 patches of 24 tokens, and on audio cut into 1 s frames of 25 tokens
    assert torch.equal(runs["baseline"].video_keep, dycoke_ttm(flat, 24, dycoke_merging_ratio(0.5)))
    assert torch.equal(runs["baseline"].audio_keep, dycoke_ttm(audio, 25, dycoke_merging_ratio(0.5)))
    # v2: the 200 dominant audio tokens (pruning ratio 0.5)
    assert torch.equal(runs["v2"].audio_keep, dominant_tokens(received_attention(attn), 0.5))
    # v1: TTM at sqrt(0.5), then per 2 s block (tokens 48b .. 48b+47) DPC-kNN keeps 24 of that block's survivors
    survivors = dycoke_ttm(flat, 24, dycoke_merging_ratio(0.5 ** 0.5))
    kept = []
    for b in range(8):
        pool = survivors[(survivors >= 48 * b) & (survivors < 48 * (b + 1))]
        assert len(pool) >= 24
        kept += pool[dpc_knn(flat[pool], 24, 5)].tolist()
    assert runs["v1"].video_keep.tolist() == sorted(kept)
    # v3 / v5: 150 dominant tokens + 50 anchors among the other 250, chosen by uniform / change buckets
    dominant = dominant_tokens(received_attention(attn), 1 - 150 / 400)
    rest = torch.tensor(sorted(set(range(400)) - set(dominant.tolist())))
    for name, mode in (("v3", "uniform"), ("v5", "change")):
        anchors = contextual_anchors(audio, rest, 50, mode)
        assert runs[name].audio_keep.tolist() == sorted(dominant.tolist() + anchors.tolist())
        dropped = torch.tensor(sorted(set(rest.tolist()) - set(anchors.tolist())))
        want = anchor_merge(audio, anchors, dropped, 4, 1.0)
        assert torch.equal(runs[name].audio_merge.sources, want.sources)
        assert torch.allclose(runs[name].audio_merge.weights, want.weights)


def test_variant_audio_driven_allocation(sample):
    video, audio, attn = sample
    # audio attention concentrated in the first 4 s: dominant tokens all there -> more video there
    received = torch.cat([torch.linspace(2.0, 1.0, 100), torch.linspace(0.5, 0.1, 300)])
    spec = Variant("v2_alloc", VideoSpec(ttm="none", select="dpc_knn", allocation="audio"), AudioSpec(method="dominant"))
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


def test_pruning_is_pure():
    code = (
        "import sys, algorithms.pruning, algorithms.flops;"
        "bad = [m for m in ('transformers', 'lightning', 'pytorch_lightning') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
