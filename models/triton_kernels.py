"""The fused elementwise kernels written directly in Triton: the library's eager math, its roundings included, with no
``torch.compile`` (no TorchDynamo tracing, no Inductor set-up) before the first call.

Why (issue 41): with ``torch.compile`` the fused kernels of :mod:`models.kernels` cost the first answer a
compilation of 13-14.5 s with a warm Inductor cache (20.5 s cold) on the H100, in the process's one GIL beside the
weight load; 5 s of it is Inductor's one-time registrations, 2.3 s generated-code compiling, 1.3 s sympy
(``docs/performance.md``, sessions 2-10). A ``triton.jit`` kernel is compiled by Triton alone at its first call
for each specialization and then read from Triton's own on-disk cache (``~/.triton/cache``, ``TRITON_CACHE_DIR``).

Each kernel follows the eager function it replaces operation by operation, rounding to the tensors' dtype where the
eager code does (an eager ``bf16 * bf16`` computes in float32 and rounds once; so does each step here), reductions in
float32 as the library's kernels keep them:

* :func:`rms_norm` — ``Qwen2RMSNorm.forward``: ``weight * (x.float() * rsqrt(mean(x², -1) + eps)).to(x.dtype)``.
* :func:`silu_mul` — the gated MLP's ``act_fn(gate_proj(x)) * up_proj(x)``: ``silu`` rounded, then the product.
* :func:`rope_rows` — ``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin`` with each product and the sum
  rounded (cos, sin in q's dtype).
* :func:`vision_rotary` — ``apply_rotary_pos_emb_vision``: the same in float32 (cos, sin float32), cast once.
* :func:`add_layer_norm` — ``residual + x`` rounded, then ``F.layer_norm`` of that sum (statistics in float32).

Elementwise results equal the eager ones bit for bit wherever the two evaluate the same float32 expression (a
product of two half-precision numbers is exact in float32, and rounding it before the sum keeps the GPU compiler
from fusing the multiply and the add); the reductions (mean square, LayerNorm statistics) sum in another order,
``exp``/``rsqrt`` are the GPU's fast forms (as Inductor's kernels use them), and the vision rotary's float32
``q cos + rot sin`` becomes a fused multiply-add: one step of the output dtype at most, on few elements. Measured on
the H100 at the 7B sizes in bfloat16 (``bench/triton_kernels_check.py``, session 11): 0 to 2e-5 of the elements
differ from eager, against 26-34 % for ``torch.compile``'s kernels of the LLM's RMSNorm, SiLU gate and rotary
(Inductor rounds once at the end); each kernel's GPU time at or below Inductor's (add + LayerNorm 0.095 against
0.176 ms).

Each wrapper takes what the eager function takes and returns what it returns; it raises :class:`Unsupported` for
arguments it does not handle (dtypes other than float16/bfloat16/float32, mixed dtypes the eager code would promote,
a width above :data:`MAX_WIDTH`), and the caller (:class:`models.kernels.Fusable`) runs the eager function for them.
Non-contiguous inputs are copied to contiguous ones first (the same values).

The kernels run on CUDA; ``TRITON_INTERPRET=1`` (set before this module is imported) runs them on CPU tensors with
Triton's interpreter, which is how the CPU tests check them (in float16 and float32: the interpreter's float32 ->
bfloat16 cast truncates instead of rounding to nearest, so bfloat16 is checked on the GPU only).

Legend: N rows, D width (hidden size), H / H_kv query / key-value heads, d head dim, T frames.
"""
from __future__ import annotations

import torch

import triton
import triton.language as tl

__all__ = ["Unsupported", "add_layer_norm", "rms_norm", "rope_rows", "silu_mul", "vision_rotary"]

MAX_WIDTH = 16384     # the widest row one program holds (RMSNorm / LayerNorm width, a head dim)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class Unsupported(ValueError):
    """Arguments these kernels do not take (the caller, :class:`models.kernels.Fusable`, runs the eager math)."""


