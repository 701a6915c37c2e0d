"""Analytic FLOPs: published figures (paper convention) and FlopCounterMode on tiny models (accurate form)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from algorithms.flops import (
    PRESETS,
    ModelShape,
    decode_flops,
    get_shape,
    paper_decode_flops,
    paper_prefill_flops,
    paper_total_flops,
    prefill_flops,
)


def test_paper_formula_by_hand():
    s = ModelShape("hand", num_layers=1, hidden_size=2, intermediate_size=3, num_heads=1, num_kv_heads=1,
                   head_dim=2, vocab_size=5)
    # n = 4: 4*4*2^2 + 2*4^2*2 + 2*4*2*3 = 64 + 64 + 48
    assert paper_prefill_flops(s, 4) == 176
    # R = 2 after n = 4: sum_i (4*4 + 2*(4+i)*2 + 2*2*3) = (16 + 20 + 12) + (16 + 24 + 12) = 100
    assert paper_decode_flops(s, 4, 2) == 100
    assert paper_total_flops(s, 4, 2) == 276
    with pytest.raises(ValueError):
        paper_prefill_flops(s, -1)


def test_dycoke_llava_ov_7b_full_setting():
    # DyCoke Table (LLaVA-OV-7B, full tokens): 41.4 TFLOPs. Qwen2-7B shapes, n = 32 x 196 = 6272 visual
    # tokens only (no text prompt), R = 100 decoded tokens, multiply-add = 1 op.
    s = get_shape("qwen2-7b")
    assert paper_prefill_flops(s, 6272) / 1e12 == pytest.approx(40.765, abs=1e-3)
    assert paper_decode_flops(s, 6272, 100) / 1e12 == pytest.approx(0.651, abs=1e-3)
    assert round(paper_total_flops(s, 6272, 100) / 1e12, 1) == 41.4


def test_omnizip_qwen25_omni_7b_full_setting():
    # OmniZip (Qwen2.5-Omni-7B, full tokens): 73.2 TFLOPs with n = 10,000 multimodal tokens, R = 100.
    s = get_shape("qwen2.5-omni-7b")
    assert paper_prefill_flops(s, 10_000) / 1e12 == pytest.approx(72.478, abs=1e-3)
    assert round(paper_total_flops(s, 10_000, 100) / 1e12, 1) == 73.2


def test_seed_003_flops_log_line():
    """Seed 003: "Prefill dvOkwKAs.mp4: tflops=44.279911081268", "Generate ...: tflops=44.292256054998",
    "Decode ...: tflops=0.01234497373" (Qwen2.5-Omni-3B). Generate = prefill + decode to the FLOP; the decode is two
    tokens of the 3B thinker's matmuls within 0.013 %; no integer prefill token count reproduces the prefill value
    (algorithms/flops.py docstring)."""
    prefill, generate, decode = 44_279_911_081_268, 44_292_256_054_998, 12_344_973_730
    assert prefill + decode == generate
    s = get_shape("qwen2.5-omni-3b")
    two = 2 * prefill_flops(s, 1, 1)
    assert two == 12_343_377_920 and 0 < decode - two == 1_595_810 < 294_912 * 6
    for f, n in ((lambda k: prefill_flops(s, k, 1), 6040), (lambda k: prefill_flops(s, k), 5649),
                 (lambda k: paper_prefill_flops(s, k), 11351), (lambda k: 2 * paper_prefill_flops(s, k), 6841)):
        assert f(n) < prefill < f(n + 1)


def test_presets_match_transformers_defaults():
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniTextConfig

    c = Qwen2_5OmniTextConfig()
    s = PRESETS["qwen2.5-omni-7b"]
    assert (s.num_layers, s.hidden_size, s.intermediate_size, s.num_heads, s.num_kv_heads, s.vocab_size) == (
        c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
        c.vocab_size)
    assert s.head_dim == c.hidden_size // c.num_attention_heads
    assert PRESETS["qwen2.5-omni-3b"].hidden_size == 2048 and PRESETS["qwen2.5-omni-3b"].num_layers == 36


def test_accurate_by_hand():
    s = ModelShape("hand", num_layers=1, hidden_size=4, intermediate_size=6, num_heads=2, num_kv_heads=1,
                   head_dim=2, vocab_size=10)
    n = 3
    proj = 2 * n * 4 * (2 + 2) * 2 + 2 * n * 2 * 2 * 4  # q,k,v (GQA widths 4+2+2) and o
    attn = 4 * 2 * n * n * 2  # QK^T and PV per query head over the full 3x3
    mlp = 6 * n * 4 * 6
    assert prefill_flops(s, n, num_logit_positions=0) == proj + attn + mlp
    assert prefill_flops(s, n) == proj + attn + mlp + 2 * n * 4 * 10
    assert prefill_flops(s, n, num_logit_positions=1) == proj + attn + mlp + 2 * 4 * 10


TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)
TINY_SHAPE = ModelShape("tiny", 2, 64, 176, 4, 2, 16, 512)


def _measure(model, **kw):
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        out = model(**kw)
    return fc.get_total_flops(), out


def test_accurate_matches_flop_counter_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(**TINY, attn_implementation="eager")
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.randint(0, 512, (1, 37))
    measured, out = _measure(model, input_ids=ids, use_cache=True)
    expected = prefill_flops(TINY_SHAPE, 37)
    assert abs(measured - expected) / measured < 0.01
    # one decode step against the 37-token cache: 38 keys, one lm_head row
    measured, _ = _measure(model, input_ids=ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
    assert abs(measured - decode_flops(TINY_SHAPE, 37, 1)) / measured < 0.01


def test_accurate_matches_flop_counter_omni_thinker():
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

    torch.manual_seed(0)
    text = dict(TINY, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3], "rope_type": "default"})
    cfg = Qwen2_5OmniThinkerConfig(
        text_config=text,
        audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, output_dim=64,
                          num_mel_bins=128),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           fullatt_block_indexes=[0]),
    )
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    model = Qwen2_5OmniThinkerForConditionalGeneration(cfg).eval()
    ids = torch.randint(0, 512, (1, 41))
    measured, _ = _measure(model, input_ids=ids)
    expected = prefill_flops(ModelShape("tiny-omni", 2, 64, 176, 4, 2, 16, 512, rope_rows=3), 41)
    assert abs(measured - expected) / measured < 0.01


def test_no_attention_convention_matches_the_seed_logs_decode():
    """Seed 003's log: "Decode dvOkwKAs.mp4: tflops=0.01234497373" (12,344,973,730 FLOPs). Without the attention
    products one token of the 3B thinker costs, by hand: per layer 2*2048*(16+2*2)*128 + 2*16*128*2048 (q/k/v/o)
    + 6*2048*11008 (SwiGLU) = 10,485,760 + 8,388,608 + 135,266,304 = 154,140,672; x 36 layers = 5,549,064,192;
    lm_head 2*2048*151936 = 622,329,856; total 6,171,394,048. The log is 2.0004 of those; attention over a
    6,000-key cache would add 2 * 36 * 4*16*128*6000 = 3.5e9 to two steps."""
    from algorithms.flops import NO_ATTENTION

    s = get_shape("qwen2.5-omni-3b")
    one = prefill_flops(s, 1, 1, attention=False)
    assert one == 6_171_394_048 and NO_ATTENTION == "no_attention"
    assert decode_flops(s, 6000, 2, attention=False) == 2 * one == decode_flops(s, 0, 2, attention=False)
    assert abs(12_344_973_730 / one - 2.0) < 4e-4
    assert decode_flops(s, 6000, 2) - decode_flops(s, 6000, 2, attention=False) == 2 * 36 * 4 * 16 * 128 * 6000 + 36 * 4 * 16 * 128 * 3
    assert prefill_flops(s, 10, 1) - prefill_flops(s, 10, 1, attention=False) == 36 * 4 * 16 * 10 * 10 * 128


# ------------------------------------------------------------------ extension, one decode token, weights and KV bytes
HAND = ModelShape("hand", num_layers=1, hidden_size=4, intermediate_size=6, num_heads=2, num_kv_heads=1, head_dim=2,
                  vocab_size=10)


def test_extend_by_hand():
    from algorithms.flops import extend_flops

    # n = 3 new tokens on c = 5 cached: q/k/v 2*3*4*(2+2*1)*2 = 192, o 2*3*2*2*4 = 96, MLP 6*3*4*6 = 432;
    # attention over the full rectangle 4*H*n*(c+n)*h = 4*2*3*8*2 = 384; causal: pairs 3*5 + 3*4/2 = 21 -> 4*2*2*21
    # = 336; lm_head on the last position 2*4*10 = 80
    assert extend_flops(HAND, 3, 5, num_logit_positions=1) == 192 + 96 + 432 + 384 + 80 == 1184
    assert extend_flops(HAND, 3, 5, num_logit_positions=1, causal=True) == 192 + 96 + 432 + 336 + 80 == 1136
    assert extend_flops(HAND, 3, 5) == 1184 + 2 * 80            # lm_head on all 3 positions
    assert extend_flops(HAND, 3, 5, 0, attention=False) == 720   # causal does not matter without attention
    assert extend_flops(HAND, 3, 5, 0, causal=True, attention=False) == 720
    # from an empty cache it is the prefill; one token on c cached is the decode step over c + 1 keys
    assert extend_flops(HAND, 3, 0) == prefill_flops(HAND, 3)
    s = get_shape("qwen2-7b")
    assert extend_flops(s, 40, 16000, 1) == prefill_flops(s, 16040, 1) - prefill_flops(s, 16000, 0) - (
        s.num_layers * 4 * s.num_heads * s.head_dim * (16040 ** 2 - 16000 ** 2 - 40 * 16040))
    with pytest.raises(ValueError):
        extend_flops(HAND, 3, -1)


def test_decode_token_by_hand():
    from algorithms.flops import decode_token_flops, extend_flops

    # one token over 8 keys: q/k/v 2*4*4*2 = 64, o 2*2*2*4 = 32, MLP 6*4*6 = 144, attention 4*2*1*8*2 = 128,
    # lm_head 80
    assert decode_token_flops(HAND, 8) == 64 + 32 + 144 + 128 + 80 == 448
    assert decode_token_flops(HAND, 8, with_lm_head=False) == 368
    assert extend_flops(HAND, 1, 7, 1) == decode_token_flops(HAND, 8)
    assert decode_flops(HAND, 7, 3) == sum(decode_token_flops(HAND, 7 + i) for i in (1, 2, 3))
    with pytest.raises(ValueError):
        decode_token_flops(HAND, 0)


def test_weight_and_kv_bytes_by_hand():
    from algorithms.flops import decode_token_bytes, kv_cache_bytes, weight_bytes

    # per layer q/k/v 4*(2+2)*2 = 32, o 2*2*4 = 16, gate/up/down 3*4*6 = 72 -> 120; lm_head 10*4 = 40; bf16 x 2
    assert weight_bytes(HAND) == 2 * (120 + 40) == 320
    assert weight_bytes(HAND, with_lm_head=False) == 240 and weight_bytes(HAND, dtype_bytes=4) == 640
    # keys and values: 2 * L 1 * H_kv 1 * h 2 * 8 tokens * 2 bytes
    assert kv_cache_bytes(HAND, 8) == 64
    assert decode_token_bytes(HAND, 8) == 320 + 64
    # Qwen2-7B: 7.07e9 matmul weights (14.1 GB bf16); a 16k-token cache is 0.94 GB (57,344 bytes a token)
    s = get_shape("qwen2-7b")
    assert weight_bytes(s) == 2 * (28 * (3584 * 36 * 128 + 28 * 128 * 3584 + 3 * 3584 * 18944) + 152064 * 3584)
    assert kv_cache_bytes(s, 1) == 57_344
    with pytest.raises(ValueError):
        kv_cache_bytes(HAND, -1)


def test_weight_bytes_match_the_model_matrices():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from algorithms.flops import weight_bytes

    model = Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=False))
    matrices = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert weight_bytes(TINY_SHAPE, dtype_bytes=4) == 4 * matrices


def test_extend_matches_flop_counter_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from algorithms.flops import extend_flops

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**TINY, attn_implementation="eager")).eval()
    ids = torch.randint(0, 512, (1, 42))
    _, out = _measure(model, input_ids=ids[:, :37], use_cache=True)
    # 5 suffix tokens on the 37-token cache (eager attention: the full 5 x 42 rectangle), logits on all 5
    measured, _ = _measure(model, input_ids=ids[:, 37:], past_key_values=out.past_key_values, use_cache=True)
    assert abs(measured - extend_flops(TINY_SHAPE, 5, 37)) / measured < 0.01
