"""Would TorchDynamo's ahead-of-time compilation shorten the early compilation of the 6 fused kernels? (issue 41:
with a WARM Inductor cache, :func:`models.videollama3.warm.compile_fused_kernels` still takes 12.5 s on the H200,
the critical path of the first answer: Inductor's one-time registrations, ``builtins.compile`` of generated code
and guards, sympy.)

Each variant runs in a FRESH process (``python bench/aot_probe.py --child ...``), all sharing one Inductor cache
directory (``--cache-dir``, default a new one under ``--work``), in this order:

* ``fill``: the warm path (:func:`warm.compile_fused_kernels`, kernel by kernel) on an EMPTY cache: the cold compile,
  which fills the cache;
* ``warm``: the same in a fresh process on the filled cache (``--repeats`` times): ``import torch._inductor`` (and
  ``torch._inductor.compile_fx``, which pulls the lowerings) timed first, then each kernel compiled + first call;
  then each kernel called on other row counts (no graph may be added: the check that the stand-ins below are
  warm.py's);
* ``aot_save``: each kernel's function (``Fusable.fn``, compiled as :class:`models.kernels.Fusable` compiles it:
  ``torch.compile(fullgraph=True, dynamic=False, options)``, rows marked dynamic by ``Fusable._mark``) through
  ``torch.compile(...).aot_compile(((args), {}))`` on the same stand-ins, called once, and saved
  (``save_compiled_function``) to ``<work>/aot/<kernel>.bin`` with ``manifest.json`` (the key it was made under);
* ``aot_load``: a fresh process loads each (``torch.compiler.load_compiled_function(f, f_globals=<the function's
  module>)``, ``--repeats`` times) and calls it on fresh inputs of two OTHER row counts, compared with the eager
  function (tolerance of ``tests/test_gpu.py``: 1e-4 in float32, 3e-2 in bfloat16); then probes the guards: the
  same inputs under another grad mode, default dtype, thread count, with weights of the other kind (inference
  tensor or not) and at 1 row; and that a load under another torch version is refused;
* ``aot_load_empty_cache``: ``aot_load`` with an empty Inductor cache directory (is the saved file self-contained?).

On a machine without CUDA the kernels are compiled for the CPU (the probe lets each Fusable compile on CPU tensors:
``Fusable.devices``; the project's code is not changed). Prints a table (seconds per kernel and in all, per variant)
and the checks; ``--json`` writes everything (with each artifact's guards).

    python bench/aot_probe.py --config 7b --json out.json       # the H200: 7B-shaped kernels, ~2 min
    python bench/aot_probe.py --config tiny --repeats 1          # CPU validation (the tiny checkpoint's sizes)

Measured on the CPU machine (2 cores, torch 2.14.1, bfloat16, 7B-shaped kernels compiled for CPU tensors,
inference mode, plain weights; 2026-12-04): fill (cold) 18.8 s; warm 3.6 / 3.5 s (of which ``import
torch._inductor`` + ``compile_fx`` 0.84-0.87 s), ready 5.9 s from the process start; aot_save 7.3 s (files of
37-90 kB); aot_load 1.16 / 1.15 s (the first load 1.07-1.09 s, mostly the Inductor imports it pulls: 170
``torch._inductor`` modules, lowerings, scheduler and Triton codegen among them; the other 5 loads 0.01-0.02 s),
ready 3.5 s; aot_load on an EMPTY Inductor cache 16.0 s (the saved file holds the generated code, the compiled
kernels come from the cache). All 6 loaded kernels accept two other row counts without a guard miss, equal the
eager math within the tests' tolerance and the in-process ``torch.compile`` graph bit for bit. Their guards refuse
(no recompile: the loaded function raises ``RuntimeError``) 1 row, the other grad mode, weights of the other kind,
another default dtype, another thread count, grad enabled, and any argument a ``Fusable`` has marked dynamic
(``_has_dynamo_dim_marking is present on runtime tensor but was absent at compile time``: the marks are lost in
the saved guards); a load under another torch version is refused.

Stand-ins: :func:`stand_ins` mirrors the ``calls`` of :func:`warm.compile_fused_kernels` (same shapes, dtypes,
layouts, grad modes) with the row counts as parameters; ``warm`` checks that its other-row calls add no graph.
Legend as in warm.py: N rows, D LLM hidden, I intermediate, H / H_kv heads, d head dim, C vision hidden, h heads,
e vision head dim.
"""
from __future__ import annotations

import time

T_PROCESS = time.perf_counter()   # before any import below (a child's "from process start" figures)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

