"""Compile the fused kernels of a VideoLLaMA3 checkpoint while its weights load (the first video's warm-up).

The fused kernels (:mod:`models.kernels`, :mod:`models.vision_attention`) are ``torch.compile`` graphs built at
their first call, which is the first video's predict step. Their shapes depend only on the checkpoint's config
(hidden sizes, heads, head dims, norm epsilons, dtype), with the token/frame counts dynamic, so they can be compiled
from the config alone, on stand-in tensors, while ``from_pretrained`` reads the weights and the DataLoader workers
decode the first videos. :func:`start` begins it; the caller joins the returned thread before its first forward,
so the first step only waits for what is not done yet (nothing is ever computed twice: a graph compiled here is the
one the model calls, the same guards).

Why in parallel processes: on the H200 the 5 graphs (:data:`KERNELS`) take about 3 s of Inductor work each, and
compilation in one process is serial (the GIL, Dynamo's global state), so one background thread needed 15-19 s
while the 7B weights load in 10.1 s, and the first video's predict step took 11.7 s (target: 10 s or less). So
:func:`start` (CUDA only) also launches one short-lived subprocess per kernel (``python -m models.videollama3.warm``,
:func:`main`), which compiles that kernel alone with the same config values, device, dtype, grad modes and the
global torch settings that enter PyTorch's cache keys (:func:`torch_state`). They fill PyTorch's on-disk compile
caches (Inductor's FX graph cache, the AOTAutograd cache, Triton's kernel cache: on by default, in the directories
the inherited environment names, e.g. ``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_<user>``). The
thread compiles the kernels in :data:`IN_THREAD` itself meanwhile, then each other kernel in this process as soon
as its subprocess has ended, which should now mostly be cache reads (:func:`cache_counters` says how many were).

* ``add+LayerNorm`` runs with ``fx_graph_cache`` off (a torch 2.11 bug with multi-kernel graphs read back from the
  FX cache, :data:`models.kernels.add_layer_norm`), so a subprocess could only fill the Triton cache for it; the
  thread compiles it itself at once (:data:`IN_THREAD`) instead of waiting idle for the subprocesses to start.
* A subprocess that fails or runs past :data:`SUBPROCESS_TIMEOUT_S` (then killed) is only logged (a warning with
  the tail of its output); its kernel is compiled in this process as before, just without the cache entries.
* The subprocesses run with ``TORCHINDUCTOR_COMPILE_THREADS=1`` unless the environment sets it (each compiles one
  small graph: no pool of compile workers per process; the setting is not part of Inductor's cache key).
* Environment switch: ``TOKENBUDGET_PARALLEL_COMPILE=0`` turns the subprocesses off (the thread then compiles all
  kernels itself, in series, as before); so does ``start(..., parallel=False)``.
* Cache hits are not guaranteed: the keys (torch 2.14) hash the traced graph, the example inputs' sizes, strides,
  dtypes and devices, the Inductor / functorch configs, grad mode and autocast state, deterministic-algorithm and
  CUDA matmul precision settings, the default dtype, torch / Triton / CUDA versions and the GPU. The first three
  come from the same code and config here; the global settings are copied (:func:`torch_state`, taken when
  :func:`start` is called). A difference (e.g. ``transformers`` sets the default dtype while it builds the model,
  so a lookup in that window misses) means a compile from scratch, still correct.

Timings (INFO, logger ``models.videollama3.warm``): each subprocess's wall time from launch to exit, the thread's
time compiling in this process, and the cache counters of that pass; also kept on the thread (``timings``).

Legend: N rows (dynamic), D LLM hidden size, I LLM intermediate size, H / H_kv query / key-value heads, d head dim,
C vision hidden size, h vision heads, e vision head dim.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator, Sequence

import torch

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]   # on the subprocesses' PYTHONPATH, so ``models`` imports
ENV_PARALLEL = "TOKENBUDGET_PARALLEL_COMPILE"     # "0": no subprocesses (see the module docstring)
SUBPROCESS_TIMEOUT_S = 120.0                      # wall seconds from launch; then the subprocess is killed
# The fused kernels, by their Fusable names (what compile_fused_kernels takes and returns), in call order.
KERNELS = ("RMSNorm", "SiLU*up", "rotary (rows)", "add+LayerNorm", "vision rotary")
IN_THREAD = frozenset({"add+LayerNorm"})          # compiled by the thread itself (no FX graph cache for it)
_TAIL_CHARS = 2000                                # of a failed subprocess's output, in the warning


def compile_fused_kernels(config, device: torch.device | str, dtype: torch.dtype, inference: bool = False,
                          inference_weights: bool | None = None, kernels: Sequence[str] | None = None) -> list[str]:
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
            kernel's call is independent of the others', so one can be compiled alone (as :func:`main` does in
            :func:`start`'s subprocesses) and give the same graph.

    Returns:
        The names of the kernels called (the shared-prefix merge of the decode step is left to its first call: its
        shapes come from the questions).

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

    device = torch.device(device)
    text, vision = config.get_text_config(), config.vision_config
    d_model, inter = text.hidden_size, text.intermediate_size
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or d_model // heads
    c, v_heads = vision.hidden_size, vision.num_attention_heads
    v_dim = c // v_heads
    rows, frames, patches = 19, 3, 40   # > 1: sizes 0 and 1 would be specialized

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
    }
    with torch.inference_mode() if inference else torch.no_grad():
        for name in selected:
            calls[name]()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return selected


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


def torch_state() -> dict:
    """The process-wide torch settings that enter the compile caches' keys (besides the graph and the Inductor
    config), as JSON values: the default dtype, the deterministic-algorithm settings and the CUDA matmul precision
    settings. :func:`start` takes them in the calling thread and the subprocesses apply them
    (:func:`apply_torch_state`), so their cache entries are the ones this process looks up."""
    m = torch.backends.cuda.matmul
    state = {"default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
             "deterministic": torch.are_deterministic_algorithms_enabled(),
             "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
             "fill_uninitialized_memory": bool(torch.utils.deterministic.fill_uninitialized_memory),
             "float32_matmul_precision": torch.get_float32_matmul_precision()}
    for name in ("fp32_precision", "allow_fp16_reduced_precision_reduction",
                 "allow_bf16_reduced_precision_reduction"):
        value = getattr(m, name, None)
        if isinstance(value, (bool, str)):
            state[f"matmul.{name}"] = value
    return state


def apply_torch_state(state: dict) -> None:
    """Set the settings :func:`torch_state` took (keys it did not take are left alone)."""
    if "default_dtype" in state:
        torch.set_default_dtype(_dtype(state["default_dtype"]))
    if "deterministic" in state:
        torch.use_deterministic_algorithms(bool(state["deterministic"]),
                                           warn_only=bool(state.get("deterministic_warn_only", False)))
    if "fill_uninitialized_memory" in state:
        torch.utils.deterministic.fill_uninitialized_memory = bool(state["fill_uninitialized_memory"])
    if "float32_matmul_precision" in state:
        torch.set_float32_matmul_precision(state["float32_matmul_precision"])
    for key, value in state.items():   # after the precision above: the backend's own value is what the key hashes
        if key.startswith("matmul."):
            setattr(torch.backends.cuda.matmul, key.removeprefix("matmul."), value)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


@dataclass
class Subprocess:
    """One kernel's compilation in a subprocess (:func:`launch`). ``seconds``: wall time from launch to its exit
    (or to its kill, ``timed_out``); ``returncode``: its exit status (``None`` until it ended); ``tail``: the end of
    its output (stdout and stderr), read when it ended."""
    kernel: str
    proc: subprocess.Popen
    output: IO[bytes]
    started: float
    seconds: float | None = None
    returncode: int | None = None
    timed_out: bool = False
    tail: str = ""
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def command(model_path: str | Path, device: torch.device | str, dtype: torch.dtype, inference: bool,
            inference_weights: bool | None, kernel: str, state: dict | None = None) -> list[str]:
    """The command line of :func:`main` compiling ``kernel`` (``sys.executable -m models.videollama3.warm ...``)."""
    inference_weights = inference if inference_weights is None else inference_weights
    cmd = [sys.executable, "-m", "models.videollama3.warm", str(model_path),
           "--device", str(device), "--dtype", str(dtype).removeprefix("torch."), "--kernel", kernel,
           "--inference" if inference else "--no-inference",
           "--inference-weights" if inference_weights else "--no-inference-weights"]
    if state is not None:
        cmd += ["--torch-state", json.dumps(state)]
    return cmd


def launch(model_path: str | Path, device: torch.device | str, dtype: torch.dtype, inference: bool,
           kernels: Sequence[str], inference_weights: bool | None = None, state: dict | None = None,
           timeout_s: float = SUBPROCESS_TIMEOUT_S) -> list[Subprocess]:
    """Start one subprocess per kernel in ``kernels`` (:func:`main`, same working directory and environment, with
    the repository root on ``PYTHONPATH`` and ``TORCHINDUCTOR_COMPILE_THREADS=1`` unless set), each watched by a
    daemon thread that reaps it, kills it after ``timeout_s`` wall seconds, logs how it ended and sets its
    ``ended`` event (:func:`in_order_of_ending` yields them as they end). A subprocess that cannot be started
    (``OSError``) is logged and left out."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    children = []
    for kernel in kernels:
        output = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(command(model_path, device, dtype, inference, inference_weights, kernel, state),
                                    stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env)
        except OSError as e:
            output.close()
            log.warning("cannot start the subprocess compiling %s (%s); it compiles in this process", kernel, e)
            continue
        child = Subprocess(kernel, proc, output, time.perf_counter())
        threading.Thread(target=_watch, args=(child, timeout_s), name=f"fused-kernel-compile {kernel}",
                         daemon=True).start()
        children.append(child)
    return children


