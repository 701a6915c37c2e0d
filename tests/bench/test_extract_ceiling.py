"""bench/extract_throughput.py's compute ceiling (issue 25, target 3): the analytic FLOPs of
``algorithms/encoder_flops.py`` against numbers worked out by hand (and against ``FlopCounterMode`` on the library's
own towers), and the tiny CPU smoke run's rows carrying the ceiling fields."""
import json
from types import SimpleNamespace

import pytest
import torch

from algorithms.encoder_flops import (audio_flops_per_second, audio_payload_flops, audio_spans_ms, block_tokens,
                                      llm_mean_context, llm_prefill_flops, thinker_floor_flops, vision_grid,
                                      vision_patch_flops)
from algorithms.flops import get_shape, prefill_flops

from tests.conftest import load_bench_script


# A 2-block vision tower: block 0 windowed, block 1 full attention; width C = 8, MLP I = 12, 3 x 2 x 14 x 14 patch
# input, merge 2, windows of 56 px = 2 x 2 merged cells = 16 patches, merger output 10.
VISION = SimpleNamespace(depth=2, hidden_size=8, intermediate_size=12, num_heads=2, out_hidden_size=10,
                         fullatt_block_indexes=[1], window_size=56, patch_size=14, spatial_merge_size=2,
                         temporal_patch_size=2, in_channels=3)
# A 1-layer audio tower: 4 mel bins, width C = 8, FFN 16, chunks of 2 n_window = 10 mel frames, output 6.
AUDIO = SimpleNamespace(num_mel_bins=4, d_model=8, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16,
                        n_window=5, output_dim=6, max_source_positions=100)
# A 2-layer LLM: d = 8, m = 12, H = 4 query heads, H_kv = 2, head dim h = 8 / 4 = 2.
TEXT = SimpleNamespace(num_hidden_layers=2, hidden_size=8, intermediate_size=12, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=None)


def _bench():
    return load_bench_script("extract_throughput")


def test_vision_patch_by_hand():
    # grid 4 x 6 patches: P = 24, merged 2 x 3; windows along merged rows [2], along merged cols [2, 1]
    # -> windows of 2x2 and 2x1 merged cells = 16 and 8 patches.
    # patch embedding 2 P (3 * 2 * 14 * 14) C = 2 * 24 * 1176 * 8         =   451,584
    # per block: q, k, v, proj 8 P C^2 = 8 * 24 * 64 = 12,288; MLP 6 P C I = 6 * 24 * 8 * 12 = 13,824
    #   -> 26,112 per block, 2 blocks                                      =    52,224
    # block 0 (windowed) attention 4 C (16^2 + 8^2) = 32 * 320             =    10,240
    # block 1 (full) attention 4 C P^2 = 32 * 576                          =    18,432
    # merger, 6 merged rows of 4 C = 32: 2 * 6 * 32 * 32 + 2 * 6 * 32 * 10 = 12,288 + 3,840 = 16,128
    # total 451,584 + 52,224 + 10,240 + 18,432 + 16,128                    =   548,608
    assert vision_patch_flops(VISION, (4, 6)) == 548_608
    assert vision_grid(VISION, (56, 84)) == (4, 6)
    with pytest.raises(ValueError):
        vision_patch_flops(VISION, (3, 6))