KERNELS = ("RMSNorm", "SiLU*up", "rotary (rows)", "add+LayerNorm", "vision rotary", "shared-prefix suffix+merge")
SHORT = {"RMSNorm": "rms", "SiLU*up": "silu", "rotary (rows)": "rope", "add+LayerNorm": "addln",
         "vision rotary": "vrope", "shared-prefix suffix+merge": "merge"}
VARIANTS = ("fill", "warm", "aot_save", "aot_load", "aot_load_empty_cache")
MARK = "AOT_PROBE_RESULT "
TOL = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 3e-2}   # tests/test_gpu.py's per-dtype tolerance

# warm.py's stand-in row counts (> 1: sizes 0 and 1 are specialized) and two other sets for the loaded functions
WARM_ROWS = {"rows": 19, "frames": 3, "patches": 40, "q_rows": 3, "keys": 19, "prefix": 23}
OTHER_ROWS = ({"rows": 7, "frames": 2, "patches": 56, "q_rows": 5, "keys": 11, "prefix": 31},
              {"rows": 45, "frames": 4, "patches": 24, "q_rows": 2, "keys": 30, "prefix": 17})

# VideoLLaMA3-7B (Qwen2.5-7B LM, SigLIP-so400m-style vision tower)
SIZES_7B = {"d_model": 3584, "inter": 18944, "heads": 28, "kv_heads": 4, "head_dim": 128, "rms_eps": 1e-6,
            "c": 1152, "v_heads": 16, "ln_eps": 1e-6}


def sizes_from_config(config) -> dict:
    """The fixed sizes warm.py reads from a ``VideoLlama3Config`` (same fallbacks)."""
    text, vision = config.get_text_config(), config.vision_config
    heads = text.num_attention_heads
    return {"d_model": text.hidden_size, "inter": text.intermediate_size, "heads": heads,
            "kv_heads": text.num_key_value_heads,
            "head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads,
            "rms_eps": float(text.rms_norm_eps), "c": vision.hidden_size, "v_heads": vision.num_attention_heads,
            "ln_eps": float(vision.layer_norm_eps)}


def config_sizes(name: str, model_config: str | None = None) -> dict:
    """``tiny`` (models/videollama3/tiny.py), ``7b`` (:data:`SIZES_7B`), or a checkpoint's ``config.json``."""
    if model_config:
        from transformers import VideoLlama3Config

        return sizes_from_config(VideoLlama3Config.from_pretrained(model_config))
    if name == "tiny":
        from models.videollama3.tiny import tiny_videollama3_config

        return sizes_from_config(tiny_videollama3_config())
    return dict(SIZES_7B)


def namespace_config(sizes: dict):
    """A stand-in for ``VideoLlama3Config`` with what warm.compile_fused_kernels reads (no transformers import in
    the timed children)."""
    from types import SimpleNamespace as NS

    text = NS(hidden_size=sizes["d_model"], intermediate_size=sizes["inter"], num_attention_heads=sizes["heads"],
              num_key_value_heads=sizes["kv_heads"], head_dim=sizes["head_dim"], rms_norm_eps=sizes["rms_eps"])
    vision = NS(hidden_size=sizes["c"], num_attention_heads=sizes["v_heads"], layer_norm_eps=sizes["ln_eps"])
    return NS(get_text_config=lambda: text, vision_config=vision)


# ----------------------------------------------------------------------------------------------------------- child

def fusables() -> dict:
    """The 6 :class:`models.kernels.Fusable` objects by name."""
    from models import kernels as K
    from models import vision_attention as va
    from models.videollama3 import shared_prefix as sp

    return {"RMSNorm": K.rms_norm, "SiLU*up": K.silu_mul, "rotary (rows)": K.rope_rows,
            "add+LayerNorm": K.add_layer_norm, "vision rotary": va.fused_rotary_qk,
            "shared-prefix suffix+merge": sp._suffix_and_merge}


def make_weights(sizes: dict, device, dtype, inference_weights: bool) -> dict:
    """The weights as warm.py makes them (parameters; inference tensors when ``inference_weights``)."""
    import torch

    with torch.inference_mode(inference_weights):
        weight = torch.nn.Parameter(torch.ones(sizes["d_model"], device=device, dtype=dtype), requires_grad=False)
        ln_w, ln_b = (torch.nn.Parameter(torch.ones(sizes["c"], device=device, dtype=dtype), requires_grad=False)
                      for _ in range(2))
    return {"weight": weight, "ln_w": ln_w, "ln_b": ln_b}