def _watch(child: Subprocess, timeout_s: float) -> None:
    """Wait for ``child`` (killing it at ``timeout_s``), record how it ended, log it, set ``ended``."""
    try:
        try:
            child.returncode = child.proc.wait(timeout=max(0.0, timeout_s - (time.perf_counter() - child.started)))
        except subprocess.TimeoutExpired:
            child.timed_out = True
            child.proc.kill()
            child.returncode = child.proc.wait()
        child.seconds = time.perf_counter() - child.started
        try:
            child.output.seek(0, os.SEEK_END)
            child.output.seek(max(0, child.output.tell() - 4 * _TAIL_CHARS))
            child.tail = child.output.read().decode(errors="replace")[-_TAIL_CHARS:].strip()
        finally:
            child.output.close()
        if child.timed_out:
            log.warning("the subprocess compiling %s ran past %.0f s and was killed; it compiles in this process "
                        "(output: %s)", child.kernel, timeout_s, child.tail or "none")
        elif child.returncode:
            log.warning("the subprocess compiling %s exited with %d after %.1f s; it compiles in this process "
                        "(output: %s)", child.kernel, child.returncode, child.seconds, child.tail or "none")
        else:
            last = child.tail.splitlines()[-1] if child.tail else ""
            log.info("subprocess compiled %s in %.1f s wall (launch to exit; %s)", child.kernel, child.seconds, last)
    except Exception as e:  # noqa: BLE001 - a watcher never raises; the kernel compiles in this process anyway
        log.warning("watching the subprocess compiling %s failed (%s)", child.kernel, e)
    finally:
        child.ended.set()


