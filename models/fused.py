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
  fused rotary; ``fuse(model, False)`` restores the library's forwards (what the throughput benches' baselines
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


class Fusable:
    """``fn`` compiled (``torch.compile(dynamic=True, fullgraph=True)``) when its first argument is a tensor on one
    of ``devices`` (CUDA), eager otherwise or after a failed first compilation.

    Dynamic shapes: sizes are symbolic except 0 and 1 (which PyTorch specializes), so a new length or batch size
    does not recompile; a first call with a size-1 dimension (a one-token decode step) compiles once more.
    """

    def __init__(self, fn: Callable, name: str, devices: tuple[str, ...] = ("cuda",)):
        self.fn, self.name, self.devices = fn, name, devices
        self._compiled: Callable | None = None
        self.state = "new"                     # new | ok (compiled and ran once) | failed (eager for good)
        self.__doc__ = fn.__doc__

    def __call__(self, *args):
        if self.state == "failed" or args[0].device.type not in self.devices:
            return self.fn(*args)
        if self._compiled is None:
            self._compiled = torch.compile(self.fn, dynamic=True, fullgraph=True)
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


rms_norm = Fusable(_rms_norm, "RMSNorm")
rope = Fusable(_rope, "rotary")
silu_mul = Fusable(_silu_mul, "SiLU*up")

_ROPE_ON = [False]                             # the patched apply_rotary_pos_emb uses the fused rotary
_ROPE_ORIGINAL: dict[str, Callable] = {}       # module name -> the library's apply_rotary_pos_emb


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


def _rope_dispatch(original: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if _ROPE_ON[0] and unsqueeze_dim == 1 and q.is_cuda:
            return rope(q, k, cos, sin)
        return original(q, k, cos, sin, unsqueeze_dim)
    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _is_silu(act) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def fuse(model: nn.Module, on: bool = True) -> int:
    """Bind (``on``) or unbind the fused forwards on ``model``'s RMSNorm and gated-SiLU MLP modules, and switch the
    fused rotary of the modules' ``apply_rotary_pos_emb`` (process-wide: every model of those transformers
    modules; on CPU tensors the library's function runs either way).

    Returns:
        The number of modules bound (``on``) or restored.
    """
    n = 0
    for mod in model.modules():
        name = type(mod).__name__
        if name in NORM_CLASSES and hasattr(mod, "variance_epsilon"):
            fwd = _norm_forward
        elif name in MLP_CLASSES and _is_silu(getattr(mod, "act_fn", None)):
            fwd = _mlp_forward
        else:
            if name.endswith("Attention"):
                _patch_rope(type(mod).__module__)
            continue
        if on:
            mod.forward = types.MethodType(fwd, mod)
            n += 1
        elif "forward" in mod.__dict__:
            del mod.forward
            n += 1
    _ROPE_ON[0] = on
    return n


def _patch_rope(module_name: str) -> None:
    """Route ``<module>.apply_rotary_pos_emb`` through :func:`_rope_dispatch` (once per module)."""
    mod = sys.modules.get(module_name)
    fn = getattr(mod, "apply_rotary_pos_emb", None)
    if fn is None or module_name in _ROPE_ORIGINAL:
        return
    _ROPE_ORIGINAL[module_name] = fn
    mod.apply_rotary_pos_emb = _rope_dispatch(fn)