def stand_ins(name: str, sizes: dict, rows: dict, device, dtype, weights: dict) -> tuple:
    """The arguments warm.compile_fused_kernels passes kernel ``name`` (its ``calls``), at the row counts ``rows``
    (:data:`WARM_ROWS` gives warm.py's). Call in the grad mode the kernel is compiled / called in (activations made
    in inference mode are inference tensors, which guards tell apart)."""
    import torch

    from models.videollama3 import shared_prefix as sp

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, device=device, dtype=dt)

    n, s = rows["rows"], sizes
    e = s["c"] // s["v_heads"]
    if name == "RMSNorm":
        return randn(n, s["d_model"]), weights["weight"], float(s["rms_eps"])
    if name == "SiLU*up":
        return randn(n, s["inter"]), randn(n, s["inter"])
    if name == "rotary (rows)":
        return (randn(n, s["heads"], s["head_dim"]), randn(n, s["kv_heads"], s["head_dim"]),
                randn(n, s["head_dim"]), randn(n, s["head_dim"]))
    if name == "add+LayerNorm":
        return randn(n, s["c"]), randn(n, s["c"]), weights["ln_w"], weights["ln_b"], float(s["ln_eps"])
    if name == "vision rotary":
        f, p = rows["frames"], rows["patches"]
        return (randn(f, p, s["v_heads"], e), randn(f, p, s["v_heads"], e),
                randn(p, 1, e, dt=torch.float32), randn(p, 1, e, dt=torch.float32))
    if name == "shared-prefix suffix+merge":
        return sp.decode_step_stand_ins(rows["q_rows"], s["heads"], s["kv_heads"], s["head_dim"], rows["keys"],
                                        rows["prefix"], dtype, device)
    raise ValueError(f"unknown kernel {name!r}")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _mode(inference: bool):
    import torch

    return torch.inference_mode() if inference else torch.no_grad()


def _close(got, want, tol: float) -> tuple[bool, float]:
    import torch

    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    ok, err = len(got) == len(want), 0.0
    for g, w in zip(got, want):
        ok = ok and g.shape == w.shape and g.dtype == w.dtype
        if g.shape == w.shape:
            err = max(err, float((g.float() - w.float()).abs().max()) if g.numel() else 0.0)
            ok = ok and torch.allclose(g.float(), w.float(), atol=tol, rtol=tol)
    return bool(ok), err


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


def _profiled(enabled: bool):
    """(start, stop) of a cProfile over the timed region; ``stop`` returns the top functions by cumulative time."""
    if not enabled:
        return (lambda: None), (lambda: {})
    import cProfile
    import pstats

    prof = cProfile.Profile()

    def stop():
        prof.disable()
        st = pstats.Stats(prof)

        def top(col: int, n: int) -> list[dict]:
            rows = sorted(st.stats.items(), key=lambda kv: -kv[1][col])[:n]
            return [{"fn": f"{Path(k[0]).name}:{k[1]}:{k[2]}", "cum_s": round(v[3], 3), "tot_s": round(v[2], 3),
                     "calls": v[1]} for k, v in rows]
        return {"by_cumulative": top(3, 40), "by_self": top(2, 25)}
    return prof.enable, stop