def in_order_of_ending(children: Sequence[Subprocess], poll_s: float = 0.02) -> Iterator[Subprocess]:
    """``children`` as each one ends (exit, failure or kill), first ended first."""
    pending = list(children)
    while pending:
        ended = [c for c in pending if c.ended.is_set()]
        if not ended:
            pending[0].ended.wait(poll_s)
            continue
        for c in ended:
            pending.remove(c)
            yield c


def compile_in_parallel(config, model_path: str | Path, device: torch.device | str, dtype: torch.dtype,
                        inference: bool, parallel: bool = True, state: dict | None = None,
                        timeout_s: float = SUBPROCESS_TIMEOUT_S, timings: dict | None = None) -> list[str]:
    """What :func:`start`'s thread runs: with ``parallel``, :func:`launch` a subprocess per kernel not in
    :data:`IN_THREAD`, compile the :data:`IN_THREAD` ones here meanwhile, then each other kernel here as soon as
    its subprocess has ended (successful or not: at worst it compiles from scratch, as without subprocesses);
    without, :func:`compile_fused_kernels` of all kernels here. Logs the timings (INFO) and fills ``timings``
    (seconds): ``total``, ``in_process`` (compiling here), ``subprocesses`` (kernel -> launch to exit, ``None``
    if not ended), ``cache`` (:func:`cache_counters` changed by the compilation here).

    Returns:
        The names of the kernels compiled here (all of :data:`KERNELS`).

    Raises:
        what :func:`compile_fused_kernels` raises (the subprocesses keep running to their end or timeout; they are
        reaped by their watcher threads).
    """
    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    children = launch(model_path, device, dtype, inference, [k for k in KERNELS if k not in IN_THREAD],
                      state=state, timeout_s=timeout_s) if parallel else []
    timings["subprocesses"] = {c.kernel: None for c in children}
    before = cache_counters()
    in_process = 0.0

    def here(kernels: list[str]) -> list[str]:
        nonlocal in_process
        t = time.perf_counter()
        done = compile_fused_kernels(config, device, dtype, inference, kernels=kernels)
        in_process += time.perf_counter() - t
        return done

    done = list(here([k for k in KERNELS if k not in {c.kernel for c in children}]))
    for child in in_order_of_ending(children):
        timings["subprocesses"][child.kernel] = child.seconds
        done += here([child.kernel])
    timings.update(total=time.perf_counter() - t0, in_process=in_process,
                   cache=_counter_delta(before, cache_counters()))
    if children:
        ended = [s for s in timings["subprocesses"].values() if s is not None]
        log.info("fused kernels compiled in %.1f s: %d subprocesses (%d ok, the last ended after %.1f s), "
                 "%.1f s compiling in this process; cache counters of that: %s", timings["total"], len(children),
                 sum(c.ok for c in children), max(ended, default=0.0), in_process, timings["cache"])
    else:
        log.info("fused kernels compiled in this process in %.1f s (no subprocesses); cache counters: %s",
                 in_process, timings["cache"])
    return done


