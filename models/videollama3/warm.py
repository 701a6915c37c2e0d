"""Compile the fused kernels of a VideoLLaMA3 checkpoint while its weights load (the first video's warm-up).

With ``kernels: triton`` (the default since session 11, :func:`models.kernels.set_mode`) the same calls make Triton
compile its hand-written kernels (or read them from its cache) and run the merge's eager math once; on the H100 the
thread took 4.9-6.0 s beside the weight load, the process's CUDA initialisation included, and ended before the load
did. What follows describes ``kernels: inductor``.

The fused kernels (:mod:`models.kernels`, :mod:`models.vision_attention`) are ``torch.compile`` graphs built at
their first call, which is the first video's predict step. Their shapes depend only on the checkpoint's config
(hidden sizes, heads, head dims, norm epsilons, dtype), with the token/frame counts dynamic, so they can be compiled
from the config alone, on stand-in tensors, while ``from_pretrained`` reads the weights and the DataLoader workers
decode the first videos. :func:`start` begins it; the caller joins the returned thread before its first forward,
so the first step only waits for what is not done yet (nothing is ever computed twice: a graph compiled here is the
one the model calls, the same guards).

Measured on the H200 (``bench/cli_throughput.py``, cold compile caches, 2026-12-02): the thread compiles the 5
graphs of :data:`KERNELS` in 20.6 s while the 7B weights load in 11.9 s and 8 DataLoader workers decode; the first
step then waited 8.7 s for it and compiled the decode step's shared-prefix merge itself (since 2026-12-03 the
merge is compiled here too). Compiling each kernel in a
subprocess that fills PyTorch's on-disk caches first was tried (the in-process pass then hit the FX graph and
AOTAutograd caches for all 4 cacheable graphs) and did not shorten the warm-up: 16.8 s against 16.5 s for the
first video, the subprocesses taking 19-22 s each on a machine busy with the load and the decoding; it was removed.

Timings (INFO, logger ``models.videollama3.warm``): seconds compiling and the compile-cache counters of that pass
(:func:`cache_counters`); also kept on the thread (``timings``), which ``BudgetedQA`` writes to the run's
``timing_rank<r>.json`` (``warmup``).

Legend: N rows (dynamic), D LLM hidden size, I LLM intermediate size, H / H_kv query / key-value heads, d head dim,
C vision hidden size, h vision heads, e vision head dim.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .weight_files import QBASE_DIR

log = logging.getLogger(__name__)

# The fused kernels, by their Fusable names (what compile_fused_kernels takes and returns), in call order.
KERNELS = ("RMSNorm", "SiLU*up", "rotary (rows)", "add+LayerNorm", "vision rotary", "shared-prefix suffix+merge")

# stand-in question rows of the decode step's merge: > 1 (a size-1 row count is its own graph, PyTorch specializes
# sizes 0 and 1); every count above 1 shares the graph (the rows are marked dynamic). Video-MME asks 3 per video.
MERGE_ROWS = 3


DTYPE_WAIT_S = 30.0   # the most one kernel's call waits for the process's default dtype to come back


def await_default_dtype(expected: torch.dtype | None, timeout_s: float = DTYPE_WAIT_S, poll_s: float = 0.005) -> bool:
    """Wait until ``torch.get_default_dtype()`` is ``expected`` (``None``: do not wait).

    Why: the default dtype is process-wide and TorchDynamo guards every graph on it (a graph traced while it is
    bfloat16 is traced again when the step calls it under float32); ``from_pretrained`` sets it to the model's dtype
    while it builds the model, in the weight-load thread that runs beside the early compilation. A graph traced in
    that window was compiled again in the first step (2 to 6 graphs on the H200, as the two threads' timing fell).

    Returns:
        ``True`` when the default dtype is ``expected`` (at once or after waiting), ``False`` after ``timeout_s``
        (the caller goes on; such a graph is compiled again at its first call, as before).
    """
    if expected is None:
        return True
    end = time.monotonic() + timeout_s
    while torch.get_default_dtype() != expected:
        if time.monotonic() >= end:
            return False
        time.sleep(poll_s)
    return True


def model_sizes(config) -> dict[str, int]:
    """The fixed sizes the stand-ins are made of, from a ``VideoLlama3Config`` (legend above): ``D``, ``I``, ``H``,
    ``H_kv``, ``d`` of the LLM; ``C``, ``h``, ``e`` (head dim), ``patch`` and ``channels`` of the vision tower."""
    text, vision = config.get_text_config(), config.vision_config
    heads = text.num_attention_heads
    return {"D": text.hidden_size, "I": text.intermediate_size, "H": heads, "H_kv": text.num_key_value_heads,
            "d": getattr(text, "head_dim", None) or text.hidden_size // heads, "C": vision.hidden_size,
            "h": vision.num_attention_heads, "e": vision.hidden_size // vision.num_attention_heads,
            # only the first-call warm-up's conv2d needs these (a config of the compiled kernels' sizes may lack them)
            "patch": getattr(vision, "patch_size", None), "channels": getattr(vision, "num_channels", None)}


def compile_fused_kernels(config, device: torch.device | str, dtype: torch.dtype, inference: bool = False,
                          inference_weights: bool | None = None, kernels: Sequence[str] | None = None,
                          default_dtype: torch.dtype | None = None) -> list[str]:
    """Call the fused kernels the VideoLLaMA3 model will call, on stand-in tensors of the model's fixed sizes
    (rows dynamic, as the kernels mark them), so each graph is compiled now (on a device the kernels compile for;
    elsewhere they run eagerly, and this is a few small eager calls).

    Args:
        config: a ``VideoLlama3Config`` (its ``text_config`` and ``vision_config`` give the fixed sizes).
        device: the model's device.
        dtype: the model's dtype.
        inference: run under ``torch.inference_mode`` (as Lightning's predict loop runs the model: inference
            tensors are guarded apart from plain ones, so the graphs must be made in the mode they will be called
            in), else under ``torch.no_grad``.
        inference_weights: the model's weights are inference tensors (loaded, or moved to the device, inside
            ``torch.inference_mode``, as ``BudgetedQA.on_predict_start`` does in Lightning's predict loop);
            default: ``inference``.
        kernels: names from :data:`KERNELS` to call (in the order given, each once); default: all of them. Each
            kernel's call is independent of the others', so one can be compiled alone and give the same graph.
        default_dtype: the process's default dtype the model's steps will run under: each kernel is called only
            once ``torch.get_default_dtype()`` is that again (:func:`await_default_dtype`; ``None``: no wait).

    Returns:
        The names of the kernels called. The decode step's shared-prefix merge
        (:data:`models.videollama3.shared_prefix._suffix_and_merge`) is called with :data:`MERGE_ROWS` question rows,
        one query token and a suffix region of 19 keys: its rows and suffix length are dynamic, so the decode step
        of any video with 2 or more questions calls this graph; one question compiles its own at the first call.

    Raises:
        ValueError: a name in ``kernels`` that is not in :data:`KERNELS` (named in the message; nothing is called).
    """
    selected = list(KERNELS) if kernels is None else list(dict.fromkeys(kernels))
    unknown = [k for k in selected if k not in KERNELS]
    if unknown:
        raise ValueError(f"unknown fused kernel(s) {unknown}; known: {list(KERNELS)}")
    if not selected:
        return []
    from ..kernels import add_layer_norm, rms_norm, rope_rows, silu_mul
    from ..vision_attention import fused_rotary_qk
    from . import shared_prefix

    device = torch.device(device)
    text, vision = config.get_text_config(), config.vision_config
    z = model_sizes(config)
    d_model, inter, heads, kv_heads, head_dim = z["D"], z["I"], z["H"], z["H_kv"], z["d"]
    c, v_heads, v_dim = z["C"], z["h"], z["e"]
    rows, frames, patches = 19, 3, 40   # > 1: sizes 0 and 1 would be specialized
    q_rows, keys = MERGE_ROWS, 19

    def randn(*shape, dt=dtype):      # dtypes always explicit: the default dtype is process-wide (transformers
        return torch.randn(*shape, device=device, dtype=dt)   # sets it while it builds a model in another thread)

    # the weights as the model holds them (parameters; inference tensors when loaded in inference mode), the
    # activations in the mode the model runs in (inference tensors carry another dispatch key set, which is guarded)
    with torch.inference_mode(inference if inference_weights is None else inference_weights):
        weight = torch.nn.Parameter(torch.ones(d_model, device=device, dtype=dtype), requires_grad=False)
        ln_w, ln_b = (torch.nn.Parameter(torch.ones(c, device=device, dtype=dtype), requires_grad=False)
                      for _ in range(2))
    calls = {
        "RMSNorm": lambda: rms_norm(randn(rows, d_model), weight, float(text.rms_norm_eps)),
        "SiLU*up": lambda: silu_mul(randn(rows, inter), randn(rows, inter)),
        "rotary (rows)": lambda: rope_rows(randn(rows, heads, head_dim), randn(rows, kv_heads, head_dim),
                                           randn(rows, head_dim), randn(rows, head_dim)),
        "add+LayerNorm": lambda: add_layer_norm(randn(rows, c), randn(rows, c), ln_w, ln_b,
                                                float(vision.layer_norm_eps)),
        # cos, sin in float32, as the vision attention passes them
        "vision rotary": lambda: fused_rotary_qk(randn(frames, patches, v_heads, v_dim),
                                                 randn(frames, patches, v_heads, v_dim),
                                                 randn(patches, 1, v_dim, dt=torch.float32),
                                                 randn(patches, 1, v_dim, dt=torch.float32)),
        # the decode step: query (Q, H, 1, d), the suffix region's keys / values (Q, Hkv, S, d), its additive mask
        # (Q, 1, 1, S), the prefix part over the folded queries (1, Hkv, Q G, d) and its log-sum-exp in float32,
        # each in the layout the decode step hands it over (guards check strides)
        "shared-prefix suffix+merge": lambda: shared_prefix._suffix_and_merge(*shared_prefix.decode_step_stand_ins(
            q_rows, heads, kv_heads, head_dim, keys, 23, dtype, device)),
    }
    with torch.inference_mode() if inference else torch.no_grad():
        for name in selected:
            if not await_default_dtype(default_dtype):
                log.info("default dtype still %s, not %s, after %.0f s: %s compiled under it", torch.get_default_dtype(),
                         default_dtype, DTYPE_WAIT_S, name)
            calls[name]()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return selected


def warm_first_calls(config, device: torch.device | str, dtype: torch.dtype) -> dict[str, tuple]:
    """Pay the process's one-time set-up of the GPU libraries the first predict step calls, on small stand-in tensors
    of the model's sizes, in a thread of its own beside the early compilation: cuDNN (the vision tower's patch
    embedding is a ``conv2d``), cuBLAS (the first GEMM) and the flash attention kernels at the LLM's and the vision
    tower's head dims, which SDPA picks for the model's calls with cuDNN's attention left out
    (:func:`models.vision_attention.sdpa_without_cudnn`); called directly (``aten._scaled_dot_product_flash_attention``)
    because SDPA's backend switches are process-wide and the other threads run meanwhile; plain SDPA off CUDA. These
    calls run in C++ with the GIL released, so the compilation's Python goes on meanwhile.

    Why: in the first step after the early compilation (``bench/qa_step_profile.py``, H100, 2026-12-06) the vision
    tower's first ``conv2d`` took 0.33 s of host time (cuDNN's set-up) where a second step's whole encode took 0.13 s.
    Nothing made here is kept and the model's numerics are unchanged; the handles and loaded kernels are the
    process's, reused by the steps.

    Returns:
        The stand-ins' shapes by call (``conv2d``: input, weight; ``linear``: input, weight; ``sdpa_llm`` /
        ``sdpa_vision``: the query's ``(batch, heads, tokens, head dim)``), for a test to hold against the model.
    """
    import torch.nn.functional as F

    device = torch.device(device)
    z = model_sizes(config)
    c, patch, ch = z["C"], z["patch"], z["channels"]
    shapes = {"conv2d": ((2, ch, patch, patch), (c, ch, patch, patch)), "linear": ((16, z["D"]), (z["I"], z["D"])),
              "sdpa_llm": ((1, z["H"], 16, z["d"]),), "sdpa_vision": ((1, z["h"], 16, z["e"]),)}

    def randn(shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    with torch.inference_mode():
        x, w = (randn(s) for s in shapes["conv2d"])
        F.conv2d(x, w, torch.zeros(c, device=device, dtype=dtype), stride=patch)
        F.linear(*(randn(s) for s in shapes["linear"]))
        for name, causal in (("sdpa_llm", True), ("sdpa_vision", False)):
            q = randn(shapes[name][0])
            if device.type == "cuda":
                torch.ops.aten._scaled_dot_product_flash_attention(q, randn(q.shape), randn(q.shape), 0.0, causal)
            else:
                F.scaled_dot_product_attention(q, randn(q.shape), randn(q.shape), is_causal=causal)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return shapes


def warm_compressor(qbase_dir: str | Path, device: torch.device | str, dtype: torch.dtype,
                    windows: Sequence[tuple[int, int, int]] = ((4, 16, 16), (2, 16, 16))) -> tuple[int, ...]:
    """Pay the first calls of the qbase compressor's kernels (its SDPA at its own head dim, the masked
    cross-attention, LayerNorm, tanh GELU, the rotary's float32 math) on a stand-in compressor of the checkpoint's
    ``qbase/config.json`` with random weights, in the first-call warm-up's thread: in the first predict step the plan
    stage, which runs the compressor, took 0.32-0.41 s against 0.06-0.07 s in later steps (H100, session 12).
    Nothing made here is kept; the model's numerics are unchanged.

    ``windows``: ``(frames, h, w)`` per stand-in window (two of different lengths, so the padded, masked key layout
    is exercised). Returns the stand-in's output shape ``(B * K, C)``.

    Raises:
        FileNotFoundError / ValueError: as :meth:`TransformerDecoderFlatCompressor.from_pretrained` for the config.
    """
    import json

    from .qbase import TokenCompressorConfig, TransformerDecoderFlatCompressor

    cfg_path = Path(qbase_dir) / TransformerDecoderFlatCompressor.CONFIG_NAME
    config = TokenCompressorConfig.from_dict(json.loads(cfg_path.read_text()), str(cfg_path))
    device = torch.device(device)
    with torch.inference_mode():
        with device:
            stand_in = TransformerDecoderFlatCompressor(config)
        stand_in = stand_in.to(dtype)
        rows = [t * h * w for t, h, w in windows]
        cu = [0]
        for n in rows:
            cu.append(cu[-1] + n)
        kv = torch.randn(cu[-1], config.hidden_size, device=device, dtype=dtype)
        out = stand_in(kv, cu, [(h, w) for _, h, w in windows])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return tuple(out.shape)


def caller_num_threads() -> int:
    """``torch.get_num_threads()`` of the calling thread, fixed now.

    Why: TorchDynamo guards every graph on the intra-op thread count of the thread that calls it (its global-state
    guard), and that count is per thread, set at the thread's first use from the process's last
    ``torch.set_num_threads``. The DataLoader's pin-memory thread calls ``torch.set_num_threads(1)``, so a main thread
    whose first use came after it ran its steps with 1 thread while the early compilation's thread, started before
    the loader, had the machine's count: every graph of the early compilation was compiled again in the first step
    (``GLOBAL_STATE changed: num_threads``, 6 graphs on the H200, 2026-12-04). Calling this in the thread that will
    run the steps fixes that thread's count; the compilation thread then sets the same count for itself.

    Returns:
        The calling thread's intra-op thread count (``>= 1``).
    """
    return torch.get_num_threads()


def cache_counters() -> dict[str, int]:
    """This process's compile-cache counters so far (cumulative; a bench prints them, or the difference over a
    pass): ``torch._dynamo.utils.counters`` entries whose name has ``cache`` in it, of the groups ``inductor``
    (``fxgraph_cache_hit`` / ``_miss`` / ``_bypass``...), ``aot_autograd`` (``autograd_cache_hit`` / ``_miss`` /
    ``_bypass`` / ``_saved``...) and ``dynamo_cache``, keyed ``"<group>.<name>"``. Triton's own cache keeps no
    counters."""
    from torch._dynamo.utils import counters

    return {f"{group}.{name}": int(n) for group in ("inductor", "aot_autograd", "dynamo_cache")
            for name, n in counters[group].items() if "cache" in name}


def _counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


def start(model_path: str | Path, device: torch.device | str, dtype: torch.dtype,
          inference: bool | None = None, inference_weights: bool | None = None,
          first_calls: bool = True) -> threading.Thread | None:
    """Start :func:`compile_fused_kernels` for the checkpoint at ``model_path`` in a daemon thread (``None`` when
    there is nothing to compile: not CUDA, or a config transformers' ``VideoLlama3Config`` cannot read, such as the
    original VideoLLaMA3 layout).

    Args:
        model_path: the checkpoint directory (its ``config.json``).
        device: the model's device (CUDA, else nothing is done).
        dtype: the model's dtype.
        inference: the grad mode the model will be called in (default: the calling thread's,
            ``torch.is_inference_mode_enabled()``; the thread's own mode is not inherited).
        inference_weights: whether the model's weights will be inference tensors (see
            :func:`compile_fused_kernels`; default: ``inference``). Weights read in another thread (the background
            load) are plain tensors whatever the predict loop's mode: inference mode is per thread.
        first_calls: also run :func:`warm_first_calls`, then :func:`warm_compressor` (when the checkpoint has a
            ``qbase/``), in a second thread started now; the compilation thread joins it before it ends, so joining
            the returned thread joins both.

    Returns:
        The started thread (join it before the model's first forward; its ``timings`` dict gets ``seconds`` and
        ``cache``, the :func:`cache_counters` that changed, ``first_calls_s`` (the second thread's seconds, or the
        error it logged) and ``end_perf_counter``, its ``time.perf_counter()`` at the end, when it ends), or
        ``None``. A failure in the thread is
        logged; the kernels then compile at their first call as usual (or fall back to eager,
        :class:`models.kernels.Fusable`).
    """
    if torch.device(device).type != "cuda":
        return None
    if inference is None:
        inference = torch.is_inference_mode_enabled()
    default_dtype = torch.get_default_dtype()   # now, before the weight load (started after this) changes it
    threads = caller_num_threads()
    try:
        from transformers import VideoLlama3Config

        config = VideoLlama3Config.from_pretrained(str(model_path))
    except Exception as e:  # noqa: BLE001 - an unreadable config only means no early compilation
        log.info("no early kernel compilation for %s (%s)", model_path, e)
        return None
    timings: dict = {}
    first = None
    if first_calls:
        def run_first_calls() -> None:
            t0 = time.perf_counter()
            try:
                warm_first_calls(config, device, dtype)
                qbase = Path(model_path) / QBASE_DIR
                if qbase.is_dir():
                    warm_compressor(qbase, device, dtype)
                timings["first_calls_s"] = round(time.perf_counter() - t0, 3)
            except Exception as e:  # noqa: BLE001 - the first step pays the set-up itself, as before
                log.info("first-call warm-up failed (%s); the first step sets the libraries up", e)
                timings["first_calls_s"] = f"failed: {e}"

        first = threading.Thread(name="first-calls", daemon=True)
        first.run = _track(first, run_first_calls)
        first.start()

    def run() -> None:
        torch.set_num_threads(threads)          # the caller's, which every graph is guarded on (see caller_num_threads)
        before, t0 = cache_counters(), time.perf_counter()
        try:
            compile_fused_kernels(config, device, dtype, inference, inference_weights, default_dtype=default_dtype)
        except Exception as e:  # noqa: BLE001 - the kernels compile at their first call instead
            log.warning("early compilation of the fused kernels failed (%s); they compile at their first call", e)
        if first is not None:
            first.join()
        timings.update(seconds=round(time.perf_counter() - t0, 3), cache=_counter_delta(before, cache_counters()),
                       num_threads=threads, end_perf_counter=time.perf_counter())
        log.info("fused kernels compiled in %.1f s; cache counters %s", timings["seconds"], timings["cache"])

    thread = threading.Thread(name="fused-kernel-compile", daemon=True)
    thread.run = _track(thread, run)
    thread.timings = timings
    thread.start()
    return thread


# the background threads started here (the weight load, the early compilation) while they run: a fork from the main
# thread waits for them (_wait_before_fork)
_RUNNING: set[threading.Thread] = set()
FORK_WAIT_S = 600.0   # the longest a fork waits for them (then it forks anyway, with a warning)


def _wait_before_fork() -> None:
    """``os.register_at_fork(before=...)``: a fork made by the main thread (the DataLoader's forked workers, on a
    machine without CUDA) waits until this module's background threads have ended.

    Why: a forked child gets a copy of every lock as it was at the fork, and only the forking thread. The weight load
    and the compilation take torch's default-generator lock (random initialisation, random stand-in inputs); a worker
    forked while one of them held it blocked for ever in its first ``torch.manual_seed`` (``_worker_loop``), and the
    run hung (seen in the test suite: ``THPGenerator_manualSeed`` -> ``pthread_mutex_lock`` in the worker). Workers
    started by the fork server (every run on CUDA) are forked from that clean process and do not wait. A fork from
    another thread (a compiler's own subprocesses) does not wait either."""
    if threading.current_thread() is not threading.main_thread():
        return
    t0, interrupt = time.perf_counter(), None
    for thread in list(_RUNNING):
        while not thread.done.is_set() and time.perf_counter() - t0 < FORK_WAIT_S:
            try:
                thread.done.wait(max(0.0, FORK_WAIT_S - (time.perf_counter() - t0)))
            except KeyboardInterrupt as e:     # Ctrl-C / SIGTERM now: the fork still must not copy held locks
                interrupt = e
    late = sorted(t.name for t in _RUNNING if not t.done.is_set())
    if late:
        log.warning("forking while the background %s still runs (waited %.0f s): a worker may inherit its locks",
                    ", ".join(late), FORK_WAIT_S)
    if interrupt is not None:
        # an at-fork hook's exception is only reported ("Exception ignored in ..."); the fork context of the decode
        # workers (datamodules.fork_context) raises it again after the fork, so the run stops as on any Ctrl-C
        raise interrupt


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_wait_before_fork)


