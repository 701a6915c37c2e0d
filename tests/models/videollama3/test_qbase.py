"""The seeds' token compressor (models/videollama3/qbase.py) against OnlineLong's ``TransformerDecoderFlatCompressor``.

* The batched compressor equals a plain per-window implementation written here from the fork's formulas (fp32,
  windows of different lengths and grids), with and without ``match_encoder_scale``.
* Hand values of the fork's sin/cos query encoding and of its factorized (t, h, w) key rotary.
* The parameter names are the fork's (a list written from reading its classes): a state dict with exactly those
  keys loads with ``strict=True``.
* ``adaptive_segmentation`` inside forward cuts each window as ``adaptive_segment_lengths`` does.
* The fork's config fields: legacy names, unknown types, training-only fields.
* ``BudgetedVideoLlama3.compress`` makes seed 001's single call (every group a window, ``cu = cumsum(L * hw)``)
  and returns group j's rows ``[j * K, (j + 1) * K)``.
"""
import math

import pytest
import torch

from algorithms.budget import make_plan
from algorithms.segmentation import adaptive_segment_lengths
from models.videollama3.qbase import (
    TokenCompressorConfig, TransformerDecoderFlatCompressor, cross_rotary_angles, sinusoidal_position_encoding,
)

C, HEADS, K = 32, 2, 8


def _config(**kw):
    base = dict(compressor_type="transformer_decoder_flat", hidden_size=C, intermediate_size=48, num_layers=2,
                num_attention_heads=HEADS, num_queries=K)
    return TokenCompressorConfig(**{**base, **kw})


def _spread(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():   # away from the near-zero init so every term shows in the output
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim > 1 else 0.5) + (1.0 if p.ndim == 1 else 0))
    return m.eval()


# ------------------------------------------------------------------ the fork's math, one window at a time
def _ln(x, mod):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + mod.eps) * mod.weight + mod.bias


