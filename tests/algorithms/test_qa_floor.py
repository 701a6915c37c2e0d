"""algorithms/qa_floor.py: each part by hand on tiny shapes, and against FlopCounterMode on the real modules (the qbase
compressor, the VideoLLaMA3 projector and vision tower of the tiny model)."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from algorithms.flops import ModelShape
from algorithms.qa_floor import (PART_NAMES, CompressorShape, VisionShape, compressor_flops, compressor_weight_bytes,
                                 floor_seconds, projector_flops, qa_floor_parts, vision_tower_flops,
                                 vision_tower_weight_bytes)

LLM = ModelShape("hand", num_layers=1, hidden_size=4, intermediate_size=6, num_heads=2, num_kv_heads=1, head_dim=2,
                 vocab_size=10)
VIS = VisionShape(hidden_size=2, intermediate_size=3, num_layers=1)
QB = CompressorShape(hidden_size=2, intermediate_size=3, num_layers=1, num_queries=2)


def _count(fn):
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        fn()   # the math SDPA backend runs as matmuls, which the counter sees (the CPU flash kernel it does not)
    return fc.get_total_flops()


def test_vision_tower_by_hand():
    # P = 4 patches, C = 2, I = 3: q/k/v/o 8*4*2*2 = 128, attention 4*16*2 = 128, MLP 4*4*2*3 = 96 -> 352 a frame
    assert vision_tower_flops(VIS, 3, 4) == 3 * 352
    assert vision_tower_weight_bytes(VIS) == 2 * (4 * 4 + 2 * 2 * 3) == 56
    with pytest.raises(ValueError):
        vision_tower_flops(VIS, -1, 4)


def test_compressor_by_hand():
    # K = 2, C = 2, I = 3, windows of 2 and 4 rows. Per window, on the queries: self-attention q/k/v/o 8*2*4 = 64
    # and scores 4*K^2*C = 32; cross-attention q, o 4*2*4 = 32; MLP 4*2*2*3 = 48 -> 176. On the rows (6 in all):
    # cross k, v 4*6*4 = 96; cross scores and values 4*K*6*C = 96. Total 2*176 + 96 + 96 = 544.
    assert compressor_flops(QB, [2, 4]) == 544
    # one layer: two attentions 8*C^2 = 32, MLP 2*C*I = 12; queries K*C = 4; bf16
    assert compressor_weight_bytes(QB) == 2 * (32 + 12 + 4) == 96
    assert compressor_flops(QB, []) == 0


def test_projector_by_hand():
    # C = 2 -> D = 4 -> D: 2 * rows * (2*4 + 4*4) = 48 a row
    assert projector_flops(2, 4, 3) == 144


def test_floor_parts_by_hand():
    parts = qa_floor_parts(LLM, VIS, QB, num_frames=2, hw=1, raw_frames_reencoded=1, raw_hw=1,
                           compressor_windows=[2, 4], vision_rows=3, prefix_len=5, suffix_lens=[3, 1], new_tokens=3)
    assert [p.name for p in parts] == list(PART_NAMES)
    got = {p.name: (p.flops, p.bytes) for p in parts}
    # vision: 3 frames (2 + 1 re-encoded) of 4 patches, 352 each (above); the tower's weights once
    assert got["vision"] == (1056, 56)
    assert got["compress"] == (544, 96)
    # projector on 3 rows; its weights 2*(2*4 + 4*4) = 48 bytes
    assert got["project"] == (144, 48)
    # prefix of 5 from scratch, no lm_head, causal: q/k/v 2*5*4*4*2 = 320, o 2*5*2*2*4 = 160, MLP 6*5*4*6 = 720,
    # attention 15 pairs 4*2*2*15 = 240 -> 1440; bytes: weights without lm_head 240 + its KV 5 tokens * 8 = 40
    assert got["prefix"] == (1440, 280)
    # suffixes 3 and 1 on the 5 cached, lm_head on each last position: n = 3: 1136 (test_flops.test_extend_by_hand);
    # n = 1: q/k/v/o 96, MLP 144, attention 6 pairs 4*2*2*6 = 96, lm_head 80 -> 416. Bytes: all weights 320 once,
    # the prefix KV read once and the suffixes' written: 9 tokens * 8 = 72
    assert got["suffix"] == (1136 + 416, 392)
    # R = 3: two decode steps. Step 1: rows over 5+3+1 = 9 and 5+1+1 = 7 keys: (96 + 144 + 4*2*9*2 + 80) +
    # (96 + 144 + 112 + 80) = 464 + 432; step 2 over 10 and 8: 480 + 448. Bytes a step: weights 320 + prefix KV 40
    # + the rows' own KV: step 1 (4 + 2 tokens) * 8 = 48, step 2 (5 + 3) * 8 = 64 -> 408 + 424
    assert got["decode"] == (464 + 432 + 480 + 448, 408 + 424)
    # 1000 FLOP/s and 100 B/s: vision FLOP-bound, the rest bandwidth-bound
    t = floor_seconds(parts, 1000.0, 100.0)
    assert t == pytest.approx({"vision": 1.056, "compress": 0.96, "project": 0.48, "prefix": 2.8, "suffix": 3.92,
                               "decode": 8.32, "total": 17.536})
    # one answer token: no decode step; no question: no suffix, no decode
    one = {p.name: p.flops for p in qa_floor_parts(LLM, VIS, QB, num_frames=2, hw=1, raw_frames_reencoded=0,
                                                  raw_hw=1, compressor_windows=[], vision_rows=3, prefix_len=5,
                                                  suffix_lens=[3, 1], new_tokens=1)}
    assert one["decode"] == 0 and one["compress"] == 0 and one["vision"] == 704
    none = {p.name: (p.flops, p.bytes) for p in qa_floor_parts(LLM, VIS, QB, num_frames=2, hw=1,
                                                              raw_frames_reencoded=0, raw_hw=1, compressor_windows=[],
                                                              vision_rows=3, prefix_len=5, suffix_lens=[],
                                                              new_tokens=3)}
    assert none["suffix"] == none["decode"] == (0, 0)
    with pytest.raises(ValueError):
        qa_floor_parts(LLM, VIS, QB, num_frames=2, hw=1, raw_frames_reencoded=0, raw_hw=1, compressor_windows=[],
                       vision_rows=3, prefix_len=5, suffix_lens=[-1], new_tokens=3)


def test_compressor_matches_flop_counter():
    from models.videollama3.qbase import TokenCompressorConfig, TransformerDecoderFlatCompressor

    torch.manual_seed(0)
    cfg = TokenCompressorConfig(compressor_type="transformer_decoder_flat", hidden_size=32, intermediate_size=48,
                                num_layers=2, num_attention_heads=2, num_queries=4, match_encoder_scale=True)
    qb = TransformerDecoderFlatCompressor(cfg).eval()
    # three windows of 3 frames x 2x3 rows (equal windows: no padded keys, which the counter would count)
    kv = torch.randn(54, 32)
    measured = _count(lambda: qb(kv, [0, 18, 36, 54], [(2, 3)] * 3))
    assert measured == compressor_flops(CompressorShape(32, 48, 2, 4), [18, 18, 18])


def test_projector_and_tower_match_flop_counter(tiny_vlm):
    model = tiny_vlm.model
    vc, tc = model.config.vision_config, model.config.text_config
    rows = torch.randn(7, vc.hidden_size)
    assert _count(lambda: model.model.projector(rows)) == projector_flops(vc.hidden_size, tc.hidden_size, 7)
    # the tower on 2 frames of 4x6 patches (merged 2x3 = 6 tokens a frame); the counter also sees the patch
    # embedding, a (3*14*14 -> C) matmul per patch, which the floor leaves out
    frames = torch.randint(0, 255, (2, 84, 56, 3), dtype=torch.uint8)
    rows_out, grid = tiny_vlm.encode(frames, 6)
    assert grid == (3, 2)
    measured = _count(lambda: tiny_vlm.encode(frames, 6))
    patches = 2 * 4 * grid[0] * grid[1]
    embed = 2 * patches * (3 * 14 * 14) * vc.hidden_size
    shape = VisionShape(vc.hidden_size, vc.intermediate_size, vc.num_hidden_layers)
    assert measured - embed == vision_tower_flops(shape, 2, 4 * grid[0] * grid[1])
