"""Fused elementwise kernels for the transformers models we run (CUDA only; the library's math, fewer passes).

Eager transformers code runs each elementwise step of RMSNorm, rotary and the gated MLP as its own kernel: an
RMSNorm is ~7 passes over the hidden states (cast, square, mean, rsqrt, two multiplies, cast back), the rotary
~10 passes over q and k. In a prefill of 16k rows these are memory-bound passes; in a decode step of a few rows
they are ~1,700 tiny kernels per step, which bound the step's time. Here each of them is ONE kernel:
``torch.compile`` (Inductor, dynamic shapes, full graph) of a function holding exactly the library's math.

* :class:`Fusable` — a function compiled on CUDA tensors and run eagerly elsewhere. On the CPU the eager function
  IS the library's math, so results are bit-identical there (tested); on CUDA they equal it to the rounding of the
  intermediates Inductor keeps in float32. If compiling fails at the first call (no Triton, an unsupported GPU)
  the eager function is used for the rest of the process, with one warning.
* :func:`fuse` binds fused forwards on a model's RMSNorm / gated-SiLU MLP modules (the Qwen2 LLM of VideoLLaMA3,
  the Qwen2.5-Omni thinker's LLM and vision blocks) and routes the modules' ``apply_rotary_pos_emb`` through the
  fused rotary; on CUDA a gated MLP whose intermediate size is not a multiple of 8 runs zero-padded to a multiple
  of 64, gate and up in one GEMM (:func:`_padded_gate_up`, exact); ``fuse(model, False)`` restores the library's forwards (what the throughput benches' baselines
  run).

* The VideoLLaMA3 vision encoder (SigLIP-style, pre-LN; transformers' ``modeling_video_llama_3.py``): on CUDA the
  MLP's fc1 and its tanh GELU are ONE cuBLASLt GEMM with a GELU epilogue (:func:`gelu_tanh_linear`), and each
  encoder layer's residual adds run fused with the LayerNorm that follows them (:data:`add_layer_norm`): the add
  ending the attention block with ``layer_norm2``, the add ending the MLP block with the NEXT layer's
  ``layer_norm1`` (:func:`_vision_layer_forward`). On the CPU both are the library's math, bit-identical (tested).
  Measured on the H200 (torch 2.11, random weights of the real size, 16 frames of 1,008 patches in bf16): the
  encoder's GPU time 34.1 -> 30.3 ms (GELU pass 2.2 ms gone for +0.5 ms in the fc1 GEMM; LayerNorm + add passes
  3.8 -> 2.1 ms).

Whole-layer ``torch.compile`` of the VideoLLaMA3 vision encoder was measured and did not pay (see
:mod:`models.vision_attention`); these are the pieces that are launch- or memory-bound.
"""
from __future__ import annotations

import logging
import sys
import threading
import types
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

NORM_CLASSES = frozenset({"Qwen2RMSNorm", "Qwen2_5OmniRMSNorm"})
MLP_CLASSES = frozenset({"Qwen2MLP", "Qwen2_5OmniMLP"})
VISION_LAYER_CLASSES = frozenset({"VideoLlama3VisionEncoderLayer"})   # pre-LN: x + attn(LN1(x)); x + mlp(LN2(x))
VISION_MLP_CLASSES = frozenset({"VideoLlama3VisionMLP"})              # fc2(gelu_tanh(fc1(x)))
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

    def __init__(self, fn: Callable, name: str, dynamic: tuple = (), devices: tuple[str, ...] = ("cuda",),
                 backend: str = "inductor", options: dict | None = None):
        self.fn, self.name, self.dynamic, self.devices, self.backend = fn, name, dynamic, devices, backend
        self.options = options                 # backend options (Inductor config keys), e.g. emulate_precision_casts
        self._compiled: Callable | None = None
        self.state = "new"                     # new | ok (compiled and ran once) | failed (eager for good)
        self.__doc__ = fn.__doc__

    def _mark(self, args) -> None:
        for a, dims in zip(args, self.dynamic):
            if isinstance(a, torch.Tensor):
                dims = range(a.dim() - dims) if isinstance(dims, int) else [d % a.dim() for d in dims]
                for d in dims:
                    torch._dynamo.maybe_mark_dynamic(a, d)

    def __call__(self, *args):
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

    def _eager(self, what: str, error: Exception, args: tuple):
        """Give up compiling for good (warning once, naming the function) and run the eager math."""
        log.warning("torch.compile of %s %s (%s); using the eager function", self.name, what, error)
        self.state = "failed"
        return self.fn(*args)


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
rms_norm = Fusable(_rms_norm, "RMSNorm", dynamic=(1,))                  # x (N, D)
rope = Fusable(_rope, "rotary", dynamic=((0, 2), (0, 2), 1, 1))          # q, k (B, H, S, d); cos, sin (B, S, d)
# the same math on token rows: cos/sin (N, d) unsqueezed to (N, 1, d) broadcast over the heads of q, k (N, H, d)
rope_rows = Fusable(_rope, "rotary (rows)", dynamic=(2, 2, 1, 1))       # q, k (N, H, d); cos, sin (N, d)
silu_mul = Fusable(_silu_mul, "SiLU*up", dynamic=(1, 1))                 # (N, I)


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
                                  "fx_graph_cache": False})

