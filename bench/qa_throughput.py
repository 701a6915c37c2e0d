"""Budgeted-QA throughput on real decoded videos: what common harnesses do vs the shared prefix vs ours.

Per video and budget (3 questions, answers forced to ``--new-tokens`` tokens, greedy):
  (a) harness    encode once, then a full prefill + ``generate`` per question
  (b) seq-prefix encode once, prefill the shared prefix once, questions one by one from the cropped cache
                 ((a) and (b): the library's forwards, stock per-frame SDPA encoder)
  (c) batched    encode once (frame-batched attention), prefill once, all questions decoded together on a
                 DynamicCache repeated per question (transformers' masks; the simple batched path); (c) and (d)
                 run the fused RMSNorm / rotary / SiLU-gate kernels of ``models/kernels.py`` (``--kernels``: the
                 hand-written Triton ones by default, ``inductor`` for torch.compile's, ``eager``)
  (d) ours       as (c), but the questions attend the shared prefix once per layer (``models/videollama3/shared_prefix.py``),
                 only their suffixes live in a small StaticCache and the decode step is a CUDA graph (GPU only;
                 ``nan`` on the CPU, and its ratios are not computed there)
plus the analytic floor of (d)'s work (``algorithms/qa_floor.py``), part by part: the vision tower, the qbase
compressor, the projector, the prefix prefill, the question-suffix prefill of every question and the decode steps,
each part's time ``max(FLOPs / measured bf16 GEMM rate, bytes / HBM bandwidth)`` and the floor their sum, so that
(d) / floor measures overhead only; ``floor_prefill`` is the floor this bench printed before (vision tower + prefix
prefill FLOPs at the GEMM rate + one weight read per answer token), kept for comparison with earlier results. Also
peak GPU memory, and the share of wall time the GPU waits for DataLoader workers in the real
``BudgetedQA.predict_step`` loop.

GPU (VideoLLaMA3-7B shapes, random bf16 weights, no download; ``bench/make_media.py`` writes the long videos):
    python bench/make_media.py && python bench/qa_throughput.py --videos bench/media/*.mp4
CPU smoke test (tiny model):
    python bench/qa_throughput.py --tiny
"""
from __future__ import annotations

import atexit
import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))   # the other bench scripts

from algorithms.flops import ModelShape, get_shape, prefill_flops  # noqa: E402
from algorithms.qa_floor import PART_NAMES, CompressorShape, VisionShape, floor_seconds, qa_floor_parts  # noqa: E402
from algorithms.token_check import compare_paths  # noqa: E402
from datamodules.decode import decode_video  # noqa: E402
from models.videollama3 import BudgetedVideoLlama3, EncodeCache, prepare_budgets  # noqa: E402

QUESTIONS = [
    "What is the main subject of the video?\nA. A bird.\nB. A car.\nC. A house.\nD. A tree.\nAnswer with the letter.",
    "What happens at the end of the video?\nA. Nothing changes.\nB. The camera moves.\nC. It gets dark.\n"
    "D. Someone enters.\nAnswer with the letter.",
    "Where was the video most likely filmed?\nA. Indoors.\nB. Underwater.\nC. In space.\nD. On a mountain.\n"
    "Answer with the letter.",
]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def videollama3_7b_config():
    """VideoLLaMA3-7B shapes: Qwen2-7B LM + the 27-layer, 1152-wide SigLIP-NaViT encoder (patch 14)."""
    from transformers import Qwen2Config, VideoLlama3Config
    from transformers.models.video_llama_3.configuration_video_llama_3 import VideoLlama3VisionConfig

    text = Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rope_theta=1_000_000.0, tie_word_embeddings=False)
    vision = VideoLlama3VisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                                     num_attention_heads=16, patch_size=14)
    return VideoLlama3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_id=151655,
                             video_token_id=151656)


def build_bench_model(attn: str, vision_attn: str) -> BudgetedVideoLlama3:
    """Random bf16 VideoLLaMA3-7B on the GPU (meta init, then normal(0, 0.02) in place: seconds, no download)."""
    from transformers import VideoLlama3ForConditionalGeneration
    from transformers.models.video_llama_3.video_processing_video_llama_3 import VideoLlama3VideoProcessor

    from models.videollama3.qbase import TokenCompressorConfig, TransformerDecoderFlatCompressor
    from models.tokenizer import build_qwen_tokenizer

    cfg = videollama3_7b_config()
    cfg._attn_implementation = attn
    cfg.text_config._attn_implementation = attn
    cfg.vision_config._attn_implementation = attn
    with torch.device("meta"):
        model = VideoLlama3ForConditionalGeneration(cfg)
    model = model.to_empty(device="cuda").to(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or "layernorm" in name):
                p.fill_(1.0)
            elif p.ndim == 1:
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=g)
    _reinit_rotary(model)
    model.requires_grad_(False)
    # the fork's training defaults (compressor_num_layers 8, heads 8, intermediate 4 * mm_hidden_size), K = 64
    qb = TransformerDecoderFlatCompressor(TokenCompressorConfig(
        compressor_type="transformer_decoder_flat", hidden_size=1152, intermediate_size=4 * 1152, num_layers=8,
        num_attention_heads=8, num_queries=64, match_encoder_scale=True)).to("cuda", torch.bfloat16)
    tok = build_qwen_tokenizer()
    vlm = BudgetedVideoLlama3(model.eval(), tok, VideoLlama3VideoProcessor(use_token_compression=False), qb.eval())
    return vlm.set_vision_attention(None if vision_attn == "none" else vision_attn).set_fused_kernels(True)


