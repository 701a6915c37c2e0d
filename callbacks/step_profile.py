"""Profile chosen predict steps of a real run on the GPU, then the same videos again once nothing else runs beside
them, so that what slowed a step in the run is told apart: its own kernels running longer (the GPU shared with the
decode workers' contexts), the GPU idle between them (the host late to queue work), or the host thread itself kept
off a CPU (waiting on the run queue while the workers' threads ran).

Used by the bench (``bench/cli_throughput.py``: ``BENCH_STEP_PROFILE=2,3,5`` adds it to the user's command), or
by hand::

    python evaluate.py predict --config configs/predict/videomme.yaml ... \\
        --trainer.callbacks+='{"class_path": "callbacks.step_profile.StepProfile",
                               "init_args": {"steps": [2, 3, 5], "path": "outputs/step_profile.json"}}'

For each step index in ``steps`` (the predict loop's ``batch_idx``: 0 is the first video) the step runs under
``torch.profiler`` (CPU and CUDA activity); at the end of predicting, each of those items is stepped once more under
the profiler (its records are dropped: nothing is written twice). ``path`` gets, per step, both passes'
:func:`summarize` and their ratios. Costs: the profiler's start (CUPTI's first use, about a second, made in
``setup``), the profiled steps themselves (recording every kernel: on the H100 a run of 6 videos predicted in 35 s
against 20-22 s with three steps profiled), a synchronisation before and after each profiled step, and the items
kept in host memory until the end. Off unless named in the trainer's callbacks.
"""
from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from callbacks.process_clock import process_age_s


