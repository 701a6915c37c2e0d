"""Frame-batched vision-tower attention, shared by both families (VideoLLaMA3's encoder; the omni batch runner
uses its chunk lengths and fused rotary).

The encoder attends within each frame (``cu_seqlens`` marks frame boundaries in one packed sequence). Outside
flash-attention, transformers runs one SDPA call per frame in a Python loop (27 layers x T frames of small
calls), and applies the vision rotary embedding in float32 as ~10 separate elementwise passes over q and k
(at 180 frames x 1008 patches that is ~40% of the encoder's GPU time).

Two pieces, both selected by ``BudgetedVideoLlama3.set_vision_attention("frame_batched")``:

* :func:`frame_batched_sdpa`, registered as a transformers attention backend under :data:`FRAME_BATCHED_SDPA`
  (the name contains "flash" because transformers routes packed, ``cu_seqlens`` attention only to backends whose
  name contains it): all frames of one encode share one size, so the packed sequence is viewed as a batch of T
  frames and attended in ONE SDPA call per layer; unequal segments fall back to the per-segment loop.
* :func:`frame_batched_attention_forward`, bound to every ``VideoLlama3VisionAttention`` of the model: the same
  projections and the same float32 rotary math as the library's forward (``apply_rotary_pos_emb_vision``), but
  the rotary is one fused kernel on CUDA (:data:`fused_rotary_qk`, :mod:`models.kernels`; eager on CPU,
  bit-identical to the library there), uses one frame's cos/sin for all frames (the positions repeat per frame),
  and the frame layout comes from :func:`frame_layout` (set by ``encode``) instead of a device-to-host read of
  ``cu_seqlens`` in every layer.

Legend: S packed tokens, H heads, d head dim, T frames, N tokens per frame, C = H d.
"""
from __future__ import annotations

import contextlib
import types
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from .kernels import Fusable, _triton

FRAME_BATCHED_SDPA = "flash_compatible_frame_batched_sdpa"

_LAYOUT: tuple[int, int] | None = None   # (T, N) of the encode in progress, see frame_layout


def chunk_lengths(cu_seqlens: torch.Tensor) -> list[int]:
    """Segment lengths of a (n + 1,) ``cu_seqlens`` tensor, read to the host once per tensor object.

    A vision or audio tower passes the same ``cu_seqlens`` object (full attention) or ``cu_window_seqlens`` object
    (windowed) to all of its layers. Boundaries already on the host cost host work only; boundaries on the device
    (the library's own computation, e.g. Omni audio spanning several attention chunks, or a VideoLLaMA3 encode
    without :func:`frame_layout`) would otherwise wait for the GPU once per layer, each time leaving it idle while the
    host launches the next layer. The lengths are kept on the tensor object itself (a new forward builds new tensors,
    so they can never be stale; ``cu_seqlens`` is never modified in place).
    """
    cached = getattr(cu_seqlens, "_tb_chunk_lengths", None)
    if cached is None:
        cached = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        cu_seqlens._tb_chunk_lengths = cached
    return cached


def frame_batched_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask=None, scaling: float | None = None, dropout: float = 0.0,
                       cu_seq_lens_q: torch.Tensor | None = None, **kwargs):
    """Packed per-segment attention.

    Args:
        query, key, value: (1, H, S, d).
        cu_seq_lens_q: (T + 1,) cumulative segment lengths (frames); ``None`` = one segment.

    Returns:
        ``(out, None)`` with out (1, S, H, d), as transformers' flash-attention backends return it.
    """
    _, heads, seq, dim = query.shape
    if cu_seq_lens_q is None:
        lengths = [seq]
    elif _LAYOUT is not None and _LAYOUT[0] * _LAYOUT[1] == seq and cu_seq_lens_q.shape[0] == _LAYOUT[0] + 1:
        lengths = [_LAYOUT[1]] * _LAYOUT[0]
    else:
        lengths = chunk_lengths(cu_seq_lens_q)
    if len(set(lengths)) == 1:
        t, n = len(lengths), lengths[0]
        q, k, v = (x.view(heads, t, n, dim).transpose(0, 1) for x in (query[0], key[0], value[0]))  # (T, H, N, d)
        with sdpa_without_cudnn(q.device):
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling)        # (T, H, N, d)
        return out.permute(0, 2, 1, 3).reshape(1, seq, heads, dim), None
    outs = []
    with sdpa_without_cudnn(query.device):
        for q, k, v in zip(*(x.split(lengths, dim=2) for x in (query, key, value))):
            outs.append(F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling))  # (1, H, n, d)
    return torch.cat(outs, dim=2).transpose(1, 2), None


_CUDNN_ALLOWED = [False]   # see sdpa_without_cudnn / allow_cudnn_sdpa


def allow_cudnn_sdpa(on: bool) -> None:
    """Let SDPA pick cuDNN's attention again wherever :func:`sdpa_without_cudnn` leaves it out (process-wide; for A/B
    measurements: cuDNN's kernel is faster per call on Hopper, its per-shape plan building costs host time)."""
    _CUDNN_ALLOWED[0] = bool(on)


