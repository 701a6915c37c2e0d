"""The fused kernels three ways on one GPU: the library's eager math, the hand-written Triton kernels
(``models/triton_kernels.py``, ``kernels: triton``, the default) and ``torch.compile`` (``kernels: inductor``), at the
VideoLLaMA3-7B sizes in bfloat16; prints a table: per kernel, the share of output elements that differ from eager
and the largest difference, the GPU time per call (CUDA events, median of 20) and each mode's first-call seconds in
this process (Triton: its own JIT or its on-disk cache; Inductor: TorchDynamo + Inductor, their caches).

    python bench/triton_kernels_check.py [--rows 16384] [--json out.json]

The reference for "differ" is eager PyTorch (the library's kernels), which is what the model code computes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import kernels as K                       # noqa: E402
from models.vision_attention import fused_rotary_qk, rotary_qk   # noqa: E402


def cases(rows: int, frames: int, dev: str, dt=torch.bfloat16) -> dict:
    """name -> (Fusable, eager function, argument maker) at the 7B sizes (D 3584, I 18944, 28 / 4 heads of 128;
    vision C 1152, 16 heads of 72, intermediate 4304, frames of 1,008 patches)."""
    def r(*shape, dtype=dt, scale=1.0):
        return torch.randn(*shape, device=dev, dtype=dtype) * scale

    w = r(3584)
    ln_w, ln_b = r(1152), r(1152)
    fc1_w, fc1_b = r(4304, 1152, scale=0.03), r(4304, scale=0.1)

    def fc1_gelu_library(x, weight, bias):      # VideoLlama3VisionMLP: fc1, then the tanh GELU (two roundings)
        return torch.nn.functional.gelu(torch.nn.functional.linear(x, weight, bias), approximate="tanh")

    def fc1_gelu(x, weight, bias):              # what the fused vision MLP runs in the current mode
        return K.gelu_tanh_linear(x, weight, bias) if K.gelu_epilogue_on() else fc1_gelu_library(x, weight, bias)

    return {
        "RMSNorm (N, 3584)": (K.rms_norm, K._rms_norm, lambda: (r(rows, 3584, scale=4), w, 1e-6)),
        "SiLU*up (N, 18944)": (K.silu_mul, K._silu_mul, lambda: (r(rows, 18944, scale=3), r(rows, 18944))),
        "rotary rows (N, 28|4, 128)": (K.rope_rows, K._rope, lambda: (r(rows, 28, 128), r(rows, 4, 128),
                                                                    r(rows, 128), r(rows, 128))),
        "add+LayerNorm (T*1008, 1152)": (K.add_layer_norm, K._add_layer_norm,
                                         lambda: (r(frames * 1008, 1152), r(frames * 1008, 1152, scale=8), ln_w,
                                                  ln_b, 1e-6)),
        "vision rotary (T, 1008, 16, 72)": (fused_rotary_qk, rotary_qk,
                                            lambda: (r(frames, 1008, 16, 72), r(frames, 1008, 16, 72),
                                                     r(1008, 1, 72, dtype=torch.float32),
                                                     r(1008, 1, 72, dtype=torch.float32))),
        # not a Triton kernel: the GELU epilogue GEMM runs under kernels: inductor only (models.kernels.
        # gelu_epilogue_on), so the triton column is the library's two kernels and the inductor one the epilogue
        "fc1 + tanh GELU (T*1008, 1152->4304)": (fc1_gelu, fc1_gelu_library,
                                                 lambda: (r(frames * 1008, 1152), fc1_w, fc1_b)),
    }


def gpu_ms(fn, args, n: int = 20) -> float:
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def flat(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple) else [out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16384, help="LLM rows (N)")
    ap.add_argument("--frames", type=int, default=16, help="vision frames (T) of 1,008 patches")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    rows = []
    with torch.inference_mode():
        for name, (fusable, eager, make) in cases(a.rows, a.frames, dev).items():
            args = make()
            ref = flat(eager(*args))
            row = {"kernel": name}
            for mode in ("eager", "triton", "inductor"):
                K.set_mode(mode)
                t0 = time.perf_counter()
                out = flat(fusable(*args))
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                n_diff = sum(int((o != e).sum()) for o, e in zip(out, ref))
                n_all = sum(e.numel() for e in ref)
                row[mode] = {"first_call_s": round(first, 3), "ms": round(gpu_ms(fusable, args), 4),
                             "differ_share": n_diff / n_all,
                             "max_abs_diff": max(float((o.float() - e.float()).abs().max()) for o, e in zip(out, ref))}
            rows.append(row)
    K.set_mode("triton")
    print(f"{'kernel':34s} | {'eager ms':>8s} | {'triton ms':>9s} | {'inductor ms':>11s} | {'triton != eager':>15s} | "
          f"{'inductor != eager':>17s} | {'max |d| tri/ind':>17s} | first call s (tri / ind)")
    for r in rows:
        e, t, i = r["eager"], r["triton"], r["inductor"]
        print(f"{r['kernel']:34s} | {e['ms']:8.3f} | {t['ms']:9.3f} | {i['ms']:11.3f} | {t['differ_share']:15.2e} | "
              f"{i['differ_share']:17.2e} | {t['max_abs_diff']:8.3g}/{i['max_abs_diff']:<8.3g} | "
              f"{t['first_call_s']:.2f} / {i['first_call_s']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "rows": a.rows, "frames": a.frames, "kernels": rows}, indent=1))


if __name__ == "__main__":
    main()