def child_compile(a, out: dict) -> None:
    """``fill`` / ``warm``: warm.compile_fused_kernels, one kernel at a time, then other row counts."""
    t0 = time.perf_counter()
    import torch
    out["import_torch_s"] = round(time.perf_counter() - t0, 3)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    if device.type == "cuda":
        torch.cuda.init()
    for f in fusables().values():          # compile on this device (the project compiles on CUDA only)
        if device.type not in f.devices:
            f.devices = (*f.devices, device.type)
    from models.videollama3 import warm

    sizes = json.loads(a.sizes)
    config = namespace_config(sizes)
    out["inductor_modules_before"] = sum(m.startswith("torch._inductor") for m in sys.modules)
    start, stop = _profiled(a.profile)
    start()
    t_all = time.perf_counter()
    t = time.perf_counter()
    import torch._inductor  # noqa: F401
    out["import_inductor_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    import torch._inductor.compile_fx  # noqa: F401 - what the first compile imports (lowerings, decompositions)
    out["import_compile_fx_s"] = round(time.perf_counter() - t, 3)
    per = {}
    for name in KERNELS:
        t = time.perf_counter()
        warm.compile_fused_kernels(config, device, dtype, a.inference, a.inference_weights, kernels=[name])
        per[name] = round(time.perf_counter() - t, 3)
    out["kernel_s"] = per
    out["total_s"] = round(time.perf_counter() - t_all, 3)   # imports of torch._inductor + the 6 compiles
    out["ready_s"] = round(time.perf_counter() - T_PROCESS, 3)   # process start -> the 6 ready
    out["profile"] = stop()
    out["cache"] = warm.cache_counters()
    out["states"] = {n: f.state for n, f in fusables().items()}
    # the same Fusables on other row counts with this probe's stand-ins: no graph may be added (else the stand-ins
    # below are not warm.py's, or the rows are not dynamic)
    graphs = _graphs()
    weights = make_weights(sizes, device, dtype, a.inference if a.inference_weights is None else a.inference_weights)
    t = time.perf_counter()
    with _mode(a.inference):
        for rows in OTHER_ROWS:
            for name, f in fusables().items():
                f(*stand_ins(name, sizes, rows, device, dtype, weights))
    _sync(device)
    out["other_rows_s"] = round(time.perf_counter() - t, 3)
    out["graphs_added_on_other_rows"] = _graphs() - graphs


def _aot_path(a, name: str) -> Path:
    return Path(a.aot_dir) / f"{SHORT[name]}.bin"


def system_key(device) -> dict:
    """What an artifact is tied to: torch's own check (``torch._dynamo.package.SystemInfo``: Python, torch, CUDA
    toolkit, Triton, GPU name) and what a project key would add (compute capability, thread count)."""
    import torch
    from torch._dynamo.package import SystemInfo

    info = SystemInfo.current()
    key = {"python": info.python_version, "torch": info.torch_version, "toolkit": info.toolkit_version,
           "triton": list(info.triton_version) if info.triton_version else None, "gpu_name": info.gpu_name,
           "num_threads": torch.get_num_threads(), "default_dtype": str(torch.get_default_dtype())}
    if device.type == "cuda":
        key["capability"] = list(torch.cuda.get_device_capability(device))
    return key


def guard_summary(text: str) -> dict:
    """Counts of guard kinds in a guard tree's text, the global-state guard's values and the lambda guards."""
    kinds: dict[str, int] = {}
    lambdas, global_state = [], None
    for line in text.splitlines():
        body = line.lstrip("| +-").strip()
        kind = body.split(":", 1)[0]
        if kind.isupper() and " " not in kind:
            kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "GLOBAL_STATE" and " against " in body:
            try:
                global_state = json.loads(body.split(" against ", 1)[1].split("  #")[0])
            except ValueError:
                global_state = body
        if kind in ("LAMBDA_GUARD", "EQUALS_MATCH"):
            lambdas.append(body.split("  #")[0][:200])
    return {"kinds": kinds, "global_state": global_state, "value_guards": lambdas}


def _child_start(a, out: dict):
    """Import torch (timed into ``out``), initialise CUDA where asked; returns ``(torch, device, dtype, sizes)``."""
    t0 = time.perf_counter()
    import torch
    out["import_torch_s"] = round(time.perf_counter() - t0, 3)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    if device.type == "cuda":
        torch.cuda.init()
    return torch, device, dtype, json.loads(a.sizes)


def child_aot_save(a, out: dict) -> None:
    """aot_compile each kernel's function on warm.py's stand-ins, call it once, save it."""
    torch, device, dtype, sizes = _child_start(a, out)
    aot_dir = Path(a.aot_dir)
    aot_dir.mkdir(parents=True, exist_ok=True)
    inference_weights = a.inference if a.inference_weights is None else a.inference_weights
    weights = make_weights(sizes, device, dtype, inference_weights)
    t_all = time.perf_counter()
    per, saved, guards, errors = {}, {}, {}, {}
    for name, fus in fusables().items():
        t = time.perf_counter()
        try:
            with _mode(a.inference):
                args = stand_ins(name, sizes, WARM_ROWS, device, dtype, weights)
                fus._mark(args)                                  # the rows dynamic, as Fusable marks them
                kw = {"options": fus.options} if fus.options else {}
                compiled = torch.compile(fus.fn, fullgraph=True, dynamic=False, backend=fus.backend, **kw)
                fn = compiled.aot_compile((args, {}))
                fn(*args)
                _sync(device)
            per[name] = round(time.perf_counter() - t, 3)
            text = str(fn._artifacts.guard_manager)
            guards[name] = {"summary": guard_summary(text), "text": text}
            t = time.perf_counter()
            fn.save_compiled_function(str(_aot_path(a, name)))
            saved[name] = {"save_s": round(time.perf_counter() - t, 3), "bytes": _aot_path(a, name).stat().st_size}
        except Exception as e:  # noqa: BLE001 - the probe reports it and goes on
            per[name] = None
            errors[name] = f"{type(e).__name__}: {str(e)[:800]}"
    out["kernel_s"] = per
    out["total_s"] = round(time.perf_counter() - t_all, 3)
    out["ready_s"] = round(time.perf_counter() - T_PROCESS, 3)   # process start -> the 6 ready
    out["saved"], out["guards"], out["errors"] = saved, guards, errors
    key = {"system": system_key(device), "sizes": sizes, "dtype": a.dtype, "inference": a.inference,
           "inference_weights": inference_weights, "kernels": sorted(saved)}
    (aot_dir / "manifest.json").write_text(json.dumps(key, indent=1))
    out["key"] = key


def child_aot_load(a, out: dict) -> None:
    """Load each saved kernel, call it on two other row counts (compared with the eager math), probe its guards."""
    torch, device, dtype, sizes = _child_start(a, out)
    manifest = json.loads((Path(a.aot_dir) / "manifest.json").read_text())
    fus = fusables()                                # imports models.* (and torch._dynamo), not torch._inductor
    out["inductor_modules_before"] = sum(m.startswith("torch._inductor") for m in sys.modules)
    inference_weights = a.inference if a.inference_weights is None else a.inference_weights
    weights = make_weights(sizes, device, dtype, inference_weights)
    tol = TOL[a.dtype]
    before = set(sys.modules)
    start, stop = _profiled(a.profile)
    start()
    t_all = time.perf_counter()
    per, load_s, call_s, loaded, errors = {}, {}, {}, {}, {}
    for name in KERNELS:
        if name not in manifest["kernels"]:
            errors[name] = "not saved"
            continue
        t = time.perf_counter()
        try:
            with open(_aot_path(a, name), "rb") as f:
                fn = torch.compiler.load_compiled_function(f, f_globals=sys.modules[fus[name].fn.__module__].__dict__)
            load_s[name] = round(time.perf_counter() - t, 3)
            t1 = time.perf_counter()
            with _mode(a.inference):
                args = stand_ins(name, sizes, OTHER_ROWS[0], device, dtype, weights)
                got = fn(*args)
                _sync(device)
            call_s[name] = round(time.perf_counter() - t1, 3)
            per[name] = round(time.perf_counter() - t, 3)
            loaded[name] = (fn, args, got)
        except Exception as e:  # noqa: BLE001 - reported
            per[name] = None
            errors[name] = f"{type(e).__name__}: {str(e)[:800]}"
    out["total_s"] = round(time.perf_counter() - t_all, 3)
    out["ready_s"] = round(time.perf_counter() - T_PROCESS, 3)   # process start -> the 6 ready
    out["profile"] = stop()
    out["kernel_s"], out["load_s"], out["first_call_s"], out["errors"] = per, load_s, call_s, errors
    new = sorted(m for m in set(sys.modules) - before if m.startswith("torch._inductor"))
    out["inductor_modules_imported_by_load"] = len(new)
    out["heavy_inductor_modules_imported_by_load"] = [
        m for m in ("torch._inductor.compile_fx", "torch._inductor.lowering", "torch._inductor.graph",
                    "torch._inductor.decomposition", "torch._inductor.codegen.triton", "torch._inductor.scheduler",
                    "torch._inductor.codecache", "torch._inductor.runtime.triton_heuristics") if m in sys.modules]
    # correctness and dynamic rows: both other row counts pass the guards and equal the eager math
    checks = {}
    for name, (fn, args, got) in loaded.items():
        f = fus[name].fn
        c: dict = {}
        with _mode(a.inference):
            c["rows_a_close"], c["rows_a_max_err"] = _close(got, f(*args), tol)
            args_b = stand_ins(name, sizes, OTHER_ROWS[1], device, dtype, weights)
            c["rows_b_guard_ok"] = bool(fn.guard_check(*args_b))
            if c["rows_b_guard_ok"]:
                c["rows_b_close"], c["rows_b_max_err"] = _close(fn(*args_b), f(*args_b), tol)
            one = dict(OTHER_ROWS[0], rows=1, frames=1, patches=1, q_rows=1, keys=1)
            c["one_row_guard_ok"] = bool(fn.guard_check(*stand_ins(name, sizes, one, device, dtype, weights)))
        c["guards"] = guard_probes(fn, name, sizes, device, dtype, a.inference, inference_weights)
        checks[name] = c
    out["checks"] = checks
    out["refuses_other_torch_version"] = refuses_other_version(a, fus)
    if a.compare_compiled:   # after the timings: the graph torch.compile builds here (warm cache) gives the same bits
        out["equal_to_torch_compile"] = equal_to_compiled(loaded, fus, sizes, device, dtype, a.inference, weights)
    out["system"] = system_key(device)
    out["key_matches_manifest"] = {k: v == manifest["system"].get(k) for k, v in out["system"].items()}


def equal_to_compiled(loaded: dict, fus: dict, sizes, device, dtype, inference: bool, weights: dict) -> dict:
    """Per kernel: the loaded function's output ``torch.equal`` to the Fusable's own compiled graph's on the same
    inputs (the Fusable compiled on this device, as the model would; ``None`` when it fell back to eager)."""
    import torch

    res = {}
    for name, (fn, _, _) in loaded.items():
        f = fus[name]
        if device.type not in f.devices:
            f.devices = (*f.devices, device.type)
        with _mode(inference):
            args = stand_ins(name, sizes, OTHER_ROWS[1], device, dtype, weights)
            got = fn(*args)                      # first: the Fusable marks its arguments' rows dynamic
            want = f(*args)
            marked = True if fn.guard_check(*args) else _reason(fn, args)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        res[name] = {"equal": None if f.state != "ok" else
                     all(g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want)),
                     "guard_on_marked_args": marked}
    return res


