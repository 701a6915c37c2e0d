"""The Video-MME-shaped workload, measured per decode path (issue 31 §1, §3).

1. **The set**, made on the machine where it runs: short / medium / long videos at Video-MME lengths, mixed
   640x360 / 1280x720 / 1920x1080, 25 / 29.97 / 30 fps, H.264 High yuv420p with 3 B-frames and GOPs of 60 and 250,
   one HEVC and one VP9. Moving content (a scrolling gradient with moving blocks and noise, so the encoder and the
   decoder do real work). A 60 s base segment per look is encoded (imageio-ffmpeg's ffmpeg where it exists, else
   the libx264 / libx265 / libvpx inside PyAV's wheel: the GPU machine has no ffmpeg binary), then looped to the
   full length by copying its packets with shifted timestamps (closed GOPs, identical parameter sets: a valid
   stream; the content repeats every 60 s, the decoding cost per frame does not change).
2. **Decode paths**, each in a pool of ``--workers`` spawned processes (the DataLoader's shape: 8 workers, the CPU
   path with ``auto_decode_threads`` threads each): the frames seed 001's sampling keeps at the run's largest
   budget (``algorithms.budget.sample_frames``, 16,384 tokens; decode size ``decode_frame_size``), read by decord
   (``cpu``, today's reader: ``VideoReader.get_batch``), by :func:`datamodules.decode.nvdec.read_nvdec` fed only the
   packets the sampled frames need (``nvdec``: ``nvdec_skip_nonref=True``, the default; per-file CPU fallback
   with the reason) or decoding every frame of the runs' GOPs (``nvdec_full``: what ``nvdec`` was in
   ``bench/results/workload_h200_2026-12-02.*``), or by FFmpeg's software decoder (PyAV) fed only the needed
   packets and converted by decord's swscale (``cpu_skip``: the CPU proof on the workload; its hashes must equal
   ``cpu``'s), or as ``decode_video``'s CPU path reads with its concealment flags (``cpu_checked``: decord then
   :func:`datamodules.decode.concealed_frames`, before issue 42's one pass; ``cpu_run``: the reader
   ``cpu_reader_for`` picks now, ``pyav_sws`` giving frames and flags in one pass). Each packet-filtered video
   prints how many of its covered source frames were never decoded. Each video's frames are hashed, so the paths
   are compared frame for
   frame. ``--window-s`` decodes only the sampled frames of the first N seconds of each video (both paths alike)
   and scales the seconds to the whole video by its source-frame count (the decode cost is linear in the frames
   decoded); the table says when it did.
3. **GPU step** per video: the user's ``evaluate.py predict --config configs/predict/videomme.yaml`` on the set
   (``--cli``; the figures from its ``timing_rank0.json`` via ``bench/cli_throughput.py``), else ``--gpu-step-s``
   (default: the H200 figures of issues 31/33 with the 7B-size random checkpoint at 4k+16k: 1.53 s for a short
   video, 2.36 s for a 10-minute one and longer, whose frame count the budget caps).
4. **Table** per duration class and path: GPU step, decode seconds per video, GPU wait share and videos per hour
   with ``--workers`` decoding in parallel (per-video wall = max(step, decode / workers)), and the extrapolated
   full Video-MME (900 videos: 300 short of 80.7 s mean, 300 medium of 520 s, 300 long of 2466 s; decode scaled by
   duration from the measured seconds per source frame) on one GPU, side by side.

    python bench/workload.py --make /tmp/workload            # the set only
    python bench/workload.py --videos /tmp/workload --paths cpu nvdec --window-s 240
    python bench/workload.py --tiny                          # CPU smoke run: tiny clips, tiny model, the CLI

On the H200 (device tool; no ffmpeg there, so the set is encoded with PyAV's encoders on the machine):
``python bench/workload.py --videos /tmp/wl --paths cpu nvdec_full nvdec --workers 8 --window-s 180 --sweep``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from datamodules.decode import nvdec  # noqa: E402  (before anything imports decord: nvdec._import_nvc)

T0 = time.perf_counter()
VIDEO_MME = {"short": (300, 80.7), "medium": (300, 520.0), "long": (300, 2466.0)}   # (videos, mean seconds)
DEFAULT_STEP_S = {"short": 1.53, "medium": 2.36, "long": 2.36}
BASE_S = 60

# name: (class, seconds, width, height, fps (num, den), codec, gop)
FULL_SET = [
    ("s1_h264_360p25_g60", "short", 90, 640, 360, (25, 1), "h264", 60),
    ("s2_h264_720p2997_g250", "short", 90, 1280, 720, (30000, 1001), "h264", 250),
    ("s3_vp9_360p30", "short", 90, 640, 360, (30, 1), "vp9", 120),
    ("m1_h264_720p30_g250", "medium", 480, 1280, 720, (30, 1), "h264", 250),
    ("m2_hevc_720p25_g60", "medium", 480, 1280, 720, (25, 1), "hevc", 60),
    ("l1_h264_1080p2997_g250", "long", 1800, 1920, 1080, (30000, 1001), "h264", 250),
]
TINY_SET = [
    ("s1_h264_160x90", "short", 4, 160, 90, (25, 1), "h264", 60),
    ("m1_h264_192x108", "medium", 8, 192, 108, (30000, 1001), "h264", 250),
    ("l1_hevc_160x90", "long", 12, 160, 90, (30, 1), "hevc", 60),
]


# ------------------------------------------------------------------------------------------------ making the set

def _frames(width: int, height: int, n: int, seed: int):
    """``n`` moving RGB frames: a gradient scrolling 7 px a frame, blocks moving on their own paths, noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0: 2 * width]
    base = np.stack([(xx * 255 // (2 * width)), (yy * 255 // height), ((xx + yy) * 3 % 256)], -1).astype(np.uint8)
    noise = rng.integers(0, 24, (8, height, width, 3), dtype=np.uint8)
    for i in range(n):
        off = (7 * i) % width
        f = base[:, off: off + width].copy()
        for b in range(4):
            bw, bh = width // 6, height // 5
            x = int((width - bw) * (0.5 + 0.5 * math.sin(0.05 * i + b)))
            y = int((height - bh) * (0.5 + 0.5 * math.cos(0.037 * i * (b + 1))))
            f[y: y + bh, x: x + bw] = (60 * b + 3 * i) % 256
        f += noise[i % 8]
        yield f


def _encode_base(out: Path, width: int, height: int, rate: tuple[int, int], codec: str, gop: int,
                 seconds: int, seed: int) -> None:
    """A ``seconds`` segment: H.264 High (3 B-frames, closed GOPs of ``gop``), HEVC or VP9, yuv420p."""
    from fractions import Fraction

    import av

    n = round(seconds * rate[0] / rate[1])
    ffmpeg = shutil.which("ffmpeg")
    try:
        import imageio_ffmpeg

        ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
    except Exception:  # noqa: BLE001 - no imageio-ffmpeg binary here (the GPU machine): PyAV's encoders
        pass
    if os.environ.get("WORKLOAD_ENCODER") == "pyav":
        ffmpeg = None
    opts = {"h264": ("libx264", {"preset": "veryfast", "profile": "high", "bf": "3", "g": str(gop),
                                 "keyint_min": str(gop), "sc_threshold": "0", "crf": "26"}),
            "hevc": ("libx265", {"preset": "ultrafast", "x265-params": f"keyint={gop}:min-keyint={gop}:bframes=3:"
                                 "log-level=error:no-open-gop=1", "crf": "28"}),
            "vp9": ("libvpx-vp9", {"deadline": "realtime", "cpu-used": "8", "g": str(gop), "crf": "36",
                                   "b": "0", "row-mt": "1"})}[codec]
    if ffmpeg:
        cmd = [ffmpeg, "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}",
               "-r", f"{rate[0]}/{rate[1]}", "-i", "-", "-c:v", opts[0], "-pix_fmt", "yuv420p"]
        for k, v in opts[1].items():
            cmd += ([f"-{k}", v] if k != "g" else ["-g", v])
        proc = subprocess.Popen([*cmd, str(out)], stdin=subprocess.PIPE)
        for f in _frames(width, height, n, seed):
            proc.stdin.write(f.tobytes())
        proc.stdin.close()
        if proc.wait():
            raise RuntimeError(f"ffmpeg failed making {out}")
        return
    with av.open(str(out), "w") as c:
        s = c.add_stream(opts[0], rate=Fraction(*rate))
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        o = dict(opts[1])
        if codec == "h264":
            o = {"preset": o["preset"], "profile": "high", "crf": o["crf"],
                 "x264-params": f"bframes=3:keyint={gop}:min-keyint={gop}:scenecut=0"}
        s.options = o
        for f in _frames(width, height, n, seed):
            for pkt in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)


def _loop(base: Path, out: Path, seconds: int) -> None:
    """``out``: ``base``'s packets repeated (timestamps shifted by its length) until ``seconds`` are covered."""
    import av

    with av.open(str(base)) as src:
        s = src.streams.video[0]
        pkts = [p for p in src.demux(s) if p.size]
        step = max(p.pts + p.duration for p in pkts) - min(p.pts for p in pkts)
        seg_s = float(step * s.time_base)
        with av.open(str(out), "w") as dst:
            d = dst.add_stream_from_template(s)
            for k in range(math.ceil(seconds / seg_s)):
                for p in pkts:
                    q = av.Packet(bytes(p))
                    q.pts, q.dts, q.duration = p.pts + k * step, p.dts + k * step, p.duration
                    q.is_keyframe, q.time_base, q.stream = p.is_keyframe, p.time_base, d
                    dst.mux(q)


def _make_one(job) -> Path:
    out_dir, (name, _cls, seconds, w, h, rate, codec, gop), seed = job
    ext = "webm" if codec == "vp9" else "mp4"
    out = out_dir / f"{name}_{seconds}s.{ext}"
    if out.is_file():
        return out
    base = out_dir / f".base_{name}.{ext}"
    _encode_base(base, w, h, rate, codec, gop, min(BASE_S, seconds), seed)
    if seconds <= BASE_S:
        base.rename(out)
    else:
        _loop(base, out.with_suffix(".tmp" + out.suffix), seconds)
        out.with_suffix(".tmp" + out.suffix).rename(out)
        base.unlink()
    return out


def make_set(out_dir: Path, spec: list[tuple], processes: int | None = None) -> list[Path]:
    """Write the set (one process per video; existing files are kept)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(out_dir, row, i) for i, row in enumerate(spec)]
    with ProcessPoolExecutor(min(len(jobs), processes or os.cpu_count() or 1), mp_context=get_context("spawn")) as p:
        return list(p.map(_make_one, jobs))


# ------------------------------------------------------------------------------------------------ decode paths

def plan(path: Path, budget: int = 16384, native_decode_bytes: float = 2e9, max_side: int = 896) -> dict:
    """Seed 001's frame choice and decode size, as ``decode_video`` makes them (``probe_video`` + ``plan_decode``:
    FFmpeg's fps filter on the stream's integer pts)."""
    from datamodules.decode import plan_decode, probe_video

    probe = probe_video(path)
    p = plan_decode(path, probe, budget, 1.0, native_decode_bytes, max_side)
    return {"n": len(probe.pts), "fps": probe.fps, "duration_s": probe.duration_s,
            "hw": (probe.height, probe.width), "idx": p.unique, "decode_hw": p.decode_hw}


def _decode_task(job) -> dict:
    """One video (or part ``k`` of ``K`` of its sampled frames, as ``data.decode_part_mb`` cuts them) on one path,
    in a pool worker: seconds, frames, a hash of the frames (:func:`frames_sha1`), the decoder used."""
    path, decoder, threads, sessions, window_s, *more = job
    part, copy = (more + [None, 0])[:2]
    p = plan(Path(path))
    idx = p["idx"]
    covered = p["n"]
    if window_s:
        cut = int(window_s * p["fps"])
        if cut < p["n"]:
            idx, covered = [i for i in idx if i < cut], cut
    if part is not None:
        from datamodules.decode.parts import part_bounds

        lo, hi = part_bounds(len(idx), *part)
        idx = idx[lo:hi]
    dh, dw = p["decode_hw"]
    h, w = p["hw"]

    def cpu(path_, idx_, hw):
        import decord

        same = tuple(hw) == (h, w)
        vr = decord.VideoReader(str(path_), num_threads=threads, width=-1 if same else hw[1],
                                height=-1 if same else hw[0])
        return vr.get_batch(list(idx_)).asnumpy()

    t0 = time.perf_counter()
    st: dict = {}
    if decoder == "hybrid":   # data.cpu_slots as the CLI's workers take them (decode_video: the same rule)
        from datamodules.decode.cpu_slots import CpuSlots

        slots = CpuSlots(os.environ["WORKLOAD_CPU_SLOTS_DIR"], int(os.environ["WORKLOAD_CPU_SLOTS"]),
                         int(os.environ["WORKLOAD_CPU_SLOT_THREADS"]), float(os.environ["WORKLOAD_CPU_SLOT_MPX"]))
        with slots.take(p["n"] * h * w / 1e6 * len(idx) / max(len(p["idx"]), 1)) as on_cpu:
            if on_cpu:
                frames, used, why = _cpu_run(path, idx, (dh, dw), slots.threads, False)
                why = f"CPU slot ({used})"
            else:
                frames, used, why = nvdec.read_with_fallback(path, idx, (dh, dw), cpu, sessions=sessions, stats=st)
    elif decoder in ("nvdec", "nvdec_full"):
        frames, used, why = nvdec.read_with_fallback(path, idx, (dh, dw), cpu, sessions=sessions, stats=st,
                                                     nvdec_skip_nonref=decoder == "nvdec")
    elif decoder == "cpu_skip":
        frames, used, why = _cpu_skip(path, idx, (dh, dw), cpu, st)
    elif decoder in ("cpu_checked", "cpu_run"):
        frames, used, why = _cpu_run(path, idx, (dh, dw), threads, decoder == "cpu_checked")
    else:
        frames, used, why = cpu(path, idx, (dh, dw)), "cpu", None
    dt = time.perf_counter() - t0
    t_end = time.time()
    # packets fed to a decoder (all sessions); the rest of the covered source frames were never decoded
    fed = st.get("frames_fed", st.get("kept")) if st.get("frames_skipped", st.get("skipped")) is not None else None
    return {"path": str(path), "path_kind": decoder, "decoder": used, "why": why or st.get("skip"), "decode_s": dt,
            "frames_skipped": None if fed is None else covered - fed, "packets": None if fed is None else covered,
            "sessions_path": sorted({r.get("path", "") for r in st.get("runs", [])}) or None,
            "skip_fallback": [r["skip_fallback"] for r in st.get("runs", []) if r.get("skip_fallback")] or None,
            "frames": len(idx), "covered": covered, "n": p["n"], "duration_s": p["duration_s"],
            "decode_hw": [dh, dw], "digests": (d := [hashlib.sha1(f.tobytes()).digest() for f in frames]),
            "sha1": frames_sha1(d),
            "stages": _stages(st), "part": part, "copy": copy, "fed": fed,
            "window_unix": [t_end - dt, t_end]}


def frames_sha1(digests: list[bytes]) -> str:
    """A video's frames hash: SHA-1 over its frames' SHA-1 digests in order (so parts hash as the whole)."""
    return hashlib.sha1(b"".join(digests)).hexdigest()


def merge_parts(rows: list[dict]) -> list[dict]:
    """One row per (video, copy) from the pool's rows: a split video's parts joined (its decode window from the first
    part's start to the last one's end, which is its latency; frames, packets fed and stage seconds summed; the
    hash over all its frames), and ``digests`` replaced by ``sha1``."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["path"], r.get("copy", 0)), []).append(r)
    out = []
    for parts in groups.values():
        parts.sort(key=lambda r: (r.get("part") or (0, 1))[0])
        m = {k: v for k, v in parts[0].items() if k not in ("digests", "part", "fed")}
        m["sha1"] = frames_sha1([d for r in parts for d in r["digests"]])
        if len(parts) > 1:
            a, b = min(r["window_unix"][0] for r in parts), max(r["window_unix"][1] for r in parts)
            fed = [r.get("fed") for r in parts]
            m.update(window_unix=[a, b], decode_s=b - a, frames=sum(r["frames"] for r in parts), parts=len(parts),
                     frames_skipped=None if None in fed else m["covered"] - sum(fed),
                     decoder="+".join(sorted({r["decoder"] for r in parts})),
                     stages={k: round(sum((r.get("stages") or {}).get(k, 0) for r in parts), 3)
                             for k in (parts[0].get("stages") or {})})
        out.append(m)
    return out


def _stages(st: dict) -> dict | None:
    """Where one NVDEC read spent its seconds: the capability check and the packet scan (whole file, once), and,
    summed over the sessions, the demuxer's packet reads, ``Decode`` calls, surface copies to the host and the
    swscale conversions (seconds of session threads: they overlap in wall time)."""
    runs = st.get("runs") or []
    if not runs and "check_s" not in st:
        return None
    out = {k: st[k] for k in ("check_s", "scan_s") if k in st}
    for k in ("demux_s", "decode_s", "copy_s", "convert_s", "packets_read"):
        vals = [r[k] for r in runs if k in r]
        if vals:
            out[k] = round(sum(vals), 3)
    out["sessions"] = len(runs)
    return out


def _cpu_run(path: str, idx: list[int], hw: tuple[int, int], threads: int, before: bool):
    """``decode_video``'s CPU read with its concealment flags (issue 42 item 1): ``cpu_run``, today's, the reader
    :func:`datamodules.decode.cpu_reader_for` picks (``pyav_sws`` / ``pyav_skip``: frames and flags in one pass;
    ``decord`` / ``pyav``: then :func:`datamodules.decode.concealed_frames`); ``cpu_checked``, before it: decord
    (where the reader was decord or now is ``pyav_sws``) then the check. Frames hash as ``cpu``'s."""
    from datamodules.decode import READERS, concealed_frames, cpu_reader_for, probe_video

    probe = probe_video(Path(path))
    name = cpu_reader_for(probe, hw)
    if before and name == "pyav_sws":
        name = "decord"
    frames = READERS[name](Path(path), probe, hw[0], hw[1], threads)(list(idx))
    if name in ("decord", "pyav"):
        concealed_frames(Path(path), probe, list(idx), threads)
    return frames, name, None


def _cpu_skip(path: str, idx: list[int], hw: tuple[int, int], cpu, st: dict):
    """The CPU proof on the workload: FFmpeg's software decoder (PyAV) fed only the packets the sampled frames
    need (:func:`datamodules.decode.packet_filter.decode_planes_pyav`), converted by decord's swscale
    (:class:`datamodules.decode.nvdec.Yuv420ToRgb`); its frames' hash must equal the ``cpu`` path's. H.264 / HEVC only
    (else decord)."""
    import numpy as np

    from datamodules.decode import packet_filter as pf

    p = nvdec.probe(path)
    if p.codec not in pf.FILTERED_CODECS or nvdec._reason_from_probe(p):
        return cpu(path, idx, hw), "cpu", f"{p.codec} {p.pix_fmt}: not filtered"
    planes = pf.decode_planes_pyav(path, idx, stats=st)
    conv = nvdec.Yuv420ToRgb(p.width, p.height, p.pix_fmt, hw, p.colorspace, p.color_range)
    ch, cw = (p.height + 1) // 2, (p.width + 1) // 2
    out = np.empty((len(idx), *hw, 3), np.uint8)
    for k, (y, u, v) in enumerate(planes):
        out[k] = conv(np.frombuffer(y, np.uint8).reshape(p.height, p.width),
                      np.frombuffer(u, np.uint8).reshape(ch, cw), np.frombuffer(v, np.uint8).reshape(ch, cw))
    conv.close()
    return out, "cpu_skip", None


def run_path(videos: list[Path], decoder: str, workers: int, threads: int, sessions: int,
             window_s: float | None, copies: int = 1, part_mb: float | None = None) -> tuple[list[dict], float]:
    """Decode every video on ``decoder`` in a pool of ``workers`` spawned processes; ``(rows, pool wall s)``.
    ``copies``: each video is decoded that many times (separate jobs), so that many videos are in flight at once
    and the pool's aggregate rate measures the engines' capacity rather than one long video's latency.
    ``part_mb``: a video is cut into parts as ``data.decode_part_mb`` cuts it (each part a job; the parts' rows are
    joined by :func:`merge_parts`)."""
    from datamodules.part_join import decode_parts, max_parts

    ordered = sorted(videos, key=lambda v: -v.stat().st_size)   # the longest first
    counts = decode_parts([str(v) for v in ordered], part_mb, max_parts(workers)) if part_mb else [1] * len(ordered)
    jobs = [(str(v), decoder, threads, sessions, window_s, (k, n) if n > 1 else None, c)
            for c in range(copies) for v, n in zip(ordered, counts) for k in range(n)]
    jobs.sort(key=lambda j: j[6])   # copy by copy, each the longest first (as before: copies of a video together)
    jobs.sort(key=lambda j: -Path(j[0]).stat().st_size)
    t0 = time.perf_counter()
    with UtilSampler() as util, ProcessPoolExecutor(min(workers, len(jobs)), mp_context=get_context("spawn")) as pool:
        rows = merge_parts(list(pool.map(_decode_task, jobs)))
    wall = time.perf_counter() - t0
    windows = [r["window_unix"] for r in rows if r.get("window_unix")]
    span = max(w[1] for w in windows) - min(w[0] for w in windows) if windows else None
    UTIL[decoder] = {**util.summary(), "decode_span_s": span, "pool_wall_s": wall,
                     "source_fps_in_span": sum(r["covered"] for r in rows) / span if span else None,
                     **steady_rate([(*r["window_unix"], r["covered"]) for r in rows if r.get("window_unix")])}
    return rows, wall


def steady_rate(windows: list[tuple[float, float, float]]) -> dict:
    """The pool's decode rate while its queue still held work: from the first decode's start to the last job's
    start, every worker had a video (issue 40: the span's rate is bounded by the longest video's latency, which a
    900-video run meets only at its very end). Each video's source frames are spread evenly over its own decode
    window ``(start, end)`` and counted where that window overlaps the steady interval.

    Args:
        windows: ``(start_s, end_s, source_frames)`` per video (any clock, seconds).

    Returns:
        ``{"steady_s": length of the interval, "steady_fps": source frames/s in it}``; both ``None`` when the last
        job started with the first (nothing was queued).
    """
    if not windows:
        return {"steady_s": None, "steady_fps": None}
    a, b = min(w[0] for w in windows), max(w[0] for w in windows)
    if b <= a:
        return {"steady_s": None, "steady_fps": None}
    frames = sum(c * max(0.0, min(e, b) - max(s, a)) / (e - s) for s, e, c in windows if e > s)
    return {"steady_s": b - a, "steady_fps": frames / (b - a)}


UTIL: dict[str, dict] = {}   # per path: what bounded its pool (UtilSampler.summary, the decode span)


class UtilSampler:
    """Samples, every ``period_s`` while a pool runs, the machine's CPU busy share (``/proc/stat``) and the GPU's
    SM and NVDEC busy shares (``nvidia-smi --query-gpu=utilization.gpu,utilization.decoder``, NVML's per-period
    averages over all engines), so the table can say what bounded a decode path. Without ``nvidia-smi`` (the CPU
    machine) only the CPU is sampled."""

    def __init__(self, period_s: float = 0.25):
        self.period_s = period_s
        self.cpu: list[float] = []
        self.gpu: list[tuple[float, float]] = []
        self.cpu_at: list[float] = []     # time.perf_counter() of each sample, for summary(window=...)
        self.gpu_at: list[float] = []
        self._stop = None

    @staticmethod
    def _cpu_times() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                vals = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return sum(vals), idle

    def _run(self) -> None:
        last = self._cpu_times()
        while not self._stop.wait(self.period_s):
            now = self._cpu_times()
            if now and last and now[0] > last[0]:
                self.cpu.append(1 - (now[1] - last[1]) / (now[0] - last[0]))
                self.cpu_at.append(time.perf_counter())
            last = now

    def _read_smi(self) -> None:
        for line in self._smi.stdout:
            try:
                sm, dec = (float(x) for x in line.strip().split(",")[:2])
            except ValueError:
                continue
            self.gpu.append((sm / 100, dec / 100))
            self.gpu_at.append(time.perf_counter())

    def __enter__(self) -> "UtilSampler":
        import threading

        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)]
        self._smi = None
        if shutil.which("nvidia-smi"):
            self._smi = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu,utilization.decoder",
                                          "--format=csv,noheader,nounits", f"-lms={int(self.period_s * 1000)}"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._threads.append(threading.Thread(target=self._read_smi, daemon=True))
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
            self._smi.wait(5)
        for t in self._threads:
            t.join(5)

    def summary(self, window: tuple[float, float] | None = None) -> dict:
        """Mean and 90th-percentile busy shares (0-1) over the samples (only those taken within ``window``, a
        ``time.perf_counter()`` interval, when given); ``None`` where nothing was sampled."""
        def stats(xs):
            if not xs:
                return None
            xs = sorted(xs)
            return {"mean": round(statistics.mean(xs), 3), "p90": round(xs[int(0.9 * (len(xs) - 1))], 3)}

        def within(xs, at):
            return [x for x, t in zip(xs, at) if window is None or window[0] <= t <= window[1]]
        cpu, gpu = within(self.cpu, self.cpu_at), within(self.gpu, self.gpu_at)
        return {"cpu_busy": stats(cpu), "gpu_sm_busy": stats([g[0] for g in gpu]),
                "nvdec_busy": stats([g[1] for g in gpu]), "samples": len(cpu)}


