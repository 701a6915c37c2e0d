"""Shared-prefix attention for answering several questions from one prefilled video prefix.

Every question row of a batched answer attends to the same prefix of ``L`` tokens (system + video, up to 16k
rows) and to its own short suffix (question + generated tokens). Attention is split exactly in two, as in
Hydragen (Juravsky et al., 2024, "Hydragen: High-Throughput LLM Inference with Shared Prefixes") and cascade
attention (FlashInfer):

    prefix part : all Q rows' queries (and the n_rep query heads that share one KV head under GQA) folded into ONE
                  query sequence per KV head, attended over the prefix keys once — no mask, no per-row copy of
                  the prefix cache, one read of the prefix keys/values per layer;
    suffix part : each row's queries over its own suffix keys with the row's mask (pads hidden, causal);
    merge       : the two partial softmaxes combined through their log-sum-exp (exact in real arithmetic).

The prefix keys/values stay in the prefill's cache (batch 1); only the suffix region lives in a small batch-Q
``StaticCache``. The function is registered as a transformers attention backend (:data:`SHARED_PREFIX_SDPA`) and
finds the prefix of the layer being run through :func:`shared_prefix`. On CUDA in bf16/fp16 the prefix part is
PyTorch's flash-attention kernel (which returns the log-sum-exp); elsewhere (CPU, fp32) the same math runs
explicitly in float32.

Legend: Q question rows, H query heads, G = H / Hkv query heads per KV head, s query tokens per row,
L prefix tokens, S suffix-region keys, d head dim.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ..kernels import Fusable

SHARED_PREFIX_SDPA = "shared_prefix_sdpa"
_PREFIX: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # layer_idx -> prefix (keys, values), (1, Hkv, L, d)
# layer_idx -> the same prefix in a fixed-capacity buffer (keys, values (C, Hkv, d), used (1,) int32, cu_k, cu_q (2,)
# int32), read by the one-token decode steps (models.videollama3.decode_slots)
_BOUNDED: dict[int, tuple] = {}


@contextlib.contextmanager
def shared_prefix(layers, bounded: dict[int, tuple] | None = None):
    """Make the prefix keys/values of every layer visible to :func:`shared_prefix_sdpa` inside the block.

    Args:
        layers: the prefill cache's layers (``DynamicCache.layers``), layer ``i`` with ``keys``/``values`` of shape
            (1, Hkv, L, d).
        bounded: layer -> ``(keys, values, used, cu_k, cu_q)``, the same prefix copied into a fixed-capacity buffer
            (:meth:`models.videollama3.decode_slots.PrefixBuffer.bounded`); the decode steps (one query token per
            row) then attend through :func:`bounded_prefix_part`, whose addresses and launch sizes do not depend on L.
    """
    old, old_bounded = dict(_PREFIX), dict(_BOUNDED)
    _PREFIX.clear()
    _PREFIX.update({i: (layer.keys, layer.values) for i, layer in enumerate(layers)})
    _BOUNDED.clear()
    _BOUNDED.update(bounded or {})
    try:
        yield
    finally:
        _PREFIX.clear()
        _PREFIX.update(old)
        _BOUNDED.clear()
        _BOUNDED.update(old_bounded)


def _partial_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                  scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 attention that also returns the log-sum-exp.

    Args:
        q: (B, Hkv, M, d); k, v: (B, Hkv, S, d); mask: additive, broadcastable to (B, Hkv, M, S), or None.

    Returns:
        ``(out (B, Hkv, M, d) float32, lse (B, Hkv, M) float32)``.
    """
    b, h, m, d = q.shape
    qf, kf = q.float().reshape(b * h, m, d), k.float().reshape(b * h, -1, d)
    if mask is None:
        scores = torch.bmm(qf, kf.transpose(1, 2)).mul_(scaling)
    else:
        bias = mask.float().expand(b, h, m, kf.shape[1]).reshape(b * h, m, -1)
        scores = torch.baddbmm(bias, qf, kf.transpose(1, 2), alpha=scaling)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.bmm(torch.softmax(scores, dim=-1), v.float().reshape(b * h, -1, d))
    return out.view(b, h, m, d), lse.view(b, h, m)