def guard_probes(fn, name, sizes, device, dtype, inference: bool, inference_weights: bool) -> dict:
    """Whether the loaded function's guards pass (True) or fail (the reason) for the saved conditions changed one
    at a time."""
    import torch

    def check(mode_inference: bool, weights_inference: bool) -> bool | str:
        weights = make_weights(sizes, device, dtype, weights_inference)
        with _mode(mode_inference):
            args = stand_ins(name, sizes, OTHER_ROWS[0], device, dtype, weights)
            if fn.guard_check(*args):
                return True
            return _reason(fn, args)

    res: dict = {"as_saved": check(inference, inference_weights),
                 "other_grad_mode": check(not inference, inference_weights)}
    if name in ("RMSNorm", "add+LayerNorm"):
        res["other_weight_kind"] = check(inference, not inference_weights)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if default != torch.bfloat16 else torch.float32)
    try:
        res["other_default_dtype"] = check(inference, inference_weights)
    finally:
        torch.set_default_dtype(default)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads - 1) if threads > 1 else 2)
    try:
        res["other_num_threads"] = check(inference, inference_weights)
    finally:
        torch.set_num_threads(threads)
    with torch.enable_grad():
        weights = make_weights(sizes, device, dtype, False)
        args = stand_ins(name, sizes, OTHER_ROWS[0], device, dtype, weights)
        res["grad_enabled"] = True if fn.guard_check(*args) else _reason(fn, args)
    return res


