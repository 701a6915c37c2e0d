"""models/triton_kernels.py: the hand-written Triton kernels compute the library's eager math with its roundings.

Run on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``, which must be set before the kernels are
defined, hence a subprocess). In float16 every elementwise result is compared bit for bit with the eager function
the kernel replaces (a product of two float16 numbers is exact in float32, so kernel and eager evaluate the same
float32 expression and round it once, step by step); the reductions may sum in another order (1 ulp). bfloat16 is
checked on the GPU (tests/test_gpu.py): the interpreter truncates float32 -> bfloat16 instead of rounding.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, torch
from models import kernels as K, triton_kernels as T
from models.vision_attention import rotary_qk

def ulps(a, b):
    """largest difference in units of the last place of b (float16)"""
    d = (a.float() - b.float()).abs()
    ulp = torch.finfo(b.dtype).eps * b.float().abs().clamp_min(torch.finfo(b.dtype).tiny)
    return float((d / ulp).max())

torch.manual_seed(0)
out = {}
h = torch.float16
x = torch.randn(2, 7, 96, dtype=h) * 3; w = torch.randn(96, dtype=h)
got, ref = T.rms_norm(x, w, 1e-6), K._rms_norm(x, w, 1e-6)
out["rms"] = [list(got.shape), int((got != ref).sum()), ulps(got, ref)]
g, u = torch.randn(5, 300, dtype=h) * 3, torch.randn(5, 300, dtype=h)
got, ref = T.silu_mul(g, u), K._silu_mul(g, u)
out["silu"] = [int((got != ref).sum()), ulps(got, ref)]
q, k = torch.randn(6, 4, 16, dtype=h), torch.randn(6, 2, 16, dtype=h)
c, s = torch.randn(6, 16, dtype=h), torch.randn(6, 16, dtype=h)
(a, b), (ra, rb) = T.rope_rows(q, k, c, s), K._rope(q, k, c, s)
out["rope"] = [list(a.shape), list(b.shape), int((a != ra).sum() + (b != rb).sum())]
q, k = torch.randn(3, 5, 4, 12, dtype=h), torch.randn(3, 5, 4, 12, dtype=h)
c, s = torch.randn(5, 1, 12), torch.randn(5, 1, 12)
(a, b), (ra, rb) = T.vision_rotary(q, k, c, s), rotary_qk(q, k, c, s)
out["vision_rotary"] = [list(a.shape), int((a != ra).sum() + (b != rb).sum())]
# one cos row per token (T, N, 1, d) instead of one per position
ct, st = torch.randn(3, 5, 1, 12), torch.randn(3, 5, 1, 12)
(a, b), (ra, rb) = T.vision_rotary(q, k, ct, st), rotary_qk(q, k, ct, st)
out["vision_rotary_per_token"] = int((a != ra).sum() + (b != rb).sum())
# the gate and up halves of one stacked GEMM output: row-strided views, read in place
gu = torch.randn(2, 7, 2 * 300, dtype=h) * 3
gate_v, up_v = gu.chunk(2, dim=-1)
got = T.silu_mul(gate_v, up_v)
out["silu_strided"] = [list(got.shape), bool(got.is_contiguous()), int((got != T.silu_mul(gate_v.contiguous(), up_v.contiguous())).sum())]
x, r = torch.randn(9, 72, dtype=h), torch.randn(9, 72, dtype=h) * 8
w, bb = torch.randn(72, dtype=h), torch.randn(72, dtype=h)
res = []
for W, B in ((w, bb), (w, None), (None, None)):
    (s1, n1), (s2, n2) = T.add_layer_norm(x, r, W, B, 1e-6), K._add_layer_norm(x, r, W, B, 1e-6)
    res.append([int((s1 != s2).sum()), ulps(n1, n2)])
out["add_layer_norm"] = res
# a strided q (the transposed view the attention hands over) gives the values of its contiguous copy
qt = torch.randn(6, 16, 4, dtype=h).transpose(1, 2)
kc, c6, s6 = torch.randn(6, 2, 16, dtype=h), torch.randn(6, 16, dtype=h), torch.randn(6, 16, dtype=h)
out["strided"] = int((T.rope_rows(qt, kc, c6, s6)[0] != T.rope_rows(qt.contiguous(), kc, c6, s6)[0]).sum())
# odd sizes: one row, widths that are not powers of two, head counts of 1 and 3, a head dim of 6
odd = 0
for n, width in ((1, 1), (1, 13), (3, 1000), (2, 4097)):
    xo, wo = torch.randn(n, width, dtype=h), torch.randn(width, dtype=h)
    odd += int((T.rms_norm(xo, wo, 1e-5).float() - K._rms_norm(xo, wo, 1e-5).float()).abs().gt(
        torch.finfo(h).eps * K._rms_norm(xo, wo, 1e-5).float().abs()).sum())
    so, lo = T.add_layer_norm(xo, wo.expand(n, width).contiguous(), wo, None, 1e-5)
    odd += int((so != K._add_layer_norm(xo, wo.expand(n, width).contiguous(), wo, None, 1e-5)[0]).sum())
    odd += int((T.silu_mul(xo, xo) != K._silu_mul(xo, xo)).float().gt(0).sum() > 1)
for n, hq, hk, d in ((1, 3, 1, 6), (4, 1, 1, 2), (2, 28, 4, 128)):
    qo, ko = torch.randn(n, hq, d, dtype=h), torch.randn(n, hk, d, dtype=h)
    co, sn = torch.randn(n, d, dtype=h), torch.randn(n, d, dtype=h)
    odd += sum(int((a != b).sum()) for a, b in zip(T.rope_rows(qo, ko, co, sn), K._rope(qo, ko, co, sn)))
out["odd_sizes"] = odd
# arguments the kernels do not take
refused = []
for name, call in (("mixed dtypes", lambda: T.rms_norm(torch.randn(3, 8), torch.randn(8, dtype=h), 1e-6)),
                   ("int", lambda: T.silu_mul(torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32))),
                   ("broadcast", lambda: T.silu_mul(torch.randn(3, 8), torch.randn(8))),
                   ("fp16 vision cos", lambda: T.vision_rotary(q, k, c.half(), s.half()))):
    try:
        call()
        refused.append([name, False])
    except T.Unsupported:
        refused.append([name, True])
out["refused"] = refused
# through a Fusable on the CPU: the kernel runs (state ok); an argument it refuses runs the eager math
f = K.Fusable(K._silu_mul, "SiLU*up (test)", devices=("cpu",), triton=K._triton("silu_mul"))
got = f(g, u)
x8, y8 = torch.randn(3, 8), torch.randn(8)      # broadcast: refused by the kernel, the eager math runs
out["fusable"] = [f.triton_state, int((got != T.silu_mul(g, u)).sum()), bool(torch.equal(f(x8, y8), K._silu_mul(x8, y8)))]
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")   # (a dependency of the CUDA torch wheels on Linux, which the project installs)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_elementwise_kernels_equal_the_eager_math_bit_for_bit(interpreted):
    assert interpreted["rope"] == [[6, 4, 16], [6, 2, 16], 0]
    assert interpreted["vision_rotary"] == [[3, 5, 4, 12], 0]
    assert [sums for sums, _ in interpreted["add_layer_norm"]] == [0, 0, 0]     # residual + x, rounded as eager
    assert interpreted["strided"] == 0
    assert interpreted["vision_rotary_per_token"] == 0
    assert interpreted["silu_strided"] == [[2, 7, 300], True, 0]
    assert interpreted["odd_sizes"] == 0         # 1 row, widths 1 / 13 / 1000 / 4097, 1 or 3 heads, head dim 2 or 6


def test_reductions_and_silu_within_one_ulp_of_the_eager_math(interpreted):
    shape, _, rms_ulps = interpreted["rms"]
    assert shape == [2, 7, 96] and rms_ulps <= 1.0
    assert all(ln_ulps <= 1.0 for _, ln_ulps in interpreted["add_layer_norm"])
    n_diff, silu_ulps = interpreted["silu"]
    assert silu_ulps <= 1.0 and n_diff <= 3          # of 1,500 (exp in another form than eager's)


def test_kernels_refuse_what_the_eager_code_would_promote_or_broadcast(interpreted):
    assert interpreted["refused"] == [["mixed dtypes", True], ["int", True], ["broadcast", True],
                                      ["fp16 vision cos", True]]


def test_fusable_runs_the_triton_kernel_in_triton_mode(interpreted):
    assert interpreted["fusable"] == ["ok", 0, True]


def test_kernel_mode_setting():
    from models import kernels as K

    old = K.set_mode("eager")
    try:
        assert K.Fusable.mode == "eager"
        with pytest.raises(ValueError, match="kernels must be one of"):
            K.set_mode("compiled")
        calls = []
        f = K.Fusable(K._silu_mul, "t", devices=("cpu",), triton=lambda *a: calls.append(a))
        g = torch.randn(4)
        assert torch.equal(f(g, g), K._silu_mul(g, g)) and not calls       # eager mode: the kernel is not called
        K.set_mode("triton")
        f(g, g)
        assert len(calls) == 1
    finally:
        K.Fusable.mode = old


def test_a_failing_first_triton_call_falls_back_to_eager_for_good(caplog):
    from models import kernels as K

    def broken(*a):
        raise RuntimeError("no GPU compiler")

    f = K.Fusable(K._silu_mul, "SiLU*up (test)", devices=("cpu",), triton=broken)
    g = torch.randn(5)
    old = K.set_mode("triton")
    try:
        with caplog.at_level("WARNING"):
            assert torch.equal(f(g, g), K._silu_mul(g, g))
        assert f.triton_state == "failed" and "Triton kernel of SiLU*up (test) failed" in caplog.text
        f.triton = lambda *a: pytest.fail("called again after failing")
        assert torch.equal(f(g, g), K._silu_mul(g, g))
    finally:
        K.Fusable.mode = old


def test_a_later_triton_build_failure_falls_back_and_a_run_error_is_raised(caplog):
    """After a kernel ran once, Triton failing to build it for new arguments (its compilation error) gives the eager
    math with a warning, as at the first call; any other error of a kernel that ran before is raised."""
    from triton.compiler.errors import CompilationError

    from models import kernels as K

    g = torch.randn(5)
    calls = []

    def kernel(*a):
        calls.append(1)
        if len(calls) == 2:
            raise CompilationError("src", None, "too wide")
        if len(calls) == 3:
            raise RuntimeError("an illegal memory access")
        return K._silu_mul(*a)

    old = K.set_mode("triton")
    try:
        f = K.Fusable(K._silu_mul, "SiLU*up (test)", devices=("cpu",), triton=kernel)
        f(g, g)
        assert f.triton_state == "ok"
        with caplog.at_level("WARNING"):
            assert torch.equal(f(g, g), K._silu_mul(g, g))
        assert f.triton_state == "failed" and "Triton kernel of SiLU*up (test) failed" in caplog.text
        f2 = K.Fusable(K._silu_mul, "SiLU*up (test 2)", devices=("cpu",), triton=kernel)
        calls[:] = [1, 1]                                   # its next call is the third: a run error
        f2.triton_state = "ok"
        with pytest.raises(RuntimeError, match="illegal memory access"):
            f2(g, g)
    finally:
        K.Fusable.mode = old


def test_a_kernel_is_built_once_per_model_whatever_the_row_or_patch_count(monkeypatch):
    """Triton compiles a kernel per specialization of its arguments (an int equal to 1, or a multiple of 16, gets its
    own). The early warm-up calls each kernel once on stand-ins (19 rows, 40 patches per frame,
    :func:`models.videollama3.warm.compile_fused_kernels`), so what the steps call must specialize as those do: the
    launches' specialization keys (computed as Triton's launcher computes them, no GPU) are one per kernel over
    row counts 1, 3, 19, 32, 4096 and patch counts 1, 40, 1008."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    from models import triton_kernels as T

    keys: dict[str, set] = {}

    class Recorder:
        def __init__(self, name, kernel):
            self.name, self.bind = name, create_function_from_signature(kernel.signature, kernel.params, BaseBackend)

        def __getitem__(self, grid):
            return lambda *a, **kw: keys.setdefault(self.name, set()).add(repr(self.bind(*a, **kw)[1]))

    for name in ("_rms_norm_kernel", "_silu_mul_kernel", "_rope_rows_kernel", "_add_layer_norm_kernel"):
        monkeypatch.setattr(T, name, Recorder(name, getattr(T, name)))
    h = torch.bfloat16
    for n in (1, 3, 19, 32, 4096):
        T.rms_norm(torch.zeros(n, 64, dtype=h), torch.zeros(64, dtype=h), 1e-6)
        T.silu_mul(torch.zeros(n, 96, dtype=h), torch.zeros(n, 96, dtype=h))
        T.silu_mul(*torch.zeros(n, 2 * 96, dtype=h).chunk(2, dim=-1))       # gate and up of one stacked GEMM
        T.rope_rows(torch.zeros(n, 4, 16, dtype=h), torch.zeros(n, 2, 16, dtype=h), torch.zeros(n, 16, dtype=h),
                    torch.zeros(n, 16, dtype=h))
        T.add_layer_norm(torch.zeros(n, 48, dtype=h), torch.zeros(n, 48, dtype=h), torch.zeros(48, dtype=h),
                         torch.zeros(48, dtype=h), 1e-6)
    rope_rows_keys = set(keys["_rope_rows_kernel"])
    for patches in (1, 40, 1008):
        T.vision_rotary(torch.zeros(3, patches, 4, 24, dtype=h), torch.zeros(3, patches, 4, 24, dtype=h),
                        torch.zeros(patches, 1, 24), torch.zeros(patches, 1, 24))
    assert {name: len(k) for name, k in keys.items()} == {"_rms_norm_kernel": 1, "_silu_mul_kernel": 1,
                                                          "_rope_rows_kernel": 2, "_add_layer_norm_kernel": 1}
    assert len(rope_rows_keys) == 1           # the LLM's rotary once, the vision rotary (other sizes) once
