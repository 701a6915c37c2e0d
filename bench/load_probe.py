"""Where the weight load's seconds go: ``BudgetedVideoLlama3.from_pretrained`` onto the GPU, alone and beside the
early kernel compilation (issue 41: the 7B load took 10.4 s for ~16 GB already in the page cache, and ended at the
same instant as the compile thread in every warm CLI run).

Each variant runs in a fresh process (its own CUDA context, initialised before the clock starts), on a checkpoint
already read once (page cache warm):

* ``cpu_then_to``: the weights read to the CPU, then ``.to("cuda")`` (the CLI's path without ``accelerate``);
* ``device_map``: ``from_pretrained(device_map="cuda")`` (the CLI's path with ``accelerate``: each tensor goes
  from the file to the GPU in transformers' loader threads);
* ``..._compile``: the same with :func:`models.videollama3.warm.start` running in its thread from the same instant
  (as the CLI's set-up starts both);
* ``raw_safetensors``: every tensor of the checkpoint's files read with ``safetensors.safe_open(device="cuda")``,
  no model (the floor of the read itself).

Prints one row per variant: load seconds, the compile thread's seconds and whether one ended waiting for the other.

    python bench/load_probe.py --model-dir /tmp/cli_throughput/videollama3-7b-random
    python bench/load_probe.py --tiny              # CPU smoke run (tiny model; the CUDA variants are skipped)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANTS = ("raw_safetensors", "cpu_then_to", "device_map", "cpu_then_to_compile", "device_map_compile")
# more (issue 41, second call): the compilation alone (``compile_alone``; ``compile_profile`` runs it in the main
# thread under cProfile and prints the top functions), transformers' loader without its thread pool
# (``HF_DEACTIVATE_ASYNC_LOAD=1``: ``device_map_serial`` / ``device_map_serial_compile``), the compilation then the
# load in one thread (``compile_then_load``) and Inductor compiling in-process (``..._threads1``:
# ``TORCHINDUCTOR_COMPILE_THREADS=1``); and the LLM's files read through page-locked staging buffers by 1, 4 or 8
# threads (``pinned_threads_N``: :func:`models.weight_reader.read_safetensors`, ``model.init_args.weight_reader:
# pinned`` without transformers' load after it; session 13)
MORE = ("compile_alone", "compile_profile", "device_map_serial", "device_map_serial_compile", "compile_then_load",
        "device_map_compile_threads1", "pinned_threads_1", "pinned_threads_4", "pinned_threads_8")
ENV = {"device_map_serial": {"HF_DEACTIVATE_ASYNC_LOAD": "1"}, "device_map_serial_compile": {"HF_DEACTIVATE_ASYNC_LOAD": "1"},
       "device_map_compile_threads1": {"TORCHINDUCTOR_COMPILE_THREADS": "1"}}


def run_variant(variant: str, model_dir: str, device: str) -> dict:
    """One variant in this process; returns its figures (seconds)."""
    import importlib.util

    import torch

    if device == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    out: dict = {"variant": variant}
    t0 = time.perf_counter()
    if variant == "raw_safetensors":
        from safetensors import safe_open

        n = 0
        for f in sorted(Path(model_dir).rglob("*.safetensors")):
            with safe_open(str(f), framework="pt", device=device) as h:
                for k in h.keys():
                    n += h.get_tensor(k).numel() * 2
        if device == "cuda":
            torch.cuda.synchronize()
        out.update(load_s=round(time.perf_counter() - t0, 2), gbytes=round(n / 1e9, 2))
        return out
    if variant.startswith("pinned_threads"):
        from models.weight_reader import checkpoint_files, read_safetensors

        state = read_safetensors(checkpoint_files(Path(model_dir)), device, threads=int(variant.rsplit("_", 1)[1]))
        n = sum(t.numel() * t.element_size() for t in state.values())
        out.update(load_s=round(time.perf_counter() - t0, 2), gbytes=round(n / 1e9, 2))
        return out
    from models.videollama3.model import BudgetedVideoLlama3
    from models.videollama3 import warm

    if variant in ("compile_alone", "compile_then_load", "compile_profile"):
        from transformers import VideoLlama3Config

        config = VideoLlama3Config.from_pretrained(model_dir)
        if variant == "compile_profile":
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            with torch.inference_mode():
                prof.runcall(warm.compile_fused_kernels, config, device, torch.bfloat16, True)
            out["compile_s"] = round(time.perf_counter() - t0, 2)
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
            print(buf.getvalue(), file=sys.stderr)
            return out
        with torch.inference_mode():
            warm.compile_fused_kernels(config, device, torch.bfloat16, True)
        out["compile_s"] = round(time.perf_counter() - t0, 2)
        if variant == "compile_alone":
            return out
        t1 = time.perf_counter()
        BudgetedVideoLlama3.from_pretrained(model_dir, dtype="bfloat16", device=device)
        torch.cuda.synchronize()
        out.update(load_s=round(time.perf_counter() - t1, 2), total_s=round(time.perf_counter() - t0, 2))
        return out
    thread = None
    if "_compile" in variant:
        thread = warm.start(model_dir, device, torch.bfloat16, inference=True)
    t0 = time.perf_counter()
    if variant.startswith("device_map"):
        if importlib.util.find_spec("accelerate") is None:
            return {**out, "skipped": "accelerate not installed"}
        vlm = BudgetedVideoLlama3.from_pretrained(model_dir, dtype="bfloat16", device=device)
    else:
        vlm = BudgetedVideoLlama3.from_pretrained(model_dir, dtype="bfloat16", device=None).to(device)
    if device == "cuda":
        torch.cuda.synchronize()
    load_end = time.perf_counter()
    out["load_s"] = round(load_end - t0, 2)
    out["on"] = str(next(vlm.model.parameters()).device)
    if thread is not None:
        thread.join()
        end = thread.timings.get("end_perf_counter", time.perf_counter())
        out.update(compile_s=thread.timings.get("seconds"), compile_end_minus_load_end_s=round(end - load_end, 2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path)
    ap.add_argument("--tiny", action="store_true", help="build the tiny model (CPU smoke run)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), help=f"of {VARIANTS + MORE}")
    ap.add_argument("--one", help=argparse.SUPPRESS)     # internal: run one variant, print its JSON
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.one:
        print("RESULT " + json.dumps(run_variant(args.one, str(args.model_dir), device)))
        return
    from models.videollama3.tiny import model_dir_or_tiny

    with model_dir_or_tiny(None if args.tiny else args.model_dir) as d:
        table(Path(d), args.variants if device == "cuda" else
              [v for v in args.variants if "compile" not in v])


def table(model_dir: Path, variants: list[str]) -> None:
    """Run each variant in its own process and print the rows."""
    for f in sorted(model_dir.rglob("*.safetensors")):   # read once: every variant finds the page cache warm
        with open(f, "rb") as h:
            while h.read(1 << 26):
                pass
    rows = []
    for v in variants:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--model-dir", str(model_dir), "--one", v],
                           capture_output=True, text=True, env={**os.environ, **ENV.get(v, {})})
        if v == "compile_profile":
            print(p.stderr[-6000:])
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        row = json.loads(line[7:]) if line else {"variant": v, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
        row["process_s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'variant':<28}{'load s':>8}{'compile s':>11}{'compile end - load end':>24}{'process s':>11}")
    for r in rows:
        print(f"{r['variant']:<28}{r.get('load_s', '-')!s:>8}{r.get('compile_s', '-')!s:>11}"
              f"{r.get('compile_end_minus_load_end_s', '-')!s:>24}{r['process_s']!s:>11}  "
              f"{r.get('skipped', r.get('error', ''))}")

if __name__ == "__main__":
    main()