def _reason(fn, args) -> str:
    f_locals = fn.prepare_f_locals(*args)
    info = fn._artifacts.guard_manager.check_verbose(f_locals)
    return "; ".join(getattr(info, "verbose_code_parts", [str(info)]))[:300]


def refuses_other_version(a, fus) -> bool | str:
    """Load RMSNorm's artifact while torch reports another version: refused (``True``) or not."""
    import dataclasses

    import torch
    from torch._dynamo import package

    name = "RMSNorm"
    if not _aot_path(a, name).exists():
        return "not saved"
    real = package.SystemInfo.current

    def other():
        info = real()
        return dataclasses.replace(info, torch_version=info.torch_version + "-other")

    package.SystemInfo.current = classmethod(lambda cls: other())
    try:
        with open(_aot_path(a, name), "rb") as f:
            torch.compiler.load_compiled_function(f, f_globals=sys.modules[fus[name].fn.__module__].__dict__)
        return False
    except RuntimeError as e:
        return True if "version" in str(e) else str(e)[:200]
    finally:
        package.SystemInfo.current = real


def child_main(a) -> int:
    out: dict = {"variant": a.child, "pid": os.getpid()}
    try:
        if a.child in ("fill", "warm"):
            child_compile(a, out)
        elif a.child == "aot_save":
            child_aot_save(a, out)
        else:
            child_aot_load(a, out)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        import traceback

        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-3000:]
    out["process_s"] = round(time.perf_counter() - T_PROCESS, 3)
    print(MARK + json.dumps(out), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------- parent

def run_child(variant: str, a, sizes: dict, cache_dir: Path, aot_dir: Path, compare: bool = False) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant, "--sizes", json.dumps(sizes),
           "--device", a.device, "--dtype", a.dtype, "--aot-dir", str(aot_dir)]
    cmd += ["--inference"] if a.inference else ["--no-inference"]
    if a.inference_weights is not None:
        cmd += ["--inference-weights"] if a.inference_weights else ["--no-inference-weights"]
    if a.profile:
        cmd += ["--profile"]
    cmd += ["--compare-compiled"] if compare else ["--no-compare-compiled"]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "error": f"timed out after {a.timeout} s"}
    wall = round(time.perf_counter() - t, 3)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(MARK)]
    if not lines:
        return {"variant": variant, "error": f"exit {p.returncode}, no result", "stderr": p.stderr[-3000:],
                "wall_s": wall}
    res = json.loads(lines[-1][len(MARK):])
    res["wall_s"] = wall
    if res.get("error"):
        res["stderr"] = p.stderr[-3000:]
    return res


