"""Streaming-extraction throughput (issue 12): eager one-session baseline vs lockstep batched sessions with reuse.

    python bench/extract_throughput.py                          # GPU: random bf16 thinker, Qwen2.5-Omni-3B shapes
    python bench/extract_throughput.py --sessions 8 16 --duration 24 --compile --json out.json
    python bench/extract_throughput.py --tiny                   # CPU smoke run on the tiny thinker (< 60 s)
    python bench/extract_throughput.py --memory-policy sliding  # only the sliding-window KV rows (+ the baseline)
    python bench/extract_throughput.py --sessions 8 --breakdown --json out.json  # + where the batched wall goes
    python bench/extract_throughput.py --gemm-tflops 790        # the ceiling columns at a given GEMM rate
    python bench/extract_throughput.py --memory-policy window --reprefill-slides 1 2 4 auto  # K side by side
    python bench/extract_throughput.py --memory-policy window --fuse-slide-rows  # slide row fused or not

Self-contained: nothing is downloaded. The thinker is built in memory from a ``Qwen2_5OmniThinkerConfig`` with the
Qwen2.5-Omni-3B thinker shapes (LLM 36 layers, hidden 2048, FFN 11008, 16 heads, 2 KV heads, vocab 151936; vision
tower 32 layers, width 1280, FFN 3420, 16 heads, full attention at 7/15/23/31, merger to 2048; whisper-like audio
tower 32 layers, width 1280, FFN 5120, 20 heads, output 2048) and random bf16 weights; the feature extractor and
video processor are the official settings, written to a temporary folder. Media: EasyCom-like synthetic sessions,
random 2 FPS frames of 560x1008 pixels (a 20x36 merged grid = 720 merged tokens per 1 s temporal patch) and 16 kHz
noise; session ``k`` of N lasts ``duration * (1 - 0.25 k / (N - 1))`` s (rounded to 0.2 s) so that batched sessions
drop out at different times. Memory 8 s.

For each mode it measures (after a warm-up on a short stream, ``--warmup`` s):
* ``1-session eager``: ``OmniThinkerRunner.run_stream`` on session 0 under the ``window`` memory policy with the
  library's forwards (the issue's baseline, measured once per mode; its dataset-level RTF is the same number,
  sessions running one after another);
* ``batched N``, once per memory policy of ``--memory-policy`` (default both: ``window`` = exact 8 s memory with a
  re-prefill of the kept blocks per slide, ``sliding`` = sliding-window KV cache, each block through the LLM once;
  ``models/omni/thinker.py``): ``BatchedOmniRunner.run_streams`` on all N sessions in lockstep with reuse and the fused
  RMSNorm / rotary / SiLU-gate kernels of ``models/kernels.py`` (``--no-fused``: without them; ``+compile`` rows
  with ``--compile``: ``torch.compile`` of the small fixed-shape calls; micro-chunk-200ms rows batch a native
  block's 10 rows into one call per tower and one LLM prefill, ``--row-by-row`` adds a row with one call per row,
  as a live stream must run; the LLM prefills on top of the cache use SDPA's lower-right causal flash path,
  ``--library-prefill``: the library's explicit-mask SDPA);
and prints one table: memory policy, real-time factor (media seconds / wall seconds; batched = per-session RTF of
session 0's share), dataset-level RTF (all sessions' media seconds / total wall) against the target, peak GPU memory
(CPU: process peak RSS), the largest state difference of session 0 against the one-session path under the same
policy (``window``: the timed baseline, with the library's forwards, so the difference includes the fused kernels'
rounding; ``sliding``: an extra untimed one-session run with the fused kernels), and the computed vision
patches and LLM tokens per media second, and the compute ceiling (below). Issue-12 targets (H200, 720 tokens/patch,
dataset-level): completed-block-hold >= 40x, micro-chunk-200ms >= 20x, open-stream-replay >= 8x (derived assuming
committed blocks' KV is computed once and kept, i.e. the ``sliding`` policy).

Compute ceiling (issue 25, target 3; batched rows): the analytic matmul FLOPs of what the run computed, summed over
its sessions' ``computed`` counts (``algorithms/encoder_flops.py``: temporal patches x vision-tower FLOPs of one patch
of the frame grid, audio seconds x audio-tower FLOPs per second at the mode's payload lengths, prefilled LLM tokens x
LLM FLOPs per token at the policy's steady-state mean attention context; no lm_head, no padding, shapes from the
thinker's config), divided by the dense bf16 GEMM rate measured once per run on CUDA (8192^3 matmul, mean of 10 after 3
warm-ups; ``--gemm-tflops`` sets it instead) is the run's floor time; columns ``TFLOP / media s`` (the floor's FLOPs
per media second), ``RTF ceiling`` (media seconds / floor seconds: the dataset RTF the GPU could reach if every FLOP
ran at the GEMM rate) and ``of ceiling`` (dataset RTF / RTF ceiling). On the CPU the rate is a nominal
``CPU_NOMINAL_TFLOPS`` and the ceiling columns mean nothing.

``--breakdown`` (off by default) times the batched runs part by part (``models.omni.batch.BREAKDOWN_PARTS``: host /
device preprocessing of audio and of video, vision tower, audio tower, LLM prefill, LLM re-prefill of the window
policy, KV cache edits, the rest), with a device synchronization around every part, and prints a second table:
wall seconds per part and their share of the run's wall time, per (mode, policy, sessions). The synchronizations stop
the parts from overlapping, so the batched rows' RTF with ``--breakdown`` is a slightly pessimistic figure.

``--reprefill-slides K [K ...]`` (window rows): the re-prefills of up to K window slides run as one LLM call
(``BatchedOmniRunner(reprefill_slides=K)``: 1 = one call per slide, ``auto`` = the runner's default from its memory
bound); one window row per value, its path ending ``K=...``; each row's ``reprefill_calls`` in ``--json`` is the
sum of the sessions' ``computed_reprefill_calls`` (one batched call counts once per session in it). Without the flag
the window rows run the default, unlabelled.

``--fuse-slide-rows`` (window rows, issue 41): every window row runs twice, unfused then fused
(``BatchedOmniRunner(fuse_slide_rows=True)``: the slide row's own payloads ride in the re-prefill call, so a slide
costs 1/K LLM calls instead of 1/K + 1; path ending ``, fused``), and a last table compares each pair: dataset RTF,
speed-up, share of the compute ceiling, LLM calls of the timed run (``llm_calls``, every row), re-prefill calls and
the fused run's state difference from the unfused one (``vs_unfused``) and from the 1-session path.

Cost of ``--sessions 8 --breakdown --json out.json`` on one H200 (all modes, both policies, longest session 24 s,
8 sessions = 168 media s per batched run, warm-ups of 2 s streams, which already cover every replay-tail and micro
length): per mode an eager warm-up, the eager baseline, an untimed sliding reference and, per policy, a batched
warm-up (8 x 2 s) and the timed batched run. At the last measured rates (before the sliding policy and before the
preprocessing moved to the device: batched window replay 3.4x, hold 12x, micro 3.7x, i.e. 49 + 14 + 46 s per policy)
that is about 5.5 minutes including the model build; the current code should be faster.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from algorithms.encoder_flops import thinker_floor_flops  # noqa: E402
from algorithms.streaming import MEMORY_POLICIES, MICRO_CHUNK_200MS, MODES, WINDOW  # noqa: E402
from bench.extract_tables import (HEADER, _fmt_row, format_breakdown, format_ceiling_note,  # noqa: E402,F401
                                  format_fused_comparison, format_table)

TARGETS = {"completed-block-hold": 40.0, "micro-chunk-200ms": 20.0, "open-stream-replay": 8.0}
FRAME_HW = (560, 1008)  # 40x72 patches of 14 px -> 20x36 merged = 720 merged tokens per temporal patch
TINY_FRAME_HW = (112, 112)  # tiny video processor cap: 4x4 merged = 16 tokens per temporal patch
CPU_NOMINAL_TFLOPS = 0.5  # the GEMM rate used off CUDA: the ceiling columns are meaningless there
CEILING_FIELDS = ("gemm_tflops", "gemm_source", "floor_tflop", "floor_tflop_parts", "floor_grid", "llm_mean_context",
                  "tflop_per_media_s", "floor_s", "rtf_ceiling", "of_ceiling_pct")


def omni_3b_thinker_config():
    """``Qwen2_5OmniThinkerConfig`` with the Qwen2.5-Omni-3B thinker shapes (no weights)."""
    from transformers import Qwen2_5OmniThinkerConfig

    return Qwen2_5OmniThinkerConfig(
        audio_config=dict(num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                          d_model=1280, n_window=100, max_source_positions=1500, output_dim=2048),
        vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                           fullatt_block_indexes=[7, 15, 23, 31], window_size=112, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        text_config=dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                         num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1e6},
                         tie_word_embeddings=True),
        position_id_per_seconds=25, seconds_per_chunk=2, vision_start_token_id=151652, vision_end_token_id=151653)


def write_processors(out: Path, max_pixels: int, config=None) -> Path:
    """The official WhisperFeatureExtractor settings and a Qwen2VLVideoProcessor (patch 14, merge 2, temporal 2);
    with ``config`` also its ``config.json`` (``OmniThinkerRunner`` takes only a directory holding one)."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400,
                            padding_value=0.0, return_attention_mask=True).save_pretrained(out)
    Qwen2VLVideoProcessor(size={"shortest_edge": 56 * 56, "longest_edge": max_pixels}, patch_size=14,
                          temporal_patch_size=2, merge_size=2).save_pretrained(out)
    if config is not None:
        config.save_pretrained(out)
    return out


