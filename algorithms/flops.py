"""Analytic prefill and decode FLOPs of a decoder-only LLM, in the two conventions used in the literature.

1. **Paper convention** (FastV, Chen et al. 2024; DyCoke, Tao et al. CVPR 2025; OmniZip, Tao et al. 2025),
   counting one multiply-add as **one** operation, with multi-head attention and a 2-matrix FFN::

       prefill(n)  = L * (4 n d^2 + 2 n^2 d + 2 n d m)
       decode(n,R) = sum_{i=1..R} L * (4 d^2 + 2 (n + i) d + 2 d m)

   (L layers, d hidden, m FFN intermediate, n prefill tokens, R decoded tokens; the i-th decoded token
   attends to ``n + i`` keys). Nothing else is counted (no lm_head, no GQA, no gate projection). With the
   **visual / multimodal tokens only** as ``n`` this reproduces the published figures:
   DyCoke, LLaVA-OV-7B (Qwen2-7B LLM), 32 frames x 196 = 6,272 tokens, R = 100: 41.4 TFLOPs
   (40.77 prefill + 0.65 decode); OmniZip, Qwen2.5-Omni-7B, 10,000 tokens, R = 100: 73.2 TFLOPs
   (72.48 + 0.73). The papers leave the text prompt out of ``n``.

2. **Accurate convention** (:func:`prefill_flops`, :func:`decode_flops`): FLOPs = 2 x multiply-adds over
   **every matrix product the model runs**, as ``torch.utils.flop_counter.FlopCounterMode`` counts them
   for a transformers Qwen2 / Qwen2.5-Omni thinker text model in eager or SDPA attention:

   * per layer: q/k/v/o projections with GQA shapes (``2 n d (H + 2 H_kv) h + 2 n H h d``),
     attention scores ``Q K^T`` and ``P V`` over the **full** ``n x c`` rectangle per query head
     (``4 H n c h``; dense kernels compute masked entries too, so causality does not halve it — a flash
     kernel would skip about half of the prefill square),
     SwiGLU MLP gate, up, down (``6 n d m``);
   * lm_head on the positions whose logits are computed (``2 p d V``; ``p = n`` for a plain forward,
     ``p = 1`` when generation keeps only the last logits).

   Not counted (not matrix products): embeddings lookup, RMSNorm, rotary frequencies and their application
   (``inv_freq @ position_ids`` has inner size 1 and runs as a broadcast multiply, which
   ``FlopCounterMode`` does not count), softmax, SiLU, element-wise products, residual adds and bias adds
   (folded into ``addmm``, which ``FlopCounterMode`` counts as the matmul alone).

   Measuring caveat: on CPU, ``FlopCounterMode`` does not see attention run through
   ``scaled_dot_product_attention`` (the CPU flash kernel has no FLOP formula registered), so measured
   prefill on CPU must use ``attn_implementation="eager"``; on CUDA the flash / efficient SDPA kernels are
   counted (as the full rectangle).

Seed 003's log line (Qwen2.5-Omni-3B, one WorldSense video): "Prefill dvOkwKAs.mp4: tflops=44.279911081268",
"Generate ...: tflops=44.292256054998", "Decode ...: tflops=0.01234497373". What it fixes: generate = prefill + decode
to the FLOP (44,279,911,081,268 + 12,344,973,730 = 44,292,256,054,998), and the decode is about two decoded tokens of
the 3B thinker's matmuls: ``2 * prefill_flops(3b, 1, 1) = 12,343,377,920``, 1,595,810 FLOPs (0.013 %) short, far
less than the 294,912 FLOPs per context token that decode attention over a ~6,000-token cache would add. What it
does not fix: no integer token count reproduces the prefill under either convention here (accurate, lm_head on 1
position: between n = 6,040 and 6,041; on all n: 5,649-5,650; paper form: 11,351-11,352; twice the paper form:
6,841-6,842), nor under the variants tried (MHA instead of GQA, 2-matrix MLP, biases, causal half attention,
``2 N_params`` per token plus a Kaplan-style attention term, decode counted as ``F(n + R) - F(n)``). The log's
counter evidently leaves decode attention (nearly) out and may count the encoders or element-wise ops in the
prefill; the video's token count is not in the log, so the formula cannot be identified from it.

Model shapes (:data:`PRESETS`), from the published ``config.json`` files / transformers defaults:

============================ ==== ===== ====== === ==== ==== ======== ===============================
preset                       L    d     m      H   H_kv h    V        source
============================ ==== ===== ====== === ==== ==== ======== ===============================
qwen2-7b (LLaVA-OV-7B LLM)   28   3584  18944  28  4    128  152064   Qwen2-7B config
qwen2.5-omni-7b (thinker)    28   3584  18944  28  4    128  152064   Qwen2_5OmniTextConfig defaults
qwen2.5-omni-3b (thinker)    36   2048  11008  16  2    128  151936   Qwen2.5-Omni-3B = Qwen2.5-3B LLM
============================ ==== ===== ====== === ==== ==== ======== ===============================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ModelShape",
    "PRESETS",
    "get_shape",
    "paper_prefill_flops",
    "paper_decode_flops",
    "paper_total_flops",
    "prefill_flops",
    "decode_flops",
    "extend_flops",
    "decode_token_flops",
    "weight_bytes",
    "kv_cache_bytes",
    "decode_token_bytes",
    "NO_ATTENTION",
]


@dataclass(frozen=True)
class ModelShape:
    """Shapes of a decoder-only LLM that determine its matmul FLOPs.

    Attributes:
        name: preset name.
        num_layers: L.
        hidden_size: d.
        intermediate_size: m (SwiGLU width).
        num_heads: H, query heads.
        num_kv_heads: H_kv (GQA).
        head_dim: h (``d // H`` for Qwen2).
        vocab_size: V (lm_head rows).
        rope_rows: position rows of the rotary embedding (1 RoPE, 3 M-RoPE / TMRoPE); descriptive only.
    """

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_rows: int = 1


PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        ModelShape("qwen2-7b", 28, 3584, 18944, 28, 4, 128, 152064, rope_rows=1),
        ModelShape("qwen2.5-omni-7b", 28, 3584, 18944, 28, 4, 128, 152064, rope_rows=3),
        ModelShape("qwen2.5-omni-3b", 36, 2048, 11008, 16, 2, 128, 151936, rope_rows=3),
    )
}


def get_shape(name: str) -> ModelShape:
    """Preset by name (``qwen2-7b``, ``qwen2.5-omni-7b``, ``qwen2.5-omni-3b``); ``KeyError`` otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model shape {name!r}; known: {sorted(PRESETS)}") from None


def _check(n: int, what: str = "num_tokens") -> None:
    if n < 0:
        raise ValueError(f"{what} must be >= 0, got {n}")


# ------------------------------------------------------------------------------- paper convention
def paper_prefill_flops(shape: ModelShape, num_tokens: int) -> int:
    """``L (4 n d^2 + 2 n^2 d + 2 n d m)``: prefill multiply-adds in the FastV/DyCoke/OmniZip form.

    Raises:
        ValueError: ``num_tokens < 0``.
    """
    _check(num_tokens)
    n, d, m = num_tokens, shape.hidden_size, shape.intermediate_size
    return shape.num_layers * (4 * n * d * d + 2 * n * n * d + 2 * n * d * m)


def paper_decode_flops(shape: ModelShape, num_tokens: int, num_decode: int) -> int:
    """``sum_{i=1..R} L (4 d^2 + 2 (n + i) d + 2 d m)``: decode multiply-adds with a KV cache, paper form.

    Raises:
        ValueError: negative counts.
    """
    _check(num_tokens)
    _check(num_decode, "num_decode")
    n, d, m, r = num_tokens, shape.hidden_size, shape.intermediate_size, num_decode
    context_sum = r * n + r * (r + 1) // 2  # sum of (n + i), i = 1..R
    return shape.num_layers * (r * (4 * d * d + 2 * d * m) + 2 * d * context_sum)


def paper_total_flops(shape: ModelShape, num_tokens: int, num_decode: int = 100) -> int:
    """Prefill + decode in the paper convention (the "TFLOPs" columns of DyCoke / OmniZip)."""
    return paper_prefill_flops(shape, num_tokens) + paper_decode_flops(shape, num_tokens, num_decode)


# ---------------------------------------------------------------------------- accurate convention
def _layer_flops(shape: ModelShape, num_new: int, context: int, attention: bool = True) -> int:
    """FLOPs (2 x MACs) of one layer for ``num_new`` query tokens attending ``context`` keys (``attention=False``:
    the weight matmuls only, :data:`NO_ATTENTION`)."""
    d, h, hq, hkv, m = shape.hidden_size, shape.head_dim, shape.num_heads, shape.num_kv_heads, shape.intermediate_size
    proj = 2 * num_new * d * (hq + 2 * hkv) * h + 2 * num_new * hq * h * d
    attn = 4 * hq * num_new * context * h if attention else 0
    mlp = 6 * num_new * d * m
    return proj + attn + mlp


# The counting convention seed 003's log evidently used for its decode (module docstring): the accurate convention
# without the attention products ``Q K^T`` and ``P V`` (weight matmuls and lm_head only). Its decode figure,
# 12,344,973,730 FLOPs, is 2.0004 one-token forwards of the 3B thinker counted so (6,171,394,048 each); with
# attention over a ~6,000-token cache each step would add ~1.8e9. Pass ``attention=False`` to the accurate functions.
NO_ATTENTION = "no_attention"


def prefill_flops(shape: ModelShape, num_tokens: int, num_logit_positions: int | None = None,
                  attention: bool = True) -> int:
    """Accurate prefill FLOPs (2 x multiply-adds) over every matmul of the forward pass.

    Args:
        shape: model shape.
        num_tokens: n, prefill tokens (all of them: text, video, audio).
        num_logit_positions: positions that go through lm_head; ``None`` = all ``n`` (a plain
            ``model(input_ids)`` forward), 1 for ``generate``'s prefill, 0 to leave lm_head out.
        attention: count the attention products; ``False``: the :data:`NO_ATTENTION` convention.

    Returns:
        ``L * layer(n, n) + 2 * p * d * V``.

    Raises:
        ValueError: negative counts.
    """
    _check(num_tokens)
    p = num_tokens if num_logit_positions is None else num_logit_positions
    _check(p, "num_logit_positions")
    layers = shape.num_layers * _layer_flops(shape, num_tokens, num_tokens, attention)
    return layers + 2 * p * shape.hidden_size * shape.vocab_size


def decode_flops(shape: ModelShape, num_tokens: int, num_decode: int, with_lm_head: bool = True,
                 attention: bool = True) -> int:
    """Accurate FLOPs of ``num_decode`` single-token steps after an ``num_tokens`` prefill (KV cache).

    Step ``i = 1..R`` runs one token against ``n + i`` keys (the cache plus itself) and, if
    ``with_lm_head``, one lm_head row. ``attention=False``: the :data:`NO_ATTENTION` convention (each step then
    costs the same whatever the cache).

    Raises:
        ValueError: negative counts.
    """
    _check(num_tokens)
    _check(num_decode, "num_decode")
    total = 0
    per_step = 2 * shape.hidden_size * shape.vocab_size if with_lm_head else 0
    for i in range(1, num_decode + 1):
        total += shape.num_layers * _layer_flops(shape, 1, num_tokens + i, attention) + per_step
    return total


# ------------------------------------------------------------------------------ cached extension and decode costs
def extend_flops(shape: ModelShape, num_new: int, context: int, num_logit_positions: int | None = None,
                 causal: bool = False, attention: bool = True) -> int:
    """FLOPs (2 x multiply-adds) of prefilling ``num_new`` tokens on top of ``context`` cached tokens (a question
    suffix after a prefilled video prefix), one sequence.

    Each new token attends the cache and the new tokens: with ``causal=False`` the full ``num_new x (context +
    num_new)`` rectangle (a dense kernel, ``FlopCounterMode``'s count), with ``causal=True`` only the keys up to
    itself, ``num_new * context + num_new (num_new + 1) / 2`` query-key pairs in all (what a flash kernel computes;
    the floor's count). Weight matmuls per layer as :func:`_layer_flops`.

    Args:
        shape: model shape.
        num_new: n, tokens prefilled now.
        context: c, tokens already in the KV cache.
        num_logit_positions: positions that go through lm_head; ``None`` = all ``n``, 1 = the last one only.
        causal: count the causal triangle of the new tokens (see above).
        attention: count the attention products (``False``: the :data:`NO_ATTENTION` convention).

    Returns:
        ``L * layer(n, c + n) + 2 p d V`` (``causal``: the attention term over the pairs above).
        ``extend_flops(s, n, 0) == prefill_flops(s, n)`` and ``extend_flops(s, 1, c, 1) ==
        decode_token_flops(s, c + 1)``.

    Raises:
        ValueError: negative counts.
    """
    _check(num_new, "num_new")
    _check(context, "context")
    p = num_new if num_logit_positions is None else num_logit_positions
    _check(p, "num_logit_positions")
    if causal and attention:
        pairs = num_new * context + num_new * (num_new + 1) // 2
        layer = _layer_flops(shape, num_new, 0) + 4 * shape.num_heads * shape.head_dim * pairs
    else:
        layer = _layer_flops(shape, num_new, context + num_new, attention)
    return shape.num_layers * layer + 2 * p * shape.hidden_size * shape.vocab_size


def decode_token_flops(shape: ModelShape, context: int, with_lm_head: bool = True) -> int:
    """FLOPs of one single-token forward attending ``context`` keys (the KV cache plus the token itself), with one
    lm_head row (``with_lm_head``): ``L * layer(1, context) + 2 d V``. The ``i``-th step of
    :func:`decode_flops` after an ``n``-token prefill is ``decode_token_flops(shape, n + i)``.

    Raises:
        ValueError: ``context < 1``.
    """
    if context < 1:
        raise ValueError(f"context must be >= 1 (the token itself), got {context}")
    lm = 2 * shape.hidden_size * shape.vocab_size if with_lm_head else 0
    return shape.num_layers * _layer_flops(shape, 1, context) + lm


def weight_bytes(shape: ModelShape, dtype_bytes: int = 2, with_lm_head: bool = True) -> int:
    """Bytes of the weight matrices one forward reads: per layer q/k/v/o (``d (H + 2 H_kv) h + H h d``) and the
    SwiGLU gate, up, down (``3 d m``), plus lm_head (``V d``) when ``with_lm_head``; times ``dtype_bytes`` (2 for
    bf16). Not counted: the embedding table (a forward reads one row per token), norms and the q/k/v biases
    (``(H + 2 H_kv) h + 2 d`` per layer: under 0.01 % of a 7B layer)."""
    d, h, hq, hkv, m = shape.hidden_size, shape.head_dim, shape.num_heads, shape.num_kv_heads, shape.intermediate_size
    per_layer = d * (hq + 2 * hkv) * h + hq * h * d + 3 * d * m
    return dtype_bytes * (shape.num_layers * per_layer + (shape.vocab_size * d if with_lm_head else 0))


def kv_cache_bytes(shape: ModelShape, tokens: int, dtype_bytes: int = 2) -> int:
    """Bytes of the keys and values of ``tokens`` positions over all layers: ``2 L H_kv h tokens dtype_bytes``.

    Raises:
        ValueError: ``tokens < 0``.
    """
    _check(tokens, "tokens")
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * tokens * dtype_bytes


def decode_token_bytes(shape: ModelShape, context: int, dtype_bytes: int = 2, with_lm_head: bool = True) -> int:
    """Bytes one single-token forward must read from memory: the weights once (:func:`weight_bytes`) and the KV
    cache of all ``context`` keys it attends (:func:`kv_cache_bytes`). Decoding is bandwidth-bound (a few FLOPs per
    byte), so its floor time is ``bytes / bandwidth``. Activations, and the one new key/value row written, are left
    out (a few kB).

    Raises:
        ValueError: ``context < 0``.
    """
    return weight_bytes(shape, dtype_bytes, with_lm_head) + kv_cache_bytes(shape, context, dtype_bytes)
