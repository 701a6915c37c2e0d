"""bench/qa_throughput.py's floor: the LLM shape read from the config, and a row's parts as the bench computes them
(the row's fields passed through, the model's element size, the decode's steps), checked by hand on the tiny model.
The CPU smoke run's printed parts: tests/models/videollama3/test_throughput.py::test_qa_bench_runs_on_the_cpu."""
from pathlib import Path

import pytest

from algorithms.flops import extend_flops, get_shape, kv_cache_bytes, prefill_flops, weight_bytes
from algorithms.qa_floor import PART_NAMES

from tests.conftest import load_bench_script


def _bench():
    return load_bench_script("qa_throughput")


def test_llm_shape_of_the_bench_model_is_qwen2_7b():
    bench = _bench()
    got = bench.llm_shape(bench.videollama3_7b_config().text_config)
    want = get_shape("qwen2-7b")
    assert (got.num_layers, got.hidden_size, got.intermediate_size, got.num_heads, got.num_kv_heads, got.head_dim,
            got.vocab_size) == (28, 3584, 18944, 28, 4, 128, 152064) == (
        want.num_layers, want.hidden_size, want.intermediate_size, want.num_heads, want.num_kv_heads, want.head_dim,
        want.vocab_size)


def test_floor_fields_of_a_row_on_the_tiny_model(tiny_vlm):
    bench = _bench()
    llm = bench.llm_shape(tiny_vlm.model.config.text_config)
    # tiny: 2 layers, d 64, m 128, 4 heads (h 16), 2 KV heads, vocab 151680; fp32 (4 bytes)
    assert (llm.num_layers, llm.hidden_size, llm.intermediate_size, llm.num_heads, llm.num_kv_heads, llm.head_dim,
            llm.vocab_size) == (2, 64, 128, 4, 2, 16, 151680)
    row = {"frames": 4, "hw": 6, "raw_reencoded": 0, "raw_hw": 6, "compressor_windows": [12, 12], "vision_tokens": 140,
           "prefix_len": 200, "suffix_lens": [10, 12]}
    f = bench.floor_fields(tiny_vlm, row, new_tokens=3, tflops=1e-3, bytes_per_s=1e9)   # 1 GFLOP/s, 1 GB/s
    parts = f["floor_parts"]
    assert list(parts) == list(PART_NAMES)
    assert f["floor_s"] == pytest.approx(sum(f[f"floor_{n}_s"] for n in PART_NAMES))
    for n in PART_NAMES:
        assert f[f"floor_{n}_s"] == pytest.approx(max(parts[n]["flops"] / 1e9, parts[n]["bytes"] / 1e9))
    # weights: per layer q/k/v 64*(4+2*2)*16 = 8192, o 4*16*64 = 4096, MLP 3*64*128 = 24576 -> 36864; x 2 layers
    # = 73728; lm_head 151680*64 = 9,707,520; fp32: x 4 -> 39,124,992 bytes. KV: 2 (K, V) * 2 layers * 2 heads * 16 * 4
    # = 512 bytes a token.
    w = 4 * (73728 + 151680 * 64)
    assert weight_bytes(llm, 4) == w == 39_124_992 and kv_cache_bytes(llm, 1, 4) == 512
    # decode: 2 steps (3 tokens, the first from the suffix logits); a step reads the weights once, the prefix's KV
    # once, and the two rows' own KV: step 1 (10+1) + (12+1) tokens, step 2 (10+2) + (12+2)
    assert parts["decode"]["bytes"] == 2 * (w + 200 * 512) + (24 + 26) * 512
    # suffix: the weights once, the prefix's KV read, the 22 suffix rows written; FLOPs of the two extensions
    assert parts["suffix"]["bytes"] == w + (200 + 22) * 512
    assert parts["suffix"]["flops"] == extend_flops(llm, 10, 200, 1, causal=True) + extend_flops(llm, 12, 200, 1,
                                                                                                 causal=True)
    # prefix: no lm_head; with the full square it is the earlier floor's prefill less its one lm_head row
    assert parts["prefix"]["bytes"] == 4 * 73728 + 200 * 512
    full = bench.floor_fields(tiny_vlm, row, 3, 1e-3, 1e9, causal=False)["floor_parts"]
    assert full["prefix"]["flops"] == prefill_flops(llm, 200, 1) - 2 * 64 * 151680
    # causal: the square's upper half less, 4 H h (200^2 - 200*201/2) per layer
    assert full["prefix"]["flops"] - parts["prefix"]["flops"] == 2 * 4 * 4 * 16 * (200 * 200 - 200 * 201 // 2)
    # the vision tower: 4 frames of 4*6 = 24 patches (tiny tower: C 32, I 64, 2 layers):
    # 2 * (8*24*32^2 + 4*24^2*32 + 4*24*32*64) = 2 * (196608 + 73728 + 196608) = 933,888 a frame
    assert parts["vision"]["flops"] == 4 * 933_888


@pytest.mark.parametrize("budget", [128, 1024])
def test_floor_parts_match_a_counted_step(tiny_vlm, budget):
    """The whole step of (d) on the tiny model (encode, plan, compress, project, prefix, 3 suffixes, 3 decode steps,
    the static decode path on the CPU) under FlopCounterMode with the math SDPA backend (every attention a matmul,
    full squares) against the floor's parts with ``causal=False``: equal but for the patch embedding, which the
    floor leaves out (added here: ``2 * patches * 3 * 14^2 * C``), and padding, which the step computes and the
    floor does not (the compressor's windows padded to the longest, the static cache's decode region; the suffixes'
    left pads up to the decode slot's bucket are counted in): measured - analytic is >= 0 and under 2 %."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from datamodules.decode import decode_video
    from models.videollama3 import EncodeCache, prepare_budgets
    from models.videollama3.decode_slots import SUFFIX_BUCKET, bucket

    bench = _bench()
    dec = decode_video(str(Path(__file__).resolve().parents[2] / "assets" / "media" / "cockatoo.mp4"), budget)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        (bi,) = prepare_budgets(tiny_vlm, dec.frames, dec.times_s, [budget],
                                cache=EncodeCache(tiny_vlm, dec.frames, 256), chunk_frames=256)
        encode = fc.get_total_flops()
        answers = tiny_vlm.answer_batched(bi.prompt, bench.QUESTIONS, 4, ignore_eos=True, decode="static")
    answer = fc.get_total_flops() - encode
    assert all(len(a.token_ids) == 4 for a in answers)
    row = bench.step_fields(tiny_vlm, bi, bench.QUESTIONS)
    assert len(row["suffix_lens"]) == 3 and row["compressor_windows"]
    # the static path computes every row at the decode slot's suffix bucket (left pads included): the floor of
    # what it computes counts n_b tokens per row (the real lengths' floor is below by those pads)
    n_b = bucket(max(row["suffix_lens"]), SUFFIX_BUCKET)
    padded = dict(row, suffix_lens=[n_b] * len(row["suffix_lens"]))
    parts = {p.name: p.flops for p in bench.floor_parts(tiny_vlm, padded, 4, causal=False)}
    c = tiny_vlm.model.config.vision_config.hidden_size
    embed = 2 * 4 * (row["frames"] * row["hw"] + row["raw_reencoded"] * row["raw_hw"]) * 3 * 14 ** 2 * c
    front = parts["vision"] + parts["compress"] + parts["project"] + embed
    back = parts["prefix"] + parts["suffix"] + parts["decode"]
    assert 0 <= encode - front < 0.02 * front
    assert 0 <= answer - back < 0.02 * back
    causal = {p.name: p.flops for p in bench.floor_parts(tiny_vlm, padded, 4)}
    assert causal["prefix"] < parts["prefix"] and causal["decode"] == parts["decode"]


@pytest.mark.slow   # (fast twin: tests/algorithms/test_token_check.py on hand-made logits)
def test_token_check_logits_reproduce_the_greedy_tokens(tiny_vlm):
    """The token check's teacher-forced logits (issue 41): in fp32 on the CPU their argmax along a greedy answer is
    that answer (row t is the distribution of token t given the tokens before it), and two paths with identical
    tokens and kernels compare as exact and the same, with no logit difference."""
    from datamodules.decode import decode_video
    from models.videollama3 import prepare_budgets
    from tests.conftest import MEDIA

    bench = _bench()
    dec = decode_video(MEDIA / "cockatoo.mp4", 128)
    (bi,) = prepare_budgets(tiny_vlm, dec.frames, dec.times_s, [128], raw_mode="orig")
    answers = tiny_vlm.answer_all(bi.prompt, bench.QUESTIONS, 4, ignore_eos=True)
    toks = [a.token_ids for a in answers]
    logits = bench.forced_logits(tiny_vlm, bi.prompt, bench.QUESTIONS[0], toks[0], fused=False)
    assert logits.shape == (4, tiny_vlm.model.config.text_config.vocab_size)
    assert logits.argmax(-1).tolist() == toks[0]
    out = bench.token_checks(tiny_vlm, {"a": bi.prompt, "b": bi.prompt}, {"a": toks, "b": toks}, tol=1e-4)
    assert out["same_tokens_ab"] is True and out["exact_tokens_ab"] is True
    assert out["token_check_ab"] == ";".join(["True(d=0)"] * 3) and out["same_tokens_bc"] == "-"


def test_memory_floor_rate_is_measured_on_cuda_and_the_nominal_one_elsewhere(monkeypatch):
    """The floor's bandwidth: the 4.8 TB/s constant only where nothing is measured (the CPU); on CUDA a timed copy
    (stood in for here on the CPU, with a clock that says 2 s)."""
    bench = _bench()
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.hbm_tbps() == bench.HBM_BYTES_PER_S / 1e12 == 4.8
    # on "CUDA": the copy's bytes read + written over the clock's seconds (2 x 1 MiB x 10 in 2 s of clock)
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "sync", lambda: None)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    real_empty = bench.torch.empty
    monkeypatch.setattr(bench.torch, "empty", lambda n, device, dtype: real_empty(n, dtype=dtype))
    monkeypatch.setattr(bench.torch.cuda, "empty_cache", lambda: None)
    assert bench.hbm_tbps(gib=1 / 1024) == pytest.approx(2 * 2 ** 20 * 10 / 2.0 / 1e12)
