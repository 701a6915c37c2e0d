"""The library modules' forwards rebound on the fused kernels of :mod:`models.kernels` (CUDA; the library's math).

* :func:`fuse` binds fused forwards on a model's RMSNorm / gated-SiLU MLP modules (the Qwen2 LLM of VideoLLaMA3,
  the Qwen2.5-Omni thinker's LLM and vision blocks) and routes the modules' ``apply_rotary_pos_emb`` through the
  fused rotary; on CUDA a gated MLP whose intermediate size is not a multiple of 8 runs zero-padded to a multiple
  of 64, gate and up in one GEMM (:func:`_padded_gate_up`, exact); ``fuse(model, False)`` restores the library's
  forwards (what the throughput benches' baselines run).
* The VideoLLaMA3 vision encoder (SigLIP-style, pre-LN; transformers' ``modeling_video_llama_3.py``): on CUDA under
  ``kernels: inductor`` only (:func:`models.kernels.gelu_epilogue_on`) the MLP's fc1 and its tanh GELU are ONE
  cuBLASLt GEMM with a GELU epilogue (:func:`models.kernels.gelu_tanh_linear`, which rounds once where the library
  rounds twice), and in every mode each encoder layer's residual adds run fused with the LayerNorm that follows them
  (:data:`models.kernels.add_layer_norm`): the add ending the attention block with ``layer_norm2``, the add ending
  the MLP block with the NEXT layer's ``layer_norm1`` (:func:`_vision_layer_forward`). On the CPU both are the
  library's math, bit-identical (tested). Measured on the H200 (torch 2.11, random weights of the real size, 16 frames of 1,008 patches in bf16): the
  encoder's GPU time 34.1 -> 30.3 ms (GELU pass 2.2 ms gone for +0.5 ms in the fc1 GEMM; LayerNorm + add passes
  3.8 -> 2.1 ms).
"""
from __future__ import annotations

import sys
import types
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import _on_rows, add_layer_norm, fused_rope, gelu_epilogue_on, gelu_tanh_linear, rms_norm, silu_mul

NORM_CLASSES = frozenset({"Qwen2RMSNorm", "Qwen2_5OmniRMSNorm"})
MLP_CLASSES = frozenset({"Qwen2MLP", "Qwen2_5OmniMLP"})
VISION_LAYER_CLASSES = frozenset({"VideoLlama3VisionEncoderLayer"})   # pre-LN: x + attn(LN1(x)); x + mlp(LN2(x))
VISION_MLP_CLASSES = frozenset({"VideoLlama3VisionMLP"})              # fc2(gelu_tanh(fc1(x)))

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

    On CUDA under ``kernels: inductor`` (:func:`models.kernels.gelu_epilogue_on`), without autograd, with an
    ``nn.Linear`` fc1 that has a bias in the input's dtype and autocast off, fc1 and the GELU are
    :func:`gelu_tanh_linear` (one GEMM, rounded once); otherwise, and always on the CPU, the library's forward.
    """
    fc1 = self.fc1
    if (hidden_states.is_cuda and gelu_epilogue_on() and _plain(fc1, nn.Linear) and fc1.bias is not None
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
