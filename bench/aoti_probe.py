"""Probe (issue 41, the first answer): would ahead-of-time compiled fused kernels (torch.export + AOTInductor
packages, loaded with ``torch._inductor.aoti_load_package``) start faster than the early compilation's
``torch.compile`` with a warm cache (12.5 s alone on the H200, 5 s of it Inductor's one-time registrations), and
do they compute the same values as the compiled ``Fusable`` kernels?

    python bench/aoti_probe.py --dir /tmp/aoti            # build the packages, then check them in a fresh process

``build``: each kernel of the 7B sizes exported with its rows dynamic (``Dim(min=1)``) and compiled to a package
(seconds per kernel). ``check`` (a fresh process, as a warm run would be): seconds to import torch and to load every
package, whether Inductor's lowering / sympy were imported by the loads, then on rows N in ``--rows`` each package's
output against the ``Fusable`` (torch.compile) kernel's and the eager math (elements that differ), and the median
time per call of both at the largest and smallest N. Prints a table; ``--json`` writes the figures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the 7B checkpoint's fixed sizes (VideoLLaMA3-7B: Qwen2.5-7B LLM, SigLIP-so400m vision tower)
D, I, H, H_KV, HEAD, C, EPS = 3584, 18944, 28, 4, 128, 1152, 1e-6
KERNELS = ("RMSNorm", "SiLU*up", "rotary (rows)", "add+LayerNorm")


def _modules():
    import torch
    from models import kernels as k

    class RMS(torch.nn.Module):
        def forward(self, x, w):
            return k._rms_norm(x, w, EPS)

    class Silu(torch.nn.Module):
        def forward(self, g, u):
            return k._silu_mul(g, u)

    class Rope(torch.nn.Module):
        def forward(self, q, kk, cos, sin):
            return k._rope(q, kk, cos, sin)

    class AddLN(torch.nn.Module):
        def forward(self, x, r, w, b):
            return k._add_layer_norm(x, r, w, b, EPS)

    return {"RMSNorm": (RMS(), k.rms_norm, lambda x, w: k.rms_norm(x, w, EPS)),
            "SiLU*up": (Silu(), k.silu_mul, k.silu_mul),
            "rotary (rows)": (Rope(), k.rope_rows, k.rope_rows),
            "add+LayerNorm": (AddLN(), k.add_layer_norm, lambda x, r, w, b: k.add_layer_norm(x, r, w, b, EPS))}


def _inputs(name: str, n: int, device, dtype, seed: int = 0):
    """Tensors of one call with N rows (the per-row ones random, weights random too)."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)

    def r(*s):
        return torch.randn(*s, device=device, dtype=dtype, generator=g)
    return {"RMSNorm": lambda: (r(n, D), r(D)),
            "SiLU*up": lambda: (r(n, I), r(n, I)),
            "rotary (rows)": lambda: (r(n, H, HEAD), r(n, H_KV, HEAD), r(n, HEAD), r(n, HEAD)),
            "add+LayerNorm": lambda: (r(n, C), r(n, C), r(C), r(C))}[name]()


def _dynamic(name: str, n):
    rows = {0: n}
    return {"RMSNorm": (rows, None), "SiLU*up": (rows, rows), "rotary (rows)": (rows, rows, rows, rows),
            "add+LayerNorm": (rows, rows, None, None)}[name]