def table(results: list[dict]) -> str:
    cols = [SHORT[k] for k in KERNELS]
    head = (f"{'variant':<22}{'ready':>7}{'proc':>7}{'torch':>7}{'ind_imp':>8}{'total':>8}"
            + "".join(f"{c:>7}" for c in cols))
    lines = [head, "-" * len(head)]
    for r in results:
        if r.get("error"):
            lines.append(f"{r['variant']:<22} ERROR {r['error'][:100]}")
            continue
        imp = (r.get("import_inductor_s") or 0) + (r.get("import_compile_fx_s") or 0)
        ks = r.get("kernel_s", {})
        cells = "".join(f"{ks[k]:>7.2f}" if ks.get(k) is not None else f"{'-':>7}" for k in KERNELS)
        lines.append(f"{r['variant']:<22}{r.get('ready_s', 0):>7.2f}{r.get('process_s', 0):>7.2f}"
                     f"{r.get('import_torch_s', 0):>7.2f}"
                     f"{imp if 'import_inductor_s' in r else float('nan'):>8.2f}{r.get('total_s', 0):>8.2f}{cells}")
    lines.append("ready: seconds from the child's start to the 6 kernels compiled / loaded and called once; proc: its "
                 "whole life (aot_load#0 with the torch.compile comparison after the timings); torch: import torch; "
                 "ind_imp: import torch._inductor + compile_fx (warm paths; inside total); total: the timed region "
                 "(warm: those imports + 6 compiles + first calls; aot_save: 6 aot_compiles + first calls; aot_load: "
                 "6 loads + first calls); then seconds per kernel")
    return "\n".join(lines)


