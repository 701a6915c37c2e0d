"""Is one long video's NVDEC latency shorter when its sampled frames are decoded by several PROCESSES? (issue 40)

On the H100 (2026-12-06), the 30-minute 1080p H.264 file took 16.4 s with 8 sessions in one process (NVDEC 50 %
busy, CPU 14 %) and 29.3 s with 16: the sessions of one process serialise inside the library or driver, while many
processes (the 6-copy mix) kept the engines 67 % busy. This probe measures the lever that leaves: the video's
sampled indices cut at IDR periods into ``procs`` parts (:func:`datamodules.decode.nvdec.split_runs_at_periods`),
each part decoded by :func:`datamodules.decode.nvdec.read_nvdec` with ``sessions`` sessions in its own process.

The processes are started (spawn), import the decoder and make their CUDA context BEFORE the clock starts (what a
persistent pool of decode processes would pay once per run; that start is printed apart), then all are released at
once. Each part does its own packet scan (as a worker would). The frames of every configuration are hashed part by
part and compared with the same slices of the first configuration's frames.

    python bench/nvdec_split_probe.py VIDEO --configs 1x8 2x4 4x2 4x4 8x2 [--json out.json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def _child(path: str, run: list[int], decode_hw, sessions: int, ready, go, results) -> None:
    t0 = time.perf_counter()
    from datamodules.decode import nvdec
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    nvdec._nvc()
    start_s = time.perf_counter() - t0
    ready.put(start_s)
    go.wait()
    t1 = time.time()
    stats: dict = {}
    frames = nvdec.read_nvdec(path, run, tuple(decode_hw), sessions=sessions, stats=stats)
    t2 = time.time()
    results.put({"first": run[0], "n": len(run), "t_start": t1, "t_end": t2, "scan_s": stats.get("scan_s"),
                 "runs": len(stats.get("runs") or []),
                 "decode_s": round(sum(r.get("decode_s", 0.0) for r in stats.get("runs") or []), 2),
                 "sha": hashlib.sha1(frames.tobytes()).hexdigest(), "frame_bytes": frames[0].nbytes})


def measure(path: Path, idx: list[int], decode_hw, procs: int, sessions: int, period: list[int] | None) -> dict:
    from datamodules.decode.nvdec import split_runs, split_runs_at_periods
    from workload import UtilSampler

    parts = split_runs_at_periods(idx, period, procs, min_frames=1) if period else split_runs(idx, procs, 1)
    ctx = get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    t_spawn = time.perf_counter()
    ps = [ctx.Process(target=_child, args=(str(path), part, list(decode_hw), sessions, ready, go, results))
          for part in parts]
    for p in ps:
        p.start()
    starts = [ready.get(timeout=120) for _ in ps]
    spawn_s = time.perf_counter() - t_spawn
    with UtilSampler() as util:
        t0 = time.time()
        go.set()
        rows = [results.get(timeout=300) for _ in ps]
        wall = time.time() - t0
    for p in ps:
        p.join(timeout=30)
    rows.sort(key=lambda r: r["first"])
    u = util.summary()
    return {"procs": len(parts), "sessions": sessions, "wall_s": round(wall, 2), "spawn_ready_s": round(spawn_s, 2),
            "child_start_s": [round(s, 2) for s in starts], "parts": [r["n"] for r in rows],
            "part_wall_s": [round(r["t_end"] - r["t_start"], 2) for r in rows],
            "scan_s": [r["scan_s"] for r in rows], "decode_calls_s": [r["decode_s"] for r in rows],
            "nvdec_busy": u.get("nvdec_busy"), "cpu_busy": u.get("cpu_busy"), "gpu_sm_busy": u.get("gpu_sm_busy"),
            "shas": [r["sha"] for r in rows], "bounds": [[r["first"], r["n"]] for r in rows]}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("video")
    ap.add_argument("--configs", nargs="+", default=["1x8", "2x4", "4x2", "4x4", "8x2"],
                    help="PROCSxSESSIONS per configuration")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from datamodules.decode import nvdec, packet_filter as pf
    from workload import plan
    import numpy as np

    path = Path(a.video)
    p = plan(path)
    idx, decode_hw = list(p["idx"]), tuple(p["decode_hw"])
    scanned = pf.scan(str(path))
    per = scanned.periods()
    period = [per[i] for i in idx]
    print(f"{path.name}: {len(idx)} sampled frames, decode size {decode_hw}, {len(scanned.pts)} packets, "
          f"{max(per) + 1} IDR periods", flush=True)
    # the reference frames, whole, in this process (one read, 8 sessions), hashed per part below
    ref = nvdec.read_nvdec(str(path), idx, decode_hw, sessions=8)
    out = []
    for cfg in a.configs:
        k, s = (int(x) for x in cfg.split("x"))
        row = measure(path, idx, decode_hw, k, s, period)
        pos = {i: j for j, i in enumerate(idx)}
        equal = all(hashlib.sha1(np.ascontiguousarray(ref[pos[f]: pos[f] + n]).tobytes()).hexdigest() == sha
                    for (f, n), sha in zip(row["bounds"], row["shas"]))
        row["frames_equal"] = equal
        out.append(row)
        print(f"split {cfg}: {row['procs']} processes x {s} sessions: wall {row['wall_s']} s "
              f"({len(idx) / row['wall_s']:.0f} sampled frames/s); parts {row['parts']} took {row['part_wall_s']} s "
              f"(scan {row['scan_s']}, decode calls {row['decode_calls_s']}); busy NVDEC {row['nvdec_busy']} "
              f"CPU {row['cpu_busy']} SM {row['gpu_sm_busy']}; start+import+context before the clock "
              f"{row['spawn_ready_s']} s; frames {'equal' if equal else 'DIFFER'}", flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