def _flash_ok(q: torch.Tensor) -> bool:
    """PyTorch's flash kernel can run ``q``: CUDA sm80+, half precision, head dim a multiple of 8 up to 256, and the
    flash SDPA backend not disabled."""
    return (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] % 8 == 0
            and q.shape[-1] <= 256 and torch.backends.cuda.flash_sdp_enabled()
            and torch.cuda.get_device_capability(q.device)[0] >= 8)


def _prefix_part(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float):
    """Unmasked attention of folded queries (1, Hkv, M, d) over the prefix (1, Hkv, L, d): (out, lse) in fp32."""
    if _flash_ok(q):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scaling)[:2]
        return out.float(), lse.float()
    return _partial_math(q, k, v, None, scaling)


@functools.cache
def _varlen_flash_takes_seqused_k() -> bool:
    """Whether this PyTorch's ``aten::_flash_attention_forward`` takes ``seqused_k`` (the variable-length kernel's
    valid key counts; ``torch.nn.attention.varlen.varlen_attn`` exposes it only from torch 2.14)."""
    try:
        return "seqused_k" in str(torch.ops.aten._flash_attention_forward.default._schema)
    except (AttributeError, RuntimeError):
        return False


def bounded_prefix_part(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, used: torch.Tensor,
                        cu_k: torch.Tensor, cu_q: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_prefix_part` over a prefix held in a fixed-capacity buffer whose valid row counts are on the device,
    so the launch does not depend on L (what a CUDA graph replayed for many prefixes needs).

    Split-KV by hand: the buffer's C rows are S equal chunks (:class:`~models.videollama3.decode_slots.PrefixBuffer`),
    each attended by all M folded queries, and the S partial softmaxes are merged through their log-sum-exp (exact in
    real arithmetic, as the prefix / suffix merge of :func:`shared_prefix_sdpa`). Without the split one sequence of
    M <= 128 queries runs on Hkv thread blocks: measured on the H200, 281 us per layer and decode step over a
    16k-key prefix, where the dense kernel splits the keys by itself.

    Per chunk, on CUDA in half precision: FlashAttention's variable-length kernel (``aten::_flash_attention_forward``,
    what ``torch.nn.attention.varlen.varlen_attn`` calls) with ``seqused_k = used``: the key blocks past a chunk's
    valid rows are not visited. On another device, or where the kernel takes no ``seqused_k``: the float32 math of
    :func:`_partial_math` with the rows past ``used`` masked by ``-inf`` (exactly zero weight). A chunk without valid
    rows gets weight zero. On the CPU (nothing is captured there, and the counts are host memory) the math attends
    the first L rows as one sequence: :func:`_prefix_part`'s inputs and arithmetic.

    Args:
        q: (1, Hkv, M, d) folded queries.
        keys, values: (C, Hkv, d) buffers, C = S x chunk.
        used: (S,) int32, the valid keys of each chunk (the first L rows of the buffer in all).
        cu_k, cu_q: (S + 1,) int32 ``[0, chunk, ..., C]`` and ``[0, M, ..., S M]`` (the kernel's offsets).

    Returns:
        ``(out (1, Hkv, M, d), lse (1, Hkv, M))`` in float32, as :func:`_prefix_part`.
    """
    if q.device.type == "cpu":   # the host holds the counts (no graph to capture): the exact prefix, no padding
        n = int(used.sum())
        return _partial_math(q, keys[:n].permute(1, 0, 2)[None], values[:n].permute(1, 0, 2)[None], None, scaling)
    return split_prefix_part(q, keys, values, used, cu_k, cu_q, scaling)


def split_prefix_part(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, used: torch.Tensor,
                      cu_k: torch.Tensor, cu_q: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`bounded_prefix_part` on a device: the S chunks attended apart (varlen flash, or the masked float32 math)
    and merged through their log-sum-exp, with no host read of the counts (arguments and returns as there)."""
    _, kv_heads, m, d = q.shape
    splits, cap = used.shape[0], keys.shape[0]
    chunk = cap // splits
    if _flash_ok(q) and _varlen_flash_takes_seqused_k():
        q_rep = q[0].transpose(0, 1).repeat(splits, 1, 1)                       # (S M, Hkv, d)
        out, lse = torch.ops.aten._flash_attention_forward(
            q_rep, keys, values, cu_q, cu_k, m, chunk, 0.0, False, False, scale=scaling, seqused_k=used)[:2]
        out = out.view(splits, m, kv_heads, d).transpose(1, 2).float()          # (S, Hkv, M, d)
        # lse: (Hkv, S M) unpadded, or (S, Hkv, M) in kernels that pad it per sequence
        lse = (lse.view(kv_heads, splits, m).transpose(0, 1) if lse.dim() == 2 else lse).float()
    else:
        mask = torch.zeros(splits, 1, 1, chunk, dtype=torch.float32, device=q.device).masked_fill(
            (torch.arange(chunk, device=q.device)[None] >= used[:, None]).view(splits, 1, 1, chunk), float("-inf"))
        out, lse = _partial_math(q.expand(splits, -1, -1, -1), keys.view(splits, chunk, kv_heads, d).transpose(1, 2),
                                 values.view(splits, chunk, kv_heads, d).transpose(1, 2), mask, scaling)
    filled = (used > 0).view(splits, 1, 1)
    lse = torch.where(filled, lse, float("-inf"))                               # an empty chunk: weight 0
    total = torch.logsumexp(lse, 0)                                             # (Hkv, M)
    weight = torch.exp(lse - total)
    out = (torch.where(filled[..., None], out, 0.0) * weight[..., None]).sum(0)
    return out[None], total[None]


def shared_prefix_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       **kwargs) -> tuple[torch.Tensor, None]:
    """Attention over [shared prefix | own suffix region] for Q rows (a transformers attention backend).

    Args:
        module: the attention module (``layer_idx`` selects the prefix, ``num_key_value_groups`` = G).
        query: (Q, H, s, d).
        key, value: (Q, Hkv, S, d) — the suffix region as returned by the suffix ``StaticCache``.
        attention_mask: additive (Q, 1, s, S) mask of the suffix region (prefix keys are always visible).

    Returns:
        ``(out (Q, s, H, d), None)`` in the query dtype.

    Raises:
        RuntimeError: no prefix registered for this layer (called outside :func:`shared_prefix`).
        NotImplementedError: a sliding-window layer or attention dropout (the split assumes full attention).
    """
    if module.layer_idx not in _PREFIX:
        raise RuntimeError(f"shared_prefix_sdpa: no prefix for layer {module.layer_idx}; use shared_prefix(...)")
    if kwargs.get("sliding_window") is not None or dropout:
        raise NotImplementedError("shared_prefix_sdpa: sliding-window layers and attention dropout are not supported")
    pk, pv = _PREFIX[module.layer_idx]
    rows, heads, s, d = query.shape
    kv_heads = key.shape[1]
    g = heads // kv_heads
    scale = float(scaling if scaling is not None else d ** -0.5)
    # prefix: fold (rows, G, s) into one query axis per KV head; query head h = kv * G + j (repeat_kv's layout)
    folded = query.view(rows, kv_heads, g, s, d).permute(1, 0, 2, 3, 4).reshape(1, kv_heads, rows * g * s, d)
    bounded = _BOUNDED.get(module.layer_idx) if s == 1 else None
    if bounded is not None:   # the decode step: the prefix at fixed addresses (one graph for many prefixes)
        out_p, lse_p = bounded_prefix_part(folded, *bounded, scale)
    else:
        out_p, lse_p = _prefix_part(folded, pk, pv, scale)
    # the decode step (s = 1, every step, inside the CUDA graph) runs the compiled chain; the question suffixes
    # (s = n, once per layer and (video, budget)) the same math eagerly: one compiled graph, not two
    if s == 1:
        # one layout for the compiled graph, which guards on strides: the projection's transposed view (Q, H, 1, d)
        # has stride H d on its size-1 axis where a contiguous tensor has d; squeeze + unsqueeze is the same memory
        # with the contiguous strides (no copy), whichever rotary kernel produced the query
        return _suffix_and_merge(query.squeeze(2).unsqueeze(2), key, value, attention_mask, out_p, lse_p, scale), None
    return _suffix_and_merge_math(query, key, value, attention_mask, out_p, lse_p, scale), None


def _suffix_and_merge_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, out_p: torch.Tensor, lse_p: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """The suffix part and the merge (one fused kernel chain on CUDA, see :data:`_suffix_and_merge`).

    Args:
        query: (Q, H, s, d); key, value: (Q, Hkv, S, d); attention_mask: additive (Q, 1, s, S) or None;
        out_p, lse_p: the prefix part over the folded queries, (1, Hkv, Q G s, d) and (1, Hkv, Q G s) float32.

    Returns:
        (Q, s, H, d) in the query dtype.
    """
    rows, heads, s, d = query.shape
    kv_heads = key.shape[1]
    g = heads // kv_heads
    out_p = out_p.view(kv_heads, rows, g, s, d).permute(1, 0, 2, 3, 4).reshape(rows, heads, s, d)
    lse_p = lse_p.view(kv_heads, rows, g, s).permute(1, 0, 2, 3).reshape(rows, heads, s)
    # suffix: per row, grouped heads against their KV head, with the row's mask
    q_g = query.reshape(rows, kv_heads, g * s, d)
    mask = attention_mask.view(rows, 1, 1, s, -1).expand(rows, kv_heads, g, s, -1).reshape(rows, kv_heads, g * s, -1) \
        if attention_mask is not None else None
    out_s, lse_s = _partial_math(q_g, key, value, mask, scale)
    out_s, lse_s = out_s.view(rows, heads, s, d), lse_s.view(rows, heads, s)
    # merge the two softmaxes: weight of the prefix part = e^lse_p / (e^lse_p + e^lse_s) = sigmoid(lse_p - lse_s)
    out = torch.lerp(out_s, out_p, torch.sigmoid(lse_p - lse_s)[..., None])
    return out.to(query.dtype).transpose(1, 2).contiguous()


# the suffix part and the merge are ~20 small kernels per layer and decode step in eager mode; compiled on CUDA
_suffix_and_merge = Fusable(_suffix_and_merge_math, "shared-prefix suffix+merge",
                            dynamic=((0, 2), (0, 2), (0, 2), (0, 2, 3), (2,), (2,)))


def decode_step_stand_ins(rows: int, heads: int, kv_heads: int, head_dim: int, keys: int, prefix_len: int,
                          dtype: torch.dtype, device: torch.device | str) -> tuple:
    """Random arguments of :data:`_suffix_and_merge` as :func:`shared_prefix_sdpa` passes them in a decode step, in
    the same layouts (a compiled graph guards on strides as well as shapes): the query, the suffix keys / values and
    the mask contiguous (the decode step hands the query over with contiguous strides), the prefix part computed by
    :func:`bounded_prefix_part` itself over the folded query, as the decode step computes it (on CUDA in half
    precision the variable-length flash kernel's output layout).

    Returns:
        ``(query (Q, H, 1, d), key, value (Q, Hkv, S, d), mask (Q, 1, 1, S), out_p (1, Hkv, Q G, d), lse_p
        (1, Hkv, Q G), scale)`` with ``S = keys``; the prefix part attends over ``prefix_len`` random keys.
    """
    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    query = randn(rows, heads, 1, head_dim)
    key, value = randn(rows, kv_heads, keys, head_dim), randn(rows, kv_heads, keys, head_dim)
    mask = torch.zeros(rows, 1, 1, keys, device=device, dtype=dtype)
    g = heads // kv_heads
    scale = float(head_dim ** -0.5)
    folded = query.view(rows, kv_heads, g, 1, head_dim).permute(1, 0, 2, 3, 4).reshape(1, kv_heads, rows * g, head_dim)
    # the decode step's prefix part reads a fixed-capacity buffer (models.videollama3.decode_slots)
    from .decode_slots import PREFIX_BUCKET, PrefixBuffer, bucket

    buf = PrefixBuffer(1, bucket(prefix_len, PREFIX_BUCKET), kv_heads, head_dim, dtype, device)
    buf.keys[0].normal_(), buf.values[0].normal_()
    buf.set_length(prefix_len)
    out_p, lse_p = bounded_prefix_part(folded, buf.keys[0], buf.values[0], buf.used, buf.cu_k,
                                       buf.cu_q(rows * g), scale)
    return query, key, value, mask, out_p, lse_p, scale


def register() -> str:
    """Register the backend with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(SHARED_PREFIX_SDPA, shared_prefix_sdpa)
    return SHARED_PREFIX_SDPA