def _reinit_rotary(model) -> None:
    """Rotary buffers created on the meta device hold garbage after ``to_empty``: rebuild those modules."""
    for name, mod in model.named_modules():
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
            fresh = type(mod)(mod.config)
            for bname, buf in fresh.named_buffers(recurse=False):
                mod.register_buffer(bname, buf.to(model.device), persistent=False)  # float32, as from_pretrained


def build_tiny_model() -> BudgetedVideoLlama3:
    from models.videollama3.tiny import build_tiny_videollama3

    root = tempfile.mkdtemp(prefix="qa_throughput_tiny_")
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # ~56 MB per run: never left behind
    d = Path(root) / "tiny"
    build_tiny_videollama3(d)
    return BudgetedVideoLlama3.from_pretrained(d)


def gemm_tflops() -> float:
    """Measured dense bf16 GEMM rate (8192³, mean of 10 after 3 warm-ups; ``extract_throughput.gemm_tflops``);
    a nominal 0.5 on the CPU, where the floor is meaningless."""
    from extract_throughput import gemm_tflops as measured

    return measured(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def vision_flops(num_frames: int, hw: int, cfg) -> float:
    """Encoder FLOPs (2 x MACs): per frame P = 4 hw patches, per layer 8 P C² (qkvo) + 4 P² C (attention)
    + 4 P C I (MLP)."""
    c, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    p = 4 * hw
    return num_frames * layers * (8 * p * c * c + 4 * p * p * c + 4 * p * c * i)


HBM_BYTES_PER_S = 4.8e12   # H200 HBM3e bandwidth: the memory floor's rate where none is measured (the CPU)


def hbm_tbps(gib: float = 2.0) -> float:
    """Measured device memory bandwidth in TB/s on CUDA: a ``gib`` GiB bf16 copy (``copy_``: the bytes read plus
    the bytes written), mean of 10 after 3 warm-ups, the memory floor's rate as :func:`gemm_tflops` is the compute
    floor's (a measured rate, below the card's spec: 4.8 TB/s on the H200, 3.35 on the H100 SXM, whose constant the
    floor used before session 10). ``HBM_BYTES_PER_S`` on the CPU, where the floor is meaningless."""
    if not torch.cuda.is_available():
        return HBM_BYTES_PER_S / 1e12
    n = int(gib * 2 ** 30) // 2
    a = torch.empty(n, device="cuda", dtype=torch.bfloat16).normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync()
    t = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    sync()
    rate = 2 * a.numel() * a.element_size() * 10 / (time.perf_counter() - t) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return rate


def llm_shape(text_config) -> ModelShape:
    """The LLM's :class:`~algorithms.flops.ModelShape` from its text config (the bench's 7B: ``qwen2-7b``)."""
    t = text_config
    heads = int(t.num_attention_heads)
    return ModelShape("bench-llm", int(t.num_hidden_layers), int(t.hidden_size), int(t.intermediate_size), heads,
                      int(t.num_key_value_heads), int(getattr(t, "head_dim", None) or t.hidden_size // heads),
                      int(t.vocab_size))


def step_fields(vlm: BudgetedVideoLlama3, bi, questions: list[str]) -> dict:
    """What one (video, budget)'s step computes, for its floor: ``frames`` encoded at ``hw`` merged tokens,
    ``raw_reencoded`` raw frames encoded again at ``raw_hw`` (``prepare_budgets``: when the raw grid differs),
    ``compressor_windows`` (encoder rows of each window of the qbase call: every group with ``match_encoder_scale``,
    else the compressed ones, as ``vlm.compress``), ``vision_tokens`` (the projector's rows), ``prefix_len``,
    ``suffix_lens`` (the questions answered in the batch) and ``suffix_fallbacks`` (questions answered from scratch,
    DESIGN §3.7: not in the floor), plus the plan's ``mode``."""
    plan = bi.plan
    groups = plan.group_bounds()
    windows = range(len(groups)) if vlm.compressor.match_encoder_scale else plan.compressed
    suffixes = [vlm.question_ids(bi.prompt, q) for q in questions]
    return dict(prefix_len=bi.prompt.ids.numel(), vision_tokens=plan.vision_tokens, frames=len(bi.frame_idx),
                hw=plan.hw, mode=plan.mode, raw_hw=plan.raw_hw,
                raw_reencoded=plan.n_raw_frames if tuple(bi.raw_grid) != tuple(bi.grid) else 0,
                compressor_windows=[(groups[g][1] - groups[g][0]) * plan.hw for g in windows] if plan.compressed
                else [],
                suffix_lens=[len(ids) for ids, fallback in suffixes if not fallback],
                suffix_fallbacks=sum(fallback for _, fallback in suffixes))


def floor_parts(vlm: BudgetedVideoLlama3, row: dict, new_tokens: int, dtype_bytes: int | None = None,
                causal: bool = True):
    """:func:`algorithms.qa_floor.qa_floor_parts` of one bench row (the fields :func:`run_methods` records) with the
    model's shapes (``dtype_bytes``: the model's element size unless given; ``causal``: the LLM's own attention
    counted as the causal triangle, else the full square)."""
    v, qb = vlm.model.config.vision_config, vlm.compressor.config
    return qa_floor_parts(
        llm_shape(vlm.model.config.text_config),
        VisionShape(int(v.hidden_size), int(v.intermediate_size), int(v.num_hidden_layers)),
        CompressorShape(qb.hidden_size, qb.intermediate_size, qb.num_layers, qb.num_queries),
        num_frames=row["frames"], hw=row["hw"], raw_frames_reencoded=row["raw_reencoded"], raw_hw=row["raw_hw"],
        compressor_windows=row["compressor_windows"], vision_rows=row["vision_tokens"],
        prefix_len=row["prefix_len"], suffix_lens=row["suffix_lens"], new_tokens=new_tokens,
        dtype_bytes=dtype_bytes or vlm.dtype.itemsize, causal=causal)


def floor_fields(vlm: BudgetedVideoLlama3, row: dict, new_tokens: int, tflops: float,
                 bytes_per_s: float = HBM_BYTES_PER_S, causal: bool = True) -> dict:
    """The row's floor at ``tflops`` TFLOP/s and ``bytes_per_s``: ``floor_<part>_s`` per part
    (:data:`algorithms.qa_floor.PART_NAMES`), ``floor_s`` their sum, and ``floor_parts`` (each part's FLOPs and
    bytes)."""
    parts = floor_parts(vlm, row, new_tokens, causal=causal)
    secs = floor_seconds(parts, tflops * 1e12, bytes_per_s)
    out = {f"floor_{p.name}_s": secs[p.name] for p in parts}
    out["floor_s"] = secs["total"]
    out["floor_parts"] = {p.name: {"flops": p.flops, "bytes": p.bytes} for p in parts}
    return out


def timed(fn):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


# the token check's tolerance in logit units (issue 41): bf16 spacing is 2^-7 = 0.0078 at |logit| ~ 1 and 0.0625 at
# ~ 8-16; other summation orders over 28 layers move random-weight logits by a few hundredths
LOGIT_TOL = 0.1
FUSED = {"a": False, "b": False, "c": True, "d": True}   # the kernels each path runs (set_fused_kernels)


@torch.no_grad()
def forced_logits(vlm: BudgetedVideoLlama3, prompt, question: str, tokens: list[int], fused: bool) -> torch.Tensor:
    """Logits (T, V) float32 on the host of the T answer tokens ``tokens`` teacher-forced after ``prompt`` +
    ``question`` in one causal forward (row ``t``: the distribution of ``tokens[t]`` given ``tokens[:t]``), with the
    fused kernels on or off (``fused``); ``lm_head`` on the last T positions only."""
    vlm.set_fused_kernels(fused)
    q_ids, fallback = vlm.question_ids(prompt, question)
    base = prompt.ids if not fallback else prompt.ids[: len(prompt.ids) - prompt.last_text_len]
    full = torch.cat([base, torch.tensor(list(q_ids) + list(tokens[:-1]), dtype=torch.long)])
    hidden = vlm.model.model(inputs_embeds=vlm.embed(full, prompt.vision_embeds)).last_hidden_state[0, -len(tokens):]
    return vlm.model.lm_head(hidden).float().cpu()


def token_checks(vlm: BudgetedVideoLlama3, prompts: dict, tokens: dict, tol: float = LOGIT_TOL) -> dict:
    """The pairs a=b, b=c, c=d under :func:`algorithms.token_check.compare_paths`: per question, both paths' logits
    teacher-forced along the first path's tokens (each with its own prompt rows and kernels; (d)'s shared-prefix
    attention and static cache are not replayed, its kernels are (c)'s), compared within ``tol``, and the tokens
    compared only where the top-2 margin exceeds ``tol``. Returns ``same_tokens_<pq>`` (the rule's verdict),
    ``exact_tokens_<pq>`` (ids identical) and ``token_check_<pq>`` (per question, :class:`TokenCheck` as text)."""
    out, memo = {}, {}

    def logits(m: str, i: int, toks: list[int]) -> torch.Tensor:
        key = (id(prompts[m]), FUSED[m], i, tuple(toks))
        if key not in memo:
            memo[key] = forced_logits(vlm, prompts[m], QUESTIONS[i], toks, FUSED[m])
        return memo[key]

    for p, q in (("a", "b"), ("b", "c"), ("c", "d")):
        if p not in tokens or q not in tokens:
            out.update({f"same_tokens_{p}{q}": "-", f"exact_tokens_{p}{q}": "-", f"token_check_{p}{q}": "-"})
            continue
        checks = [compare_paths(tp, tq, logits(p, i, tp), logits(q, i, tp), tol) if tp else
                  compare_paths(tp, tq, None, None, tol) for i, (tp, tq) in enumerate(zip(tokens[p], tokens[q]))]
        out.update({f"same_tokens_{p}{q}": all(c.same for c in checks),
                    f"exact_tokens_{p}{q}": all(c.exact for c in checks),
                    f"token_check_{p}{q}": ";".join(str(c) for c in checks)})
    out.update(bc_parts(vlm, prompts, tokens, logits))
    vlm.set_fused_kernels(True)
    return out


@contextlib.contextmanager
def library_efficient_attention(backends):
    """transformers' SDPA attention limited to ``backends``, with the key and value heads repeated to the query
    heads (``repeat_kv``, as transformers does where it does not pass ``enable_gqa``): the memory-efficient kernel
    takes no grouped heads on dense inputs, so with ``enable_gqa`` it did not run at all (session 15's row: nan)."""
    from unittest import mock

    import transformers.integrations.sdpa_attention as library_sdpa
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backends), mock.patch.object(library_sdpa, "use_gqa_in_sdpa", lambda *a, **kw: False):
        yield


def bc_parts(vlm: BudgetedVideoLlama3, prompts: dict, tokens: dict, logits) -> dict:
    """Where b and c part: per question, max |logit difference| along (b)'s tokens of (b)'s own logits (its prompt
    rows, the library's kernels) against ``bc_vision_d``: (c)'s prompt rows (frame-batched encoder) under the
    library's kernels; ``bc_kernels_d``: (b)'s prompt rows under (c)'s fused kernels; ``library_spread_d``: (b)'s
    prompt rows and kernels with SDPA's memory-efficient backend in place of its default (flash on CUDA)
    (:func:`library_efficient_attention`): two paths the library itself may take, i.e. the spread the tolerance has
    to allow. ``-`` without both (b) and (c); each a
    ``;``-joined list of per-question floats (``nan`` for a question without tokens)."""
    if "b" not in tokens or "c" not in tokens:
        return {"bc_vision_d": "-", "bc_kernels_d": "-", "library_spread_d": "-"}
    from torch.nn.attention import SDPBackend

    parts = {"bc_vision_d": [], "bc_kernels_d": [], "library_spread_d": []}
    for i, toks in enumerate(tokens["b"]):
        if not toks:
            for v in parts.values():
                v.append(float("nan"))
            continue
        base = logits("b", i, toks)
        vision = forced_logits(vlm, prompts["c"], QUESTIONS[i], toks, fused=False)
        kernels = forced_logits(vlm, prompts["b"], QUESTIONS[i], toks, fused=True)
        # on CUDA the memory-efficient backend alone: with MATH allowed a 16k prompt's fallback took a 6.6 GiB
        # score matrix and ran out of memory on the H100 (session 14); where it cannot run, the row says nan. The CPU
        # has no such backend: MATH there (the tiny model's test)
        backends = [SDPBackend.EFFICIENT_ATTENTION] + ([SDPBackend.MATH] if vlm.device.type == "cpu" else [])
        try:
            with library_efficient_attention(backends):
                spread = forced_logits(vlm, prompts["b"], QUESTIONS[i], toks, fused=False)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            print(f"library_spread_d: question {i}: the memory-efficient SDPA backend did not run "
                  f"({type(e).__name__}: {str(e).splitlines()[0][:120]})", flush=True)
            spread = None
            torch.cuda.empty_cache()
        for name, other in (("bc_vision_d", vision), ("bc_kernels_d", kernels), ("library_spread_d", spread)):
            parts[name].append(float("nan") if other is None else float((other - base).abs().max()))
    return {k: ";".join(f"{x:.3g}" for x in v) for k, v in parts.items()}


def run_methods(vlm: BudgetedVideoLlama3, frames, times, budget: int, new_tokens: int, chunk: int,
                vision_attn: str = "frame_batched", logit_tol: float = LOGIT_TOL, paths: str = "abcd"):
    """Seconds of (a), (b), (c), (d) for one video at one budget (those in ``paths``; the others ``nan`` and their
    token checks ``-``), the stage times of (d)'s work and the prefix length."""
    res = {m: float("nan") for m in "abcd"}
    tokens, prompts = {}, {}
    methods = tuple(m for m in ("a", "b", "c", "d") if m in paths and (m != "d" or torch.cuda.is_available()))
    for method in methods:
        # (a) and (b) use transformers' stock per-frame SDPA loop in the encoder; (c)/(d) the frame-batched call
        vlm.set_vision_attention("sdpa" if method in ("a", "b") else vision_attn)
        vlm.set_fused_kernels(method not in ("a", "b"))       # the baselines run the library's forwards

        def go(method=method):
            cache = EncodeCache(vlm, frames, chunk)
            (bi,) = prepare_budgets(vlm, frames, times, [budget], cache=cache, chunk_frames=chunk)
            if method == "a":
                return bi, [vlm.answer_from_scratch(bi.prompt, q, new_tokens, ignore_eos=True) for q in QUESTIONS]
            if method == "b":
                return bi, vlm.answer_all(bi.prompt, QUESTIONS, new_tokens, ignore_eos=True)
            return bi, vlm.answer_batched(bi.prompt, QUESTIONS, new_tokens, ignore_eos=True,
                                          decode="dynamic" if method == "c" else "graph")

        (bi, answers), sec = timed(go)
        res[method] = sec
        tokens[method] = [a.token_ids for a in answers]
        prompts[method] = bi.prompt
    # separate stage timings of ours
    cache = EncodeCache(vlm, frames, chunk)
    (bi,), prep = timed(lambda: prepare_budgets(vlm, frames, times, [budget], cache=cache, chunk_frames=chunk))
    _, pre = timed(lambda: vlm.prefill(bi.prompt))
    res.update(encode=cache.encode_seconds, plan_build=prep - cache.encode_seconds, prefill=pre,
               **step_fields(vlm, bi, QUESTIONS), **token_checks(vlm, prompts, tokens, logit_tol))
    return res


TIMED_KEYS = ("a", "b", "c", "d", "encode", "plan_build", "prefill")


def median_of_timed(runs: list[dict]) -> dict:
    """One (video, budget) row from repeated ``run_methods`` results: the first run is warm-up when there are more
    (dropped), and each timed key is the median of the rest (one slow repeat of a baseline does not set a ratio);
    the other fields are the last run's. ``repeats`` records how many runs were timed."""
    timed_runs = runs[1:] if len(runs) > 1 else runs
    row = dict(timed_runs[-1])
    for key in TIMED_KEYS:
        row[key] = float(np.median([t[key] for t in timed_runs]))
    row["repeats"] = len(timed_runs)
    return row


def wait_share(vlm, videos: list[str], budgets: list[int], workers: int, chunk: int, load: bool = True,
               decode_threads: int | None = None) -> dict:
    """Run the real predict_step loop over DataLoader workers; share of time the GPU waits for data.

    The order is the real run's (``BudgetedQA.on_predict_start``): the DataLoader workers start, then the model
    loads while they decode the first videos. The bench's model lives in memory (random weights), so its load here
    is the part every real load has, the weights' host-to-device copy (``load_state_dict`` from a CPU copy made
    before the clock starts; ``load=False``: none). A load from disk takes longer and hides more of the fill.
    ``wait_share`` is the data wait over the wall time after the load.
    """
    from datamodules.benchmarks import Question
    from datamodules.decode import auto_decode_threads
    from datamodules.videoqa import VideoQADataset, VideoTask
    from lightning_modules.budgeted_qa import BudgetedQA, job_name

    module = BudgetedQA(model_path="<in-memory>", budgets=budgets, encode_chunk_frames=chunk, max_new_tokens=16)
    module.vlm = vlm
    module.to(vlm.device)    # as Lightning places it: frames preprocessed on the GPU, the decode step a CUDA graph
    jobs = [job_name(b) for b in budgets]
    tasks = []
    for i, v in enumerate(videos):
        qs = [Question(qid=f"{i}-{j}", video_id=str(i), video_path=v, question=q.split("\n")[0],
                       options=["A bird.", "A car.", "A house.", "A tree."], answer="A", meta={}) for j, q in
              enumerate(QUESTIONS)]
        tasks.append(VideoTask(str(i), v, "bench", qs, {q.qid: jobs for q in qs}))
    threads = decode_threads or auto_decode_threads(workers)    # as the datamodule
    ds = VideoQADataset(tasks, max(budgets), decode_threads=threads)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, prefetch_factor=2 if workers else None)
    host = {k: v.to("cpu", copy=True) for k, v in vlm.model.state_dict().items()} if load else None
    wait = 0.0
    first_wait = None
    t0 = time.perf_counter()
    batches = iter(dl)                       # workers start decoding
    if host is not None:
        vlm.model.load_state_dict(host)      # the model loads meanwhile
        sync()
        del host
    load_s = time.perf_counter() - t0
    mark = time.perf_counter()
    n = 0
    unix0 = time.time() - (time.perf_counter() - t0)
    timeline = []                            # per video: (waited s, worker decode s, ready at s, taken at s)
    for item in batches:
        w = time.perf_counter() - mark
        if first_wait is None:
            first_wait = w  # pipeline fill left after the load: the first video is not decoded yet
        wait += w
        timeline.append((round(w, 3), round(item.get("decode_s", float("nan")), 3),
                         round(item.get("decoded_unix", float("nan")) - unix0, 3), round(time.perf_counter() - t0, 3)))
        if item.get("error"):
            raise RuntimeError(item["error"])
        module.predict_step(item)
        sync()
        n += 1
        mark = time.perf_counter()
    wall = time.perf_counter() - t0 - load_s
    steady = wait - (first_wait or 0.0)
    return {"videos": n, "wall_s": wall, "load_s": load_s, "wait_s": wait, "wait_share": wait / wall,
            "first_wait_s": first_wait, "steady_wait_share": steady / max(wall - (first_wait or 0.0), 1e-9),
            "timeline": timeline, "workers": workers, "decode_threads": threads}