def test_audio_payload_by_hand():
    # 10 mel frames = one chunk; after conv2 l' = (10 - 1) // 2 + 1 = 5
    # conv1 2 * 10 * 4 * 3 * 8 = 1,920; conv2 2 * 5 * 8 * 3 * 8 = 1,920
    # layer: q, k, v, out 8 * 5 * 64 = 2,560; fc1 + fc2 4 * 5 * 8 * 16 = 2,560; attention 4 * 5^2 * 8 = 800 -> 5,920
    # pool: a = 5 -> (5 - 2) // 2 + 1 = 2 rows; proj 2 * 2 * 8 * 6 = 192.   total 1,920 + 1,920 + 5,920 + 192 = 9,952
    assert audio_payload_flops(AUDIO, 10) == 9_952
    # 25 mel frames = chunks 10, 10, 5 (valid frames only) -> l' = 5, 5, 3, 13 in all
    # conv1 2 * 25 * 4 * 3 * 8 = 4,800; conv2 2 * 13 * 8 * 3 * 8 = 4,992
    # layer: 8 * 13 * 64 = 6,656; 4 * 13 * 8 * 16 = 6,656; attention 4 * 8 * (25 + 25 + 9) = 1,888 -> 15,200
    # pool: a = (25 - 1) // 2 + 1 = 13 -> 6 rows; proj 2 * 6 * 8 * 6 = 576.  total 4,800 + 4,992 + 15,200 + 576 = 25,568
    assert audio_payload_flops(AUDIO, 25) == 25_568
    # a 2 s hold payload = 200 frames = 20 chunks of 10, l' = 5 each, 100 in all
    # conv1 2 * 200 * 4 * 3 * 8 = 38,400; conv2 2 * 100 * 8 * 3 * 8 = 38,400
    # layer 8 * 100 * 64 + 4 * 100 * 8 * 16 + 4 * 8 * 20 * 25 = 51,200 + 51,200 + 16,000 = 118,400
    # pool: a = 100 -> 50 rows; proj 2 * 50 * 8 * 6 = 4,800.   total 200,000 per 2 s = 100,000 per s
    assert audio_spans_ms("completed-block-hold") == [2000]
    assert audio_flops_per_second(AUDIO, [2000]) == 100_000
    assert audio_spans_ms("micro-chunk-200ms") == [200] * 10
    assert audio_spans_ms("open-stream-replay") == [200 * k for k in range(1, 11)]


def test_towers_match_flop_counter_on_the_library_modules():
    """The formulas count what the library's towers run (FlopCounterMode, eager attention, CPU); the audio payloads
    here are whole chunks (a short last chunk is padded by the library, which the floor leaves out)."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (Qwen2_5OmniAudioEncoderConfig,
                                                                             Qwen2_5OmniVisionEncoderConfig)
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (Qwen2_5OmniAudioEncoder,
                                                                        Qwen2_5OmniVisionEncoder)

    vc = Qwen2_5OmniVisionEncoderConfig(**vars(VISION))
    vc._attn_implementation = "eager"
    grids = [(4, 6), (8, 10)]  # (8, 10): merged 4 x 5, windows 2 x 2, 2 x 1 cells
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        Qwen2_5OmniVisionEncoder(vc).eval()(torch.randn(sum(h * w for h, w in grids), 3 * 2 * 14 * 14),
                                            grid_thw=torch.tensor([[1, h, w] for h, w in grids]))
    assert fc.get_total_flops() == sum(vision_patch_flops(VISION, g) for g in grids)
    ac = Qwen2_5OmniAudioEncoderConfig(**vars(AUDIO))
    ac._attn_implementation = "eager"
    tower = Qwen2_5OmniAudioEncoder(ac).eval()
    for n in (7, 10, 20):
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            tower(torch.randn(4, n), feature_lens=torch.tensor([n]))
        assert fc.get_total_flops() == audio_payload_flops(AUDIO, n), n


def test_llm_by_hand():
    # per layer per token: q, k, v 2 d (H + 2 H_kv) h = 2 * 8 * 8 * 2 = 256; o 2 H h d = 128; MLP 6 d m = 576 -> 960;
    # attention 4 H h c = 32 c.  10 tokens at c = 20: 2 layers * 10 * (960 + 640) = 32,000
    assert llm_prefill_flops(TEXT, 10, 20) == 32_000


def test_llm_matches_algorithms_flops_at_3b():
    """At context = n and without lm_head it is ``algorithms.flops``' full-rectangle prefill (3B thinker shapes)."""
    t = SimpleNamespace(num_hidden_layers=36, hidden_size=2048, intermediate_size=11008, num_attention_heads=16,
                        num_key_value_heads=2)
    assert llm_prefill_flops(t, 1000, 1000) == prefill_flops(get_shape("qwen2.5-omni-3b"), 1000, 0)


