"""Where one real predict step's time goes: the CLI's ``BudgetedQA.predict_step`` at VideoLLaMA3-7B size.

Random bf16 VideoLLaMA3-7B + 8-layer qbase (``bench/qa_throughput.py``'s model, in memory), the CLI's settings of
``configs/predict/videomme.yaml`` (budgets 4,096 + 16,384, frames held at the encoder's sizes, 3 questions, 16 new
tokens, graph decode), videos decoded in this process before the clock starts. Prints:

1. **warm-up** (the first video): its step time, the compiled graphs (``torch._dynamo`` counters, per-function
   compile seconds) and the top host functions by cumulative time (``cProfile``);
2. **steady steps** on videos not seen before (each may need new shapes: that cost is part of the figure);
3. **one steady step under torch.profiler** on a further unseen video: GPU busy share, GPU idle time attributed to
   the host stage running at the time (``encode``, ``plan``, ``compress``, ``build_prompt``, ``prefill``,
   ``suffix+capture``, ``decode`` ...), kernel time by class (GEMM, attention, Triton/fused, other) and the top
   kernels, and the places where the host waits for the device (``torch.cuda.set_sync_debug_mode``).

    python bench/cli_throughput.py --make-videos bench/media/distinct --n-videos 6
    python bench/qa_step_profile.py --videos bench/media/distinct/*.mp4
    python bench/qa_step_profile.py --tiny          # CPU smoke run (tiny model, bundled clips)
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from callbacks.step_profile import classify, union  # noqa: E402 - the kernel classes and busy intervals

STAGES = {  # (owner, attribute) -> label: host stages wrapped in profiler ranges
    ("vlm", "encode"): "encode", ("vlm", "compress"): "compress", ("vlm", "project"): "project",
    ("vlm", "build_prompt"): "build_prompt", ("vlm", "prefill"): "prefill", ("vlm", "embed"): "embed",
    ("vlm", "_static_decoder"): "suffix+capture", ("vlm", "_greedy"): "decode",
    ("vlm", "question_ids"): "question_ids", ("budgets", "plan_groups"): "plan",
    ("module", "prompts"): "prompts",
}


def _ranged(fn, label):
    def wrapper(*a, **k):
        with torch.profiler.record_function(label):
            return fn(*a, **k)
    return wrapper


def instrument(vlm, module) -> None:
    """Wrap the host stages in ``record_function`` ranges (instance attributes: the classes stay untouched)."""
    from models.videollama3 import budgets

    owners = {"vlm": vlm, "module": module, "budgets": budgets}
    for (owner, attr), label in STAGES.items():
        obj = owners[owner]
        setattr(obj, attr, _ranged(getattr(obj, attr), label))


def build(tiny: bool, budgets: list[int]):
    from lightning_modules.budgeted_qa import BudgetedQA

    if tiny:
        from qa_throughput import build_tiny_model
        vlm = build_tiny_model()
    else:
        from qa_throughput import build_bench_model
        vlm = build_bench_model("sdpa", "frame_batched")
    module = BudgetedQA(model_path="<in-memory>", budgets=budgets, max_new_tokens=16,
                        dtype="float32" if tiny else "bfloat16")
    module.vlm = vlm
    module.to(vlm.device)
    return vlm, module


def make_item(module, path: str, index: int) -> dict:
    """The DataLoader item of one video, as ``VideoQADataset`` makes it (frames held at the encoder's sizes)."""
    from datamodules.benchmarks import Question
    from datamodules.videoqa import VideoQADataset, VideoTask
    from lightning_modules.budgeted_qa import job_name

    from qa_throughput import QUESTIONS

    jobs = [job_name(b) for b in module.budgets]
    qs = [Question(qid=f"{index}-{j}", video_id=str(index), video_path=path, question=q.split("\n")[0],
                   options=["A bird.", "A car.", "A house.", "A tree."], answer="A", meta={})
          for j, q in enumerate(QUESTIONS)]
    task = VideoTask(str(index), path, "videomme", qs, {q.qid: jobs for q in qs})
    item = VideoQADataset([task], max(module.budgets), decode_threads=4, sizing=module.frame_sizing())[0]
    if item.get("error"):
        raise RuntimeError(item["error"])
    return item


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_step(module, item) -> float:
    sync()
    t = time.perf_counter()
    recs = module.predict_step(item)
    sync()
    if any(r.get("error") for r in recs):
        raise RuntimeError(next(r["error"] for r in recs if r.get("error")))
    return time.perf_counter() - t


def dynamo_counts() -> dict:
    from torch._dynamo.utils import counters

    return {"unique_graphs": counters["stats"].get("unique_graphs", 0),
            "calls_captured": counters["stats"].get("calls_captured", 0),
            "frames_ok": counters["frames"].get("ok", 0), "recompiles": sum(counters["recompiles"].values())}


def warmup_report(module, item) -> None:
    from torch._dynamo.utils import compile_times

    before = dynamo_counts()
    prof = cProfile.Profile()
    sync()
    t = time.perf_counter()
    prof.enable()
    module.predict_step(item)
    sync()
    prof.disable()
    sec = time.perf_counter() - t
    after = dynamo_counts()
    print(f"\n## warm-up: first video {Path(item['video_path']).name}: {sec:.2f} s")
    print("dynamo:", {k: after[k] - before[k] for k in after})
    with contextlib.suppress(Exception):
        print(compile_times(repr="str", aggregate=True))
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
    print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:9000])
    s = io.StringIO()            # where the host's own time went (first calls: kernel builds, library set-up)
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:6000])