def _attn(q_in, kv_in, att, key_angles=None):
    """Heads, rotary on the keys only (``rotate_half`` pairing i with i + hd/2), softmax(q k^T / sqrt(hd)) v."""
    hd = C // HEADS
    q, k, v = q_in @ att.w_q.weight.T, kv_in @ att.w_k.weight.T, kv_in @ att.w_v.weight.T
    outs = []
    for h in range(HEADS):
        qh, kh, vh = (t[:, h * hd:(h + 1) * hd] for t in (q, k, v))
        if key_angles is not None:
            rot = torch.empty_like(kh)
            for n in range(kh.shape[0]):
                for i in range(hd // 2):
                    a = float(key_angles[n][i])
                    x1, x2 = kh[n, i], kh[n, i + hd // 2]
                    rot[n, i] = x1 * math.cos(a) - x2 * math.sin(a)
                    rot[n, i + hd // 2] = x2 * math.cos(a) + x1 * math.sin(a)
            kh = rot
        w = torch.softmax(qh @ kh.T / math.sqrt(hd), dim=-1)
        outs.append(w @ vh)
    return torch.cat(outs, -1) @ att.w_o.weight.T


def _angles(n_rows, h, w):
    """Per key: t = j // hw, y = (j % hw) // w, x = j % w; bands d_t = D // 3, d_h = (D - d_t) // 2, d_w = rest of
    inv_freq_i = 10000^(-2i / hd), i < D = hd / 2."""
    hd = C // HEADS
    d = hd // 2
    d_t = d // 3
    d_h = (d - d_t) // 2
    inv = [10000.0 ** (-(2 * i) / hd) for i in range(d)]
    out = []
    for j in range(n_rows):
        t, y, x = j // (h * w), (j % (h * w)) // w, j % w
        out.append([c * inv[i] for c, i in
                    [(t, i) for i in range(d_t)] + [(y, i) for i in range(d_t, d_t + d_h)]
                    + [(x, i) for i in range(d_t + d_h, d)]])
    return out


def _reference(m, windows, grids):
    """The fork's forward over each window alone (dropout off), then Option A over the whole call."""
    pe = torch.tensor([[math.sin(p / 10000 ** (2 * (i // 2) / C)) if i % 2 == 0 else
                        math.cos(p / 10000 ** (2 * (i // 2) / C)) for i in range(C)] for p in range(K)])
    outs = []
    for kv, (h, w) in zip(windows, grids):
        q = m.query[0] + pe
        ang = _angles(kv.shape[0], h, w)
        for layer in m.layers:
            q = q + _attn(_ln(q, layer.layer_norm1), _ln(q, layer.layer_norm1), layer.self_attn)
            q = q + _attn(_ln(q, layer.layer_norm2), kv, layer.cross_attn, ang)
            z = _ln(q, layer.layer_norm3) @ layer.mlp.fc1.weight.T + layer.mlp.fc1.bias
            z = 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))
            q = q + z @ layer.mlp.fc2.weight.T + layer.mlp.fc2.bias
        outs.append(q)
    out = torch.cat(outs)
    if m.match_encoder_scale:
        ref = torch.cat(windows)
        n, r = out.shape[0], ref.shape[0]
        m_out, m_ref = out.mean(0), ref.mean(0)
        s_out = torch.sqrt(((out - m_out) ** 2).sum(0) / (n - 1)).clamp_min(1e-6)   # unbiased
        s_ref = torch.sqrt(((ref - m_ref) ** 2).sum(0) / (r - 1)).clamp_min(1e-6)
        out = ((out - m_out) / s_out * s_ref + m_ref) * m.out_gamma + m.out_beta
    return out


GRIDS = [(2, 3), (3, 2), (1, 4), (2, 2)]
FRAMES = [3, 1, 5, 2]          # windows of 18, 6, 20 and 8 rows: three are padded in the batched call


def _windows(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(t * h * w, C, generator=g) * 2 + 0.5 for t, (h, w) in zip(FRAMES, GRIDS)]


@pytest.mark.parametrize("scale", [False, True])
@torch.no_grad()
def test_batched_equals_the_forks_per_window_math(scale):
    torch.manual_seed(0)
    m = _spread(TransformerDecoderFlatCompressor(_config(match_encoder_scale=scale)))
    wins = _windows()
    cu = [0]
    for x in wins:
        cu.append(cu[-1] + x.shape[0])
    out = m(torch.cat(wins).unsqueeze(0), torch.tensor(cu), GRIDS)
    assert out.shape == (len(wins) * K, C)
    # fp32 rounding: outputs reach ~40, the fork rotates in fp32 (|diff| <= 8e-5 seen; 1.3e-5 even in float64)
    torch.testing.assert_close(out, _reference(m, wins, GRIDS), rtol=1e-5, atol=2e-4)
    # not vacuous: the keys' rotary matters (same rows, another grid), and windows differ
    other = m(torch.cat(wins), cu, [(3, 2), (2, 3), (4, 1), (1, 4)])
    assert (other[:K] - out[:K]).abs().max() > 1e-2
    assert (out[:K] - out[K:2 * K]).abs().max() > 1e-2


@torch.no_grad()
def test_windows_are_independent_without_scale_match_and_coupled_with_it():
    torch.manual_seed(0)
    wins = _windows()
    for scale in (False, True):
        m = _spread(TransformerDecoderFlatCompressor(_config(match_encoder_scale=scale)))
        rows = torch.cat(wins)
        cu = [0, 18, 24, 44, 52]
        whole = m(rows, cu, GRIDS)
        alone = m(wins[2], [0, 20], [GRIDS[2]])
        diff = (whole[2 * K:3 * K] - alone).abs().max()
        assert (diff < 1e-5) if not scale else (diff > 1e-2)    # Option A's statistics span the whole call


def test_hand_values_of_encodings():
    pe = sinusoidal_position_encoding(3, 4)
    # PE[p, 2i] = sin(p / 10000^(2i/4)), PE[p, 2i+1] = cos(...): row 1 = sin 1, cos 1, sin .01, cos .01
    torch.testing.assert_close(pe[1], torch.tensor([math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]))
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    # hd = 16: D = 8 frequencies 10000^(-i/8); bands d_t = 2, d_h = 3, d_w = 3. Window 0: grid (2, 3), 12 rows;
    # window 1: grid (1, 2), 4 rows. Row 7 of window 0: t = 1, y = 0, x = 1; row 3 of window 1 (flat 15): t = 1,
    # y = 0, x = 1 as well; row 11 of window 0: t = 1, y = 1, x = 2
    ang = cross_rotary_angles([12, 4], [(2, 3), (1, 2)], 16)
    inv = [10000.0 ** (-i / 8) for i in range(8)]
    want7 = [1 * inv[0], 1 * inv[1], 0, 0, 0, 1 * inv[5], 1 * inv[6], 1 * inv[7]]
    torch.testing.assert_close(ang[7], torch.tensor(want7))
    torch.testing.assert_close(ang[15], torch.tensor(want7))
    want11 = [inv[0], inv[1], inv[2], inv[3], inv[4], 2 * inv[5], 2 * inv[6], 2 * inv[7]]
    torch.testing.assert_close(ang[11], torch.tensor(want11))
    with pytest.raises(ValueError, match="window 1 has 5 rows"):
        cross_rotary_angles([12, 5], [(2, 3), (1, 2)], 16)


# the fork's parameter names, read off its classes: TransformerDecoderFlatCompressor(query; layers[i] =
# TransformerDecoderLayer(cross_attn, self_attn = Attention(w_q, w_k, w_v, w_o; bias=False), layer_norm1-3 =
# LayerNorm, mlp = mlp(fc1, fc2)); _init_encoder_scale_match: out_gamma, out_beta). pos_encoding and
# cross_rotary.inv_freq are non-persistent buffers, so a saved state dict has no such keys.
def _fork_keys(num_layers, scale):
    keys = {"query"} | ({"out_gamma", "out_beta"} if scale else set())
    for i in range(num_layers):
        for att in ("cross_attn", "self_attn"):
            keys |= {f"layers.{i}.{att}.{w}.weight" for w in ("w_q", "w_k", "w_v", "w_o")}
        keys |= {f"layers.{i}.layer_norm{n}.{p}" for n in (1, 2, 3) for p in ("weight", "bias")}
        keys |= {f"layers.{i}.mlp.{fc}.{p}" for fc in ("fc1", "fc2") for p in ("weight", "bias")}
    return keys


def test_parameter_names_are_the_forks(tmp_path):
    m = TransformerDecoderFlatCompressor(_config(match_encoder_scale=True))
    assert set(m.state_dict()) == _fork_keys(2, True)
    assert set(TransformerDecoderFlatCompressor(_config(num_layers=1)).state_dict()) == _fork_keys(1, False)
    assert m.state_dict()["query"].shape == (1, K, C) and m.state_dict()["layers.0.mlp.fc1.weight"].shape == (48, C)
    m.save_pretrained(tmp_path / "qb")
    back = TransformerDecoderFlatCompressor.from_pretrained(tmp_path / "qb")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in m.state_dict().items())


@torch.no_grad()
def test_adaptive_segmentation_in_forward():
    torch.manual_seed(0)
    m = _spread(TransformerDecoderFlatCompressor(_config(adaptive_segmentation=True)))
    g = torch.Generator().manual_seed(5)
    video = torch.randn(13 * 4, C, generator=g)          # one window: 13 frames of a (2, 2) grid
    out = m(video, [0, 52], [(2, 2)])
    lens = adaptive_segment_lengths(video.view(13, 4, C).mean(1))
    assert m._last_seg_lens == [lens] and out.shape == (len(lens) * K, C) == (m.output_len_for(13), C)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + 4 * n)
    m.adaptive_segmentation = False
    torch.testing.assert_close(out, m(video, cu, [(2, 2)] * len(lens)), rtol=0, atol=0)


def test_config_fields_as_the_fork_reads_them():
    cfg = TokenCompressorConfig.from_dict({"compressor_type": "transformer_decoder_flat", "num_queries": 64,
                                           "compress_w": 8, "intermediate_size": 64, "num_layers": 1,
                                           "token_prune_ratio": 0.3, "window_size": 4, "model_type": "x",
                                           "stage2_d_model": 256},
                                          default_hidden_size=32, default_num_attention_heads=4)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.compress_image_w, cfg.compress_image_h) == (32, 4, 8, 16)
    assert cfg.token_prune_ratio == 0.3 and cfg.segment_force_every == 8 and cfg.match_encoder_scale is False
    with pytest.warns(UserWarning, match=r"\['use_magic'\]"):
        TokenCompressorConfig.from_dict({"compressor_type": "transformer_decoder_flat", "hidden_size": 32,
                                         "use_magic": 1})
    with pytest.raises(ValueError, match=r"compressor_type='local_attn_conv' is a type of the fork .*supported: "
                                         r"transformer_decoder_flat"):
        TokenCompressorConfig.from_dict({"compressor_type": "local_attn_conv"})
    with pytest.raises(ValueError, match="compressor_type='perceiver' is an unknown type"):
        TokenCompressorConfig.from_dict({"compressor_type": "perceiver"})
    with pytest.raises(ValueError, match="transformer_decoder'"):    # the fork's default type is the grid one
        TokenCompressorConfig.from_dict({"hidden_size": 32})
    with pytest.raises(ValueError, match="not divisible"):
        _config(num_attention_heads=3)
    with pytest.raises(ValueError, match="token_prune_ratio"):
        _config(token_prune_ratio=-1.0)
    m = TransformerDecoderFlatCompressor(_config())
    with pytest.raises(ValueError, match="kept_idx"):
        m(torch.zeros(4, C), [0, 4], [(2, 2)], kept_idx=[None])
    with pytest.raises(ValueError, match="grid_hws needs one"):
        m(torch.zeros(8, C), [0, 4, 8], [(2, 2)])


@torch.no_grad()
def test_compress_makes_the_seeds_single_call(tiny_vlm, monkeypatch):
    """Seed 001 ``build_video``: ``cu = [0] + cumsum([L * hw for L in plan.seg_lens])``, ``qb(feats, cu,
    [(hh, ww)] * len(plan.seg_lens))`` with adaptive segmentation off, group j -> ``comp_rows[j*K:(j+1)*K]``."""
    qb = tiny_vlm.compressor
    assert qb.match_encoder_scale          # the tiny model has Option A on: every group must be in the call
    t, grid = 8, (2, 2)
    plan = make_plan("hybrid", [2, 3, 1, 2], [1, 3], hw=4, raw_hw=4)
    rows = torch.randn(t, 4, qb.hidden_size, generator=torch.Generator().manual_seed(3))
    calls = []
    real = qb.forward

    def capture(kv, cu, grids, kept_idx=None):
        calls.append((kv.clone(), list(cu), list(grids), qb.adaptive_segmentation))
        return real(kv, cu, grids)

    monkeypatch.setattr(qb, "forward", capture)
    qb.adaptive_segmentation = True
    try:
        out = tiny_vlm.compress(rows, plan, grid)
    finally:
        qb.adaptive_segmentation = False
    assert qb.adaptive_segmentation is False
    assert len(calls) == 1
    kv, cu, grids, seg_on = calls[0]
    assert seg_on is False and cu == [0, 8, 20, 24, 32] and grids == [grid] * 4
    assert torch.equal(kv, rows.reshape(-1, qb.hidden_size))
    monkeypatch.undo()
    qb.__dict__.pop("forward", None)
    full = qb(rows.reshape(-1, qb.hidden_size), cu, grids)
    assert out.shape == (2, 64, qb.hidden_size)
    torch.testing.assert_close(out[0], full[64:128], rtol=0, atol=0)
    torch.testing.assert_close(out[1], full[192:256], rtol=0, atol=0)
    assert tiny_vlm.compress(rows[:2], make_plan("raw", [1, 1], [], hw=4, raw_hw=4), grid).shape == (0, 64, 32)
