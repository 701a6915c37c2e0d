"""Fused elementwise kernels for the transformers models we run (CUDA only; the library's math, fewer passes).

Eager transformers code runs each elementwise step of RMSNorm, rotary and the gated MLP as its own kernel: an
RMSNorm is ~7 passes over the hidden states (cast, square, mean, rsqrt, two multiplies, cast back), the rotary
~10 passes over q and k. In a prefill of 16k rows these are memory-bound passes; in a decode step of a few rows
they are ~1,700 tiny kernels per step, which bound the step's time. Here each of them is ONE kernel, run one of
three ways (:func:`set_mode`, process-wide; ``BudgetedQA(kernels=...)``):

* ``triton`` (default): a hand-written Triton kernel (:mod:`models.triton_kernels`) that rounds where the library's
  eager code rounds, with nothing to compile but Triton's own kernel (no TorchDynamo, no Inductor: on the H100 the
  first answer came 4-13 s sooner, ``docs/performance.md`` session 11); a function without one runs its eager math
  (the shared-prefix merge and the 4-D rotary: in a CUDA-graph decode step their small kernels are replayed).
* ``inductor``: ``torch.compile`` (Inductor, dynamic shapes, full graph) of a function holding exactly the library's
  math (the default before 2026-12-06; Inductor keeps the intermediates in float32, so half-precision results
  round differently from eager);
* ``eager``: the library's math.

* :class:`Fusable` — a function run as its Triton kernel or compiled on CUDA tensors, eagerly elsewhere. On the
  CPU the eager function IS the library's math, so results are bit-identical there (tested). If the Triton kernel
  or the compilation fails at the first call (no Triton, an unsupported GPU) the eager function is used for the
  rest of the process, with one warning.
* The kernels: :data:`rms_norm`, :data:`rope` / :data:`rope_rows` (:func:`fused_rope`), :data:`silu_mul`,
  :data:`add_layer_norm` and :func:`gelu_tanh_linear` (one cuBLASLt GEMM with its GELU epilogue). They are bound on
  a model's modules by :func:`models.fused_forwards.fuse`.

Whole-layer ``torch.compile`` of the VideoLLaMA3 vision encoder was measured and did not pay (see
:mod:`models.vision_attention`); these are the pieces that are launch- or memory-bound.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

RECOMPILE_LIMIT = 32     # graphs per fused function (torch._dynamo's recompile_limit is raised to at least this)


# raised (fullgraph) when a function needs more graphs than the recompile limit; older PyTorch: none
_RECOMPILE_LIMIT_HIT = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", torch._dynamo.exc.BackendCompilerFailed)


class Fusable:
    """``fn`` compiled (``torch.compile(fullgraph=True)``) when its first argument is a tensor on one of ``devices``
    (CUDA), eager otherwise or after a failed compilation (the first one, or a later one for a new shape: the
    backend's ``BackendCompilerFailed`` or the recompile limit; errors of a compiled graph that ran before are
    raised).

    Shapes: ``dynamic`` gives, per tensor argument, its dimensions that vary between calls (rows, frames, sequence,
    batch): a tuple of dimension indices, or an int ``k`` for "all but the last ``k``". They are marked dynamic
    from the first call, so a new length or batch size does not recompile, while the sizes the model fixes (hidden
    size, heads, head dim) stay constants in the kernel (a symbolic head dim of 72 turns every index into run-time
    integer division: measured 5x slower on the H200). Compiled with ``dynamic=False``: a function that meets a
    second fixed size (the Omni thinker's vision tower D = 1280 and LLM D = 2048 share :data:`rms_norm`) gets a
    second graph, instead of PyTorch's automatic dynamic turning the fixed size symbolic for every later call.
    PyTorch specializes sizes 0 and 1, so a first call with a size-1 dimension (a one-token decode step) compiles
    once more. Inside an outer ``torch.compile`` (``compile_small_calls``) the eager math is inlined into that graph.
    ``options`` go to the backend (Inductor config keys; only passed when given).
    """

    # while this thread (the early compilation, models/videollama3/warm.py) is alive, calls from other threads run
    # the eager math instead of waiting for it (BudgetedQA(first_step="eager"), issue 41); None: off
    eager_while: "threading.Thread | None" = None

    # how every Fusable runs on its devices (process-wide; set_mode): "triton" (default) the hand-written Triton
    # kernel where the function has one (models/triton_kernels.py), the eager math where it has none; "inductor"
    # torch.compile as described above; "eager" the library's math everywhere
    mode: str = "triton"

    def __init__(self, fn: Callable, name: str, dynamic: tuple = (), devices: tuple[str, ...] = ("cuda",),
                 backend: str = "inductor", options: dict | None = None, triton: Callable | None = None):
        self.fn, self.name, self.dynamic, self.devices, self.backend = fn, name, dynamic, devices, backend
        self.options = options                 # backend options (Inductor config keys), e.g. emulate_precision_casts
        self.triton = triton                   # the same math as a triton.jit kernel (mode "triton"), or None
        self._compiled: Callable | None = None
        self.state = "new"                     # new | ok (compiled and ran once) | failed (eager for good)
        self.triton_state = "new"              # new | ok (ran once) | failed (eager for good)
        self.retried = False                   # one more try after a failure of the environment (OSError)
        self.__doc__ = fn.__doc__

    def _mark(self, args) -> None:
        for a, dims in zip(args, self.dynamic):
            if isinstance(a, torch.Tensor):
                dims = range(a.dim() - dims) if isinstance(dims, int) else [d % a.dim() for d in dims]
                for d in dims:
                    torch._dynamo.maybe_mark_dynamic(a, d)

    def __call__(self, *args):
        if Fusable.mode != "inductor":
            if (Fusable.mode == "eager" or self.triton is None or self.triton_state == "failed"
                    or args[0].device.type not in self.devices or torch.compiler.is_compiling()):
                return self.fn(*args)
            return self._run_triton(args)
        held = Fusable.eager_while
        if (self.state == "failed" or args[0].device.type not in self.devices or torch.compiler.is_compiling()
                or (held is not None and held is not threading.current_thread() and held.is_alive())):
            return self.fn(*args)
        if self._compiled is None:
            # one graph per fixed size and size-1 pattern (prefill / suffix / one-token step, one or several rows,
            # vision and LLM widths): more than PyTorch's default of 8 per function in a process running both towers
            cfg = torch._dynamo.config
            name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # older PyTorch
            setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
            kw = {"options": self.options} if self.options else {}
            try:   # (an option key another PyTorch version does not know is refused here)
                self._compiled = torch.compile(self.fn, fullgraph=True, dynamic=False, backend=self.backend, **kw)
            except Exception as e:  # noqa: BLE001 - the eager math is the same
                return self._eager("refused", e, args)
        self._mark(args)
        if self.state == "ok":                 # compiled and ran once: later errors are real errors, except that
            try:                               # building a graph for a new shape can fail like the first one did
                return self._compiled(*args)
            except (torch._dynamo.exc.BackendCompilerFailed, _RECOMPILE_LIMIT_HIT) as e:
                return self._eager("failed on a new shape", e, args)
        try:
            out = self._compiled(*args)
        except Exception as e:  # noqa: BLE001 - first call: compilation failed, the eager math is the same
            return self._eager("failed", e, args)
        self.state = "ok"
        return out

    def _run_triton(self, args: tuple):
        """The Triton kernel; arguments it does not take (it returns ``NotImplemented``,
        :class:`models.triton_kernels.Unsupported`) run the eager math, and so does every later call after a call
        failed: at the first call for any reason (no Triton, a GPU it does not compile for), later only when Triton
        could not build the kernel for new arguments (its compilation error or too few GPU resources for a new width);
        one warning names the function. Other errors of a kernel that ran before are raised."""
        try:
            out = self.triton(*args)
        except Exception as e:  # noqa: BLE001 - the eager math is the same
            if self.triton_state == "ok" and not _triton_build_error(e):
                raise
            log.warning("the Triton kernel of %s failed (%s); using the eager function", self.name, e)
            self.triton_state = "failed"
            return self.fn(*args)
        if out is NotImplemented:
            return self.fn(*args)
        self.triton_state = "ok"
        return out

    def _eager(self, what: str, error: Exception, args: tuple):
        """Give up compiling for good (warning once, naming the function) and run the eager math; except that a
        first failure caused by the process's environment (an ``OSError`` anywhere in the exception's chain: a file
        or program the compiler's toolchain did not find) is retried once, at the next call, in whichever thread
        makes it. Seen on the H200 once: every kernel of the early compilation, run in its thread at the trainer's
        set-up, failed with ``FileNotFoundError: '12'``, which left the whole run on the eager math."""
        if what == "failed" and not self.retried and _caused_by(error, OSError):
            log.warning("torch.compile of %s failed (%s); compiling again at the next call", self.name, error,
                        exc_info=error)
            self.retried, self._compiled, self.state = True, None, "new"
            return self.fn(*args)
        log.warning("torch.compile of %s %s (%s); using the eager function", self.name, what, error)
        self.state = "failed"
        return self.fn(*args)


KERNEL_MODES = ("triton", "inductor", "eager")


def set_mode(mode: str) -> str:
    """Set how every :class:`Fusable` runs on CUDA, process-wide, and return the previous mode.

    ``triton`` (default): the hand-written Triton kernels (:mod:`models.triton_kernels`: no ``torch.compile``, the
    library's roundings), the eager math for a function that has none; ``inductor``: ``torch.compile`` of the
    library's math (the fused kernels before 2026-12-06; Inductor keeps intermediates in float32, so its results
    round differently), and the vision MLP's fc1 + tanh GELU as one GEMM (:func:`gelu_epilogue_on`); ``eager``: the
    library's math everywhere.

    Raises:
        ValueError: another mode (named in the message).
    """
    if mode not in KERNEL_MODES:
        raise ValueError(f"kernels must be one of {KERNEL_MODES}, got {mode!r}")
    old, Fusable.mode = Fusable.mode, mode
    return old


def gelu_epilogue_on() -> bool:
    """Whether the VideoLLaMA3 vision MLP runs fc1 and its tanh GELU as one GEMM with the GELU in the epilogue
    (:func:`gelu_tanh_linear`, CUDA): only under ``kernels: inductor``, the mode that already rounds once where the
    library rounds twice (the epilogue applies the GELU to the float32 accumulator and rounds once; the library
    rounds fc1's output, then the GELU's). ``triton`` (default) and ``eager`` run the library's fc1 then
    ``F.gelu(approximate="tanh")``: two kernels, the library's roundings (session 12; before, the epilogue ran in
    every mode). Measured on the H200 (:mod:`models.fused_forwards`): the epilogue saved ~1.7 ms of a 34.1 ms
    encoder pass (the GELU's 2.2 ms for +0.5 ms in the fc1 GEMM)."""
    return Fusable.mode == "inductor"


def _triton(name: str) -> Callable:
    """The Triton kernel ``models.triton_kernels.<name>``, imported at its first call (Triton is imported only by a
    process that runs a fused kernel on CUDA; without Triton the first call fails and :class:`Fusable` warns once
    and runs the eager math)."""
    def call(*args):
        from . import triton_kernels
        try:
            return getattr(triton_kernels, name)(*args)
        except triton_kernels.Unsupported:
            return NotImplemented      # arguments the kernel does not take: Fusable runs the eager math
    call.__name__ = name
    return call


def _triton_build_error(error: BaseException) -> bool:
    """Whether ``error`` is Triton failing to build a kernel (its compilation error, or a kernel asking for more
    shared memory or registers than the GPU has), not an error of running one."""
    names = {"CompilationError", "OutOfResources"}
    return any(type(e).__name__ in names and type(e).__module__.startswith("triton") for e in _chain(error))


def _chain(error: BaseException | None):
    """``error``, then the exceptions it was raised from / during, each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _caused_by(error: BaseException, kind: type) -> bool:
    """Whether ``error`` or an exception it was raised from / during is a ``kind``."""
    return any(isinstance(e, kind) for e in _chain(error))


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device`` without the host waiting for the GPU: a host tensor goes to CUDA through pinned memory
    with a non-blocking copy (a plain ``.to("cuda")`` of pageable memory synchronizes the stream, so the host stops
    queueing work until everything queued before has run); other cases are a plain ``.to(device)``."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm: ``weight * (x / sqrt(mean(x², -1) + eps))`` with the statistics in float32, cast back to
    ``x``'s dtype before the weight. (..., D) -> (..., D)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers' ``apply_rotary_pos_emb`` (``unsqueeze_dim=1``): q, k (B, H, S, d); cos, sin (B, S, d); or, on
    token rows (:data:`rope_rows`), q (N, H, d), k (N, H_kv, d), cos, sin (N, d)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = q.shape[-1] // 2
    q_rot = torch.cat((-q[..., half:], q[..., :half]), -1)
    k_rot = torch.cat((-k[..., half:], k[..., :half]), -1)
    return q * cos + q_rot * sin, k * cos + k_rot * sin


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The gated MLP's activation: ``silu(gate) * up``, (..., I)."""
    return F.silu(gate) * up


def _add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-LN block's residual add and the LayerNorm after it: ``(residual + x, layer_norm(residual + x))``.

    The library's two steps in ``VideoLlama3VisionEncoderLayer.forward`` (transformers'
    ``modeling_video_llama_3.py``): ``hidden_states = residual + hidden_states`` in the model dtype, then
    ``nn.LayerNorm`` over the last dimension (``F.layer_norm``, statistics in float32, output in the input dtype) of
    that rounded sum. Compiled (:data:`add_layer_norm`) this is ONE kernel reading ``x`` and ``residual`` once and
    writing both results.

    Args:
        x: (..., D) the block's output (attention or MLP).
        residual: (..., D) the block's input, same shape and dtype as ``x``.
        weight, bias: (D,) the LayerNorm's affine parameters (or ``None``).
        eps: the LayerNorm's epsilon.

    Returns:
        ``(sum, normed)``, both (..., D) in ``x``'s dtype.

    Raises:
        RuntimeError: (from PyTorch) shapes that do not broadcast, or ``weight``/``bias`` not of size D.
    """
    s = residual + x
    return s, F.layer_norm(s, s.shape[-1:], weight, bias, eps)


# One graph per function for every call shape of a run: the row-wise functions are called on (N, D) rows (leading
# dimensions flattened by :func:`_on_rows`, a view), so a prefill (1, L, D), a suffix (Q, n, D) and a decode step
# (Q, 1, D) share one graph with N dynamic. Called with their natural (B, S, D) shapes, PyTorch specializes the
# size-1 batch of the prefill and the size-1 sequence of the decode step: 3 graphs each for RMSNorm, rotary and
# the SiLU gate, 13 graphs in all in the first VideoLLaMA3-7B predict step, 42 s of compilation on the H200
# (``bench/qa_step_profile.py``, 2026-12-02).
rms_norm = Fusable(_rms_norm, "RMSNorm", dynamic=(1,), triton=_triton("rms_norm"))               # x (N, D)
rope = Fusable(_rope, "rotary", dynamic=((0, 2), (0, 2), 1, 1))          # q, k (B, H, S, d); cos, sin (B, S, d)
# the same math on token rows: cos/sin (N, d) unsqueezed to (N, 1, d) broadcast over the heads of q, k (N, H, d)
rope_rows = Fusable(_rope, "rotary (rows)", dynamic=(2, 2, 1, 1),
                    triton=_triton("rope_rows"))                         # q, k (N, H, d); cos, sin (N, d)
silu_mul = Fusable(_silu_mul, "SiLU*up", dynamic=(1, 1), triton=_triton("silu_mul"))             # (N, I)


def _on_rows(fn: Callable, *xs: torch.Tensor) -> torch.Tensor:
    """``fn(*xs)`` for row-wise ``fn`` on (..., D) tensors of one leading shape, called on (N, D) views of them (N
    the product of the leading sizes; a tensor whose rows cannot be viewed that way is copied by ``reshape``), the
    result viewed back to (..., D_out)."""
    lead = xs[0].shape[:-1]
    out = fn(*(x.reshape(-1, x.shape[-1]) for x in xs))
    return out.view(*lead, out.shape[-1])


def fused_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers' ``apply_rotary_pos_emb`` (q, k (B, H, S, d); cos, sin (B, S, d)) through the fused rotary.

    When q and k are the usual transposed views of (B, S, H, d) projections and cos/sin are contiguous, the
    kernel runs on (B S, H, d) token rows (:data:`rope_rows`: one graph for prefill, suffix and decode shapes) and
    the results are returned as the same transposed views; otherwise on the 4-D tensors (:data:`rope`)."""
    b, h, s, d = q.shape
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    if (qt.is_contiguous() and kt.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
            and tuple(cos.shape) == (b, s, d) == tuple(sin.shape) and k.shape[0] == b and k.shape[2] == s):
        qo, ko = rope_rows(qt.view(b * s, h, d), kt.view(b * s, k.shape[1], d), cos.view(b * s, d), sin.view(b * s, d))
        return qo.view(b, s, h, d).transpose(1, 2), ko.view(b, s, k.shape[1], d).transpose(1, 2)
    return rope(q, k, cos, sin)