def build_runner(tiny: bool, device: str, workdir: Path):
    """The ``OmniThinkerRunner``: tiny (fp32, from ``models.omni.tiny``) or 3B shapes (bf16, random, in memory)."""
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    from models.omni.thinker import OmniThinkerRunner

    if tiny:
        from models.omni.tiny import build_tiny_omni

        return OmniThinkerRunner(build_tiny_omni(workdir / "tiny_omni"), layer=-1).to(device)
    cfg = omni_3b_thinker_config()
    cfg._attn_implementation = "sdpa"
    for sub in (cfg.audio_config, cfg.vision_config, cfg.text_config):
        sub._attn_implementation = "sdpa"
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            thinker = Qwen2_5OmniThinkerForConditionalGeneration(cfg)
    finally:
        torch.set_default_dtype(old)
    thinker = thinker.to(device=device, dtype=torch.bfloat16).eval()
    d = write_processors(workdir / "omni3b_processors", max_pixels=FRAME_HW[0] * FRAME_HW[1], config=cfg)
    return OmniThinkerRunner(d, layer=-1, thinker=thinker)


def make_sessions(n: int, duration_s: float, hw: tuple[int, int], seed: int = 0) -> list[dict]:
    """N synthetic streams of decreasing length (the last ~25 % shorter), random frames + noise."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        d = duration_s * (1 - 0.25 * k / max(n - 1, 1))
        d = round(round(d / 0.2) * 0.2, 1)
        frames = rng.integers(0, 256, (int(d * 2), *hw, 3), dtype=np.uint8)
        audio = (0.1 * rng.standard_normal(int(round(d * 16000)))).astype(np.float32)
        out.append({"frames": frames, "audio": audio, "duration_s": d})
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def gemm_tflops(device: torch.device) -> float:
    """Measured dense bf16 GEMM rate in TFLOP/s on CUDA (8192^3, mean of 10 after 3 warm-ups, as
    ``bench/qa_throughput.py``); ``CPU_NOMINAL_TFLOPS`` elsewhere."""
    if device.type != "cuda":
        return CPU_NOMINAL_TFLOPS
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(device)
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    _sync(device)
    rate = 2 * 8192 ** 3 * 10 / (time.perf_counter() - t) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return rate


def ceiling_fields(runner, computed: list[dict], mode: str, policy: str, frame_hw: tuple[int, int], memory_s: float,
                   media_s: float, dataset_rtf: float, rate_tflops: float, rate_source: str = "") -> dict:
    """The compute-ceiling fields of one batched row (``CEILING_FIELDS``): the analytic FLOPs of the sessions'
    ``computed`` counts (summed) at the runner's thinker shapes, the floor time at ``rate_tflops`` and the RTF
    ceiling it allows."""
    total = {k: sum(float(c.get(k, 0)) for c in computed)
             for k in ("computed_vision_patches", "computed_audio_seconds", "computed_llm_tokens")}
    f = thinker_floor_flops(runner.thinker.config, total, mode, policy, frame_hw, memory_s,
                            prompt_tokens=len(runner.prompt_token_ids), geometry=runner.geometry,
                            mel_frames_per_s=16000 // int(runner.feature_extractor.hop_length))
    floor_s = f.total / (rate_tflops * 1e12)
    ceiling = media_s / floor_s if floor_s > 0 else float("inf")
    return {"gemm_tflops": rate_tflops, "gemm_source": rate_source, "floor_tflop": f.total / 1e12,
            "floor_tflop_parts": {"vision": f.vision / 1e12, "audio": f.audio / 1e12, "llm": f.llm / 1e12},
            "floor_grid": list(f.grid_hw), "llm_mean_context": f.llm_mean_context,
            "tflop_per_media_s": f.total / 1e12 / media_s, "floor_s": floor_s, "rtf_ceiling": ceiling,
            "of_ceiling_pct": 100.0 * dataset_rtf / ceiling}


def _peak(device: torch.device) -> int:
    import resource

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def run_bench(tiny: bool = False, sessions: tuple[int, ...] = (8, 16), duration_s: float = 24.0,
              memory_s: float = 8.0, modes: tuple[str, ...] = MODES, compile_small_calls: bool = False,
              device: str | None = None, warmup_s: float = 2.0, log=print,
              policies: tuple[str, ...] = MEMORY_POLICIES, breakdown: bool = False, fused: bool = True,
              row_by_row: bool = False, flash_prefill: bool = True, gemm_rate: float | None = None,
              reprefill_slides: tuple = (None,), label_slides: bool = False,
              fuse_slide_rows: tuple = (False,)) -> list[dict]:
    """Build the model, run every measurement, return one row dict per (mode, path, memory policy); batched rows
    carry ``breakdown`` (part -> wall seconds of the timed run) when ``breakdown``, and the compute ceiling
    (``CEILING_FIELDS``; None on the eager rows) at ``gemm_rate`` TFLOP/s (None: measured, ``gemm_tflops``).
    ``window`` rows run once per ``reprefill_slides`` value (None: the runner's default from its memory bound;
    ``sliding`` has no re-prefill: its first value only), the path named ``K=...`` when ``label_slides``, and once
    per ``fuse_slide_rows`` value (``BatchedOmniRunner(fuse_slide_rows=...)``; the fused path ends ``, fused`` and
    records ``vs_unfused``, its session 0's largest state difference from the unfused row before it). Every batched
    row counts its LLM calls (``llm_calls``: calls of the language model in the timed run)."""
    from models.fused_forwards import fuse
    from models.omni.batch import BatchedOmniRunner, single_session_computed

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() and not tiny else "cpu"))
    if tiny and dev.type == "cpu":
        torch.set_num_threads(1)  # tiny widths: threads cost more than they give (and keep CPU GEMMs M-invariant)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        runner = build_runner(tiny, str(dev), Path(tmp))
        log(f"model built in {time.perf_counter() - t0:.1f} s on {dev} ({runner.dtype}, D={runner.hidden_size})")
    rate = float(gemm_rate) if gemm_rate is not None else gemm_tflops(dev)
    source = ("given" if gemm_rate is not None else "dense bf16 GEMM, 8192^3, measured" if dev.type == "cuda"
              else "nominal CPU figure: the ceiling columns mean nothing here")
    log(f"GEMM rate for the compute ceiling: {rate:.1f} TFLOP/s ({source})")
    hw = TINY_FRAME_HW if tiny else FRAME_HW
    n_max = max(sessions)
    data = make_sessions(n_max, duration_s, hw)
    warm = make_sessions(min(n_max, 2), warmup_s, hw, seed=1)
    rows = []
    for mode in modes:
        # warm-up: kernels, allocator, (compile) on a short stream
        fuse(runner.thinker, False)            # the eager baseline: the library's forwards
        runner.run_stream(warm[0]["frames"], warm[0]["audio"], mode, memory_s, verify_rows=0)
        _peak_reset(dev)
        t = time.perf_counter()
        base = runner.run_stream(data[0]["frames"], data[0]["audio"], mode, memory_s, verify_rows=0)
        _sync(dev)
        wall = time.perf_counter() - t
        media = data[0]["duration_s"]
        comp = single_session_computed(base.steps, len(data[0]["frames"]), runner.geometry)
        rows.append({"mode": mode, "path": "1-session eager", "policy": WINDOW, "sessions": 1, "media_s": media,
                     "wall_s": wall, "rtf": media / wall, "dataset_rtf": media / wall, "peak_bytes": _peak(dev),
                     "max_abs_diff": 0.0, "vision_patches_per_s": comp["computed_vision_patches"] / media,
                     "llm_tokens_per_s": None, "target": TARGETS[mode], **dict.fromkeys(CEILING_FIELDS)})
        log(_fmt_row(rows[-1]))
        fuse(runner.thinker, fused)
        for policy in policies:
            ref = base if policy == WINDOW else runner.run_stream(  # untimed: the reference states of session 0
                data[0]["frames"], data[0]["audio"], mode, memory_s, verify_rows=0, memory_policy=policy)
            variants = ([(n, False, True) for n in sessions] + ([(n_max, True, True)] if compile_small_calls else [])
                        + ([(n_max, False, False)] if row_by_row and mode == MICRO_CHUNK_200MS else []))
            slide_values = reprefill_slides if policy == WINDOW else reprefill_slides[:1]
            fuse_values = fuse_slide_rows if policy == WINDOW else (False,)
            unfused = {}  # (variant, K) -> session 0's states of the unfused row
            for (n, comp_flag, by_block), k, fz in ((v, k, f) for v in variants for k in slide_values
                                                    for f in fuse_values):
                batched = BatchedOmniRunner(runner, sessions_per_batch=n, compile_small_calls=comp_flag,
                                            profile=breakdown, batch_rows=by_block, flash_prefill=flash_prefill,
                                            reprefill_slides=k, fuse_slide_rows=fz)
                streams = [{"frames": s["frames"], "audio": s["audio"]} for s in data[:n]]
                batched.run_streams([{"frames": s["frames"], "audio": s["audio"]} for s in warm] *
                                    (n // len(warm) or 1), mode, memory_s, verify_rows=0,
                                    memory_policy=policy)  # warm-up at this batch size
                lm_calls = _count_lm_calls(batched)
                _peak_reset(dev)
                t = time.perf_counter()
                res = batched.run_streams(streams, mode, memory_s, verify_rows=0, memory_policy=policy)
                _sync(dev)
                wall = time.perf_counter() - t
                media = sum(s["duration_s"] for s in data[:n])
                diff = float((res[0].states - ref.states).abs().max())
                twin = (n, comp_flag, by_block, k)
                if not fz:
                    unfused[twin] = res[0].states
                path = (f"batched {n} + reuse" + (" + compile" if comp_flag else "")
                        + ("" if by_block else ", row by row")    # row by row: micro only
                        + (f", K={'auto' if k is None else k}" if label_slides and policy == WINDOW else "")
                        + (", fused" if fz else ""))
                rows.append({"mode": mode, "path": path,
                             "policy": policy, "sessions": n, "media_s": media, "wall_s": wall,
                             "rtf": data[0]["duration_s"] / res[0].wall_time_s, "dataset_rtf": media / wall,
                             "peak_bytes": _peak(dev), "max_abs_diff": diff,
                             "vision_patches_per_s": sum(r.computed["computed_vision_patches"] for r in res) / media,
                             "llm_tokens_per_s": sum(r.computed["computed_llm_tokens"] for r in res) / media,
                             "target": TARGETS[mode], "reprefill_slides": "auto" if k is None else k,
                             "reprefill_calls": sum(r.computed["computed_reprefill_calls"] for r in res),
                             "fuse_slide_rows": fz, "llm_calls": lm_calls[0],
                             "vs_unfused": (float((res[0].states - unfused[twin]).abs().max())
                                            if fz and twin in unfused else None),
                             "computed": [r.computed for r in res]})
                rows[-1].update(ceiling_fields(runner, rows[-1]["computed"], mode, policy, hw, memory_s, media,
                                               media / wall, rate, source))
                grid = getattr(batched, "_grid", None)  # the patch grid the vision tower saw
                if grid is not None and tuple(grid) != tuple(rows[-1]["floor_grid"]):
                    log(f"warning: the vision tower saw a {grid} patch grid, the ceiling assumes "
                        f"{rows[-1]['floor_grid']}")
                if breakdown:
                    rows[-1]["breakdown"] = dict(batched.breakdown)
                log(_fmt_row(rows[-1]))
    return rows


def _count_lm_calls(batched) -> list[int]:
    """Count the language-model calls of ``batched`` from now on (one-element list, filled as it runs)."""
    lm, count = batched._lm, [0]

    def counted(*args, **kwargs):
        count[0] += 1
        return lm(*args, **kwargs)

    batched._lm = counted
    return count


def profile_run(tiny: bool, n: int, duration_s: float, memory_s: float, mode: str, policy: str,
                device: str | None = None, rows: int = 25, fused: bool = True,
                reprefill_slides: int | None = None) -> None:
    """Print torch.profiler's top operators by device time (and by host time) for one warmed-up batched run."""
    from torch.profiler import ProfilerActivity, profile

    from models.omni.batch import BatchedOmniRunner

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() and not tiny else "cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        runner = build_runner(tiny, str(dev), Path(tmp))
    from models.fused_forwards import fuse
    fuse(runner.thinker, fused)
    hw = TINY_FRAME_HW if tiny else FRAME_HW
    data = make_sessions(n, duration_s, hw)
    warm = make_sessions(min(n, 2), 2.0, hw, seed=1)
    batched = BatchedOmniRunner(runner, sessions_per_batch=n, reprefill_slides=reprefill_slides)
    batched.run_streams([{"frames": s["frames"], "audio": s["audio"]} for s in warm] * (n // len(warm) or 1), mode,
                        memory_s, verify_rows=0, memory_policy=policy)
    streams = [{"frames": s["frames"], "audio": s["audio"]} for s in data]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        batched.run_streams(streams, mode, memory_s, verify_rows=0, memory_policy=policy)
        _sync(dev)
    print(f"{mode} / {policy} / {n} sessions: {time.perf_counter() - t:.2f} s under the profiler")
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70))