def profile_report(module, item) -> None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    labels = set(STAGES.values()) | {"step"}
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    with profile(activities=acts) as prof:
        with torch.profiler.record_function("step"):
            t = time.perf_counter()
            module.predict_step(item)
            sync()
            wall = time.perf_counter() - t
    events = prof.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and e.name not in labels]  # not GPU-side ranges
    ranges = [e for e in events if e.name in labels and e.device_type == DeviceType.CPU]
    step = next((e for e in ranges if e.name == "step"), None)
    print(f"\n## profiled steady step, {Path(item['video_path']).name}: {wall:.3f} s wall (under the profiler)")
    by_label = defaultdict(lambda: [0.0, 0])
    for e in ranges:
        by_label[e.name][0] += e.time_range.end - e.time_range.start
        by_label[e.name][1] += 1
    if kernels and step is not None:
        s0, s1 = step.time_range.start, step.time_range.end
        busy = union([(k.time_range.start, k.time_range.end) for k in kernels])
        busy_us = sum(b - a for a, b in busy)
        gaps, prev = [], s0
        for a, b in busy:
            if a > prev:
                gaps.append((prev, a))
            prev = max(prev, b)
        if s1 > prev:
            gaps.append((prev, s1))
        idle = defaultdict(float)
        for a, b in gaps:
            mid = (a + b) / 2
            inner = [e for e in ranges if e.time_range.start <= mid <= e.time_range.end]
            lab = min(inner, key=lambda e: e.time_range.end - e.time_range.start).name if inner else "?"
            idle[lab] += b - a
        span = s1 - s0
        print(f"GPU busy {busy_us / 1e3:.1f} ms of {span / 1e3:.1f} ms ({100 * busy_us / span:.1f} %); idle "
              f"{(span - busy_us) / 1e3:.1f} ms in {len(gaps)} gaps")
        print(f"{'host stage':<16}{'calls':>6}{'host ms':>10}{'GPU idle ms':>13}")
        for lab in sorted(set(by_label) | set(idle), key=lambda k: -idle.get(k, 0.0)):
            ms, n = by_label.get(lab, [0.0, 0])
            print(f"{lab:<16}{n:>6}{ms / 1e3:>10.1f}{idle.get(lab, 0.0) / 1e3:>13.1f}")
        big = sorted(gaps, key=lambda g: g[0] - g[1])[:12]
        print("largest gaps (ms at offset ms, stage): " + ", ".join(
            f"{(b - a) / 1e3:.1f}@{(a - s0) / 1e3:.0f}" for a, b in big))
        cls = defaultdict(lambda: [0.0, 0])
        per = defaultdict(lambda: [0.0, 0])
        for k in kernels:
            d = k.time_range.end - k.time_range.start
            cls[classify(k.name)][0] += d
            cls[classify(k.name)][1] += 1
            per[k.name][0] += d
            per[k.name][1] += 1
        print("kernel time by class: " + ", ".join(f"{c} {v[0] / 1e3:.1f} ms ({v[1]})" for c, v in
                                                    sorted(cls.items(), key=lambda x: -x[1][0])))
        for name, (d, n) in sorted(per.items(), key=lambda x: -x[1][0])[:20]:
            print(f"  {d / 1e3:8.2f} ms {n:6d}x  {name[:110]}")
    else:
        print(f"{'host stage':<16}{'calls':>6}{'host ms':>10}")
        for lab, (ms, n) in sorted(by_label.items(), key=lambda x: -x[1][0]):
            print(f"{lab:<16}{n:>6}{ms / 1e3:>10.1f}")
    key = "self_cuda_time_total" if kernels else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70))


