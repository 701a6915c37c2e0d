"""Peak host RSS of one DataLoader item for an hour-long 1080p video (issue 25, target 4), on the CPU.

Generates once (cached) a 1-hour 1920x1080 video (lavfi ``testsrc2`` at ``--fps`` frames per second, libx264
ultrafast), then, each in a fresh subprocess, builds one :class:`datamodules.videoqa.VideoQADataset` item for it
(the decode of a DataLoader worker) and pickles it as a worker puts it on its queue (``ForkingPickler``: the
tensors move to shared memory). The figure is ``ru_maxrss`` of that process minus the same process's peak
without the decode (interpreter, torch, decord, transformers, the processor: the baseline).

Rows: budgets ``16384`` and ``4096,16384`` (configs/predict/videomme.yaml), each with frames held at the decode size
(``hold off``, the path before issue 25) and at the encoder's sizes (``hold on``, ``data.hold_encoder_sizes``).

    python bench/hour_video_rss.py                      # video under /tmp/hour_video_rss/, both paths
    python bench/hour_video_rss.py --video my.mp4 --hold on
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def make_video(path: Path, seconds: int, fps: float, width: int = 1920, height: int = 1080) -> Path:
    """``seconds`` of ``width x height`` testsrc2 at ``fps`` (H.264 ultrafast), written once (atomic rename)."""
    if path.is_file():
        return path
    from tests.media_factory import run_ffmpeg

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".part.mp4")
    t0 = time.perf_counter()
    run_ffmpeg("-f", "lavfi", "-i", f"testsrc2=size={width}x{height}:rate={fps:g}:duration={seconds}",
               "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", str(tmp))
    tmp.rename(path)
    print(f"generated {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


def child(args: argparse.Namespace) -> None:
    """One measurement in this (fresh) process; prints a JSON line."""
    import io

    import torch  # noqa: F401
    import decord  # noqa: F401
    import torch.multiprocessing  # noqa: F401 - registers the shared-memory reductions, as DataLoader workers have
    from multiprocessing.reduction import ForkingPickler
    from transformers.models.video_llama_3.video_processing_video_llama_3 import VideoLlama3VideoProcessor

    from datamodules.videoqa import VideoQADataset, VideoTask
    try:
        from datamodules.decode import EncoderFrames, EncoderSizing
    except ImportError:   # code from before issue 25 (``--hold off`` only)
        EncoderFrames = EncoderSizing = None

    spec = args.budgets[0]
    budgets = tuple(int(b) for b in spec.split(","))
    processor = VideoLlama3VideoProcessor(use_token_compression=False)
    sizing = EncoderSizing(budgets, 256, "phase3", 256, processor) if args.hold == "on" else None
    ds = VideoQADataset([VideoTask("hour", str(args.video), "videomme", [], {})], max(budgets),
                        decode_threads=args.decode_threads, **({"sizing": sizing} if sizing else {}))
    out = {"budgets": spec, "hold": args.hold}
    if not args.baseline:
        t0 = time.perf_counter()
        item = ds[0]
        if item["error"]:
            raise SystemExit(item["error"])
        buf = io.BytesIO()
        ForkingPickler(buf).dump(item)      # what a DataLoader worker does with the item (tensors to shm)
        frames = item["frames"]
        if EncoderFrames is not None and isinstance(frames, EncoderFrames):
            item_bytes = frames.nbytes
            size = " + ".join(f"{len(p)}@{t.shape[2]}x{t.shape[1]}" for t, p in frames.held.values())
        else:
            item_bytes = frames.numel() * frames.element_size()
            size = f"{frames.shape[0]}@{frames.shape[2]}x{frames.shape[1]}"
        out.update(frames=int(frames.shape[0]), decode_hw=item["video_info"]["decode_hw"], held=size,
                   item_bytes=item_bytes, seconds=round(time.perf_counter() - t0, 1))
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB
    print(json.dumps(out), flush=True)


def measure(video: Path, budgets: str, hold: str, baseline: bool, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", "--video", str(video), "--budgets", budgets, "--hold", hold,
           "--decode-threads", str(threads)] + (["--baseline"] if baseline else [])
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--video", type=Path, default=None, help="default: generated under --cache")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/hour_video_rss"))
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--fps", type=float, default=1.0, help="frame rate of the generated video")
    ap.add_argument("--budgets", nargs="+", default=["16384", "4096,16384"])
    ap.add_argument("--hold", choices=["off", "on", "both"], default="both")
    ap.add_argument("--decode-threads", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    video = args.video or make_video(args.cache / f"testsrc2_1080p_{args.seconds}s_{args.fps:g}fps.mp4",
                                     args.seconds, args.fps)
    holds = ["off", "on"] if args.hold == "both" else [args.hold]
    rows = []
    for hold in holds:
        base = measure(video, args.budgets[0], hold, True, args.decode_threads)["peak_rss"]
        for b in args.budgets:
            r = measure(video, b, hold, False, args.decode_threads)
            r["baseline"], r["per_item"] = base, r["peak_rss"] - base
            rows.append(r)
            print(json.dumps(r), flush=True)
    gb = 1e9
    print(f"\n{video.name}: peak host RSS of one DataLoader item (GB = 1e9 bytes)")
    print(f"{'budgets':<12} {'path':<22} {'frames':>6} {'decode':>9} {'held at':>18} {'item GB':>8} {'peak GB':>8} "
          f"{'base GB':>8} {'per-item GB':>11} {'s':>6}")
    for r in rows:
        path = "decode size (before)" if r["hold"] == "off" else "encoder sizes (after)"
        print(f"{r['budgets']:<12} {path:<22} {r['frames']:>6} {'x'.join(map(str, r['decode_hw'][::-1])):>9} "
              f"{r['held']:>18} {r['item_bytes'] / gb:>8.3f} {r['peak_rss'] / gb:>8.3f} {r['baseline'] / gb:>8.3f} "
              f"{r['per_item'] / gb:>11.3f} {r['seconds']:>6}")


if __name__ == "__main__":
    main()