# ------------------------------------------------------------------------------------------------ the table

def class_of(path: str) -> str:
    return {"s": "short", "m": "medium", "l": "long"}[Path(path).name[0]]


def summarize(rows_by_path: dict[str, list[dict]], steps: dict[str, float], workers: int,
              pool_wall_s: dict[str, float] | None = None, util: dict | None = None) -> dict:
    """Per path and class: step, decode s per video (whole video), wait share, videos/hour; full Video-MME hours.

    Two estimates of the full run: ``videomme_h`` takes each video's own decode rate as it ran in the pool, with
    ``workers`` such decodes in flight at once (optimistic where the engines or cores are shared by more decodes
    than they serve at that rate); ``videomme_h_pool`` is the decode-bound time at the pool's measured aggregate
    rate (source frames of all videos / pool wall, start-up and the tail where one long video decodes alone
    included: pessimistic). The truth lies between them."""
    out = {}
    for kind, rows in rows_by_path.items():
        per = {}
        full_s = 0.0
        frames_full = 0.0
        for cls, (count, mean_s) in VIDEO_MME.items():
            mine = [r for r in rows if class_of(r["path"]) == cls]
            if not mine:
                continue
            dec = statistics.mean(r["decode_s"] * r["n"] / r["covered"] for r in mine)   # whole video
            per_frame = statistics.mean(r["decode_s"] / r["covered"] for r in mine)
            step = steps[cls]
            wall = max(step, dec / workers)
            per[cls] = {"step_s": step, "decode_s": dec, "wait_share": 1 - step / wall, "videos_per_h": 3600 / wall,
                        "decoders": sorted({r["decoder"] for r in mine})}
            fps = statistics.mean(r["n"] / r["duration_s"] for r in mine)
            full_s += count * max(step, per_frame * mean_s * fps / workers)
            frames_full += count * mean_s * fps
        out[kind] = {"classes": per, "videomme_h": full_s / 3600}
        if pool_wall_s and pool_wall_s.get(kind):
            rate = sum(r["covered"] for r in rows) / pool_wall_s[kind]
            gpu_s = sum(count * steps[c] for c, (count, _) in VIDEO_MME.items())
            out[kind].update(pool_fps=rate, videomme_h_pool=max(frames_full / rate, gpu_s) / 3600)
            # the run simulated (run order, in-order workers, a shared engine): the engine's rate from the decode
            # span of the pool when it was sampled (start-up left out), else the pool's rate (start-up included)
            span_fps = ((util or {}).get(kind) or {}).get("source_fps_in_span")
            out[kind]["videomme_sim"] = videomme_run(rows, steps, workers, span_fps or rate)
            out[kind]["videomme_sim"]["capacity_from"] = "decode span" if span_fps else "pool wall"
            steady_fps = ((util or {}).get(kind) or {}).get("steady_fps")
            if steady_fps:   # the engine's rate while the queue was full (steady_rate)
                out[kind]["videomme_sim_steady"] = {**videomme_run(rows, steps, workers, steady_fps),
                                                    "capacity_fps": steady_fps}
            # and with every decode at its own measured rate, the engine never shared (the optimistic bound)
            out[kind]["videomme_sim_unshared"] = videomme_run(rows, steps, workers, float("inf"))
            # as the CLI delivers (DataLoader(in_order=False), data.in_order's default), the same engine
            out[kind]["videomme_sim_ooo"] = videomme_run(rows, steps, workers, span_fps or rate, in_order=False)
    return out