_ROPE_ON = [False]                             # the patched apply_rotary_pos_emb uses the fused rotary
_ROPE_ORIGINAL: dict[str, Callable] = {}       # module name -> the library's apply_rotary_pos_emb


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return _on_rows(lambda x: rms_norm(x, self.weight, self.variance_epsilon), hidden_states)


ALIGN = 64   # intermediate sizes that are not a multiple of 8 (16-byte rows in bf16) miss the Hopper GEMM kernels


def _padded_gate_up(self, device: torch.device):
    """``(gate_up_weight (2 Ip, D), gate_up_bias | None, down_weight (D, Ip))`` for an intermediate size I whose rows
    are not 16-byte aligned (I not a multiple of 8 in bf16/fp16), zero-padded to ``Ip = ceil(I / 64) * 64`` and with
    gate and up stacked into one GEMM.

    The same function: a padded channel has gate = 0, so ``silu(0) * up = 0``, and its down-projection column is 0
    too (exact in real arithmetic; the GEMMs' accumulation order differs from the unpadded ones, as between any two
    GEMM kernels). Built without autograd, once per device and per weights (their storage, dtype and version), and
    kept on the module (extra memory: 3 Ip D weights per MLP, ~0.85 GB for the Qwen2.5-Omni-3B vision tower in bf16,
    whose I = 3420 otherwise runs on sm80 kernels at about half the Hopper GEMM rate: measured 36% of a
    completed-block-hold run's GPU time on the H200).
    """
    g, u, d = self.gate_proj, self.up_proj, self.down_proj
    key = (device,) + tuple(_identity(t) for t in (g.weight, u.weight, d.weight, g.bias, u.bias))
    cached = getattr(self, "_tb_padded", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    self.__dict__.pop("_tb_padded", None)           # free the stale copies first
    with torch.no_grad():
        i = g.weight.shape[0]
        ip = -(-i // ALIGN) * ALIGN
        w = g.weight.new_zeros(2 * ip, g.weight.shape[1])
        w[:i], w[ip:ip + i] = g.weight, u.weight
        b = None
        if g.bias is not None:
            b = g.bias.new_zeros(2 * ip)
            b[:i], b[ip:ip + i] = g.bias, u.bias
        dw = d.weight.new_zeros(d.weight.shape[0], ip)
        dw[:, :i] = d.weight
    packed = (w, b, dw)
    self._tb_padded = (key, packed)
    return packed


def _identity(t: torch.Tensor | None):
    """What makes a cached copy of ``t`` stale: its storage, dtype, shape and in-place version (``-1`` for inference
    tensors, which have no version and cannot be modified in place outside inference mode)."""
    if t is None:
        return None
    return t.data_ptr(), t.dtype, tuple(t.shape), _version(t)


def _padded_mlp(self, x: torch.Tensor) -> torch.Tensor:
    """The gated MLP through :func:`_padded_gate_up` (the library's function, see there)."""
    w, b, dw = _padded_gate_up(self, x.device)
    gate, up = F.linear(x, w, b).chunk(2, dim=-1)
    return F.linear(_on_rows(silu_mul, gate, up), dw, self.down_proj.bias)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    gw = self.gate_proj.weight
    if (x.is_cuda and (gw.shape[0] * gw.element_size()) % 16 and not torch.compiler.is_compiling()
            and not _autograd(gw)):
        return _padded_mlp(self, x)
    if not x.is_cuda and "_tb_padded" in self.__dict__:
        del self.__dict__["_tb_padded"]             # the module moved off the GPU: free its padded GPU copies
    return self.down_proj(_on_rows(silu_mul, self.gate_proj(x), self.up_proj(x)))


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


def _autograd(*tensors) -> bool:
    """Whether autograd would record an op on ``tensors`` (``None`` entries ignored)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _plain(mod: nn.Module, cls: type) -> bool:
    """``mod`` is exactly ``cls`` with the class forward and no hooks: calling it is its class's math, so reading its
    parameters and running that math elsewhere is the same (a wrapped, quantized or hooked module is not)."""
    return (type(mod) is cls and "forward" not in mod.__dict__ and not mod._forward_hooks
            and not mod._forward_pre_hooks)


def _vision_mlp_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """``VideoLlama3VisionMLP.forward`` (fc1 -> tanh GELU -> fc2; bound by :func:`fuse`): (..., D) -> (..., D).

    On CUDA, without autograd, with an ``nn.Linear`` fc1 that has a bias in the input's dtype and autocast off, fc1
    and the GELU are :func:`gelu_tanh_linear` (one GEMM); otherwise, and always on the CPU, the library's forward.
    """
    fc1 = self.fc1
    if (hidden_states.is_cuda and _plain(fc1, nn.Linear) and fc1.bias is not None
            and hidden_states.dtype == fc1.weight.dtype == fc1.bias.dtype
            and not torch.is_autocast_enabled(hidden_states.device.type)
            and not torch.compiler.is_compiling() and not _autograd(hidden_states, fc1.weight, fc1.bias)):
        return self.fc2(gelu_tanh_linear(hidden_states, fc1.weight, fc1.bias))
    return type(self).forward(self, hidden_states)


_HANDOFF = "_tb_next_layer_norm"   # tensor attribute: (LayerNorm module, tensor version, that norm of the tensor)
_NEXT_NORM = "_tb_next_norm"       # encoder-layer __dict__ entry: the next layer's layer_norm1 (not a submodule)


def _version(t: torch.Tensor) -> int:
    """``t``'s in-place version counter (``-1`` for inference tensors, which have none)."""
    return -1 if t.is_inference() else t._version


def _take_normed(hidden_states: torch.Tensor, norm: nn.Module) -> torch.Tensor | None:
    """The ``norm(hidden_states)`` the previous encoder layer computed with its last residual add (and drop it from
    the tensor); ``None`` when there is none for this norm or the tensor was modified in place since."""
    handed = hidden_states.__dict__.pop(_HANDOFF, None)
    if handed is None or handed[0] is not norm or handed[1] != _version(hidden_states):
        return None
    return handed[2]


def _vision_layer_forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                          position_embeddings: tuple[torch.Tensor, torch.Tensor], **kwargs) -> torch.Tensor:
    """``VideoLlama3VisionEncoderLayer.forward`` (transformers' ``modeling_video_llama_3.py``; bound by :func:`fuse`)
    with each residual add fused into the LayerNorm that follows it (:data:`add_layer_norm`, one kernel on CUDA).

    The library's math and order: ``h = x + attn(layer_norm1(x))``; ``out = h + mlp(layer_norm2(h))``. Here
    ``(h, layer_norm2(h))`` come from one :data:`add_layer_norm`, and when :func:`fuse` linked this layer to the next
    one of its encoder, ``(out, next.layer_norm1(out))`` too: the normalised rows ride on the returned tensor (an
    attribute, consumed and dropped by the next layer, which checks it is its own ``layer_norm1`` and that ``out``
    was not modified in place) so the signature and the return value stay the library's. That hand-off is skipped
    under autograd (a gradient-checkpointed layer recomputes its forward) and inside ``torch.compile``. A layer
    whose ``layer_norm2`` is not a plain ``nn.LayerNorm`` runs the library's forward.

    Args:
        hidden_states: (S, D) packed patch rows (any (..., D) works).
        cu_seqlens: (n + 1,) cumulative frame/image lengths, passed to ``self_attn`` as the library does.
        position_embeddings: ``(cos, sin)`` of the vision rotary, passed to ``self_attn``.
        **kwargs: passed to ``self_attn`` (``max_seqlen``, attention-backend kwargs).

    Returns:
        (..., D) the layer's output, in ``hidden_states``' dtype.
    """
    normed = _take_normed(hidden_states, self.layer_norm1)
    ln2 = self.layer_norm2
    if not _plain(ln2, nn.LayerNorm):
        return type(self).forward(self, hidden_states, cu_seqlens=cu_seqlens,
                                  position_embeddings=position_embeddings, **kwargs)
    if normed is None:
        normed = self.layer_norm1(hidden_states)
    attn, _ = self.self_attn(normed, cu_seqlens=cu_seqlens, position_embeddings=position_embeddings, **kwargs)
    hidden_states, normed = add_layer_norm(attn, hidden_states, ln2.weight, ln2.bias, ln2.eps)
    out = self.mlp(normed)
    nxt = self.__dict__.get(_NEXT_NORM)
    if (nxt is None or not _plain(nxt, nn.LayerNorm) or torch.compiler.is_compiling()
            or _autograd(out, hidden_states, nxt.weight, nxt.bias)):
        return hidden_states + out
    out, normed = add_layer_norm(out, hidden_states, nxt.weight, nxt.bias, nxt.eps)
    out.__dict__[_HANDOFF] = (nxt, _version(out), normed)
    return out


def _is_gelu_tanh(act) -> bool:
    """The activation is the tanh-approximated GELU (transformers' ``gelu_pytorch_tanh``)."""
    if isinstance(act, nn.GELU):
        return act.approximate == "tanh"
    return type(act).__name__ in ("GELUTanh", "PytorchGELUTanh")


def _vision_layer_fusable(mod: nn.Module) -> bool:
    return all(isinstance(getattr(mod, n, None), nn.LayerNorm) and len(getattr(mod, n).normalized_shape) == 1
               for n in ("layer_norm1", "layer_norm2"))


def _link_vision_layers(model: nn.Module, on: bool) -> None:
    """Point every bound vision encoder layer at the next layer's ``layer_norm1`` (``on``; see
    :func:`_vision_layer_forward`) or drop the links. Kept in the layer's ``__dict__``, not as a submodule (no change
    to ``modules()``, ``state_dict()`` or ``to()``)."""
    for mod in model.modules():
        layers = getattr(mod, "layers", None)
        if not isinstance(layers, nn.ModuleList):
            continue
        for layer, nxt in zip(layers, list(layers)[1:] + [None]):
            if type(layer).__name__ not in VISION_LAYER_CLASSES:
                continue
            layer.__dict__.pop(_NEXT_NORM, None)
            if (on and nxt is not None and "forward" in layer.__dict__ and "forward" in nxt.__dict__
                    and type(nxt).__name__ in VISION_LAYER_CLASSES):
                layer.__dict__[_NEXT_NORM] = nxt.layer_norm1


def _rope_dispatch(original: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if _ROPE_ON[0] and q.is_cuda and not args and set(kwargs) <= {"unsqueeze_dim"} \
                and kwargs.get("unsqueeze_dim", 1) == 1:
            return fused_rope(q, k, cos, sin)
        return original(q, k, cos, sin, *args, **kwargs)
    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _is_silu(act) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def fuse(model: nn.Module, on: bool = True) -> int:
    """Bind (``on``) or unbind the fused forwards on ``model``'s RMSNorm and gated-SiLU MLP modules and on its
    VideoLLaMA3 vision encoder layers (:func:`_vision_layer_forward`, when both norms are 1-D ``nn.LayerNorm``) and
    vision MLPs (:func:`_vision_mlp_forward`, when the activation is the tanh GELU), and, when the model has
    attention modules whose transformers module defines ``apply_rotary_pos_emb``, switch that function's fused
    rotary (process-wide: every model of those transformers modules follows the last such call; on CPU tensors the
    library's function runs either way). Unbinding also drops the padded MLP copies and the vision layers' links to
    their next layer, so the modules are back to the library's forwards.

    Returns:
        The number of modules bound (``on``) or restored.
    """
    n = 0
    rotary = False
    for mod in model.modules():
        name = type(mod).__name__
        if name in NORM_CLASSES and hasattr(mod, "variance_epsilon"):
            fwd = _norm_forward
        elif name in MLP_CLASSES and _is_silu(getattr(mod, "act_fn", None)):
            fwd = _mlp_forward
        elif name in VISION_LAYER_CLASSES and _vision_layer_fusable(mod):
            fwd = _vision_layer_forward
        elif (name in VISION_MLP_CLASSES and _is_gelu_tanh(getattr(mod, "activation_fn", None))
              and isinstance(getattr(mod, "fc1", None), nn.Linear)):
            fwd = _vision_mlp_forward
        else:
            if name.endswith("Attention"):
                rotary |= _patch_rope(type(mod).__module__)
            continue
        if on:
            mod.forward = types.MethodType(fwd, mod)
            n += 1
        elif "forward" in mod.__dict__:
            del mod.forward
            mod.__dict__.pop("_tb_padded", None)
            n += 1
    _link_vision_layers(model, on)
    if rotary:            # only a model with such attention modules switches the (process-wide) fused rotary
        _ROPE_ON[0] = on
    return n


def _patch_rope(module_name: str) -> bool:
    """Route ``<module>.apply_rotary_pos_emb`` through :func:`_rope_dispatch` (once per module); whether the module
    has that function (patched now or before)."""
    mod = sys.modules.get(module_name)
    if module_name in _ROPE_ORIGINAL:
        return True
    fn = getattr(mod, "apply_rotary_pos_emb", None)
    if fn is None:
        return False
    _ROPE_ORIGINAL[module_name] = fn
    mod.apply_rotary_pos_emb = _rope_dispatch(fn)
    return True
