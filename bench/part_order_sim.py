"""Replay a CLI run's decode windows through the loader's two orders of decode parts (issue 40, the feed).

Reads the ``per_video`` rows of a CLI run (``timing_rank0.json``, or a ``bench/workload.py --cli --json`` file's
``cli_runs``): each video's decode window (start-end, seconds), its parts and its step. Each part is taken to cost
its video's window (the parts of a video decode side by side), and each whole video its window. Then ``--workers``
workers take the items in order, each as soon as it is idle (``prefetch_factor`` 1, ``in_order=False``: what a parts
run does), a video is ready when its last part is, and the GPU steps the ready videos in turn from the run's
``model_loaded`` (relative to the first worker's start). Printed per decode scale (the windows times 1, 0.75, 0.5:
a decode that keeps up better, as on a lighter set): the end of the last step and the GPU's wait after the first
video, for the order before session 6 (each video's parts back to back in run order) and for
:func:`datamodules.part_join.interleave_parts`. The run order is :func:`datamodules.sharding.run_order` over each
video's window times its parts (the measured work standing in for ``estimate_cost``).

    python bench/part_order_sim.py bench/results/s6call3_cli_copies_h100_2026-12-06.json
    python bench/part_order_sim.py --synthetic 120     (a Video-MME-like third long / medium / short, see synthetic_rows)
"""
from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules.part_join import interleave_parts  # noqa: E402
from datamodules.sharding import run_order  # noqa: E402


def load_rows(path: Path, label: str | None = None) -> tuple[list[dict], float]:
    """(per_video rows, GPU start relative to the first decode start) of the file's CLI run named ``label`` (a
    ``bench/workload.py --cli --json`` file; its last run when None) or of a ``timing_rank0.json``.

    Raises:
        SystemExit: no run of that label (the labels the file has are named)."""
    data = json.loads(path.read_text())
    runs = data.get("cli_runs") or {}
    if label is not None and label not in runs:
        raise SystemExit(f"{path}: no CLI run {label!r}; it has {sorted(runs) or 'none'}")
    run = runs[label] if label is not None else (list(runs.values())[-1] if runs else data.get("timing") or data)
    rows = run["per_video"]
    t0 = min(r["decode_start"] for r in rows)
    gpu = run.get("timeline_s", {}).get("model_loaded", t0) - t0
    return rows, max(gpu, 0.0)


def synthetic_rows(n: int, seed: int = 0, long_s: float = 20.0, medium_s: float = 8.0, short_s: float = 3.0,
                   parts: int = 4, step_s: float = 2.3) -> list[dict]:
    """``n`` videos in Video-MME's proportions (a third long, a third medium, a third short): the long ones in
    ``parts`` parts, each part ``long_s`` seconds; the others whole, ``medium_s`` / ``short_s`` seconds; every
    window times a seeded factor in [0.7, 1.3]; each step ``step_s`` (the H100 CLI's 2.36 s). The windows are of the
    order call 3 measured (a 30-minute 1080p file's part 20-28 s beside the others, a 90 s video 3-5 s)."""
    import random

    rnd = random.Random(seed)
    rows = []
    for kind, window, k in (("long", long_s, parts), ("medium", medium_s, 1), ("short", short_s, 1)):
        for i in range(n // 3):
            row = {"video_id": f"{kind}{i}", "decode_start": 0.0, "decode_end": window * rnd.uniform(0.7, 1.3),
                   "step_s": step_s}
            if k > 1:
                row["decode_parts"] = k
            rows.append(row)
    return rows


def simulate(rows: list[dict], order: list[int], workers: int, scale: float, gpu_start: float) -> tuple[float, float,
                                                                                                         float]:
    """(end of the last step, wait after the first video, that wait's share of the time after the first video)
    with the videos' items taken in ``order`` by ``workers`` idle workers."""
    free = [(0.0, w) for w in range(workers)]
    heapq.heapify(free)
    ready = []
    for v in order:
        k = rows[v].get("decode_parts", 1)
        ends = []
        for _ in range(k):
            t, w = heapq.heappop(free)
            end = t + (rows[v]["decode_end"] - rows[v]["decode_start"]) * scale
            heapq.heappush(free, (end, w))
            ends.append(end)
        ready.append((max(ends), v))
    ready.sort()
    clock, wait, steps = gpu_start, 0.0, 0.0
    for n, (r, v) in enumerate(ready):
        if r > clock:
            wait += (r - clock) if n else 0.0
            clock = r
        step = rows[v].get("step_s", 2.0)
        steps += step if n else 0.0
        clock += step
    return clock, wait, wait / max(wait + steps, 1e-9)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, nargs="?", help="timing_rank0.json or a bench/workload.py --cli --json file")
    ap.add_argument("--synthetic", type=int, default=None, help="instead of a run: this many videos (synthetic_rows)")
    ap.add_argument("--label", default=None, help="which CLI run of a workload json (e.g. 'auto#2'; default the last)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 0.75, 0.5])
    args = ap.parse_args(argv)
    if (args.run is None) == (args.synthetic is None):
        ap.error("give a run's json or --synthetic N")
    rows, gpu_start = load_rows(args.run, args.label) if args.run else (synthetic_rows(args.synthetic), 5.0)
    costs = [(r["decode_end"] - r["decode_start"]) * r.get("decode_parts", 1) for r in rows]
    order = run_order(range(len(rows)), costs, args.workers)
    counts = [r.get("decode_parts", 1) for r in rows]
    out = []
    print(f"{len(rows)} videos ({sum(c > 1 for c in counts)} in parts), {args.workers} workers, GPU from "
          f"{gpu_start:.1f} s after the first decode start")
    print(f"{'decode x':>8}  {'order':<12} {'end s':>7} {'wait after first s':>19} {'share':>6}")
    for scale in args.scales:
        for name, o in (("back to back", order), ("interleaved", interleave_parts(order, counts))):
            end, wait, share = simulate(rows, o, args.workers, scale, gpu_start)
            out.append({"scale": scale, "order": name, "end_s": end, "wait_s": wait, "share": share})
            print(f"{scale:>8.2f}  {name:<12} {end:>7.1f} {wait:>19.1f} {share:>6.1%}")
    return out


if __name__ == "__main__":
    main()
