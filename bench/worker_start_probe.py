"""Where a decode worker's first NVDEC job spends its first seconds, with N workers starting at once (issue 41).

In the user's CLI on the H100 (session 14 call 2, ``bench/results/s14call2_cli_new1_h100_2026-12-07.json``) the 15
NVDEC workers stamp their first job's start at 8.4 s after the process start, but the NVDEC engines stay idle until
13.5 s while the CPUs are 28-39 % busy: the second video waits 2.8 s for its decode. This probe starts N processes
from a ``forkserver`` whose preload is the workers' (``datamodules.worker_server.WORKER_PRELOAD``), releases them
together (a barrier) and times, in each, the phases of a first NVDEC read in the order the worker meets them:

- ``avail``: ``torch.cuda.is_available()`` (the driver's ``cuInit`` in this process);
- ``caps``: ``nvdec_unsupported(video)`` (a PyAV probe, PyNvVideoCodec's demuxer and ``GetDecoderCaps``);
- ``ctx``: ``torch.cuda.set_device`` + one 4-byte allocation (the primary context, which ``read_nvdec``'s
  ``torch.cuda.device(...)`` creates);
- ``read``: ``read_nvdec`` of the first ``--frames`` sampled frames (one per second; decoders created, fed,
  converted).

Each N prints the phases' median and max and the wall from the release to the last process's end. Optional
``--pinned-gb G``: the parent pins G GiB of host memory (``torch.empty(..., pin_memory=True)``, as a weight load's
buffers) at the release, to see whether the main process's pinning holds the workers back.

    python bench/worker_start_probe.py --video /tmp/wl/s1_h264_360p25_g60_90s.mp4 --procs 1 4 15 [--pinned-gb 8]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PHASES = ("avail", "caps", "ctx", "read")


def _job(args: tuple) -> dict:
    """One worker's first NVDEC read, phase by phase (seconds), after the barrier; runs in a forked worker."""
    video, frames, barrier = args
    import torch

    from datamodules.decode import nvdec, nvdec_plan

    p = nvdec_plan.probe(video)   # (PyAV, the container's header: outside the timed phases, as the plan's probe)
    step = 25   # about one frame a second of the workload set's 25-30 fps videos
    idx = list(range(0, min(p.frames or frames * step, frames * step), step))
    barrier.wait()
    out, t = {}, time.perf_counter()
    out["start_unix"] = time.time()
    torch.cuda.is_available()
    out["avail"], t = time.perf_counter() - t, time.perf_counter()
    why = nvdec_plan.nvdec_unsupported(video, 0)
    out["caps"], t = time.perf_counter() - t, time.perf_counter()
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    out["ctx"], t = time.perf_counter() - t, time.perf_counter()
    stats: dict = {}
    if why is None:
        nvdec.read_nvdec(video, idx, (p.height, p.width), 0, probed=p, stats=stats)
    out["read"] = time.perf_counter() - t
    # per session: its start to its first wanted frame (packet-fed sessions), and its seconds inside Decode()
    out["sessions"] = [{k: r.get(k) for k in ("first_frame_s", "decode_s", "frames")} for r in stats.get("runs", [])]
    out["why"] = why
    out["end_unix"] = time.time()
    return out


def run(video: str, n: int, frames: int, pinned_gb: float) -> dict:
    """N forkserver processes released together; each one's phases, and the wall to the last end."""
    from datamodules.worker_server import WORKER_PRELOAD

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(WORKER_PRELOAD))
    manager = ctx.Manager()
    barrier = manager.Barrier(n + 1)
    with ctx.Pool(n) as pool:
        res = pool.map_async(_job, [(video, frames, barrier)] * n, chunksize=1)
        barrier.wait()
        t0 = time.time()
        if pinned_gb:
            import torch

            t = time.perf_counter()
            held = torch.empty(int(pinned_gb * 2**30), dtype=torch.uint8, pin_memory=True)
            print(f"  (parent pinned {pinned_gb:g} GiB in {time.perf_counter() - t:.2f} s)", flush=True)
            del held
        rows = res.get(timeout=600)
    manager.shutdown()
    return {"n": n, "pinned_gb": pinned_gb, "rows": rows, "wall_s": max(r["end_unix"] for r in rows) - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--video", required=True)
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 4, 15])
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--pinned-gb", type=float, default=0.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    print(f"{'N':>3} {'pinned':>6} " + " ".join(f"{p + ' med/max (s)':>20}" for p in PHASES) + f" {'wall (s)':>9}")
    for n in args.procs:
        r = run(args.video, n, args.frames, args.pinned_gb)
        results.append(r)
        cells = []
        for ph in PHASES:
            xs = [row[ph] for row in r["rows"]]
            cells.append(f"{statistics.median(xs):9.3f}/{max(xs):<9.3f}")
        firsts = [x["first_frame_s"] for row in r["rows"] for x in row["sessions"] if x.get("first_frame_s")]
        if firsts:
            cells.append(f"first frame {statistics.median(firsts):.3f}/{max(firsts):.3f}")
        whys = {row["why"] for row in r["rows"] if row["why"]}
        print(f"{n:3d} {args.pinned_gb:6g} " + " ".join(f"{c:>20}" for c in cells) + f" {r['wall_s']:9.2f}"
              + (f"  (not NVDEC: {whys})" if whys else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