def test_mean_context_by_hand():
    # P = 10 prompt tokens, B = 100 tokens per block, M = 4 (3 kept blocks), R = 10 rows per block
    # hold / micro, sliding: 10 + 300 + (100 + 1) / 2 = 360.5
    # window adds the re-prefill of 300 tokens on the prompt: 10 + 301 / 2 = 160.5
    #   -> (300 * 160.5 + 100 * 360.5) / 400 = 84,200 / 400 = 210.5
    # replay, sliding: tails of 10 k tokens at 310 + (10 k + 1) / 2, weighted by 10 k:
    #   310.5 + 5 * (sum k^2 = 385) / (sum k = 55) = 345.5; window: (300 * 160.5 + 550 * 345.5) / 850 = 238,175 / 850
    for mode in ("completed-block-hold", "micro-chunk-200ms"):
        assert llm_mean_context(mode, "sliding", 10, 100, 4) == 360.5
        assert llm_mean_context(mode, "window", 10, 100, 4) == 210.5
    assert llm_mean_context("open-stream-replay", "sliding", 10, 100, 4) == pytest.approx(345.5)
    assert llm_mean_context("open-stream-replay", "window", 10, 100, 4) == pytest.approx(238_175 / 850)
    assert llm_mean_context("completed-block-hold", "window", 10, 100, 1) == 10 + 101 / 2  # M = 1: no re-prefill


def test_floor_of_a_run_by_hand():
    # frames of 56 x 84 px -> grid 4 x 6 (548,608 per temporal patch); block tokens 2 patches * 6 + 50 audio = 62;
    # hold / sliding context 10 + 3 * 62 + 63 / 2 = 227.5 -> LLM 2 layers * 10 tokens * (960 + 32 * 227.5 = 8,240)
    # = 164,800; audio 4 s * 100,000; total 3 * 548,608 + 400,000 + 164,800 = 2,210,624
    cfg = SimpleNamespace(vision_config=VISION, audio_config=AUDIO, text_config=TEXT)
    computed = {"computed_vision_patches": 3, "computed_audio_seconds": 4.0, "computed_llm_tokens": 10}
    f = thinker_floor_flops(cfg, computed, "completed-block-hold", "sliding", (56, 84), memory_s=8.0, prompt_tokens=10)
    assert block_tokens(VISION, (4, 6)) == 62
    assert (f.vision, f.audio, f.llm, f.llm_mean_context) == (3 * 548_608, 400_000, 164_800, 227.5)
    assert f.total == 2_210_624


def test_tiny_smoke_rows_carry_the_ceiling(tmp_path, capsys):
    bench = _bench()
    assert bench.gemm_tflops(torch.device("cpu")) == bench.CPU_NOMINAL_TFLOPS
    out = tmp_path / "rows.json"
    bench.main(["--tiny", "--sessions", "2", "--duration", "4", "--modes", "completed-block-hold",
                "--gemm-tflops", "2", "--json", str(out)])
    text = capsys.readouterr().out
    assert "compute ceiling at 2.0 TFLOP/s (given)" in text
    assert "| TFLOP / media s | RTF ceiling | of ceiling |" in text
    rows = json.loads(out.read_text())
    eager = [r for r in rows if r["path"] == "1-session eager"]
    batched = [r for r in rows if r["path"].startswith("batched")]
    assert len(eager) == 1 and len(batched) == 2 and {r["policy"] for r in batched} == {"window", "sliding"}
    assert all(eager[0][k] is None for k in bench.CEILING_FIELDS)
    for r in batched:
        assert r["gemm_tflops"] == 2.0 and r["floor_grid"] == [8, 8]
        assert r["floor_tflop"] == pytest.approx(sum(r["floor_tflop_parts"].values()))
        assert all(v > 0 for v in r["floor_tflop_parts"].values())
        assert r["floor_s"] == pytest.approx(r["floor_tflop"] / 2.0)
        assert r["tflop_per_media_s"] == pytest.approx(r["floor_tflop"] / r["media_s"])
        assert r["rtf_ceiling"] == pytest.approx(r["media_s"] / r["floor_s"])
        assert r["of_ceiling_pct"] == pytest.approx(100 * r["dataset_rtf"] / r["rtf_ceiling"])
        assert f"{r['rtf_ceiling']:.2f}x | {r['of_ceiling_pct']:.0f}% |" in text