def build(out: Path, dtype_name: str, device_name: str = "cuda") -> dict:
    import torch
    out.mkdir(parents=True, exist_ok=True)
    dtype, device = getattr(torch, dtype_name), torch.device(device_name)
    mods, res = _modules(), {}
    for name in KERNELS:
        mod, fus, _ = mods[name]
        t = time.perf_counter()
        n = torch.export.Dim("N", min=1, max=1 << 22)
        try:
            with torch.no_grad():
                ep = torch.export.export(mod, _inputs(name, 19, device, dtype), dynamic_shapes=_dynamic(name, n))
            opts = {k: v for k, v in (fus.options or {}).items() if k != "fx_graph_cache"}
            try:
                path = torch._inductor.aoti_compile_and_package(
                    ep, package_path=str(out / f"{name.replace(' ', '_').replace('*', 'x')}.pt2"),
                    inductor_configs=opts)
                note = f"options {opts}" if opts else ""
            except Exception as e:  # noqa: BLE001 - a probe: try once more without the backend options
                opts.pop("triton.multi_kernel", None)
                path = torch._inductor.aoti_compile_and_package(
                    ep, package_path=str(out / f"{name.replace(' ', '_').replace('*', 'x')}.pt2"),
                    inductor_configs=opts)
                note = f"without multi_kernel ({type(e).__name__}: {str(e)[:120]})"
            res[name] = {"build_s": round(time.perf_counter() - t, 2), "path": path, "note": note}
        except Exception as e:  # noqa: BLE001
            res[name] = {"build_s": round(time.perf_counter() - t, 2), "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(f"build {name}: {res[name]}", flush=True)
    (out / "build.json").write_text(json.dumps(res))
    return res


def _median_ms(fn, reps: int = 20) -> float:
    import torch
    for _ in range(3):
        fn()
    ts = []
    if not torch.cuda.is_available():
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return sorted(ts)[len(ts) // 2]
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def check(out: Path, dtype_name: str, rows: list[int], device_name: str = "cuda") -> dict:
    t0 = time.perf_counter()
    import torch
    t_import = time.perf_counter() - t0
    if device_name == "cuda":
        torch.cuda.init()
    built = json.loads((out / "build.json").read_text())
    dtype, device = getattr(torch, dtype_name), torch.device(device_name)
    loaded, t = {}, time.perf_counter()
    for name, b in built.items():
        if "path" in b:
            loaded[name] = torch._inductor.aoti_load_package(b["path"])
    t_load = time.perf_counter() - t
    mods_after = {m: m in sys.modules for m in ("torch._inductor.lowering", "sympy", "torch._dynamo")}
    mods = _modules()
    res = {"import_torch_s": round(t_import, 2), "load_all_s": round(t_load, 2), "imported_by_loads": mods_after,
           "kernels": {}}
    with torch.inference_mode():
        for name, aot in loaded.items():
            mod, _, call = mods[name]
            row = {}
            t = time.perf_counter()
            call(*_inputs(name, 19, device, dtype))
            if device.type == "cuda":
                torch.cuda.synchronize()
            row["torch_compile_first_s"] = round(time.perf_counter() - t, 2)
            diffs = {}
            for n in rows:
                x = _inputs(name, n, device, dtype, seed=n)
                a, c, e = aot(*x), call(*x), mod(*x)
                a, c, e = ((v,) if isinstance(v, torch.Tensor) else tuple(v) for v in (a, c, e))
                diffs[n] = {"aoti_vs_compiled": sum(int((p != q).sum()) for p, q in zip(a, c)),
                            "aoti_vs_eager": sum(int((p != q).sum()) for p, q in zip(a, e)),
                            "elements": sum(p.numel() for p in a)}
            row["differing"] = diffs
            for n in (max(rows), min(rows)):
                x = _inputs(name, n, device, dtype, seed=1)
                row[f"ms_N{n}"] = {"aoti": round(_median_ms(lambda: aot(*x)), 4),
                                   "compiled": round(_median_ms(lambda: call(*x)), 4),
                                   "eager": round(_median_ms(lambda: mod(*x)), 4)}
            res["kernels"][name] = row
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", nargs="?", choices=("all", "build", "check"), default="all")
    p.add_argument("--dir", type=Path, default=Path("/tmp/aoti_probe"))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 19, 4096, 16411])
    p.add_argument("--device", default="cuda", help="cuda (the probe's use), or cpu to try the script")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if a.step in ("all", "build"):
        build(a.dir, a.dtype, a.device)
    if a.step == "build":
        return 0
    if a.step == "all":   # the check in a fresh process, as a warm run would load the packages
        cmd = [sys.executable, __file__, "check", "--dir", str(a.dir), "--dtype", a.dtype, "--device", a.device, "--rows",
               *map(str, a.rows)] + (["--json", str(a.json)] if a.json else [])
        return subprocess.call(cmd)
    res = check(a.dir, a.dtype, a.rows, a.device)
    print(f"import torch {res['import_torch_s']} s, load every package {res['load_all_s']} s, "
          f"imported by the loads: {res['imported_by_loads']}")
    print(f"{'kernel':<16} {'compile 1st s':>13} {'N':>6} {'aoti!=comp':>10} {'aoti!=eager':>11} "
          f"{'ms aoti/comp/eager (max N)':>28} {'(min N)':>22}")
    for name, row in res["kernels"].items():
        for i, (n, d) in enumerate(row["differing"].items()):
            big, small = row[f"ms_N{max(a.rows)}"], row[f"ms_N{min(a.rows)}"]
            tail = (f"{big['aoti']:.3f}/{big['compiled']:.3f}/{big['eager']:.3f}".rjust(28)
                    + f"{small['aoti']:.3f}/{small['compiled']:.3f}/{small['eager']:.3f}".rjust(23)) if i == 0 else ""
            print(f"{name if i == 0 else '':<16} {row['torch_compile_first_s'] if i == 0 else '':>13} {n:>6} "
                  f"{d['aoti_vs_compiled']:>10} {d['aoti_vs_eager']:>11} {tail}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