def memory_probe(vlm, video: str, budget: int, new_tokens: int, chunk: int) -> list[tuple[str, float, float]]:
    """Peak GPU memory (GiB above the weights) and seconds of each stage for one video and budget."""
    dec = decode_video(video, budget)
    frames = dec.frames.to(vlm.device)
    base = torch.cuda.memory_allocated()
    out = []

    def stage(name, fn):
        torch.cuda.reset_peak_memory_stats()
        res, sec = timed(fn)
        out.append((name, (torch.cuda.max_memory_allocated() - base) / 2**30, sec))
        return res

    for attn in ("sdpa", "frame_batched"):
        vlm.set_vision_attention(attn)
        stage(f"encode ({attn})", lambda: vlm.encode(frames, 256 if budget > 4096 else 64, chunk))
    cache = EncodeCache(vlm, frames, chunk)
    (bi,) = stage("prepare_budgets", lambda: prepare_budgets(vlm, frames, dec.times_s, [budget], cache=cache,
                                                             chunk_frames=chunk))
    stage("prefill", lambda: vlm.prefill(bi.prompt))
    stage("(a) 1 question", lambda: vlm.answer_from_scratch(bi.prompt, QUESTIONS[0], new_tokens, ignore_eos=True))
    stage("(b) 3 questions", lambda: vlm.answer_all(bi.prompt, QUESTIONS, new_tokens, ignore_eos=True))
    stage("(d) 3 questions", lambda: vlm.answer_batched(bi.prompt, QUESTIONS, new_tokens, True, decode="graph"))
    return out