def sync_sites(module, item) -> None:
    if not torch.cuda.is_available():
        return
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module.predict_step(item)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    sites = defaultdict(int)
    for w in caught:
        if "synchroniz" in str(w.message):
            sites[f"{Path(w.filename).name}:{w.lineno}"] += 1
    print(f"\nhost waits for the device in one step: {sum(sites.values())} at " +
          ", ".join(f"{k} x{v}" for k, v in sorted(sites.items(), key=lambda x: -x[1])))


BACKGROUND = """
import ctypes, os, signal, sys
try:   # Linux: killed with its parent, however the parent ends (PR_SET_PDEATHSIG)
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except Exception:
    pass
sys.path.insert(0, {repo!r})
from datamodules.decode import decode_video
import datamodules.decode.nvdec  # noqa: F401 - registers the NVDEC reader
while os.getppid() == {parent}:
    info = decode_video({video!r}, 16384, 896, num_threads=1, decoder={decoder!r}).info
    print(info["decoder"], flush=True)
"""


def contention(module, items, video: str, configs: list[tuple[str, int]], settle_s: float = 8.0) -> None:
    """The steady step beside decoders that run in other processes, as the CLI's workers do: for each ``(decoder,
    n)`` of ``configs``, ``n`` processes decode ``video`` in a loop (``decoder`` ``nvdec``: each with its own CUDA
    context on this GPU; ``cpu``: CPU load only), and the two seen videos ``items[1:3]`` are stepped twice each
    after ``settle_s`` seconds. Prints each configuration's mean step and its ratio to the first configuration."""
    import os
    import subprocess

    first = None
    for decoder, n in configs:
        code = BACKGROUND.format(repo=str(REPO), video=video, decoder=decoder, parent=os.getpid())
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = []
        try:
            for _ in range(n):
                procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, text=True))
            if n:
                time.sleep(settle_s)
            times = [timed_step(module, it) for it in items[1:3] for _ in range(2)]
            alive = sum(p.poll() is None for p in procs)
        finally:
            for p in procs:
                p.kill()
            readers = set()
            for p in procs:
                out, _ = p.communicate()
                readers.update(out.split())
        mean = sum(times) / len(times)
        first = first or mean
        print(f"steps beside {n:2d} {decoder:5s} decoder processes ({alive} alive at the end, read by "
              f"{', '.join(sorted(readers)) or '-'}): "
              + ", ".join(f"{t:.3f}" for t in times) + f" s, mean {mean:.3f} s, x{mean / first:.2f}", flush=True)