def simulate_run(frames: list[float], steps: list[float], workers: int, solo_fps: list[float],
                 capacity_fps: float, prefetch: int = 2, in_order: bool = True) -> dict:
    """A predict run's pipeline, simulated: the DataLoader's in-order workers decoding on a shared engine, the GPU
    stepping each video when it arrives.

    DataLoader semantics (``torch.utils.data``, ``num_workers = W``, ``prefetch_factor = P``, in order): video ``k``
    goes to worker ``k % W``, which decodes its videos one after another; ``W P`` videos are sent out at the start
    and video ``k + W P`` is sent when the step takes video ``k``. The GPU takes the videos in order, each when it
    is decoded and the step before has ended. Decoding shares one engine (the NVDEC engines, or the CPU cores):
    each of the ``n`` decodes in flight runs at ``min(solo_fps[k], capacity_fps / n)`` source frames/s (processor
    sharing), so the run can never decode faster than ``capacity_fps`` in all, nor one video faster than alone.

    Args:
        frames: source frames each video's decode covers, in the run's order.
        steps: GPU seconds of each video's step, same order.
        workers, prefetch: the DataLoader's ``num_workers`` and ``prefetch_factor`` (``workers >= 1``).
        solo_fps: each video's decode rate alone (source frames/s).
        capacity_fps: the engine's aggregate rate (source frames/s).
        in_order: ``False``: ``DataLoader(in_order=False)``, what the CLI runs (``data.in_order``): the step takes
            the video that arrived first among those not taken; each video taken frees its worker's slot, and the
            next video of the order goes to the next worker in the cycle with fewer than ``prefetch`` outstanding
            (torch's ``_MultiProcessingDataLoaderIter._try_put_index``); each worker decodes its videos one after
            another.

    Returns:
        ``wall_s`` (the last step's end), ``gpu_s`` (sum of the steps), ``wait_share`` (1 - gpu_s / wall_s) and
        ``arrive_s`` / ``start_s`` (each video's decode end and step start).

    Raises:
        ValueError: lengths differ, or a rate / worker count is not positive.
    """
    n = len(frames)
    if not (len(steps) == len(solo_fps) == n) or workers < 1 or prefetch < 1 or capacity_fps <= 0 \
            or any(r <= 0 for r in solo_fps):
        raise ValueError("simulate_run: frames, steps and solo_fps must have one entry per video, and the rates "
                         "and the worker count must be positive")
    if not in_order:
        return _simulate_out_of_order(frames, steps, workers, solo_fps, capacity_fps, prefetch)
    inf = float("inf")
    sent = [k < workers * prefetch for k in range(n)]
    left = list(map(float, frames))
    arrive, start = [inf] * n, [inf] * n
    busy: dict[int, int] = {}            # worker -> the video it decodes
    nxt = list(range(min(workers, n)))   # worker -> its next video index
    nxt += [n] * (workers - len(nxt))
    t, gpu_free, c = 0.0, 0.0, 0

    def launch() -> None:
        for w in range(workers):
            k = nxt[w]
            if w not in busy and k < n and sent[k]:
                busy[w] = k
                nxt[w] = k + workers

    launch()
    while c < n:
        rates = {w: min(solo_fps[k], capacity_fps / len(busy)) for w, k in busy.items()} if busy else {}
        t_dec = min((t + left[k] / rates[w] for w, k in busy.items()), default=inf)
        t_gpu = max(gpu_free, arrive[c]) if arrive[c] < inf else inf
        t_next = min(t_dec, t_gpu)
        if t_next == inf:
            raise RuntimeError("simulate_run: the pipeline stalled (no decode in flight, next video not decoded)")
        ending = [w for w, k in busy.items() if t + left[k] / rates[w] <= t_next]   # (exactly: no float residue)
        for w, k in busy.items():
            left[k] = 0.0 if w in ending else left[k] - rates[w] * (t_next - t)
        t = t_next
        if t_gpu <= t_dec:               # the step takes video c; video c + W P is sent out
            start[c], gpu_free = t, t + steps[c]
            if c + workers * prefetch < n:
                sent[c + workers * prefetch] = True
            c += 1
        else:
            for w in ending:
                arrive[busy.pop(w)] = t
        launch()
    gpu = float(sum(steps))
    wall = gpu_free
    return {"wall_s": wall, "gpu_s": gpu, "wait_share": 1 - gpu / wall if wall > 0 else 0.0,
            "arrive_s": arrive, "start_s": start}