def sdpa_without_cudnn(device: torch.device):
    """SDPA backends on CUDA for attention whose shapes change from input to input (both families' vision towers,
    the Omni audio tower, the VideoLLaMA3 qbase compressor and its LLM prefix prefill): flash, memory-efficient,
    math; cuDNN left out.

    SDPA prefers cuDNN's attention for these bf16 calls on Hopper, and cuDNN builds an execution plan on the host for
    every new shape: about 2.3 ms of CPU per call in a micro-chunk-200ms profile on the H200 (the batch of chunks
    changes with every row) and 1.34 s of CPU over the 382 attention calls of one VideoLLaMA3-7B predict step on an
    unseen 287 s video (frame counts per encode chunk, grids and compressor windows differ from video to video;
    ``bench/qa_step_profile.py``, 2026-12-02). Backends the caller turned off stay off (SDPA's backend switches are
    process-wide, as ``sdpa_kernel`` itself); :func:`allow_cudnn_sdpa` leaves SDPA's own choice.
    Returns a context manager."""
    if device.type != "cuda" or _CUDNN_ALLOWED[0] or not torch.backends.cuda.cudnn_sdp_enabled():
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cuda = torch.backends.cuda
    keep = [b for b, on in ((SDPBackend.FLASH_ATTENTION, cuda.flash_sdp_enabled()),
                            (SDPBackend.EFFICIENT_ATTENTION, cuda.mem_efficient_sdp_enabled()),
                            (SDPBackend.MATH, cuda.math_sdp_enabled())) if on]   # what the caller left on
    return sdpa_kernel(keep) if keep else nullcontext()


def rotary_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The library's vision rotary (``apply_rotary_pos_emb_vision``): float32 math, cast back.

    Args:
        q, k: (..., N, H, d) in the model dtype.
        cos, sin: (N, 1, d) float32 (broadcast over leading dims and heads).

    Returns:
        ``(q_rot, k_rot)`` in the dtypes of ``q`` and ``k``.
    """
    half = q.shape[-1] // 2
    qf, kf = q.float(), k.float()
    q_rot = torch.cat((-qf[..., half:], qf[..., :half]), -1)
    k_rot = torch.cat((-kf[..., half:], kf[..., :half]), -1)
    return (qf * cos + q_rot * sin).to(q.dtype), (kf * cos + k_rot * sin).to(k.dtype)


# one kernel on CUDA (models/kernels.py), eager elsewhere; q, k (..., N, H, d) and cos, sin (..., N, 1, d)
fused_rotary_qk = Fusable(rotary_qk, "vision rotary", dynamic=(2, 2, 2, 2), triton=_triton("vision_rotary"))


@contextlib.contextmanager
def frame_layout(num_frames: int, tokens_per_frame: int):
    """Declare that the vision forward inside this block packs ``num_frames`` frames of ``tokens_per_frame``
    patches each, in frame order with identical positions per frame (one video grid ``(T, h, w)``)."""
    global _LAYOUT
    old, _LAYOUT = _LAYOUT, (num_frames, tokens_per_frame)
    try:
        yield
    finally:
        _LAYOUT = old


def frame_batched_attention_forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                                    position_embeddings: tuple[torch.Tensor, torch.Tensor], max_seqlen=None,
                                    **kwargs):
    """Drop-in ``VideoLlama3VisionAttention.forward`` (bound per module by :func:`bind`).

    Args:
        hidden_states: (S, C).
        cu_seqlens: (T + 1,) frame boundaries (read only when no :func:`frame_layout` is active).
        position_embeddings: ``(cos, sin)``, each (S, d) float32.

    Returns:
        ``(out (S, C), None)``.
    """
    seq = hidden_states.shape[0]
    heads, dim = self.num_heads, self.head_dim
    if _LAYOUT is not None and _LAYOUT[0] * _LAYOUT[1] == seq and cu_seqlens.shape[0] == _LAYOUT[0] + 1:
        t, n, same_pos = _LAYOUT[0], _LAYOUT[1], True
    else:
        lengths = chunk_lengths(cu_seqlens)
        if len(set(lengths)) != 1:  # unequal frames: the library's forward (per-segment loop through the backend)
            return type(self).forward(self, hidden_states, cu_seqlens=cu_seqlens,
                                      position_embeddings=position_embeddings, max_seqlen=max_seqlen, **kwargs)
        t, n, same_pos = len(lengths), lengths[0], False
    q = self.q_proj(hidden_states).view(t, n, heads, dim)
    k = self.k_proj(hidden_states).view(t, n, heads, dim)
    v = self.v_proj(hidden_states).view(t, n, heads, dim)
    cos, sin = position_embeddings
    if same_pos:
        cos, sin = cos[:n], sin[:n]                                            # (N, d): every frame has these
    else:
        cos, sin = cos.view(t, n, dim), sin.view(t, n, dim)
    q, k = fused_rotary_qk(q, k, cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float())
    with sdpa_without_cudnn(q.device):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             scale=self.scaling)               # (T, H, N, d)
    out = out.transpose(1, 2).reshape(seq, heads * dim)
    return self.out_proj(out), None


def bind(vision_model: torch.nn.Module, on: bool) -> None:
    """Bind (``on``) or unbind :func:`frame_batched_attention_forward` on every vision attention module.

    (``torch.compile`` of whole encoder layers was measured on the H200 and did not pay: 0.448 s vs 0.451 s for
    180 frames of 1,008 patches, slower on 240 frames; only the rotary is compiled.)
    """
    for mod in vision_model.modules():
        if type(mod).__name__ == "VideoLlama3VisionAttention":
            if on:
                mod.forward = types.MethodType(frame_batched_attention_forward, mod)
            elif "forward" in mod.__dict__:
                del mod.forward


def register() -> str:
    """Register the backend with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(FRAME_BATCHED_SDPA, frame_batched_sdpa)
    return FRAME_BATCHED_SDPA