def classify(name: str) -> str:
    """The kernel class of a CUDA kernel name: ``attention``, ``gemm``, ``triton (fused)``, ``copy/set`` or
    ``other``."""
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "cudnn", "attention", "sdpa")):
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "nvjet", "matmul", "sm90_", "cublas")):
        return "gemm"
    if "triton" in n:
        return "triton (fused)"
    if "memcpy" in n or "memset" in n:
        return "copy/set"
    return "other"


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals, as sorted disjoint intervals (touching ones merged)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def summarize(kernels: list[tuple[str, float, float]], start: float, end: float) -> dict:
    """What one step's kernels say: ``kernels`` as ``(name, start, end)`` on one clock (microseconds), the step's
    span ``[start, end]`` on it.

    Returns:
        ``span_ms``; ``busy_ms`` (the union of the kernels' intervals inside the span) and ``busy_share``;
        ``kernel_ms`` (the sum of their durations: above ``busy_ms`` where kernels overlap); ``gap_ms`` (span minus
        busy: the GPU idle for this process); ``by_class_ms`` (:func:`classify`); ``kernels`` (count); ``by_name``
        (name -> [ms, count]).
    """
    inside = [(n, max(a, start), min(b, end)) for n, a, b in kernels if b > start and a < end]
    busy = sum(b - a for a, b in union([(a, b) for _, a, b in inside]))
    span = max(end - start, 0.0)
    by_class: dict[str, float] = defaultdict(float)
    by_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for n, a, b in inside:
        by_class[classify(n)] += (b - a) / 1e3
        by_name[n][0] += (b - a) / 1e3
        by_name[n][1] += 1
    return {"span_ms": round(span / 1e3, 3), "busy_ms": round(busy / 1e3, 3),
            "busy_share": round(busy / span, 4) if span else None,
            "kernel_ms": round(sum(by_class.values()), 3), "gap_ms": round((span - busy) / 1e3, 3),
            "by_class_ms": {k: round(v, 3) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
            "kernels": len(inside), "by_name": {k: [round(v[0], 4), v[1]] for k, v in by_name.items()}}


def compare(run: dict, alone: dict, top: int = 8) -> dict:
    """Ratios of a step in the run to the same item stepped alone (two :func:`summarize` results): ``wall``,
    ``kernel``, ``gap_ms_added``, per class, and the ``top`` kernel names by time added (each as
    ``[ms in the run, ms alone, count]``; a name with another count in the two passes ran different work)."""
    r = lambda a, b: round(a / b, 3) if b else None   # noqa: E731
    added = []
    for name, (ms, n) in run["by_name"].items():
        ms0, n0 = alone["by_name"].get(name, [0.0, 0])
        added.append((ms - ms0, name, [ms, ms0, n, n0]))
    added.sort(key=lambda x: -x[0])
    return {"kernel": r(run["kernel_ms"], alone["kernel_ms"]), "busy": r(run["busy_ms"], alone["busy_ms"]),
            "gap_ms_added": round(run["gap_ms"] - alone["gap_ms"], 3),
            "by_class": {k: r(v, alone["by_class_ms"].get(k, 0.0)) for k, v in run["by_class_ms"].items()},
            "top_added": [[name[:120], *vals] for _, name, vals in added[:top]]}


def thread_schedstat() -> tuple[float, float] | None:
    """This thread's ``(seconds on a CPU, seconds runnable but waiting for one)`` since it started, from
    ``/proc/thread-self/schedstat`` (Linux with scheduler statistics); ``None`` elsewhere."""
    try:
        run_ns, wait_ns, _ = Path("/proc/thread-self/schedstat").read_text().split()[:3]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


class StepProfile(Callback):
    """See the module docstring.

    Args:
        steps: the predict loop's batch indices to profile (0: the first video).
        path: the JSON written at the end of predicting (its folder is made); ``None``: nothing is written.
        again: step each profiled item once more at the end (the "alone" pass) and compare.
    """

    def __init__(self, steps: list[int] = (2,), path: str | None = "step_profile.json", again: bool = True):
        self.steps = {int(s) for s in steps}
        self.path = path
        self.again = again
        self._prof = None
        self._mark = None
        self._t = None
        self._items: list[tuple[int, dict]] = []
        self.results: list[dict] = []

    @staticmethod
    def _cuda() -> bool:
        return torch.cuda.is_available() and torch.cuda.is_initialized()

    def _sync(self) -> None:
        if self._cuda():
            torch.cuda.synchronize()

    def setup(self, trainer, pl_module, stage: str) -> None:
        # CUPTI's first use takes about a second: made here, off the profiled steps
        with torch.profiler.profile(activities=self._activities()):
            pass

    @staticmethod
    def _activities():
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    def _start(self) -> None:
        self._sync()
        self._prof = torch.profiler.profile(activities=self._activities())
        self._prof.__enter__()
        self._t = (time.perf_counter(), thread_schedstat(), process_age_s())
        self._mark = torch.profiler.record_function("step_profile.step")
        self._mark.__enter__()

    def _stop(self) -> dict:
        self._sync()
        self._mark.__exit__(None, None, None)
        wall = time.perf_counter() - self._t[0]
        sched = thread_schedstat()
        self._prof.__exit__(None, None, None)
        from torch.autograd import DeviceType

        events = self._prof.events()
        mark = next((e for e in events if e.name == "step_profile.step" and e.device_type == DeviceType.CPU), None)
        kernels = [(e.name, e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == DeviceType.CUDA and e.name != "step_profile.step"]
        out = {"wall_s": round(wall, 4), "at_s": self._t[2]}
        if mark is not None:
            out.update(summarize(kernels, mark.time_range.start, mark.time_range.end))
        if sched and self._t[1]:
            out["host_cpu_s"] = round(sched[0] - self._t[1][0], 4)
            out["host_runqueue_s"] = round(sched[1] - self._t[1][1], 4)
        out["threads"] = threading.active_count()
        self._prof = None
        return out

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if batch_idx in self.steps:
            self._start()

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        if self._prof is None or batch_idx not in self.steps:
            return
        res = {"step": batch_idx, "video_id": batch.get("video_id") if isinstance(batch, dict) else None,
               "run": self._stop()}
        self.results.append(res)
        if self.again:
            self._items.append((batch_idx, batch))

    def on_predict_end(self, trainer, pl_module) -> None:
        by_step = {r["step"]: r for r in self.results}
        for idx, item in self._items:
            self._start()
            pl_module.predict_step(item, idx)
            by_step[idx]["alone"] = self._stop()
            run, alone = by_step[idx]["run"], by_step[idx]["alone"]
            if "by_name" in run and "by_name" in alone:
                by_step[idx]["ratio"] = compare(run, alone)
        self._items.clear()
        for r in self.results:   # the per-name tables are for compare(); the file keeps the top ones
            for k in ("run", "alone"):
                if k in r and "by_name" in r[k]:
                    names = sorted(r[k]["by_name"].items(), key=lambda kv: -kv[1][0])[:15]
                    r[k]["by_name"] = dict(names)
        if self.path:
            p = Path(self.path)
            p.parent.mkdir(parents=True, exist_ok=True)
            if trainer.world_size > 1:   # one file per rank
                p = p.with_name(f"{p.stem}_rank{trainer.global_rank}{p.suffix}")
            p.write_text(json.dumps({"steps": self.results}, indent=1), encoding="utf-8")
        for r in self.results:
            line = f"[step profile] step {r['step']} {r.get('video_id')}: run {_brief(r['run'])}"
            if "alone" in r:
                line += f"; alone {_brief(r['alone'])}"
            print(line, flush=True)


def _brief(s: dict) -> str:
    parts = [f"wall {s['wall_s']:.3f} s"]
    if "busy_ms" in s:
        parts.append(f"GPU busy {s['busy_ms']:.0f} ms ({s['busy_share']:.0%}), kernels {s['kernel_ms']:.0f} ms, "
                     f"idle {s['gap_ms']:.0f} ms")
    if "host_runqueue_s" in s:
        parts.append(f"host on CPU {s['host_cpu_s']:.2f} s, waiting for a CPU {s['host_runqueue_s']:.2f} s")
    return ", ".join(parts)