def _simulate_out_of_order(frames: list[float], steps: list[float], workers: int, solo_fps: list[float],
                           capacity_fps: float, prefetch: int) -> dict:
    """:func:`simulate_run` with ``in_order=False`` (see there); the same processor-sharing engine."""
    from collections import deque

    n, inf = len(frames), float("inf")
    queue = [deque() for _ in range(workers)]   # worker -> its videos, the head being decoded
    tasks, owner = [0] * workers, [0] * n
    cycle, sent = 0, 0

    def put() -> bool:   # the next video of the order to the next worker in the cycle with a free slot
        nonlocal cycle, sent
        if sent >= n:
            return False
        for _ in range(workers):
            w, cycle = cycle, (cycle + 1) % workers
            if tasks[w] < prefetch:
                queue[w].append(sent)
                tasks[w], owner[sent], sent = tasks[w] + 1, w, sent + 1
                return True
        return False

    while put():   # W P at the start
        pass
    left = list(map(float, frames))
    arrive, start = [inf] * n, [inf] * n
    ready: list[int] = []   # arrived, not taken
    t, gpu_free, taken = 0.0, 0.0, 0
    while taken < n:
        busy = {w: q[0] for w, q in enumerate(queue) if q}
        rates = {w: min(solo_fps[k], capacity_fps / len(busy)) for w, k in busy.items()}
        t_dec = min((t + left[k] / rates[w] for w, k in busy.items()), default=inf)
        first = min(ready, key=lambda k: (arrive[k], k)) if ready else None
        t_gpu = max(gpu_free, arrive[first]) if first is not None else inf
        t_next = min(t_dec, t_gpu)
        if t_next == inf:
            raise RuntimeError("simulate_run: the pipeline stalled (no decode in flight, no video decoded)")
        ending = [w for w, k in busy.items() if t + left[k] / rates[w] <= t_next]
        for w, k in busy.items():
            left[k] = 0.0 if w in ending else left[k] - rates[w] * (t_next - t)
        t = t_next
        if t_gpu <= t_dec:   # the step takes the first arrived video; its worker's slot goes to the next video
            ready.remove(first)
            start[first], gpu_free, taken = t, t + steps[first], taken + 1
            tasks[owner[first]] -= 1
            put()
        else:
            for w in ending:
                k = queue[w].popleft()
                arrive[k] = t
                ready.append(k)
    gpu = float(sum(steps))
    return {"wall_s": gpu_free, "gpu_s": gpu, "wait_share": 1 - gpu / gpu_free if gpu_free > 0 else 0.0,
            "arrive_s": arrive, "start_s": start}


