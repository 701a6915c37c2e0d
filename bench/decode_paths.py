"""CPU decode paths side by side on realistic clips (issue 31 §2): the same planned frames, read by each path.

Clips (made once with imageio-ffmpeg's binary, cached under ``--dir``): H.264 High yuv420p with B-frames
(x264 ``-preset faster -bf 3``), moving content (``testsrc2`` with a hue rotation), 1280x720 GOP 250 at 30 fps,
1280x720 GOP 60 at 29.97 fps, 1920x1080 GOP 250 at 30 fps, ``--seconds`` long each. For each clip and budget the
frames of :func:`datamodules.decode.plan_decode` (native size) are read by

* ``decord``: today's CPU reader (decodes every frame up to the last sampled one);
* ``pyav``: PyAV, every frame in order up to the last sampled one;
* ``pyav+nonref``: PyAV with ``skip_frame=NONREF`` on packets no sampled frame is;
* ``pyav+seek``: PyAV seeking over spans with a key frame and no sampled frame;
* ``pyav+both``: both (:func:`datamodules.decode.pyav_skip._pyav_skip_reader`).

Columns: seconds per video, source frames per second (the clip's frames over the time: the rate a video of that
kind is got through), the speed-up over decord, and whether the frames equal decord's bit for bit.

    python bench/decode_paths.py --seconds 60 --threads 2
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CLIPS = {  # name: (size, GOP, rate)
    "720p_g250": ("1280x720", 250, "30"),
    "720p_g60": ("1280x720", 60, "30000/1001"),
    "1080p_g250": ("1920x1080", 250, "30"),
}


def make_clip(path: Path, size: str, gop: int, rate: str, seconds: float) -> Path:
    import imageio_ffmpeg

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi",
                        "-i", f"testsrc2=size={size}:rate={rate},hue=H=t/3", "-t", str(seconds), "-c:v", "libx264",
                        "-preset", "faster", "-profile:v", "high", "-bf", "3", "-g", str(gop), "-pix_fmt", "yuv420p",
                        str(path)], check=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/decode_paths")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budgets", type=int, nargs="+", default=[1024, 16384])
    ap.add_argument("--clips", nargs="+", default=list(CLIPS))
    args = ap.parse_args()

    from datamodules import decode as D
    from datamodules.decode import cpu, pyav_skip

    paths = {"pyav": dict(skip_nonref=False, seek=False), "pyav+nonref": dict(seek=False),
             "pyav+seek": dict(skip_nonref=False), "pyav+both": {}}
    print(f"{'clip':<11} {'B':>6} {'frames':>6} {'of':>6} {'path':<12} {'s/video':>8} {'src fr/s':>9} "
          f"{'speed-up':>8}  equal")
    for name in args.clips:
        size, gop, rate = CLIPS[name]
        path = make_clip(Path(args.dir) / f"{name}_{args.seconds:g}s.mp4", size, gop, rate, args.seconds)
        probe = D.probe_video(path)
        for b in args.budgets:
            plan = D.plan_decode(path, probe, b, native_decode_bytes=float("inf"))
            dh, dw = plan.decode_hw
            t = time.perf_counter()
            ref = cpu._read_frames(path, plan.unique, probe.height, probe.width, dh, dw, args.threads)
            base = time.perf_counter() - t
            rows = [("decord", base, True)]
            for label, kw in paths.items():
                t = time.perf_counter()
                got = pyav_skip._pyav_skip_reader(path, probe, dh, dw, args.threads, **kw)(plan.unique)
                rows.append((label, time.perf_counter() - t, bool(np.array_equal(got, ref))))
                del got
            for label, sec, eq in rows:
                print(f"{name:<11} {b:>6} {len(plan.unique):>6} {len(probe.pts):>6} {label:<12} {sec:>8.2f} "
                      f"{len(probe.pts) / sec:>9.0f} {base / sec:>7.2f}x  {eq}", flush=True)


if __name__ == "__main__":
    main()