def _track(thread: threading.Thread, run: Callable[[], None]) -> Callable[[], None]:
    """``run`` with ``thread`` in :data:`_RUNNING` until it ends, and ``thread.done`` (a ``threading.Event``) set
    then: wait on that (:func:`wait_for`), not on ``thread.join()``, in the main thread. A ``join`` that Ctrl-C
    interrupts marks a still running thread as ended in Python 3.11 (``Thread._wait_for_tstate_lock`` releases the
    thread's own lock when it finds it held), after which ``join`` returns at once: a run interrupted while the
    decode workers' fork waited for the weight load later read the load's result before it existed and ended in a
    ``KeyError`` instead of the "interrupted" line (found by a new-user trial, session 12)."""
    thread.done = threading.Event()

    def tracked() -> None:
        try:
            run()
        finally:
            _RUNNING.discard(thread)
            thread.done.set()
    _RUNNING.add(thread)
    return tracked


def wait_for(thread: threading.Thread) -> None:
    """Wait until ``thread`` (started by this module) has ended its work; safe to interrupt (see :func:`_track`)."""
    done = getattr(thread, "done", None)
    if done is None:
        thread.join()
    else:
        done.wait()


def in_background(fn: Callable[[], Any], name: str) -> threading.Thread:
    """Run ``fn()`` in a daemon thread started now (issue 41: the weight load, begun at the trainer's set-up so it
    overlaps the DataLoader's start and the rest of the set-up instead of following them).

    Returns:
        The thread, with ``outcome()``: join, then return ``fn``'s result or raise its exception (in the caller's
        thread); and ``timings``: ``start_perf_counter`` / ``end_perf_counter`` (``time.perf_counter()``).

    Note: ``from_pretrained`` sets torch's process-wide default dtype to the model's while it builds the model; a
    float tensor made meanwhile by the caller's thread without an explicit dtype gets that dtype (the set-up that
    runs concurrently makes none in this project: uint8 frames, explicit dtypes).
    """
    box: dict = {}
    timings = {"start_perf_counter": time.perf_counter()}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by outcome() in the caller's thread
            box["error"] = e
        timings["end_perf_counter"] = time.perf_counter()

    def outcome():
        wait_for(thread)
        if "error" in box:
            raise box["error"]
        return box["result"]

    thread = threading.Thread(name=name, daemon=True)
    thread.run = _track(thread, run)
    thread.timings, thread.outcome = timings, outcome
    thread.start()
    return thread