def videomme_run(rows: list[dict], steps: dict[str, float], workers: int, capacity_fps: float,
                 in_order: bool = True) -> dict:
    """:func:`simulate_run` on the full Video-MME (:data:`VIDEO_MME`: 300 videos per class at the class's mean
    duration) in the run's order (:func:`datamodules.sharding.run_order`, cost = duration), from a decode path's
    measured rows: per class the source frames/s of the set's videos (``covered / duration``) and the mean solo
    rate (``covered / decode_s``; the measured per-video seconds were taken with other decodes in flight, so this
    is a lower bound of a decode alone), and the GPU step per class."""
    from datamodules.sharding import run_order

    vids = []
    for cls, (count, mean_s) in VIDEO_MME.items():
        mine = [r for r in rows if class_of(r["path"]) == cls]
        if not mine:
            continue
        fps = statistics.mean(r["n"] / r["duration_s"] for r in mine)        # source frames per second of video
        solo = statistics.mean(r["covered"] / r["decode_s"] for r in mine)
        vids += [(mean_s, mean_s * fps, steps[cls], solo)] * count
    order = run_order(range(len(vids)), [v[0] for v in vids], workers)
    sim = simulate_run([vids[i][1] for i in order], [vids[i][2] for i in order], workers,
                       [vids[i][3] for i in order], capacity_fps, in_order=in_order)
    total = sum(v[1] for v in vids)
    return {"hours": sim["wall_s"] / 3600, "wait_share": sim["wait_share"], "gpu_h": sim["gpu_s"] / 3600,
            "capacity_fps": capacity_fps, "videos": len(vids), "source_frames": total,
            # what the decode would have to deliver: for a 1-hour run at all, and to keep up with the GPU
            "fps_for_1h": total / 3600, "fps_to_keep_up": total / sim["gpu_s"]}


