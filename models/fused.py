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

Whole-layer ``torch.compile`` of the VideoLLaMA3 vision encoder was measured and did not pay (see
:mod:`models.vision_attention`); these are the pieces that are launch- or memory-bound.
"""
from __future__ import annotations

import logging
import sys
import types
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

NORM_CLASSES = frozenset({"Qwen2RMSNorm", "Qwen2_5OmniRMSNorm"})
MLP_CLASSES = frozenset({"Qwen2MLP", "Qwen2_5OmniMLP"})
RECOMPILE_LIMIT = 32     # graphs per fused function (torch._dynamo's recompile_limit is raised to at least this)


class Fusable:
    """``fn`` compiled (``torch.compile(fullgraph=True)``) when its first argument is a tensor on one of ``devices``
    (CUDA), eager otherwise or after a failed first compilation.

    Shapes: ``dynamic`` gives, per tensor argument, its dimensions that vary between calls (rows, frames, sequence,
    batch): a tuple of dimension indices, or an int ``k`` for "all but the last ``k``". They are marked dynamic
    from the first call, so a new length or batch size does not recompile, while the sizes the model fixes (hidden
    size, heads, head dim) stay constants in the kernel (a symbolic head dim of 72 turns every index into run-time
    integer division: measured 5x slower on the H200). Compiled with ``dynamic=False``: a function that meets a
    second fixed size (the Omni thinker's vision tower D = 1280 and LLM D = 2048 share :data:`rms_norm`) gets a
    second graph, instead of PyTorch's automatic dynamic turning the fixed size symbolic for every later call.
    PyTorch specializes sizes 0 and 1, so a first call with a size-1 dimension (a one-token decode step) compiles
    once more. Inside an outer ``torch.compile`` (``compile_small_calls``) the eager math is inlined into that graph.
    """

    def __init__(self, fn: Callable, name: str, dynamic: tuple = (), devices: tuple[str, ...] = ("cuda",),
                 backend: str = "inductor"):
        self.fn, self.name, self.dynamic, self.devices, self.backend = fn, name, dynamic, devices, backend
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
        if self.state == "failed" or args[0].device.type not in self.devices or torch.compiler.is_compiling():
            return self.fn(*args)
        if self._compiled is None:
            # one graph per fixed size and size-1 pattern (prefill / suffix / one-token step, one or several rows,
            # vision and LLM widths): more than PyTorch's default of 8 per function in a process running both towers
            cfg = torch._dynamo.config
            name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # older PyTorch
            setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
            self._compiled = torch.compile(self.fn, fullgraph=True, dynamic=False, backend=self.backend)
        self._mark(args)
        if self.state == "ok":                 # compiled and ran once: later errors are real errors
            return self._compiled(*args)
        try:
            out = self._compiled(*args)
        except Exception as e:  # noqa: BLE001 - first call: compilation failed, the eager math is the same
            log.warning("torch.compile of %s failed (%s); using the eager function", self.name, e)
            self.state = "failed"
            return self.fn(*args)
        self.state = "ok"
        return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm: ``weight * (x / sqrt(mean(x², -1) + eps))`` with the statistics in float32, cast back to
    ``x``'s dtype before the weight. (..., D) -> (..., D)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers' ``apply_rotary_pos_emb`` (``unsqueeze_dim=1``): q, k (B, H, S, d); cos, sin (B, S, d)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = q.shape[-1] // 2
    q_rot = torch.cat((-q[..., half:], q[..., :half]), -1)
    k_rot = torch.cat((-k[..., half:], k[..., :half]), -1)
    return q * cos + q_rot * sin, k * cos + k_rot * sin


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The gated MLP's activation: ``silu(gate) * up``, (..., I)."""
    return F.silu(gate) * up


rms_norm = Fusable(_rms_norm, "RMSNorm", dynamic=(1,))                  # x (rows..., D)
rope = Fusable(_rope, "rotary", dynamic=((0, 2), (0, 2), 1, 1))          # q, k (B, H, S, d); cos, sin (B, S, d)
silu_mul = Fusable(_silu_mul, "SiLU*up", dynamic=(1, 1))                 # (rows..., I)

_ROPE_ON = [False]                             # the patched apply_rotary_pos_emb uses the fused rotary
_ROPE_ORIGINAL: dict[str, Callable] = {}       # module name -> the library's apply_rotary_pos_emb


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)


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
    return t.data_ptr(), t.dtype, tuple(t.shape), (-1 if t.is_inference() else t._version)


def _padded_mlp(self, x: torch.Tensor) -> torch.Tensor:
    """The gated MLP through :func:`_padded_gate_up` (the library's function, see there)."""
    w, b, dw = _padded_gate_up(self, x.device)
    gate, up = F.linear(x, w, b).chunk(2, dim=-1)
    return F.linear(silu_mul(gate, up), dw, self.down_proj.bias)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    gw = self.gate_proj.weight
    if (x.is_cuda and (gw.shape[0] * gw.element_size()) % 16 and not torch.compiler.is_compiling()
            and not (torch.is_grad_enabled() and gw.requires_grad)):
        return _padded_mlp(self, x)
    return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


def _rope_dispatch(original: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if _ROPE_ON[0] and q.is_cuda and not args and set(kwargs) <= {"unsqueeze_dim"} \
                and kwargs.get("unsqueeze_dim", 1) == 1:
            return rope(q, k, cos, sin)
        return original(q, k, cos, sin, *args, **kwargs)
    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _is_silu(act) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def fuse(model: nn.Module, on: bool = True) -> int:
    """Bind (``on``) or unbind the fused forwards on ``model``'s RMSNorm and gated-SiLU MLP modules, and, when the
    model has attention modules whose transformers module defines ``apply_rotary_pos_emb``, switch that function's
    fused rotary (process-wide: every model of those transformers modules follows the last such call; on CPU
    tensors the library's function runs either way). Unbinding also drops the padded MLP copies.

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