def _slides_arg(text: str) -> int | None:
    """``--reprefill-slides`` value: an integer >= 1 or ``auto`` (None)."""
    if text == "auto":
        return None
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(f"--reprefill-slides: {text!r} is neither an integer >= 1 nor 'auto'")
    return k


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny random thinker on CPU (smoke run, < 60 s)")
    p.add_argument("--sessions", type=int, nargs="+", default=None, help="batch sizes to measure (default 8 16; "
                                                                            "tiny: 4)")
    p.add_argument("--duration", type=float, default=None, help="longest session, s (default 24; tiny: 12)")
    p.add_argument("--memory", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up stream length, s (default 2: every tail length)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--memory-policy", nargs="+", default=list(MEMORY_POLICIES), choices=list(MEMORY_POLICIES),
                   help="memory policies of the batched rows (default: all; the eager baseline is always window)")
    p.add_argument("--compile", action="store_true", help="also measure torch.compile of the small calls")
    p.add_argument("--device", default=None)
    p.add_argument("--breakdown", action="store_true",
                   help="time the batched runs part by part (device syncs around parts) and print a second table")
    p.add_argument("--row-by-row", action="store_true",
                   help="micro-chunk-200ms: also a batched row with one call per row (batch_rows=False), as a live "
                        "stream must run; the default rows batch a native block's rows into one call")
    p.add_argument("--library-prefill", action="store_true",
                   help="batched rows: the library's masked SDPA for the LLM prefills instead of the lower-right "
                        "causal flash path (models.omni.attention.lower_right_causal_sdpa)")
    p.add_argument("--no-fused", action="store_true",
                   help="batched rows without the fused RMSNorm / rotary / SiLU-gate kernels (models/kernels.py)")
    p.add_argument("--gemm-tflops", type=float, default=None,
                   help="GEMM rate (TFLOP/s) for the ceiling columns instead of measuring one (default: measured on "
                        f"CUDA, {CPU_NOMINAL_TFLOPS} on the CPU)")
    p.add_argument("--reprefill-slides", nargs="+", default=None, type=_slides_arg, metavar="K",
                   help="window rows: re-prefills of up to K window slides in one LLM call (BatchedOmniRunner "
                        "reprefill_slides; 1 = one call per slide; 'auto' = the runner's default from its memory "
                        "bound); several values give one window row each, side by side (default: auto, unlabelled)")
    p.add_argument("--fuse-slide-rows", action="store_true",
                   help="window rows: also the path that prefills the slide row's payloads in the re-prefill call "
                        "(BatchedOmniRunner fuse_slide_rows=True), each next to its unfused twin, and a table "
                        "comparing the two (RTF, share of the ceiling, LLM calls, state difference)")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--profile", default=None, choices=list(MODES),
                   help="only profile one batched run of this mode (first --sessions, first --memory-policy): "
                        "torch.profiler table of the top kernels by GPU time")
    a = p.parse_args(argv)
    sessions = tuple(a.sessions or ((4,) if a.tiny else (8, 16)))
    duration = a.duration or (12.0 if a.tiny else 24.0)
    if a.profile:
        profile_run(a.tiny, sessions[0], duration, a.memory, a.profile, a.memory_policy[0], a.device,
                    fused=not a.no_fused, reprefill_slides=(a.reprefill_slides or [None])[0])
        return []
    t0 = time.perf_counter()
    print("rows as they finish (the final tables follow):")
    print(HEADER)
    rows = run_bench(a.tiny, sessions, duration, a.memory, tuple(a.modes), a.compile, a.device,
                     warmup_s=a.warmup, log=lambda s: print(s, flush=True),
                     policies=tuple(dict.fromkeys(a.memory_policy)), breakdown=a.breakdown, fused=not a.no_fused,
                     row_by_row=a.row_by_row, flash_prefill=not a.library_prefill, gemm_rate=a.gemm_tflops,
                     reprefill_slides=tuple(dict.fromkeys(a.reprefill_slides or [None])),
                     label_slides=a.reprefill_slides is not None,
                     fuse_slide_rows=(False, True) if a.fuse_slide_rows else (False,))
    print(f"\n## extract throughput ({'tiny, CPU' if a.tiny else 'Qwen2.5-Omni-3B thinker shapes, random bf16'}, "
          f"memory {a.memory:g} s, policies {', '.join(dict.fromkeys(a.memory_policy))}, longest session "
          f"{duration:g} s; this bench ran {time.perf_counter() - t0:.0f} s of wall time)\n")
    print(format_ceiling_note(rows) + "\n")
    print(format_table(rows))
    if a.fuse_slide_rows:
        print("\n## window: slide row fused into the re-prefill call vs not (fuse_slide_rows)\n")
        print(format_fused_comparison(rows))
    if a.breakdown:
        print("\n## where the batched wall time goes (seconds, share of the run's wall)\n")
        print(format_breakdown(rows))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return rows


if __name__ == "__main__":
    main()