def print_table(summary: dict, windowed: bool, step_source: str) -> None:
    kinds = list(summary)
    print(f"\nGPU step per video from: {step_source}" + ("; decode seconds scaled from --window-s" if windowed
                                                             else ""))
    head = f"{'class':<7} {'path':<10} {'GPU step s':>10} {'decode s/video':>15} {'GPU wait':>9} {'videos/h':>9}"
    print(head)
    for cls in VIDEO_MME:
        for kind in kinds:
            c = summary[kind]["classes"].get(cls)
            if c:
                print(f"{cls:<7} {kind:<10} {c['step_s']:>10.2f} {c['decode_s']:>15.2f} {c['wait_share']:>9.1%} "
                      f"{c['videos_per_h']:>9.0f}")
    print("full Video-MME (900 videos, 4k+16k, one GPU), per-video rates x workers: " +
          "  ".join(f"{k} {summary[k]['videomme_h']:.2f} h" for k in kinds))
    if all("videomme_sim" in summary[k] for k in kinds):
        print("full Video-MME simulated (run order, in-order workers sharing the engine at its measured rate): " +
              "  ".join(f"{k} {summary[k]['videomme_sim']['hours']:.2f} h, GPU wait "
                        f"{summary[k]['videomme_sim']['wait_share']:.0%} ({summary[k]['videomme_sim']['capacity_fps']:.0f}"
                        f" source frames/s from the {summary[k]['videomme_sim']['capacity_from']})" for k in kinds))
        if all("videomme_sim_steady" in summary[k] for k in kinds):
            print("  same, the engine at the pool's steady rate (every worker busy: first start to last job's start): "
                  + "  ".join(f"{k} {summary[k]['videomme_sim_steady']['hours']:.2f} h, GPU wait "
                              f"{summary[k]['videomme_sim_steady']['wait_share']:.0%} "
                              f"({summary[k]['videomme_sim_steady']['capacity_fps']:.0f} source frames/s)" for k in kinds))
        print("  same, each decode at its own measured rate (the engine not shared; optimistic): " + "  ".join(
            f"{k} {summary[k]['videomme_sim_unshared']['hours']:.2f} h, GPU wait "
            f"{summary[k]['videomme_sim_unshared']['wait_share']:.0%}" for k in kinds))
        if all("videomme_sim_ooo" in summary[k] for k in kinds):
            print("  same, out-of-order delivery (the CLI's data.in_order false; the engine as in the first line): "
                  + "  ".join(f"{k} {summary[k]['videomme_sim_ooo']['hours']:.2f} h, GPU wait "
                              f"{summary[k]['videomme_sim_ooo']['wait_share']:.0%}" for k in kinds))
        sim = summary[kinds[0]]["videomme_sim"]
        print(f"  {sim['source_frames'] / 1e6:.1f} M source frames to decode: 1.0 h needs {sim['fps_for_1h']:.0f} source "
              f"frames/s in all, keeping up with the GPU ({sim['gpu_h']:.2f} h of steps) {sim['fps_to_keep_up']:.0f}")
    if all("videomme_h_pool" in summary[k] for k in kinds):
        print("full Video-MME at the pool's aggregate decode rate: " + "  ".join(
            f"{k} {summary[k]['videomme_h_pool']:.2f} h ({summary[k]['pool_fps']:.0f} source frames/s)"
            for k in kinds))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make", default=None, help="only write the set to this folder")
    ap.add_argument("--videos", default="/tmp/workload")
    ap.add_argument("--paths", nargs="+", default=["cpu", "nvdec"],
                    choices=["cpu", "cpu_skip", "cpu_checked", "cpu_run", "nvdec", "nvdec_full", "hybrid"],
                    help="cpu: decord; cpu_checked / cpu_run: decode_video's CPU read with its concealment flags, "
                         "before / after issue 42's one pass; cpu_skip: PyAV fed only the needed packets; "
                         "nvdec: NVDEC fed only the needed packets (nvdec_skip_nonref, the default); nvdec_full: "
                         "NVDEC decoding every frame; hybrid: nvdec, but a read goes to the CPU reader while one of "
                         "--cpu-slots is free (data.cpu_slots)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--cpu-slots", type=int, default=4, help="path hybrid: data.cpu_slots (CPU reads at a time)")
    ap.add_argument("--cpu-slot-threads", type=int, default=2, help="path hybrid: data.cpu_slot_threads")
    ap.add_argument("--cpu-slot-mpx", type=float, default=30000.0, help="path hybrid: data.cpu_slot_mpx")
    ap.add_argument("--threads", type=int, default=None, help="decoder threads per CPU worker (auto from cores)")
    ap.add_argument("--sessions", type=int, default=None, help="NVDEC sessions per video (default: auto_sessions, as the CLI)")
    ap.add_argument("--window-s", type=float, default=None)
    ap.add_argument("--part-mb", type=float, default=None,
                    help="the pool decodes a video over this many MB in parts, as data.decode_part_mb (default: whole)")
    ap.add_argument("--copies", type=int, default=1,
                    help="decode each video this many times in the pool (many in flight: the engines' capacity)")
    ap.add_argument("--only", nargs="+", default=None, choices=["short", "medium", "long"],
                    help="decode only these duration classes (the CLI still gets the whole set)")
    ap.add_argument("--cli", action="store_true", help="run evaluate.py predict on the set for the GPU step")
    ap.add_argument("--cli-decoders", nargs="+", default=["cpu"], type=_cli_variant,
                    help="data.decoder of each CLI run (--cli), optionally with data settings: "
                         "auto/decode_part_mb=0; a variant named twice runs twice; the records of the runs are compared")
    ap.add_argument("--cli-max-s", type=float, default=None, help="only videos up to this length go to the CLI")
    ap.add_argument("--cli-copies", type=int, default=1,
                    help="each video this many times in the CLI's benchmark (many videos in flight, as a benchmark)")
    ap.add_argument("--gpu-step-s", type=json.loads, default=None, help='e.g. {"short": 1.5, ...}')
    ap.add_argument("--sweep", action="store_true", help="NVDEC frames/s of the largest video per session count")
    ap.add_argument("--sweep-counts", nargs="+", type=int, default=[1, 2, 4, 7],
                    help="the session counts of --sweep")
    ap.add_argument("--json", default=None, help="write the rows and the summary here")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny clips, the tiny model, the CLI")
    ap.add_argument("--table-from", default=None, help="print the table of an earlier --json file and stop")
    args = ap.parse_args(argv)
    if args.table_from:
        saved = json.loads(Path(args.table_from).read_text())
        summary = summarize(saved["rows"], saved["steps"], args.workers, saved.get("pool_wall_s"), saved.get("util"))
        print_table(summary, any(r["covered"] < r["n"] for rows in saved["rows"].values() for r in rows),
                    "the saved run's steps")
        return {"summary": summary}
    spec = TINY_SET if args.tiny else FULL_SET
    videos_dir = Path(args.make or args.videos)
    t = time.perf_counter()
    videos = make_set(videos_dir, spec, processes=2 if args.tiny else None)
    print(f"set: {len(videos)} videos in {time.perf_counter() - t:.1f} s -> {videos_dir}", flush=True)
    if args.make:
        return {}
    from datamodules.decode import auto_decode_threads

    threads = args.threads or auto_decode_threads(args.workers)
    workers = 1 if args.tiny else args.workers
    rows_by_path, walls = {}, {}
    import tempfile

    os.environ.update(WORKLOAD_CPU_SLOTS_DIR=tempfile.mkdtemp(prefix="workload-cpu-slots-"),
                      WORKLOAD_CPU_SLOTS=str(args.cpu_slots), WORKLOAD_CPU_SLOT_THREADS=str(args.cpu_slot_threads),
                      WORKLOAD_CPU_SLOT_MPX=str(args.cpu_slot_mpx))   # (the spawned pool workers inherit them)
    pool_videos = [v for v in videos if not args.only or class_of(str(v)) in args.only]
    for kind in args.paths:
        rows_by_path[kind], walls[kind] = run_path(pool_videos, kind, workers, threads, args.sessions, args.window_s,
                                                   args.copies, args.part_mb)
        print(f"{kind}: pool of {workers} ({threads} threads / {args.sessions or 'auto'} sessions) decoded "
              f"{sum(r['frames'] for r in rows_by_path[kind])} sampled frames of "
              f"{sum(r['covered'] for r in rows_by_path[kind])} source frames in {walls[kind]:.1f} s", flush=True)
        for r in rows_by_path[kind]:
            skip = "" if r.get("frames_skipped") is None else \
                f", {r['frames_skipped']} of {r['packets']} covered frames not decoded"
            print(f"  {Path(r['path']).name}: {r['decoder']} {r['decode_s']:.2f} s, {r['frames']} frames "
                  f"{r['decode_hw']}, {r['covered']}/{r['n']} source frames{skip}"
                  + (f" ({r['why']})" if r["why"] else "")
                  + (f" [packet-fed session fell back: {r['skip_fallback'][0]}]" if r.get("skip_fallback") else "")
                  + (f" stages {r['stages']}" if r.get("stages") else ""))
        u = UTIL.get(kind, {})
        if u:
            def fmt(x):
                return "n/a" if not x else f"{x['mean']:.0%} (p90 {x['p90']:.0%})"
            span = u.get("decode_span_s")
            print(f"{kind}: busy while decoding: CPU {fmt(u['cpu_busy'])}, NVDEC {fmt(u['nvdec_busy'])}, GPU SM "
                  f"{fmt(u['gpu_sm_busy'])}; first decode start to last end {span:.1f} s of the pool's "
                  f"{u['pool_wall_s']:.1f} s, {u['source_fps_in_span']:.0f} source frames/s in that span"
                  + (f"; {u['steady_fps']:.0f} source frames/s in the {u['steady_s']:.1f} s every worker was busy"
                     if u.get("steady_fps") else ""), flush=True)
        fed = [r for r in rows_by_path[kind] if r.get("frames_skipped") is not None]
        if fed:
            print(f"{kind}: {sum(r['frames_skipped'] for r in fed)} of {sum(r['packets'] for r in fed)} covered "
                  f"source frames not decoded ({len(fed)} of {len(rows_by_path[kind])} videos packet-filtered)",
                  flush=True)
    if args.sweep and "nvdec" in args.paths:
        sweep_sessions(max(videos, key=lambda v: v.stat().st_size), args.window_s, tuple(args.sweep_counts))
    if len(rows_by_path) > 1:
        ref = {r["path"]: r["sha1"] for r in rows_by_path[args.paths[0]]}
        for kind in args.paths[1:]:
            same = sum(ref[r["path"]] == r["sha1"] for r in rows_by_path[kind])
            print(f"frames identical {args.paths[0]} vs {kind}: {same} of {len(ref)} videos")
    step_source, steps, timing = "issues 31/33 (H200, 7B-size random checkpoint, 4k+16k)", dict(DEFAULT_STEP_S), None
    if args.gpu_step_s:
        steps.update(args.gpu_step_s)
        step_source = "--gpu-step-s"
    if args.cli or args.tiny:
        cli_videos = [v for v in videos if args.cli_max_s is None or duration_s(v) <= args.cli_max_s]
        if not cli_videos:
            raise SystemExit(f"--cli-max-s {args.cli_max_s}: no video that short (durations "
                             f"{[round(duration_s(v), 1) for v in videos]})")
        timings = {}
        for k, d in enumerate(args.cli_decoders):   # a variant named twice is run twice (e.g. cold, then warm)
            label = d if d not in timings else f"{d}#{k + 1}"
            t = timings[label] = run_cli(cli_videos, tiny=args.tiny, decoder=d, copies=args.cli_copies)
            print_cli_run(label, t, len(cli_videos) * args.cli_copies)   # each run as it ends: a later one may not
            if k:
                first = next(iter(timings))
                same, total = compare_records(timings[first]["out"], t["out"])
                print(f"records identical decoder={first} vs decoder={label} (video_info.decoder* left out): "
                      f"{same} of {total}", flush=True)
                for line in record_differences(timings[first]["out"], t["out"]) if same < total else []:
                    print(f"  differs: {line}", flush=True)
                if same < total:   # every record: which fields differ, and equality apart from the unchecked flag
                    fields = differing_fields(timings[first]["out"], t["out"])
                    print("  differing fields over all records: "
                          + "; ".join(f"{k} ({n})" for k, n in fields.items()), flush=True)
                    rest, _ = compare_records(timings[first]["out"], t["out"], READER_FIELDS + (UNCHECKED_FIELD,))
                    print(f"records identical apart from video_info.{UNCHECKED_FIELD} (NVDEC's frames carry no "
                          f"concealment flags): {rest} of {total}", flush=True)
            if args.json:   # what has run so far
                Path(args.json).write_text(json.dumps({"cli_runs": timings}, indent=1, default=str))
        timing = timings[list(timings)[-1]]
        rest = timing["step_s"][1:] or timing["step_s"]
        steps = dict.fromkeys(VIDEO_MME, statistics.mean(rest))
        step_source = (f"the CLI's timing_rank0.json (mean steady step of {len(rest)} videos; first answer "
                       f"{timing['first_answer_s']:.1f} s after process start)")
    summary = summarize(rows_by_path, steps, workers, walls, UTIL)
    print_table(summary, bool(args.window_s), step_source)
    result = {"rows": rows_by_path, "pool_wall_s": walls, "summary": summary, "steps": steps, "timing": timing,
              "util": UTIL, "cli_runs": timings if (args.cli or args.tiny) else {}}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return result


