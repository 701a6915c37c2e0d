"""What the concealment flags cost on the CPU path (issue 42 item 1 leftovers): before / after per video.

Before (HEAD before this change): every file decord read was decoded twice, decord's read then
:func:`datamodules.decode.concealed_frames` (a second PyAV decode of the GOPs holding sampled frames, for the flags
decord does not give). After: the reader :func:`datamodules.decode.cpu_reader_for` now picks, with its own flags:
``pyav_sws`` (one PyAV pass converted by decord's libswscale: decord's frames and the flags together) for
H.264/HEVC/VP9 8-bit 4:2:0 without a display transform; ``decord`` + the check for the rest. Columns: sampled
frames, the reader after, seconds (wall / process CPU, decoder threads included) of decord, of the check, of
before (their sum), of after, the speed-up (before / after, CPU), whether the frames equal decord's byte for byte
and the flags equal the check's; ``--candidates`` adds the check pass with ``skip_loop_filter=all`` (CPU s) and
decord with the check run concurrently in a thread (wall s; the CPU work is unchanged).

The workload-shaped set: ``python bench/workload.py --make /tmp/wl``; then

    python bench/conceal_check.py --videos /tmp/wl --max-frame 4000 --candidates
    python bench/conceal_check.py --videos /tmp/wl/s2_h264_720p2997_g250_90s.mp4 --max-side 448

``--max-frame N`` keeps the sampled frames below native index N (a long video's window: the decode cost is linear
in the frames decoded); ``--max-side S`` forces a reduced decode size (long side S) as a large budget does.
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def timed(fn):
    """``(result, wall s, process CPU s)`` of ``fn()``."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--videos", nargs="+", default=["/tmp/wl"], help="files or folders")
    ap.add_argument("--budget", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-side", type=int, default=None)
    ap.add_argument("--max-frame", type=int, default=None)
    ap.add_argument("--candidates", action="store_true")
    args = ap.parse_args(argv)

    from datamodules import decode as D
    from datamodules.decode import cpu, pyav_skip

    files = [f for v in args.videos for f in (sorted(Path(v).iterdir()) if Path(v).is_dir() else [Path(v)])]
    rows = []
    for path in files:
        probe = D.probe_video(path)
        kw = {"native_decode_bytes": 1, "decode_max_side": args.max_side} if args.max_side else {}
        plan = D.plan_decode(path, probe, args.budget, **kw)
        idx = [k for k in plan.unique if args.max_frame is None or k < args.max_frame]
        (dh, dw), n = plan.decode_hw, args.threads
        name = D.cpu_reader_for(probe, (dh, dw))
        if name not in ("decord", "pyav_sws"):   # read by PyAV with its own flags before and after
            print(f"{path.name}: {name} (no check before either)")
            continue
        ref, dw_s, dc_s = timed(lambda: cpu._read_frames(path, idx, probe.height, probe.width, dh, dw, n))
        old, cw_s, cc_s = timed(lambda: D.concealed_frames(path, probe, idx, n))
        if name == "pyav_sws":
            read = D.READERS[name](path, probe, dh, dw, n)
            got, aw_s, ac_s = timed(lambda: read(idx))
            flags, same = set(read.concealed), bool(np.array_equal(got, ref))
            del got
        else:
            (_, flags), aw_s, ac_s = timed(lambda: (cpu._read_frames(path, idx, probe.height, probe.width, dh, dw, n),
                                                    D.concealed_frames(path, probe, idx, n)))
            same = True
        row = {"video": path.name, "frames": len(idx), "hw": f"{dh}x{dw}", "after": name, "decord": (dw_s, dc_s),
               "check": (cw_s, cc_s), "before": (dw_s + cw_s, dc_s + cc_s), "after_s": (aw_s, ac_s),
               "frames_equal": same, "flags_equal": flags == old}
        if args.candidates:
            def lf():
                r = pyav_skip._pyav_skip_reader(path, probe, 1, 1, n, check_only=True,
                                                codec_options={"skip_loop_filter": "all"})
                r(idx)
                return set(r.concealed)
            lf_flags, _, row["check_lf_cpu"] = timed(lf)
            row["check_lf_flags_equal"] = lf_flags == old

            def both():
                with ThreadPoolExecutor(1) as ex:
                    fut = ex.submit(D.concealed_frames, path, probe, idx, n)
                    cpu._read_frames(path, idx, probe.height, probe.width, dh, dw, n)
                    return fut.result()
            _, row["concurrent_wall"], _ = timed(both)
        rows.append(row)
        print(row, flush=True)
    print(f"\n{'video':<34} {'frames':>6} {'size':>9} {'after':<8} {'decord':>11} {'check':>11} {'before':>11} "
          f"{'after':>11} {'x (cpu)':>7}  frames= flags=" + ("  check_lf cpu  concurrent wall" if args.candidates
                                                               else ""))
    for r in rows:
        f = lambda t: f"{t[0]:5.1f}/{t[1]:5.1f}"   # noqa: E731 - wall / CPU seconds
        extra = f"  {r['check_lf_cpu']:12.1f}  {r['concurrent_wall']:15.1f}" if args.candidates else ""
        print(f"{r['video']:<34} {r['frames']:>6} {r['hw']:>9} {r['after']:<8} {f(r['decord'])} {f(r['check'])} "
              f"{f(r['before'])} {f(r['after_s'])} {r['before'][1] / r['after_s'][1]:6.2f}x  {r['frames_equal']!s:<6} "
              f"{r['flags_equal']}{extra}")
    print("(seconds wall/CPU per video; threads per decoder:", args.threads, ")")
    return rows


if __name__ == "__main__":
    main()