def findings(results: list[dict]) -> list[str]:
    out = []
    by = {}
    for r in results:
        by.setdefault(r["variant"], []).append(r)
    for r in results:
        if r.get("profile"):
            out.append(f"profile {r['variant']}#{r.get('repeat')} (top by own s): " + "; ".join(
                f"{p['fn']} {p['tot_s']}" for p in r["profile"]["by_self"][:10]))
    for r in by.get("warm", []):
        if "graphs_added_on_other_rows" in r:
            out.append(f"warm: graphs added on other row counts: {r['graphs_added_on_other_rows']} (must be 0); "
                       f"states {set(r.get('states', {}).values())}; cache {r.get('cache')}")
    for r in by.get("aot_save", []):
        if r.get("errors"):
            out.append(f"aot_save errors: {r['errors']}")
        for name, g in r.get("guards", {}).items():
            s = g["summary"]
            gs = s.get("global_state") or {}
            out.append(f"guards {SHORT[name]}: {s['kinds']}; global state num_threads={gs.get('num_threads')} "
                       f"default_dtype={gs.get('default_dtype')} grad_mode={gs.get('grad_mode')}; "
                       f"value guards {s['value_guards']}")
    for v in ("aot_load", "aot_load_empty_cache"):
        for r in by.get(v, []):
            if r.get("error"):
                continue
            out.append(f"{v}: load {sum(r.get('load_s', {}).values()):.2f} s + first calls "
                       f"{sum(r.get('first_call_s', {}).values()):.2f} s; heavy Inductor modules imported by the "
                       f"load: {r.get('heavy_inductor_modules_imported_by_load')} "
                       f"({r.get('inductor_modules_imported_by_load')} torch._inductor modules, "
                       f"{r.get('inductor_modules_before')} before); errors {r.get('errors')}")
            for name, c in r.get("checks", {}).items():
                g = c["guards"]
                out.append(f"  {SHORT[name]}: rows A close {c['rows_a_close']} (max err {c['rows_a_max_err']:.2g}), "
                           f"rows B guard {c['rows_b_guard_ok']} close {c.get('rows_b_close')}, 1 row guard "
                           f"{c['one_row_guard_ok']}; guards pass: " + ", ".join(
                               f"{k}={'yes' if v is True else 'NO'}" for k, v in g.items()))
            if "equal_to_torch_compile" in r:
                eq = r["equal_to_torch_compile"]
                out.append("  equal bit for bit to this process's torch.compile graph: "
                           + ", ".join(f"{SHORT[k]}={v['equal']}" for k, v in eq.items())
                           + "; guards pass on arguments the Fusable marked dynamic: "
                           + ", ".join(f"{SHORT[k]}={'yes' if v['guard_on_marked_args'] is True else 'NO'}"
                                       for k, v in eq.items()))
            out.append(f"  refuses another torch version: {r.get('refuses_other_torch_version')}; key matches the "
                       f"saving process: {r.get('key_matches_manifest')}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=("tiny", "7b"), default="7b", help="kernel sizes (default 7b)")
    ap.add_argument("--model-config", help="a checkpoint directory whose config.json gives the sizes instead")
    ap.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cuda, cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=tuple(TOL))
    ap.add_argument("--inference", action=argparse.BooleanOptionalAction, default=True,
                    help="compile and call under torch.inference_mode (the predict loop's; default on)")
    ap.add_argument("--inference-weights", action=argparse.BooleanOptionalAction, default=False,
                    help="the weights are inference tensors (default off: BudgetedQA's background load)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    ap.add_argument("--repeats", type=int, default=2, help="fresh processes for warm and aot_load (default 2)")
    ap.add_argument("--work", help="directory for the cache and artifacts (default: a new temporary one, removed)")
    ap.add_argument("--cache-dir", help="Inductor cache directory (default <work>/cache, empty at the start)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile each child's timed region (top functions by cumulative and own time in --json)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per child (default 180)")
    ap.add_argument("--budget", type=float, default=220.0,
                    help="no child starts after this many seconds of the probe (default 220: under 4 min in all)")
    ap.add_argument("--compare-compiled", action=argparse.BooleanOptionalAction, default=True,
                    help="the first aot_load checks, after its timings, that the loaded kernels equal torch.compile's "
                         "bit for bit (costs it one warm compile of the 6; default on)")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--aot-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child_main(a)
    variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    if a.device == "auto":
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = config_sizes(a.config, a.model_config)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="aot_probe_"))
    work.mkdir(parents=True, exist_ok=True)
    cache = Path(a.cache_dir) if a.cache_dir else work / "cache"
    aot_dir = work / "aot"
    print(f"aot_probe: {a.device} {a.dtype} config={a.model_config or a.config} {sizes}; work {work}", flush=True)
    results = []
    t0 = time.perf_counter()
    for v in variants:
        for i in range(a.repeats if v in ("warm", "aot_load") else 1):
            c = cache
            if v == "aot_load_empty_cache":
                c = work / f"empty_cache_{i}"
                shutil.rmtree(c, ignore_errors=True)
            if time.perf_counter() - t0 > a.budget:
                results.append({"variant": v, "repeat": i, "error": f"skipped: the probe's {a.budget:.0f} s budget"})
                print(f"  {v}#{i}: skipped (budget)", flush=True)
                continue
            r = run_child(v, a, sizes, c, aot_dir, compare=a.compare_compiled and v == "aot_load" and i == 0)
            r["repeat"] = i
            results.append(r)
            print(f"  {v}#{i}: {'ERROR ' + r['error'] if r.get('error') else str(r.get('total_s')) + ' s'} "
                  f"(wall {r.get('wall_s')} s)", flush=True)
            if r.get("error") and r.get("stderr"):
                print(r.get("traceback") or r["stderr"][-1500:], flush=True)
            for name, why in (r.get("errors") or {}).items():   # per kernel, at once (a cut run keeps them)
                print(f"    {name}: {str(why)[:600]}", flush=True)
            if a.json:   # after every child, so that a run cut by a time limit keeps what it measured
                Path(a.json).write_text(json.dumps({"device": a.device, "dtype": a.dtype, "partial": True,
                                                    "results": results}, indent=1, default=str))
    print()
    print(table(results))
    print()
    for line in findings(results):
        print(line)
    print(f"\nprobe wall {time.perf_counter() - t0:.1f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": a.device, "dtype": a.dtype, "config": a.model_config or a.config,
                                            "sizes": sizes, "inference": a.inference,
                                            "inference_weights": a.inference_weights, "results": results}, indent=1))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