def loader_contention(module, items, videos: list[str], configs: list[tuple[str, int, int, bool]],
                      settle_s: float = 8.0) -> list[dict]:
    """The steady step beside the CLI's own decode loader: for each ``(decoder, workers, niceness, pin)`` of
    ``configs``, a :func:`datamodules.videoqa.video_loader` over ``videos`` (cycled) with ``workers`` workers started
    as the CLI starts them (:func:`datamodules.videoqa.decode_worker_context`), the module's encoder sizes held in
    the workers (``frame_sizing``), the CLI's decoder threads, ``data.worker_niceness`` and the pin-memory thread
    as ``pin``; a thread of this process takes the items as they come (the main process's share of the feed). After
    ``settle_s`` seconds the seen videos ``items[1:3]`` are stepped twice each. Unlike :func:`contention` (bare
    decoders, one thread each, no resize), this loads the CPUs as the CLI's workers do, so a step slowed by CPU
    starvation shows here with ``cpu`` decoders too, and one slowed by the GPU's other contexts only with NVDEC.
    Prints, per configuration, the steps, their ratio to the first configuration and the videos decoded per second
    while they ran; returns the rows."""
    import threading

    from datamodules.decode import auto_decode_threads
    from datamodules.video_items import VideoQADataset, VideoTask
    from datamodules.videoqa import decode_worker_context, video_loader

    rows, first = [], None
    for decoder, workers, niceness, pin in configs:
        got, stop, drain = [0], threading.Event(), None
        if workers:
            tasks = [VideoTask(Path(v).stem, v, "videomme", []) for v in videos]
            ds = VideoQADataset(tasks, max(module.budgets), decode_threads=auto_decode_threads(workers, 1),
                                sizing=module.frame_sizing(), decoder=decoder)
            loader = video_loader(ds, list(range(len(tasks))) * 1000, workers, 2, pin and torch.cuda.is_available(),
                                  decode_worker_context(decoder, workers, torch.cuda.is_available()),
                                  in_order=False, worker_niceness=niceness)

            def take(loader=loader):
                for _ in loader:
                    got[0] += 1
                    if stop.is_set():
                        break

            drain = threading.Thread(target=take, name="feed", daemon=True)
            drain.start()
            time.sleep(settle_s)
        n0, t0 = got[0], time.perf_counter()
        times = [timed_step(module, it) for it in items[1:3] for _ in range(2)]
        rate = (got[0] - n0) / (time.perf_counter() - t0)
        stop.set()
        if drain is not None:
            drain.join(120)
        mean = sum(times) / len(times)
        first = first or mean
        row = {"decoder": decoder, "workers": workers, "niceness": niceness, "pin": pin, "steps_s": times,
               "mean_s": mean, "ratio": mean / first, "videos_per_s": rate}
        rows.append(row)
        print(f"steps beside a loader of {workers:2d} {decoder:5s} workers (niceness {niceness}, pinned {pin}): "
              + ", ".join(f"{t:.3f}" for t in times) + f" s, mean {mean:.3f} s, x{mean / first:.2f}; "
              f"{rate:.2f} videos/s decoded meanwhile", flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--videos", nargs="*", default=None)
    ap.add_argument("--budgets", nargs="*", type=int, default=None)
    ap.add_argument("--no-cprofile", action="store_true")
    ap.add_argument("--early-compile", action="store_true",
                    help="compile the fused kernels from the config and run the first-call warm-up first (as the CLI "
                         "does during the load), so the warm-up step shows what is left: first calls, the decode "
                         "step's graphs, lazy initialisation")
    ap.add_argument("--contention", default=None, metavar="VIDEO",
                    help="at the end, time steps on seen videos beside processes decoding VIDEO in a loop: none, 16 "
                         "NVDEC, 8 NVDEC, none, 16 CPU (the CLI's decode workers, each NVDEC one with its own CUDA "
                         "context on this GPU)")
    ap.add_argument("--loader-contention", nargs="+", default=None, metavar="VIDEO",
                    help="at the end, time steps on seen videos beside the CLI's own decode loader over these videos "
                         "(cycled): none, auto, auto with worker_niceness 10, auto unpinned, cpu, none again (on the "
                         "CPU: none, cpu, cpu with niceness 10)")
    ap.add_argument("--loader-workers", type=int, default=16, help="the loader's workers (--loader-contention)")
    ap.add_argument("--settle-s", type=float, default=8.0, help="seconds the loader runs before the steps")
    ap.add_argument("--contention-only", action="store_true",
                    help="skip the profiles between the warm-up and the contention runs")
    args = ap.parse_args(argv)
    videos = args.videos or [str(REPO / "assets/media/cockatoo.mp4"), str(REPO / "assets/media/realshort.mp4")]
    budgets = args.budgets or ([128, 1024] if args.tiny else [4096, 16384])
    if len(videos) < 2:
        raise SystemExit("give at least 2 videos (warm-up + profiled step)")
    t0 = time.perf_counter()
    vlm, module = build(args.tiny, budgets)
    print(f"model built in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    items = [make_item(module, v, i) for i, v in enumerate(videos)]
    print(f"{len(items)} videos decoded in {time.perf_counter() - t0:.1f} s: " +
          ", ".join(f"{Path(v).name} T={len(it['times_s'])}" for v, it in zip(videos, items)))
    instrument(vlm, module)
    if args.early_compile:
        from models.videollama3 import warm

        t0 = time.perf_counter()
        names = warm.compile_fused_kernels(vlm.model.config, vlm.device, vlm.dtype)
        print(f"early compilation of {len(names)} fused kernels: {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()            # and the CLI's first-call warm-up (model.warm_first_calls, default on)
        warm.warm_first_calls(vlm.model.config, vlm.device, vlm.dtype)
        print(f"first-call warm-up: {time.perf_counter() - t0:.1f} s")
    if args.no_cprofile:
        from torch._dynamo.utils import compile_times

        before = dynamo_counts()
        print(f"\n## warm-up step {Path(items[0]['video_path']).name}: {timed_step(module, items[0]):.2f} s")
        after = dynamo_counts()
        print("dynamo:", {k: after[k] - before[k] for k in after})
        with contextlib.suppress(Exception):
            print("\n".join(compile_times(repr="str", aggregate=True).splitlines()[:8]))
    else:
        warmup_report(module, items[0])
    print("warm-up step stages (s):", {k: round(v, 3) for k, v in module.last_stage_seconds.items()})
    print(f"warm-up video again: {timed_step(module, items[0]):.3f} s, stages (s): "
          f"{ {k: round(v, 3) for k, v in module.last_stage_seconds.items()} }")
    if not args.contention_only:   # the steady steps, the profile, the host waits, the attention A/B
        steady = []
        for it in items[1:-1]:
            before = dynamo_counts()
            sec = timed_step(module, it)
            after = dynamo_counts()
            steady.append(sec)
            print(f"steady step {Path(it['video_path']).name}: {sec:.3f} s (T={len(it['times_s'])}, new graphs "
                  f"{after['unique_graphs'] - before['unique_graphs']}, recompiles "
                  f"{after['recompiles'] - before['recompiles']})")
        if steady:
            print(f"steady mean {sum(steady) / len(steady):.3f} s over {len(steady)} unseen videos")
        profile_report(module, items[-1])
        print(f"same video again: {timed_step(module, items[-1]):.3f} s")
        sync_sites(module, items[-1])
        if torch.cuda.is_available():   # A/B of the towers' attention backends on videos seen before (plans cached)
            from models.vision_attention import allow_cudnn_sdpa

            for it in items[1:3]:
                row = []
                for cudnn in (False, True, False):
                    allow_cudnn_sdpa(cudnn)
                    timed_step(module, it)
                    row.append(f"{'cuDNN allowed' if cudnn else 'flash/efficient'} {timed_step(module, it):.3f} s")
                allow_cudnn_sdpa(False)
                print(f"seen video {Path(it['video_path']).name}, second run each: " + ", ".join(row))
    if args.loader_contention:
        print("\n## the step beside the CLI's decode loader (seen videos, two runs each)")
        w = args.loader_workers
        loader_contention(module, items, args.loader_contention,
                          [("auto", 0, 0, True), ("auto", w, 0, True), ("auto", w, 10, True), ("auto", w, 0, False),
                           ("cpu", w, 0, True), ("auto", 0, 0, True)] if torch.cuda.is_available() else
                          [("cpu", 0, 0, False), ("cpu", w, 0, False), ("cpu", w, 10, False)],
                          settle_s=args.settle_s)
    if args.contention:
        print("\n## the step beside decoding processes (seen videos, two runs each)")
        contention(module, items, args.contention, [("cpu", 0), ("nvdec", 16), ("nvdec", 8), ("cpu", 0),
                                                     ("cpu", 16)])


if __name__ == "__main__":
    main()