def prefill_probe(vlm, video: str, budget: int, chunk: int, only: str | None = None) -> list[tuple[str, str]]:
    """Peak memory / seconds of the prefix prefill called in different ways (diagnosis of the prefill peak)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import DynamicCache

    dec = decode_video(video, budget)
    (bi,) = prepare_budgets(vlm, dec.frames.to(vlm.device), dec.times_s, [budget], chunk_frames=chunk)
    emb = vlm.embed(bi.prompt.ids, bi.prompt.vision_embeds)
    n = emb.shape[1]

    def cache():
        return DynamicCache(config=vlm.model.config.get_text_config())

    def with_backends(backends, fn):
        def run():
            with sdpa_kernel(backends):
                return fn()
        return run

    def shipped():
        return vlm.prefill(bi.prompt)

    def ones_mask():
        return vlm.model(inputs_embeds=emb, attention_mask=torch.ones(1, n, device=emb.device, dtype=torch.long),
                         past_key_values=cache(), use_cache=True)

    variants = {
        "shipped": shipped,
        "ones_mask": ones_mask,
        "flash_only": with_backends([SDPBackend.FLASH_ATTENTION], shipped),
        "efficient_only": with_backends([SDPBackend.EFFICIENT_ATTENTION], shipped),
        "ones_mask_efficient_only": with_backends([SDPBackend.EFFICIENT_ATTENTION], ones_mask),
    }
    if only:
        variants = {only: variants[only]}
    out = []
    base = torch.cuda.memory_allocated()
    for name, fn in variants.items():
        torch.cuda.reset_peak_memory_stats()
        try:
            res, sec = timed(fn)
            del res
            out.append((name, f"peak +{(torch.cuda.max_memory_allocated() - base) / 2**30:6.2f} GiB {sec:6.3f} s"))
        except Exception as e:  # noqa: BLE001 - a diagnosis prints what failed
            out.append((name, f"failed: {type(e).__name__}: {str(e)[:120]}"))
        torch.cuda.empty_cache()
    out.append(("prefix tokens", str(n)))
    return out


def prefix_attention_probe(vlm, prefix_len: int, rows: int) -> None:
    """One decode step's shared-prefix attention per layer (``models.videollama3.shared_prefix._prefix_part``'s call: the
    rows x query-group heads folded into one query sequence per key/value head, over the whole prefix) with each
    kernel that returns the log-sum-exp, timed over 200 calls (GPU)."""
    cfg = vlm.model.config.text_config
    kv, g = cfg.num_key_value_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q = torch.randn(1, kv, rows * g, d, device=vlm.device, dtype=vlm.dtype)
    k, v = (torch.randn(1, kv, prefix_len, d, device=vlm.device, dtype=vlm.dtype) for _ in range(2))
    calls = {"flash": lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False),
             "mem-efficient": lambda: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True),
             "cuDNN": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True)}
    for label, fn in calls.items():
        try:
            fn()
            _, sec = timed(lambda: [fn() for _ in range(200)])
            print(f"{'prefix attention, ' + label:<32} {sec / 200 * 1e6:7.1f} us per layer and step "
                  f"(queries {rows * g} x {kv} heads, keys {prefix_len})")
        except (RuntimeError, TypeError) as e:
            print(f"{'prefix attention, ' + label:<32} not available ({str(e).splitlines()[0][:80]})")


def encode_probe(vlm, video: str, budget: int, chunk: int) -> None:
    """Where the encode and prefill time goes for one video at one budget: processor vs vision tower vs the rest
    of ``prepare_budgets``, then torch.profiler tables (top ops by self CUDA and self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    from algorithms.budget import CELL_PIXELS, MIN_TOKENS_PER_FRAME
    from models.videollama3.budgets import _budget_geometry

    dec = decode_video(video, budget)
    frames = dec.frames.to(vlm.device)
    idx, cap, grid, *_ = _budget_geometry(frames.shape[1], frames.shape[2], budget, frames.shape[0], 256,
                                          "phase3", 256)
    clip = frames[idx]
    t = clip.shape[0]

    def proc():
        return vlm.video_processor(
            videos=[clip.permute(0, 3, 1, 2)], do_sample_frames=False, use_token_compression=False,
            size={"shortest_edge": min(MIN_TOKENS_PER_FRAME, cap) * CELL_PIXELS ** 2,
                  "longest_edge": cap * CELL_PIXELS ** 2 * t}, return_tensors="pt")

    inputs = proc()
    pv = inputs["pixel_values_videos"].to(vlm.device, vlm.dtype)
    thw, ms = inputs["video_grid_thw"].to(vlm.device), inputs["video_merge_sizes"].to(vlm.device)

    def tower():
        return vlm.model.model.vision_model(pixel_values=pv, grid_thw=thw, merge_sizes=ms)

    for name, fn in [("processor (GPU frames)", proc), ("vision tower", tower),
                     ("encode (all)", lambda: vlm.encode(clip, cap, chunk)),
                     ("prepare_budgets", lambda: prepare_budgets(vlm, frames, dec.times_s, [budget],
                                                                 chunk_frames=chunk))]:
        fn()
        secs = [timed(fn)[1] for _ in range(3)]
        print(f"{name:<26} {min(secs):7.3f} s  (frames {t}, grid {grid}, pixel rows {pv.shape[0]})")
    (bi,) = prepare_budgets(vlm, frames, dec.times_s, [budget], chunk_frames=chunk)
    print(f"{'prefill':<26} {min(timed(lambda: vlm.prefill(bi.prompt))[1] for _ in range(3)):7.3f} s  "
          f"(prefix {bi.prompt.ids.numel()})")
    if torch.cuda.is_available():   # one SDPA backend at a time (the lines above: SDPA's own choice)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for stage, fn in (("vision tower", tower), ("prefill", lambda: vlm.prefill(bi.prompt))):
            for label, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                                   ("mem-efficient", SDPBackend.EFFICIENT_ATTENTION),
                                   ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel([backend]):
                        fn()
                        secs = [timed(fn)[1] for _ in range(3)]
                    print(f"{stage + ', ' + label:<26} {min(secs):7.3f} s")
                except RuntimeError as e:
                    print(f"{stage + ', ' + label:<26} not available ({str(e).splitlines()[0][:80]})")
    runs = (("dynamic", 16), ("static", 16), ("graph", 16), ("graph", 2), ("graph", 1))
    for mode, new in runs if torch.cuda.is_available() else runs[:2]:
        t_ans = min(timed(lambda: vlm.answer_batched(bi.prompt, QUESTIONS, new, True, decode=mode))[1]
                    for _ in range(3))
        print(f"{'prefill+answer ' + mode + ' ' + str(new):<26} {t_ans:7.3f} s")
    # where the host waits for the device (each sync serialises the CPU-side work after it)
    import warnings
    if not torch.cuda.is_available():
        return
    prefix_attention_probe(vlm, bi.prompt.ids.numel(), len(QUESTIONS))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for label, fn in [("prepare_budgets", lambda: prepare_budgets(vlm, frames, dec.times_s, [budget],
                                                                       chunk_frames=chunk)),
                          ("answer_batched graph", lambda: vlm.answer_batched(bi.prompt, QUESTIONS, 16, True,
                                                                              decode="graph"))]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn()
            sites = {}
            for w in caught:
                if "synchroniz" in str(w.message):
                    key = f"{Path(w.filename).name}:{w.lineno}"
                    sites[key] = sites.get(key, 0) + 1
            print(f"syncs in {label}: {sum(sites.values())} at " + ", ".join(f"{k} x{v}" for k, v in sites.items()))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for label, fn in [("prepare_budgets", lambda: prepare_budgets(vlm, frames, dec.times_s, [budget],
                                                                   chunk_frames=chunk)),
                      ("prefill", lambda: vlm.prefill(bi.prompt)),
                      ("answer_batched graph", lambda: vlm.answer_batched(bi.prompt, QUESTIONS, 16, True,
                                                                          decode="graph"))]:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        print(f"\n==== {label}: by self CUDA time")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))
        print(f"==== {label}: by self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=60))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny random model on the CPU (smoke test)")
    ap.add_argument("--videos", nargs="*", default=None)
    ap.add_argument("--budgets", nargs="*", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--workers", type=int, default=None, help="DataLoader workers (default 6; --tiny: up to 2)")
    ap.add_argument("--decode-threads", type=int, default=None,
                    help="decoder threads per worker in the wait-share loop (default: the datamodule's rule)")
    ap.add_argument("--also-workers", type=int, nargs="*", default=[],
                    help="--wait-only: also measure with these worker counts (one model build)")
    ap.add_argument("--wait-repeat", type=int, default=4, help="the wait-share loop runs the videos this many times")
    ap.add_argument("--chunk-frames", type=int, default=256)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--vision-attn", default="frame_batched", help="frame_batched | sdpa | flash_attention_2 ...")
    ap.add_argument("--repeats", type=int, default=2, help="runs per (video, budget): the first is warm-up, each time is the median of the others")
    ap.add_argument("--json", default=None)
    ap.add_argument("--paths", default="abcd",
                    help="which of (a) (b) (c) (d) to run (e.g. bcd: without the slowest, the harness; the others "
                         "print nan, their token checks -)")
    ap.add_argument("--kernels", choices=("triton", "inductor", "eager"), default="triton",
                    help="how (c) and (d) run the fused kernels (models.kernels.set_mode; the CLI's model.kernels)")
    ap.add_argument("--logit-tol", type=float, default=LOGIT_TOL,
                    help="token check (same a=b/b=c/c=d): the paths' teacher-forced logits must agree within this "
                         "many logit units, and their tokens are compared only where the top-2 margin exceeds it")
    ap.add_argument("--hbm-tbps", type=float, default=None,
                    help="memory bandwidth of the floor's bytes / bandwidth term, TB/s (default: measured, a 2 GiB "
                         "device copy; 4.8 on the CPU)")
    ap.add_argument("--floor-attention", choices=("causal", "full"), default="causal",
                    help="the floor counts the LLM's prefix / suffix attention as the causal triangle (what flash "
                         "computes; default) or the full square (as floor_prefill counts the prefix)")
    ap.add_argument("--no-cudnn-sdp", action="store_true", help="disable the cuDNN SDPA backend (flash instead)")
    ap.add_argument("--probe-memory", action="store_true", help="only print per-stage peak memory (GPU)")
    ap.add_argument("--probe-prefill", action="store_true", help="only diagnose the prefill's peak memory (GPU)")
    ap.add_argument("--probe-variant", default=None)
    ap.add_argument("--probe-encode", action="store_true", help="only profile encode / prefill / answer (GPU)")
    ap.add_argument("--wait-only", action="store_true", help="only measure the data-wait share of the predict loop")
    args = ap.parse_args(argv)
    if not args.paths or not set(args.paths) <= set("abcd"):
        ap.error(f"--paths {args.paths!r}: give some of the letters a, b, c, d")
    if args.workers is None:
        import os
        args.workers = min(2, os.cpu_count() or 1) if args.tiny else 6
    repo = Path(__file__).resolve().parent.parent
    videos = args.videos or [str(repo / "assets/media/cockatoo.mp4")]
    budgets = args.budgets or ([256, 1024] if args.tiny else [4096, 16384])
    torch.manual_seed(0)
    from models.kernels import set_mode

    set_mode(args.kernels)
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    vlm = build_tiny_model() if args.tiny else build_bench_model(args.attn, args.vision_attn)
    if args.probe_prefill:
        for name, text in prefill_probe(vlm, videos[0], max(budgets), args.chunk_frames,
                                                   args.probe_variant):
            print(f"{name:<28} {text}")
        return
    if args.probe_encode:
        encode_probe(vlm, videos[0], max(budgets), args.chunk_frames)
        return
    if args.wait_only:
        # warm-up (compile, graph capture), as the full bench's table does before its wait-share loop
        wait_share(vlm, videos[:1], budgets, 0, args.chunk_frames, load=False)
        runs = []
        for workers in [args.workers, *args.also_workers]:
            ws = wait_share(vlm, videos * args.wait_repeat, budgets, workers, args.chunk_frames,
                            decode_threads=args.decode_threads)
            runs.append(ws)
            print(f"workers {workers} x {ws['decode_threads']} decoder threads: wait share "
                  f"{100 * ws['wait_share']:.1f}% ({ws['wait_s']:.2f} of {ws['wall_s']:.2f} s after a "
                  f"{ws['load_s']:.2f} s load)\n  waited  decode_s  ready_at  taken_at")
            for row in ws["timeline"]:
                print("  " + "".join(f"{x:>9.3f}" for x in row))
        if args.json:
            Path(args.json).write_text(json.dumps({"wait": runs}, indent=1))
        return
    if args.probe_memory:
        print(f"weights {torch.cuda.memory_allocated() / 2**30:.1f} GiB")
        for name, gib, sec in memory_probe(vlm, videos[0], max(budgets), args.new_tokens, args.chunk_frames):
            print(f"{name:<26} peak +{gib:7.2f} GiB  {sec:7.3f} s")
        return
    ceiling = gemm_tflops()
    if args.hbm_tbps is None:
        args.hbm_tbps = hbm_tbps()
    vcfg = vlm.model.config.vision_config
    shape = get_shape("qwen2-7b")
    weight_bytes = sum(p.numel() * p.element_size() for p in vlm.model.model.language_model.parameters())
    rows = []
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    for v in videos:
        dec = decode_video(v, max(budgets))
        frames = dec.frames.to(vlm.device)
        for b in budgets:
            runs = [run_methods(vlm, frames, dec.times_s, b, args.new_tokens, args.chunk_frames, args.vision_attn,
                                args.logit_tol, args.paths) for _ in range(max(args.repeats, 1))]
            r = median_of_timed(runs)
            # the floor printed before (vision tower + prefix prefill at the GEMM rate, one weight read per answer
            # token, 7B shapes), kept as floor_prefill for comparison with earlier results
            floor_prefill_s = (vision_flops(r["frames"], r["hw"], vcfg) + prefill_flops(shape, r["prefix_len"], 1)) / (
                ceiling * 1e12) + args.new_tokens * weight_bytes / 4.8e12
            rows.append({"video": Path(v).name, "duration_s": dec.info["duration_s"], "budget": b, **r,
                         **floor_fields(vlm, r, args.new_tokens, ceiling, args.hbm_tbps * 1e12,
                                        args.floor_attention == "causal"),
                         "floor_prefill_s": floor_prefill_s})
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    ws = wait_share(vlm, videos * args.wait_repeat, budgets, args.workers, args.chunk_frames,
                    decode_threads=args.decode_threads)
    hdr = (f"{'video':<16}{'budget':>7}{'frames':>7}{'prefix':>8}{'mode':>9}{'(a) s':>8}{'(b) s':>8}{'(c) s':>8}"
           f"{'(d) s':>8}{'a/d':>6}{'b/d':>6}{'enc':>7}{'prefill':>8}{'floor':>7}{'d/fl':>6}{'fl_pre':>7}"
           f"{'d/fl_pre':>9}  same a=b/b=c/c=d (logits within {args.logit_tol:g}, tokens where the margin exceeds it)")
    print(f"\nGEMM ceiling {ceiling:.0f} TFLOP/s; peak GPU memory {peak:.1f} GiB; wait share "
          f"{100 * ws['wait_share']:.1f}% ({ws['wait_s']:.2f} of {ws['wall_s']:.2f} s after a {ws['load_s']:.2f} s "
          f"weight load, {ws['videos']} videos, {args.workers} workers x {ws['decode_threads']} decoder threads; first video {ws['first_wait_s']:.2f} s, "
          f"after it {100 * ws['steady_wait_share']:.1f}%)")
    print(f"times: median of {rows[0]['repeats'] if rows else 0} timed run(s) per row after a warm-up run"
          if args.repeats > 1 else "times: one run per row, no warm-up")
    print(hdr)
    for r in rows:
        print(f"{r['video'][:15]:<16}{r['budget']:>7}{r['frames']:>7}{r['prefix_len']:>8}{r['mode']:>9}{r['a']:>8.3f}"
              f"{r['b']:>8.3f}{r['c']:>8.3f}{r['d']:>8.3f}{r['a'] / r['d']:>6.2f}{r['b'] / r['d']:>6.2f}"
              f"{r['encode']:>7.3f}{r['prefill']:>8.3f}{r['floor_s']:>7.3f}{r['d'] / r['floor_s']:>6.2f}"
              f"{r['floor_prefill_s']:>7.3f}{r['d'] / r['floor_prefill_s']:>9.2f}  {r['same_tokens_ab']}/"
              f"{r['same_tokens_bc']}/{r['same_tokens_cd']}")
    for r in rows:   # the details where token ids differ or logits are not within the tolerance
        for pair in ("ab", "bc", "cd"):
            if r[f"exact_tokens_{pair}"] is False or r[f"same_tokens_{pair}"] is False:
                print(f"  {r['video'][:15]} B={r['budget']} {pair[0]}={pair[1]}: {r[f'token_check_{pair}']} "
                      "(per question: verdict, ~first differing position (m=top-2 margin), d=max |logit diff|)")
        if r.get("bc_vision_d", "-") != "-":
            print(f"  {r['video'][:15]} B={r['budget']} b vs c, max |logit diff| per question: encoder rows "
                  f"{r['bc_vision_d']}, fused kernels {r['bc_kernels_d']}; the library's own spread (SDPA backend) "
                  f"{r['library_spread_d']}")
    print(f"\nfloor of (d), part by part: max(FLOPs / {ceiling:.4g} TFLOP/s, bytes / {args.hbm_tbps:.3g} TB/s), seconds "
          f"(LLM attention {args.floor_attention}; suffix: {len(QUESTIONS)} questions; decode: new tokens - 1 steps, "
          f"the questions' rows together)")
    print(f"{'video':<16}{'budget':>7}" + "".join(f"{name:>10}" for name in PART_NAMES) + f"{'floor':>10}"
          f"{'floor_prefill':>15}")
    for r in rows:
        print(f"{r['video'][:15]:<16}{r['budget']:>7}" + "".join(f"{r[f'floor_{n}_s']:>10.4f}" for n in PART_NAMES)
              + f"{r['floor_s']:>10.4f}{r['floor_prefill_s']:>15.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "wait": ws, "peak_gib": peak, "gemm_tflops": ceiling,
                                               "hbm_tbps": args.hbm_tbps, "floor_attention": args.floor_attention,
                                               "kernels": args.kernels},
                                              indent=2, default=str))


if __name__ == "__main__":
    main()