def sweep_sessions(path: Path, window_s: float | None, counts=(1, 2, 4, 7)) -> dict[int, float]:
    """Source frames/s of :func:`datamodules.decode.nvdec.read_nvdec` on one video (its sampled frames in the window),
    per NVDEC session count, in this process, alone on the machine; each line also gives the NVDEC / SM / CPU busy
    shares over that decode (:class:`UtilSampler`) and the summed per-session stage seconds (``read_nvdec``'s
    ``stats``: demux, decode calls, copies), so that what bounds one video's latency can be read off."""
    p = plan(path)
    cut = int(window_s * p["fps"]) if window_s else p["n"]
    idx = [i for i in p["idx"] if i < cut]
    covered = min(cut, p["n"])
    out, first_sha = {}, None
    for k in counts:
        stats: dict = {}
        with UtilSampler() as util:
            t0 = time.perf_counter()
            frames = nvdec.read_nvdec(path, idx, p["decode_hw"], sessions=int(k), stats=stats)
            wall = time.perf_counter() - t0
        sha = hashlib.sha1(frames.tobytes()).hexdigest()
        first_sha = first_sha or sha
        out[k] = covered / wall
        u = util.summary()
        runs = stats.get("runs") or []
        stages = {key: round(sum(r.get(key, 0.0) for r in runs), 2) for key in ("demux_s", "decode_s", "copy_s")}
        stages.update({key: stats[key] for key in ("scan_s", "convert_s") if key in stats})
        busy = {key: u[key] for key in ("nvdec_busy", "gpu_sm_busy", "cpu_busy")}
        print(f"sweep {path.name}: {k} sessions ({len(runs)} runs): {out[k]:.0f} source frames/s ({len(idx)} "
              f"sampled, {wall:.1f} s); busy {busy}; summed stage s {stages}; frames "
              f"{'equal to the first count' if sha == first_sha else 'DIFFER from the first count'}", flush=True)
    return out


def duration_s(path: Path) -> float:
    """The container's duration (s)."""
    import av

    with av.open(str(path)) as c:
        return float(c.duration or 0) / 1e6


READER_FIELDS = ("decoder", "decoder_fallback")   # video_info fields that name the reader: left out of comparisons
UNCHECKED_FIELD = "concealment_checked"   # video_info: false where NVDEC decoded (its frames carry no flags)