def parallel_enabled(parallel: bool = True) -> bool:
    """``parallel`` unless the environment variable ``TOKENBUDGET_PARALLEL_COMPILE`` is ``0``."""
    return parallel and os.environ.get(ENV_PARALLEL, "1").strip() != "0"


def start(model_path: str | Path, device: torch.device | str, dtype: torch.dtype,
          inference: bool | None = None, parallel: bool = True) -> threading.Thread | None:
    """Start compiling the fused kernels for the checkpoint at ``model_path`` in a daemon thread
    (:func:`compile_in_parallel`; ``None`` when there is nothing to compile: not CUDA, or a config transformers'
    ``VideoLlama3Config`` cannot read, such as the original VideoLLaMA3 layout).

    Args:
        model_path: the checkpoint directory (its ``config.json``).
        device: the model's device (CUDA, else nothing is done).
        dtype: the model's dtype.
        inference: the grad mode the model will be called in (default: the calling thread's,
            ``torch.is_inference_mode_enabled()``; the thread's own mode is not inherited).
        parallel: also compile in subprocesses (see the module docstring; off when the environment variable
            ``TOKENBUDGET_PARALLEL_COMPILE`` is ``0``).

    Returns:
        The started thread (join it before the model's first forward; its ``timings`` dict is filled when it
        ends, see :func:`compile_in_parallel`), or ``None``. A failure in the thread is logged; the kernels then
        compile at their first call as usual (or fall back to eager, :class:`models.kernels.Fusable`).
    """
    if torch.device(device).type != "cuda":
        return None
    if inference is None:
        inference = torch.is_inference_mode_enabled()
    try:
        from transformers import VideoLlama3Config

        config = VideoLlama3Config.from_pretrained(str(model_path))
    except Exception as e:  # noqa: BLE001 - an unreadable config only means no early compilation
        log.info("no early kernel compilation for %s (%s)", model_path, e)
        return None
    parallel = parallel_enabled(parallel)
    state = torch_state()   # here, before the caller builds its model (transformers changes the default dtype)
    timings: dict = {}

    def run() -> None:
        try:
            compile_in_parallel(config, model_path, device, dtype, inference, parallel, state, timings=timings)
        except Exception as e:  # noqa: BLE001 - the kernels compile at their first call instead
            log.warning("early compilation of the fused kernels failed (%s); they compile at their first call", e)

    thread = threading.Thread(target=run, name="fused-kernel-compile", daemon=True)
    thread.timings = timings
    thread.start()
    return thread


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m models.videollama3.warm MODEL_PATH --device cuda:0 --dtype bfloat16 --kernel NAME
    [--inference] [--inference-weights] [--torch-state JSON]``: compile the named kernels (``--kernel`` repeated;
    default all) for the checkpoint's config as :func:`compile_fused_kernels` does, then exit; what
    :func:`start`'s subprocesses run to fill the compile caches. Prints one line: the kernels, the compile
    seconds (after the imports) and :func:`cache_counters`.

    Returns:
        The exit status: 0, or 1 when a selected kernel's compilation failed (the kernel fell back to eager,
        :class:`models.kernels.Fusable`); argument errors exit 2, other errors raise.
    """
    parser = argparse.ArgumentParser(prog="python -m models.videollama3.warm", description=main.__doc__)
    parser.add_argument("model_path", help="checkpoint directory (its config.json)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kernel", action="append", dest="kernels", choices=KERNELS)
    parser.add_argument("--inference", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--inference-weights", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--torch-state", type=json.loads, default=None, help="JSON of torch_state()")
    args = parser.parse_args(argv)
    try:
        dtype = _dtype(args.dtype)
    except ValueError as e:
        parser.error(str(e))
    if args.torch_state:
        apply_torch_state(args.torch_state)
    from transformers import VideoLlama3Config

    from .. import kernels, vision_attention

    config = VideoLlama3Config.from_pretrained(args.model_path)
    t0 = time.perf_counter()
    names = compile_fused_kernels(config, args.device, dtype, args.inference, args.inference_weights, args.kernels)
    seconds = time.perf_counter() - t0
    fusables = {f.name: f for f in (kernels.rms_norm, kernels.silu_mul, kernels.rope_rows, kernels.add_layer_norm,
                                    vision_attention.fused_rotary_qk)}
    failed = [n for n in names if fusables[n].state == "failed"]
    print(f"compiled {', '.join(names)} in {seconds:.1f} s{'; FAILED: ' + ', '.join(failed) if failed else ''}; "
          f"cache counters {cache_counters()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
