"""Frame-batched attention for the VideoLLaMA3 vision encoder.

The encoder attends within each frame (``cu_seqlens`` marks frame boundaries in one packed sequence). Outside
flash-attention, transformers runs one SDPA call per frame in a Python loop (27 layers x T frames of small
calls). All frames of one encode share one size, so the packed sequence can be viewed as a batch of T frames and
attended in ONE SDPA call per layer; unequal segments fall back to the per-segment loop. Registered as an
attention backend under :data:`FRAME_BATCHED_SDPA`; the name contains "flash" because transformers routes
packed (``cu_seqlens``) attention only to backends whose name contains it.

Legend: S packed tokens, H heads, d head dim, T frames, N tokens per frame.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

FRAME_BATCHED_SDPA = "flash_compatible_frame_batched_sdpa"


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
    else:
        lengths = (cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).tolist()
    if len(set(lengths)) == 1:
        t, n = len(lengths), lengths[0]
        q, k, v = (x.view(heads, t, n, dim).transpose(0, 1) for x in (query[0], key[0], value[0]))  # (T, H, N, d)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling)            # (T, H, N, d)
        return out.permute(0, 2, 1, 3).reshape(1, seq, heads, dim), None
    outs = []
    for q, k, v in zip(*(x.split(lengths, dim=2) for x in (query, key, value))):
        outs.append(F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling))  # (1, H, n, d)
    return torch.cat(outs, dim=2).transpose(1, 2), None


def register() -> str:
    """Register the backend with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(FRAME_BATCHED_SDPA, frame_batched_sdpa)
    return FRAME_BATCHED_SDPA