def _records(out: Path, drop: tuple[str, ...] = READER_FIELDS) -> dict[tuple, str]:
    """``{(file, qid, budget, variant): record}`` of a predict folder, each record without the ``video_info``
    fields in ``drop`` (default: which reader decoded it) as canonical JSON."""
    recs = {}
    for f in sorted(out.glob("*/*/rank*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            for k in drop:
                (r.get("video_info") or {}).pop(k, None)
            recs[(f.parent.parent.name, r.get("qid"), r.get("budget"), r.get("variant"))] = \
                json.dumps(r, sort_keys=True)
    return recs


def compare_records(a: Path, b: Path, drop: tuple[str, ...] = READER_FIELDS) -> tuple[int, int]:
    """(records equal byte for byte, records of ``a``) between two predict folders, the ``video_info`` fields in
    ``drop`` left out."""
    ra, rb = _records(a, drop), _records(b, drop)
    return sum(rb.get(k) == v for k, v in ra.items()), len(ra)


def differing_fields(a: Path, b: Path) -> dict[str, int]:
    """Over every record of ``a``: how many records differ in each set of fields (``"pred, video_info.n"``;
    ``"missing"`` where ``b`` lacks the record), the reader's fields left out; the most frequent first."""
    ra, rb = _records(a), _records(b)
    counts: dict[str, int] = {}
    for k, v in ra.items():
        if rb.get(k) == v:
            continue
        if k not in rb:
            key = "missing"
        else:
            fx, fy = _flat(json.loads(v)), _flat(json.loads(rb[k]))
            key = ", ".join(f for f in sorted(set(fx) | set(fy)) if fx.get(f) != fy.get(f))
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _flat(r: dict) -> dict:
    """A record's top-level fields and its ``video_info`` fields as ``video_info.<field>``."""
    return {**{f: r[f] for f in r if f != "video_info"},
            **{f"video_info.{f}": w for f, w in (r.get("video_info") or {}).items()}}


def record_differences(a: Path, b: Path, limit: int = 3) -> list[str]:
    """Where the records of two predict folders differ: for up to ``limit`` records of ``a`` that ``b`` lacks or
    holds otherwise, ``"<key>: <fields>"`` with the top-level fields (``video_info.<field>`` one level down) whose
    values differ, each as ``field a-value -> b-value`` cut to 80 characters."""
    ra, rb = _records(a), _records(b)
    out = []
    for k, v in ra.items():
        if rb.get(k) == v:
            continue
        if k not in rb:
            out.append(f"{k}: missing")
        else:
            fx, fy = _flat(json.loads(v)), _flat(json.loads(rb[k]))
            fields = [f"{f} {str(fx.get(f))[:80]!r} -> {str(fy.get(f))[:80]!r}" for f in sorted(set(fx) | set(fy))
                      if fx.get(f) != fy.get(f)]
            out.append(f"{k}: " + "; ".join(fields))
        if len(out) >= limit:
            break
    return out


def _cli_option(opt: str) -> str:
    """One ``/setting=value`` part of a ``--cli-decoders`` entry as the CLI's option: ``model.x=v`` ->
    ``--model.init_args.x=v``, ``x=v`` -> ``--data.init_args.x=v`` (``env.NAME=v`` parts are no option:
    :func:`_cli_env`)."""
    return f"--model.init_args.{opt[6:]}" if opt.startswith("model.") else f"--data.init_args.{opt}"


def _cli_env(opts: list[str]) -> dict[str, str]:
    """The ``env.NAME=value`` parts of a ``--cli-decoders`` entry, as the run's environment variables (e.g.
    ``auto/env.TOKENBUDGET_EARLY_CUDA=0``: the run without the early CUDA context)."""
    return dict(o[4:].split("=", 1) for o in opts if o.startswith("env."))


def _cli_variant(spec: str) -> str:
    """``--cli-decoders`` entry: ``cpu | nvdec | auto``, optionally followed by ``/setting=value`` data settings
    (e.g. ``auto/decode_part_mb=0``: the run without decode parts), ``/model.setting=value`` model settings
    (e.g. ``auto/model.first_step=eager``) or ``/env.NAME=value`` environment variables of the run."""
    name, *opts = spec.split("/")
    if name not in ("cpu", "nvdec", "auto") or any("=" not in o for o in opts):
        raise argparse.ArgumentTypeError(f"{spec!r}: cpu | nvdec | auto, then /setting=value ...")
    return spec


def print_cli_run(label: str, t: dict, n_videos: int) -> None:
    """Three lines for one CLI run (:func:`run_cli`'s timing): the figures, the timeline, the videos."""
    rest = t["step_s"][1:] or t["step_s"]
    print(f"CLI decoder={label}: {n_videos} videos, first answer "
          f"{t['first_answer_s']:.1f} s after process start, steady step {statistics.mean(rest):.2f} s, wait share "
          f"{t['wait_share']:.1%} (after the first video {t['steady_wait_share']:.1%}; wall / steps after it "
          f"{t['wall_over_steps']:.2f}), decoders used {t['decoders']}"
          + ("" if "cuda_mps_pipe" not in t else f", CUDA MPS {'on' if t['cuda_mps_pipe'] else 'off'}"), flush=True)
    u = t.get("util") or {}
    if u.get("window_s"):
        share = lambda k: "-" if not u.get(k) else f"{u[k]['mean']:.0%} (p90 {u[k]['p90']:.0%})"   # noqa: E731
        print(f"CLI decoder={label}: busy from the first decode to the end ({u['window_s'][0]:.1f}-"
              f"{u['window_s'][1]:.1f} s): NVDEC {share('nvdec_busy')}, SM {share('gpu_sm_busy')}, CPU "
              f"{share('cpu_busy')}", flush=True)
    print(f"CLI decoder={label}: timeline (s after process start) "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(t["timeline_s"].items(), key=lambda kv: kv[1]))
          + f"; warm-up {t.get('warmup')}", flush=True)
    print(f"CLI decoder={label}: per video (s after process start: decoded start-end, step start, wait) "
          + "; ".join(f"{r.get('video_id')} {r.get('decode_start', float('nan')):.1f}-"
                      f"{r.get('decode_end', float('nan')):.1f}, {r.get('step_start', float('nan')):.1f}, "
                      f"{r['wait_s']:.2f}" + (f" ({r['decode_parts']} parts)" if r.get("decode_parts") else "")
                      for r in t.get("per_video") or []), flush=True)
    rows = [r for r in t.get("per_video") or [] if r.get("stages_s")]
    if rows:   # where a first step's extra seconds went: its stages beside the mean of the others'
        fmt = lambda st: ", ".join(f"{k} {v:.2f}" for k, v in st.items())   # noqa: E731
        others = {k: statistics.mean(r["stages_s"].get(k, 0.0) for r in rows[1:]) for k in rows[0]["stages_s"]} \
            if len(rows) > 1 else {}
        print(f"CLI decoder={label}: first step's stages (s) {fmt(rows[0]['stages_s'])}"
              + (f"; mean of the other {len(rows) - 1}: {fmt(others)}" if others else ""), flush=True)


def run_cli(videos: list[Path], tiny: bool, work: Path = Path("/tmp/workload_cli"), decoder: str = "cpu",
            copies: int = 1) -> dict:
    """The user's command on the set (``bench/cli_throughput.py``'s root and runner); adds ``first_answer_s``:
    process start to the end of the first predict step (the timing json's ``timeline_s.first_answer``).
    ``decoder`` is a ``--cli-decoders`` entry (:func:`_cli_variant`: its ``/setting=value`` parts become
    ``--data.init_args.setting=value``, its ``/model.setting=value`` parts ``--model.init_args.setting=value``);
    ``copies``: each video that many times in the benchmark root."""
    import cli_throughput as ct

    decoder, *opts = decoder.split("/")
    if tiny:
        from models.videollama3.tiny import build_tiny_videollama3

        ckpt, config = build_tiny_videollama3(work / "tiny"), "configs/predict/demo.yaml"
        extra = ["--trainer.accelerator=cpu", "--data.init_args.num_workers=1", "--data.init_args.loader_kwargs={}"]
    else:
        ckpt = work / "videollama3-7b-random"
        if not (ckpt / "config.json").is_file():
            ct.write_checkpoint(ckpt)
        config, extra = "configs/predict/videomme.yaml", []
    root = work / "root"
    if root.exists():
        shutil.rmtree(root)
    ct.write_benchmark(root, videos, copies)
    out = work / f"out_{decoder}_{int(time.time() * 1000)}"
    with UtilSampler() as util:
        launched = time.perf_counter()
        saved = {k: os.environ.get(k) for k in _cli_env(opts)}
        os.environ.update(_cli_env(opts))
        try:
            timing, total_s = ct.run_predict(ckpt, root, out, config, extra + [f"--data.init_args.decoder={decoder}"]
                                             + [_cli_option(o) for o in opts if not o.startswith("env.")])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    timing["util"] = cli_util(util, launched, timing.get("timeline_s") or {})
    timing["out"] = out
    timing["process_s"] = total_s   # the CLI process from its launch to its exit (the tail after predict_end too)
    used: dict = {}
    for f in out.glob("*/*/rank*.jsonl"):
        for line in f.read_text().splitlines():
            d = (json.loads(line).get("video_info") or {}).get("decoder", "error")
            used[d] = used.get(d, 0) + 1
    timing["decoders"] = used
    # the run's own clock from the process start (callbacks.timing.process_age_s); the earlier estimate (process
    # wall minus the run's wall, plus load, first wait and first step) also counted the scoring after the run
    timing["first_answer_s"] = timing["timeline_s"]["first_answer"]
    timing.update(wait_figures(timing))
    return timing


def cli_util(util: UtilSampler, launched: float, timeline: dict) -> dict:
    """The busy shares of a CLI run (:class:`UtilSampler`) from its first decode's start to the end of predicting
    (the run's ``timeline_s``, seconds after its process start, which ``launched`` approximates: the subprocess's
    launch on this process's ``perf_counter``), with that window's bounds in the run's seconds; the whole run's
    samples where the timeline lacks those marks."""
    a, b = timeline.get("first_decode_start"), timeline.get("predict_end")
    series = util_series(util, launched)
    if a is None or b is None or b <= a:
        return {**util.summary(), "window_s": None, "series": series}
    return {**util.summary((launched + a, launched + b)), "window_s": (a, b), "series": series}


def util_series(util: UtilSampler, launched: float) -> dict:
    """Every sample of a CLI run, for the plot over time (``bench/plot_cli_run.py``): ``cpu`` and ``gpu`` lists of
    ``[seconds after the process start, busy share(s)]`` (``gpu``: SM, NVDEC), rounded to 0.01 s / 0.001."""
    return {"cpu": [[round(t - launched, 2), round(x, 3)] for x, t in zip(util.cpu, util.cpu_at)],
            "gpu": [[round(t - launched, 2), round(g[0], 3), round(g[1], 3)] for g, t in zip(util.gpu, util.gpu_at)]}


def wait_figures(timing: dict) -> dict:
    """The GPU's data wait in a CLI run's ``timing_rank0.json`` summary: ``wait_share`` (waits over the wall after
    the load, the first video's pipeline fill included), ``steady_wait_share`` (waits after the first video over
    the wall after it) and ``wall_over_steps`` (that wall over the sum of the steps after the first video: the
    issue's "within 1.1x the sum of its steps")."""
    from callbacks.timing import StageTimer

    stages = timing.get("stages_s") or {}
    steps = timing.get("step_s") or []
    span = max(timing["wall_s"] - stages.get("load", 0.0), 1e-9)
    steady_wait, after_first = StageTimer.steady_wait(timing)   # the console's wait hint reads the same share
    after_first = max(after_first, 1e-9)
    return {"wait_share": stages.get("wait", 0.0) / span, "steady_wait_share": steady_wait / after_first,
            "wall_over_steps": after_first / max(sum(steps[1:]), 1e-9) if len(steps) > 1 else float("nan")}


if __name__ == "__main__":
    main()