def _check(*tensors: torch.Tensor, same_dtype: bool = True) -> None:
    for t in tensors:
        if t.dtype not in _DTYPES:
            raise Unsupported(f"dtype {t.dtype}")
    if same_dtype and len({t.dtype for t in tensors}) > 1:
        raise Unsupported(f"mixed dtypes {[t.dtype for t in tensors]}")
    if len({t.device for t in tensors}) > 1:
        raise Unsupported("tensors on several devices")


def _width_block(d: int) -> int:
    if d > MAX_WIDTH:
        raise Unsupported(f"width {d} > {MAX_WIDTH}")
    return triton.next_power_of_2(d)


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


# ---------------------------------------------------------------------------------------------------- RMSNorm
@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, eps, D: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    x = tl.load(x_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / D                                         # xf.pow(2).mean(-1)
    normed = (x * tl.rsqrt(var + eps)).to(x_ptr.dtype.element_ty)           # (xf * rsqrt(var + eps)).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=m, other=0.0)
    out = w.to(tl.float32) * normed.to(tl.float32)                          # weight * ..., rounded once
    tl.store(out_ptr + row * D + offs, out.to(out_ptr.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm on rows: x (..., D), weight (D,) of x's dtype -> (..., D) in x's dtype.

    Raises:
        Unsupported: another dtype or a weight of another dtype (the eager product would promote).
    """
    _check(x, weight)
    d = x.shape[-1]
    if weight.shape != (d,) or x.dim() == 0:
        raise Unsupported(f"weight {tuple(weight.shape)} for x {tuple(x.shape)}")
    rows, weight = x.reshape(-1, d).contiguous(), weight.contiguous()
    out = torch.empty_like(rows)
    if rows.shape[0]:
        block = _width_block(d)
        _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, float(eps), D=d, BLOCK=block, num_warps=_warps(block))
    return out.view(x.shape)


# ---------------------------------------------------------------------------------------------------- SiLU * up
@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, width, g_stride, u_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < width
    g = tl.load(g_ptr + row * g_stride + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * u_stride + cols, mask=m, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)   # F.silu(gate), rounded
    tl.store(out_ptr + row * width + cols, (s * u).to(out_ptr.dtype.element_ty), mask=m)   # * up, rounded


_SILU_BLOCK = 1024


def _rows_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as (rows, width) with unit column stride: a view where the strides allow (the gate and up halves of one
    stacked GEMM output are such row-strided views), else a contiguous copy."""
    t2 = t.reshape(-1, t.shape[-1]) if t.dim() else t.reshape(1, 1)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``: gate, up (..., I) of one shape and dtype -> (..., I) contiguous. Rows may be strided
    (read in place).

    Raises:
        Unsupported: shapes or dtypes that differ (the eager code would broadcast or promote), another dtype.
    """
    _check(gate, up)
    if gate.shape != up.shape or gate.dim() == 0:
        raise Unsupported(f"shapes {tuple(gate.shape)} and {tuple(up.shape)}")
    g2, u2 = _rows_view(gate), _rows_view(up)
    rows, width = g2.shape
    out = torch.empty(gate.shape, device=gate.device, dtype=gate.dtype)
    if rows and width:
        _silu_mul_kernel[(rows, triton.cdiv(width, _SILU_BLOCK))](g2, u2, out, width, g2.stride(0), u2.stride(0),
                                                                   BLOCK=_SILU_BLOCK, num_warps=4)
    return out


# ---------------------------------------------------------------------------------------------------- rotary
@triton.jit
def _rotate(x_ptr, out_ptr, base, c, s, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
            BLOCK_D: tl.constexpr, ROUND_EACH: tl.constexpr):
    """One row's heads: ``x * cos + rotate_half(x) * sin`` (``rotate_half(x) = cat(-x[d/2:], x[:d/2])``)."""
    half: tl.constexpr = HEAD_DIM // 2
    h = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, BLOCK_D)[None, :]
    m = (h < HEADS) & (j < HEAD_DIM)
    partner = tl.where(j < half, j + half, j - half)
    x = tl.load(x_ptr + base + h * HEAD_DIM + j, mask=m, other=0.0).to(tl.float32)
    xp = tl.load(x_ptr + base + h * HEAD_DIM + partner, mask=m, other=0.0).to(tl.float32)
    rot = tl.where(j < half, -xp, xp)
    if ROUND_EACH:   # half-precision eager math: q * cos, rotate_half(q) * sin and their sum each rounded
        a = (x * c).to(out_ptr.dtype.element_ty).to(tl.float32)
        b = (rot * s).to(out_ptr.dtype.element_ty).to(tl.float32)
        y = a + b
    else:            # float32 math (the vision rotary), cast once
        y = x * c + rot * s
    tl.store(out_ptr + base + h * HEAD_DIM + j, y.to(out_ptr.dtype.element_ty), mask=m)


# COS_PERIOD (the token rows, or a frame's patches) is not specialized on: Triton would otherwise compile one kernel
# for 1, one for multiples of 16 and one for the rest, and the early warm-up's stand-ins (19 rows, 40 patches) would
# leave the first video's prefill and encode to compile theirs in the first step
@triton.jit(do_not_specialize=["COS_PERIOD"])
def _rope_rows_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, HQ: tl.constexpr, HK: tl.constexpr,
                      HEAD_DIM: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                      BLOCK_D: tl.constexpr, COS_PERIOD, ROUND_EACH: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_D)[None, :]
    cs_row = row % COS_PERIOD     # the row's position: cos/sin rows repeat every COS_PERIOD rows (vision frames)
    c = tl.load(cos_ptr + cs_row * HEAD_DIM + j, mask=j < HEAD_DIM, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + cs_row * HEAD_DIM + j, mask=j < HEAD_DIM, other=0.0).to(tl.float32)
    _rotate(q_ptr, qo_ptr, row * HQ * HEAD_DIM, c, s, HQ, HEAD_DIM, BLOCK_HQ, BLOCK_D, ROUND_EACH)
    _rotate(k_ptr, ko_ptr, row * HK * HEAD_DIM, c, s, HK, HEAD_DIM, BLOCK_HK, BLOCK_D, ROUND_EACH)


def _rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, period: int, round_each: bool):
    """q (R, H, d), k (R, H_kv, d), cos / sin (P, d) with row r using cos row ``r % period``."""
    rows, hq, d = q.shape
    hk = k.shape[1]
    if d % 2 or k.shape[0] != rows or k.shape[2] != d:
        raise Unsupported(f"q {tuple(q.shape)}, k {tuple(k.shape)}")
    q, k, cos, sin = q.contiguous(), k.contiguous(), cos.contiguous(), sin.contiguous()
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    if rows:
        block_d = _width_block(d)
        block_h = triton.next_power_of_2(max(hq, hk))
        _rope_rows_kernel[(rows,)](q, k, cos, sin, qo, ko, HQ=hq, HK=hk, HEAD_DIM=d,
                                   BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HK=triton.next_power_of_2(hk),
                                   BLOCK_D=block_d, COS_PERIOD=period, ROUND_EACH=round_each,
                                   num_warps=_warps(block_h * block_d // 4))
    return qo, ko


def rope_rows(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers' ``apply_rotary_pos_emb`` on token rows: q (N, H, d), k (N, H_kv, d), cos, sin (N, d), all of one
    dtype -> ``(q_embed (N, H, d), k_embed (N, H_kv, d))``.

    Raises:
        Unsupported: mixed dtypes (the eager code would promote), an odd head dim, mismatched rows.
    """
    _check(q, k, cos, sin)
    if cos.shape != (q.shape[0], q.shape[-1]) or sin.shape != cos.shape:
        raise Unsupported(f"cos {tuple(cos.shape)} for q {tuple(q.shape)}")
    return _rope(q, k, cos, sin, max(q.shape[0], 1), round_each=q.dtype != torch.float32)


def vision_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``apply_rotary_pos_emb_vision`` as :func:`models.vision_attention.rotary_qk` computes it: q, k (..., N, H, d) of
    one dtype, cos / sin float32 of shape (N, 1, d) (broadcast over the leading dims and heads: every frame has the
    same positions) or (..., N, 1, d) (one row per token); float32 math, results cast to q's dtype ->
    ``(q_rot, k_rot)`` of q's shape.

    Raises:
        Unsupported: cos / sin not float32 or of another shape, q and k of other shapes or dtypes.
    """
    _check(q, k)
    _check(cos, sin)
    if cos.dtype != torch.float32 or sin.dtype != torch.float32 or q.shape != k.shape or q.dim() < 3:
        raise Unsupported("vision rotary wants float32 cos/sin and q, k of one shape")
    heads, d = q.shape[-2], q.shape[-1]
    if sin.shape != cos.shape or cos.shape not in ((q.shape[-3], 1, d), (*q.shape[:-2], 1, d)):
        raise Unsupported(f"cos {tuple(cos.shape)} for q {tuple(q.shape)}")
    lead = q.shape[:-2]
    period = cos.numel() // d                # rows of cos: N (repeated per frame) or every token's
    qo, ko = _rope(q.reshape(-1, heads, d), k.reshape(-1, heads, d), cos.reshape(period, d),
                   sin.reshape(period, d), max(period, 1), round_each=False)
    return qo.view(*lead, heads, d), ko.view(*lead, heads, d)


# ---------------------------------------------------------------------------------------------------- add + LayerNorm
@triton.jit
def _add_layer_norm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, sum_ptr, out_ptr, eps, D: tl.constexpr, BLOCK: tl.constexpr,
                           HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    x = tl.load(x_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
    s = (r + x).to(sum_ptr.dtype.element_ty)                                # residual + x, rounded
    tl.store(sum_ptr + row * D + offs, s, mask=m)
    sf = s.to(tl.float32)
    mean = tl.sum(sf, axis=0) / D
    centred = tl.where(m, sf - mean, 0.0)
    var = tl.sum(centred * centred, axis=0) / D                              # biased variance, as F.layer_norm
    y = centred * tl.rsqrt(var + eps)
    if HAS_W:
        y = y * tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + offs, y.to(out_ptr.dtype.element_ty), mask=m)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual + x, layer_norm(residual + x))`` on rows: x, residual (..., D) of one shape and dtype, weight /
    bias (D,) of that dtype or ``None`` -> both (..., D) in x's dtype.

    Raises:
        Unsupported: other shapes or dtypes (the eager code would broadcast or promote).
    """
    _check(x, residual, *(t for t in (weight, bias) if t is not None))
    d = x.shape[-1] if x.dim() else 0
    if (x.dim() == 0 or residual.shape != x.shape
            or any(t is not None and t.shape != (d,) for t in (weight, bias))):
        raise Unsupported(f"x {tuple(x.shape)}, residual {tuple(residual.shape)}")
    rows, res = x.reshape(-1, d).contiguous(), residual.reshape(-1, d).contiguous()
    total, out = torch.empty_like(rows), torch.empty_like(rows)
    if rows.shape[0]:
        block = _width_block(d)
        w = weight.contiguous() if weight is not None else rows
        b = bias.contiguous() if bias is not None else rows
        _add_layer_norm_kernel[(rows.shape[0],)](rows, res, w, b, total, out, float(eps), D=d, BLOCK=block,
                                                 HAS_W=weight is not None, HAS_B=bias is not None,
                                                 num_warps=_warps(block))
    return total.view(x.shape), out.view(x.shape)
