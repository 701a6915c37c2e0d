"""Turn heads on frozen causal features (plain ``nn.Module``; no lightning).

Every head maps ``x: (B, T, D)`` (B sequences of T rows on the 5 Hz grid, D hidden) to logits ``(B, T, O)`` and
row ``t``'s output depends on rows ``<= t`` only (causal; the linear and MLP heads use row ``t`` alone). The
temporal heads see at most ``context_rows`` rows (``t - context_rows + 1 .. t``; 5 rows = 1 s).

Heads: :class:`LinearHead`, :class:`MLPHead`, :class:`CausalConvHead` (stack of left-padded convolutions whose
receptive field is exactly ``context_rows``), :class:`CausalAttentionHead` (sliding-window causal self-attention with
a learned relative-position bias over the window). :func:`build_head` builds one by name.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HEAD_TYPES = ("linear", "mlp", "causal_conv", "causal_attention")


class LinearHead(nn.Module):
    """Per-row linear probe: (B, T, D) -> (B, T, O)."""

    context_rows = 1

    def __init__(self, in_dim: int, num_outputs: int):
        super().__init__()
        self.norm = nn.LayerNorm(in_dim)
        self.proj = nn.Linear(in_dim, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class MLPHead(nn.Module):
    """Per-row MLP: LayerNorm, ``num_layers`` x (Linear(hidden_dim), GELU, Dropout), Linear(O). (B, T, D) -> (B, T, O)."""

    context_rows = 1

    def __init__(self, in_dim: int, num_outputs: int, hidden_dim: int = 256, num_layers: int = 1, dropout: float = 0.1):
        super().__init__()
        layers: list[nn.Module] = [nn.LayerNorm(in_dim)]
        d = in_dim
        for _ in range(num_layers):
            layers += [nn.Linear(d, hidden_dim), nn.GELU(), nn.Dropout(dropout)]
            d = hidden_dim
        layers.append(nn.Linear(d, num_outputs))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CausalConvHead(nn.Module):
    """Causal temporal convolutions over past rows: (B, T, D) -> (B, T, O).

    Input projection to ``hidden_dim``, then ``num_layers`` residual blocks of a left-padded Conv1d (kernel ``k``)
    + GELU + Dropout, then a per-row linear output. Kernels are chosen so that the receptive field is exactly
    ``context_rows``: ``k = ceil((context_rows - 1) / num_layers) + 1`` for all but the last layer, which takes the
    remainder. Row ``t`` never sees rows ``> t`` (padding is on the left only).

    Raises:
        ValueError: ``context_rows < 1`` or ``num_layers < 1``.
    """

    def __init__(self, in_dim: int, num_outputs: int, hidden_dim: int = 256, num_layers: int = 2,
                 context_rows: int = 10, dropout: float = 0.1):
        super().__init__()
        if context_rows < 1 or num_layers < 1:
            raise ValueError(f"context_rows ({context_rows}) and num_layers ({num_layers}) must be >= 1")
        self.context_rows = context_rows
        span, per = context_rows - 1, -(-(context_rows - 1) // num_layers)
        kernels = []
        for _ in range(num_layers):
            kernels.append(min(per, span) + 1)
            span -= kernels[-1] - 1
        self.kernels = kernels  # sum(k - 1) == context_rows - 1
        self.inp = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, hidden_dim))
        self.convs = nn.ModuleList(nn.Conv1d(hidden_dim, hidden_dim, k) for k in kernels)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Sequential(nn.LayerNorm(hidden_dim), nn.Linear(hidden_dim, num_outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x).transpose(1, 2)  # (B, H, T)
        for conv in self.convs:
            h = h + self.drop(F.gelu(conv(F.pad(h, (conv.kernel_size[0] - 1, 0)))))  # left pad: causal
        return self.out(h.transpose(1, 2))  # (B, T, O)


class CausalAttentionHead(nn.Module):
    """Sliding-window causal self-attention over the last ``context_rows`` rows: (B, T, D) -> (B, T, O).

    Pre-norm transformer blocks (``num_layers``, ``num_heads``, MLP 2x ``hidden_dim``); the attention mask allows
    key ``j`` for query ``i`` iff ``0 <= i - j < context_rows`` and adds a learned bias per distance ``i - j`` (one
    per head), which is the only position information (no absolute positions, so outputs do not depend on where a
    chunk starts). Receptive field: ``num_layers * (context_rows - 1) + 1`` rows.
    """

    def __init__(self, in_dim: int, num_outputs: int, hidden_dim: int = 128, num_layers: int = 1,
                 context_rows: int = 10, num_heads: int = 4, dropout: float = 0.1):
        super().__init__()
        if context_rows < 1 or hidden_dim % num_heads:
            raise ValueError(f"context_rows ({context_rows}) >= 1 and hidden_dim % num_heads == 0 required")
        self.context_rows, self.num_heads = context_rows, num_heads
        self.inp = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, hidden_dim))
        self.rel_bias = nn.Parameter(torch.zeros(num_layers, num_heads, context_rows))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden_dim, num_heads, 2 * hidden_dim, dropout, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(num_layers))
        self.out = nn.Sequential(nn.LayerNorm(hidden_dim), nn.Linear(hidden_dim, num_outputs))

    def _mask(self, layer: int, T: int, B: int, device: torch.device) -> torch.Tensor:
        idx = torch.arange(T, device=device)
        dist = idx[:, None] - idx[None, :]  # (T, T) i - j
        allowed = (dist >= 0) & (dist < self.context_rows)
        bias = self.rel_bias[layer][:, dist.clamp(0, self.context_rows - 1)]  # (heads, T, T)
        mask = bias.masked_fill(~allowed, float("-inf"))
        return mask.repeat(B, 1, 1)  # (B * heads, T, T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        h = self.inp(x)  # (B, T, H)
        for layer, block in enumerate(self.blocks):
            h = block(h, src_mask=self._mask(layer, T, B, x.device))
        return self.out(h)


def build_head(head_type: str, in_dim: int, num_outputs: int, hidden_dim: int = 256, num_layers: int = 1,
               context_rows: int = 10, dropout: float = 0.1, num_heads: int = 4) -> nn.Module:
    """Build a head by name (``HEAD_TYPES``); arguments a head does not use are ignored.

    Raises:
        ValueError: unknown ``head_type``.
    """
    if head_type == "linear":
        return LinearHead(in_dim, num_outputs)
    if head_type == "mlp":
        return MLPHead(in_dim, num_outputs, hidden_dim, num_layers, dropout)
    if head_type == "causal_conv":
        return CausalConvHead(in_dim, num_outputs, hidden_dim, num_layers, context_rows, dropout)
    if head_type == "causal_attention":
        return CausalAttentionHead(in_dim, num_outputs, hidden_dim, num_layers, context_rows, num_heads, dropout)
    raise ValueError(f"unknown head_type {head_type!r}; expected one of {HEAD_TYPES}")
