"""How soon the first decoded video reaches the step, by how the DataLoader's decode workers start (issue 31).

``spawn`` (what NVDEC runs used): every worker is a fresh interpreter that imports torch, the decoders and the
video processor before its first decode, all at once. ``forkserver``: one server process imports them once and
forks each worker (``datamodules.videoqa.decode_worker_context``); ``forkserver, started early``: the server was
started ``--head-start`` seconds before the loader (``VideoQADataModule.setup`` starts it while the model loads).
``fork`` (the CPU decoders) for reference. Each mode runs in a fresh process: the timed loader is the first one
there, as in a run. Prints, per mode: seconds from the loader's ``iter()`` to the first item, to every worker's
first decode start, and to all items.

    python bench/worker_start.py --workers 8 --videos 16
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def one(mode: str, workers: int, videos: int, head_start: float, model: str) -> dict:
    """Runs in its own process: build the demo dataset and time its loader (``mode`` as above)."""
    import multiprocessing

    from torch.utils.data import DataLoader

    from callbacks.process_clock import boot_s
    from datamodules.benchmarks import Question
    from datamodules.decode import EncoderSizing
    from datamodules.video_items import VideoQADataset, VideoTask
    from datamodules.videoqa import decode_worker_context
    from models.videollama3.frame_sizes import load_video_processor

    processor = load_video_processor(model)
    media = sorted((REPO / "assets" / "media").glob("*.mp4"))
    tasks = []
    for k in range(videos):
        v = media[k % len(media)]
        tasks.append(VideoTask(f"{v.stem}_{k}", str(v), "videomme",
                               [Question(f"q{k}", f"{v.stem}_{k}", str(v), "Q?", ["a", "b"], "A")], {f"q{k}": ["b256"]}))
    ds = VideoQADataset(tasks, 256, sizing=EncoderSizing((256,), 256, "phase3", 256, processor), decoder="cpu")
    if mode == "fork":
        ctx = multiprocessing.get_context("fork")
    elif mode == "spawn":
        ctx = multiprocessing.get_context("spawn")
    else:
        ctx = decode_worker_context("auto", workers, True, (type(processor).__module__,))
        if mode == "forkserver_early":
            from multiprocessing import forkserver

            forkserver.ensure_running()
            time.sleep(head_start)      # the main process's model load, in a run
    t0, b0 = time.perf_counter(), boot_s()
    first, starts = None, {}
    for item in DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=ctx):
        if first is None:
            first = time.perf_counter() - t0
        w = item["worker_start_boot_s"]
        starts.setdefault(w, item["decode_boot_s"][0] - b0)
    return {"mode": mode, "first_item_s": first, "all_s": time.perf_counter() - t0,
            "first_decode_starts_s": sorted(starts.values())}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--videos", type=int, default=16)
    ap.add_argument("--head-start", type=float, default=5.0, help="s the early server runs before the loader")
    ap.add_argument("--model", default=str(REPO / "checkpoints" / "tiny-videollama3"))
    ap.add_argument("--modes", nargs="+", default=["fork", "spawn", "forkserver", "forkserver_early"])
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.workers, args.videos, args.head_start, args.model)))
        return []
    if not (Path(args.model) / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "models.videollama3.tiny"], cwd=REPO, check=True)
    rows = []
    for mode in args.modes:
        r = subprocess.run([sys.executable, __file__, "--one", mode, "--workers", str(args.workers), "--videos",
                            str(args.videos), "--head-start", str(args.head_start), "--model", args.model],
                           cwd=REPO, capture_output=True, text=True, check=True)
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"\n{args.workers} workers, {args.videos} videos (bundled clips, CPU decoder), seconds after the loader's "
          f"iter(); forkserver_early: server started {args.head_start:.0f} s before")
    print(f"{'mode':<18} {'first item':>10} {'workers decoding (first .. last start)':>40} {'all items':>10}")
    for r in rows:
        s = r["first_decode_starts_s"]
        print(f"{r['mode']:<18} {r['first_item_s']:>10.2f} {f'{s[0]:.2f} .. {s[-1]:.2f} ({len(s)})':>40} "
              f"{r['all_s']:>10.2f}")
    return rows


if __name__ == "__main__":
    main()
