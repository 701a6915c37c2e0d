"""Values of the qbase group compressor (models/qbase.py) and of ``BudgetedVideoLlama3.compress``.

* Padded batching: one call over G groups of different lengths (one key-padding window per group) equals
  compressing every group alone with the same video context (fp32, 1e-6).
* Padded slots are never read: garbage written into them (inside every layer) changes nothing.
* The video context (DESIGN §3.5, qbase docstring): the mean encoder row of the *whole* video, i.e. over all
  frames' rows, raw frames included, captured from the call ``compress`` makes.
"""
import pytest
import torch

from algorithms.budget import make_plan
from models.qbase import QBaseCompressor, QBaseConfig, _Layer

C = 32


@pytest.fixture
def qb():
    torch.manual_seed(0)
    m = QBaseCompressor(QBaseConfig(hidden_size=C, num_queries=8, num_layers=2, num_heads=2)).eval()
    with torch.no_grad():  # spread the (small) default query init so the outputs differ clearly between inputs
        m.queries.normal_(0.0, 1.0)
    return m


def _groups(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, C, generator=g) for n in lengths]


LENGTHS = [5, 1, 12, 3]      # longest 12: three of the four groups are padded


@torch.no_grad()
def test_padded_batch_equals_each_group_alone(qb):
    groups = _groups(LENGTHS)
    ctx = torch.randn(C, generator=torch.Generator().manual_seed(2))
    out = qb(torch.cat(groups), LENGTHS, video_context=ctx)
    assert out.shape == (len(LENGTHS), 8, C)
    for g, x in enumerate(groups):
        alone = qb(x, [x.shape[0]], video_context=ctx)     # one group: no padding at all
        torch.testing.assert_close(out[g], alone[0], rtol=0, atol=1e-6)
    # not vacuous: the groups give different rows, and the context matters
    assert (out[0] - out[2]).abs().max() > 1e-2
    other = torch.randn(C, generator=torch.Generator().manual_seed(3))   # (a shift of ctx would not do: norm_kv)
    assert (qb(torch.cat(groups), LENGTHS, video_context=other) - out).abs().max() > 1e-3


@torch.no_grad()
def test_default_context_is_mean_of_rows(qb):
    groups = _groups(LENGTHS)
    rows = torch.cat(groups)
    mean = rows.double().sum(0).div(rows.shape[0]).float()   # 21 rows summed in float64
    torch.testing.assert_close(qb(rows, LENGTHS), qb(rows, LENGTHS, video_context=mean), rtol=0, atol=1e-6)


@torch.no_grad()
def test_padded_slots_are_ignored(qb, monkeypatch):
    groups = _groups(LENGTHS)
    rows = torch.cat(groups)
    ctx = rows.mean(0)
    ref = qb(rows, LENGTHS, video_context=ctx)
    real_forward = _Layer.forward
    seen = []

    def poisoned(target):
        def forward(self, q, kv, key_mask):
            kv = kv.clone()
            g = torch.Generator().manual_seed(len(seen))
            noise = 1e3 * torch.randn(kv.shape, generator=g)
            slots = ~key_mask if target == "pad" else key_mask
            kv[slots] = noise[slots]
            seen.append(int(slots.sum()))
            return real_forward(self, q, kv, key_mask)
        return forward

    monkeypatch.setattr(_Layer, "forward", poisoned("pad"))
    out = qb(rows, LENGTHS, video_context=ctx)
    # every layer saw the 4 x 13 window (12 rows + context) with 52 - 21 rows - 4 context rows = 27 padded slots
    assert seen == [4 * 13 - sum(LENGTHS) - 4] * 2
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    # the same poisoning of the *valid* slots does change the output (the check above can fail)
    monkeypatch.setattr(_Layer, "forward", poisoned("valid"))
    assert (qb(rows, LENGTHS, video_context=ctx) - ref).abs().max() > 1e-2


@torch.no_grad()
def test_compress_windows_and_video_context(tiny_vlm, monkeypatch):
    """``compress`` passes the compressed groups' rows in group order, one window per group of ``frames * hw``
    rows, and the mean over *all* frames' rows (raw frames included) as the video context; its output equals
    compressing each group alone with that context."""
    t, hw = 8, 4
    # groups [0,2) raw, [2,5) compressed, [5,6) raw, [6,8) compressed
    plan = make_plan("hybrid", [2, 3, 1, 2], [1, 3], hw=hw, raw_hw=hw)
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(t, hw, C, generator=g)
    rows[:2] += 5.0                      # raw frames far from the rest: a context over compressed frames only differs
    calls = []
    real = tiny_vlm.compressor.forward

    def capture(r, group_rows, video_context=None):
        calls.append((r.clone(), list(group_rows), None if video_context is None else video_context.clone()))
        return real(r, group_rows, video_context=video_context)

    monkeypatch.setattr(tiny_vlm.compressor, "forward", capture)
    out = tiny_vlm.compress(rows, plan)
    assert len(calls) == 1                               # one call for the whole video
    r, group_rows, ctx = calls[0]
    assert group_rows == [3 * hw, 2 * hw]
    assert torch.equal(r, torch.cat([rows[2:5].reshape(-1, C), rows[6:8].reshape(-1, C)]))
    # mean over all 8 frames x 4 rows, summed independently in float64
    want = sum(rows[i, j].double() for i in range(t) for j in range(hw)) / (t * hw)
    assert ctx is not None
    torch.testing.assert_close(ctx.double(), want, rtol=0, atol=1e-6)
    # the whole-video mean is not the compressed frames' mean here (the check above tells them apart)
    assert (r.double().mean(0) - want).abs().max() > 1.0
    assert out.shape == (2, 64, C)
    monkeypatch.undo()
    tiny_vlm.compressor.__dict__.pop("forward", None)   # undo leaves the bound method as an instance attribute
    for k, (a, b) in enumerate([(2, 5), (6, 8)]):
        alone = tiny_vlm.compressor(rows[a:b].reshape(-1, C), [(b - a) * hw], video_context=want.float())
        torch.testing.assert_close(out[k], alone[0], rtol=0, atol=1e-6)


def test_compress_with_no_compressed_group(tiny_vlm):
    plan = make_plan("raw", [1, 1], [], hw=4, raw_hw=4)
    out = tiny_vlm.compress(torch.randn(2, 4, C), plan)
    assert out.shape == (0, 64, C)