# x, residual (rows..., D). emulate_precision_casts: Inductor would otherwise normalise the float32 sum; eager PyTorch
# (the library) normalises the sum rounded to the model dtype, and so does this kernel (H200, 16,128 x 1152 bf16:
# 675 of 18.6 M normed values 1 bf16 step off eager instead of 503,308). multi_kernel: at D = 1152 Inductor's
# heuristic picks a looped reduction that reads x and residual twice, slower than eager LayerNorm + add (105 vs
# 77 us); multi_kernel also builds the one-pass persistent kernel and keeps the faster one after timing both at the
# first call (60 us). Measured with torch 2.11 there. fx_graph_cache off: with torch 2.11 a multi-kernel graph read
# back from Inductor's on-disk cache fails to load (triton's JITFunction ``_hash_lock`` is None), which a recompile
# for a new shape in the same process hit on the H200 (the failure is also caught, see ``Fusable``).
add_layer_norm = Fusable(_add_layer_norm, "add+LayerNorm", dynamic=(1, 1),
                         options={"emulate_precision_casts": True, "triton.multi_kernel": 1,
                                  "fx_graph_cache": False}, triton=_triton("add_layer_norm"))


def gelu_tanh_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(x @ weight.T + bias)`` as ONE cuBLASLt GEMM with its GELU epilogue (CUDA only).

    Replaces ``fc1`` + ``activation_fn`` of ``VideoLlama3VisionMLP.forward`` (transformers'
    ``modeling_video_llama_3.py``; ``hidden_act = "gelu_pytorch_tanh"``, i.e. ``F.gelu(approximate="tanh")``) through
    ``torch._addmm_activation(bias, x, weight.T, use_gelu=True)``. On CUDA that op applies the tanh approximation,
    in the Lt epilogue (on the float32 accumulator, so the GEMM output is rounded to the model dtype once, after the
    GELU, where the library rounds before and after it) or, when PyTorch does not take the Lt path, as a separate
    ``gelu_(approximate="tanh")``. On the CPU the same op computes the erf GELU, hence the refusal below. There is
    no autograd formula for it: call it without gradients.

    Args:
        x: (..., K) rows (packed (S, K) or batched (B, N, K)), flattened to 2-D for the GEMM (a copy if not viewable).
        weight: (N, K) as in ``nn.Linear`` (contiguous: its transpose is the column-major operand cuBLAS wants).
        bias: (N,) in ``x``'s dtype.

    Returns:
        (..., N) in ``x``'s dtype.

    Raises:
        ValueError: ``x`` is not on a CUDA device.
        RuntimeError: (from PyTorch) mismatched shapes or dtypes, or a tensor that requires grad under autograd.
    """
    if not x.is_cuda:
        raise ValueError(f"gelu_tanh_linear is CUDA only (the {x.device.type} _addmm_activation is the erf GELU)")
    out = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
    return out.view(*x.shape[:-1], weight.shape[0])
