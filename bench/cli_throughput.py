"""The real CLI run at VideoLLaMA3-7B size: ``evaluate.py predict`` on distinct videos, first-video warm-up and steady
seconds per video.

What runs is the user's command, unchanged: ``python evaluate.py predict --config configs/predict/videomme.yaml``
(budgets 4,096 + 16,384, bf16, 8 DataLoader workers) on a Video-MME-format root of distinct videos (3 questions
each), with a full-size random checkpoint written to disk first (Qwen2-7B LM + the 27-layer SigLIP encoder + the
fork's 8-layer qbase, random bf16, ``save_pretrained``; ``from_pretrained`` reads it as it would a real one). The
figures come from the run's own ``timing_rank0.json`` (``step_s``: each video's predict step, in order):

- warm-up: the first video's step (compilation and CUDA-graph capture happen there);
- steady: the mean step of the other videos, and the wall time per video after the first (steps + waits).

Videos (OpenCV, on either machine; written once), then the run (GPU):
    python bench/cli_throughput.py --make-videos bench/media/distinct --n-videos 12
    python bench/cli_throughput.py --videos bench/media/distinct
CPU smoke test (the tiny model, 2 videos): ``--tiny``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MEDIA = REPO / "assets" / "media"

def _transform(i: int):
    """The i-th video's look (numpy on H x W x 3 uint8 frames): flips, crops, channel orders, negation."""
    import numpy as np

    looks = [lambda f: f, lambda f: f[:, ::-1], lambda f: f[: f.shape[0] // 2, : f.shape[1] // 2],
             lambda f: f[::-1], lambda f: f[..., [1, 2, 0]], lambda f: f[f.shape[0] // 8: -f.shape[0] // 8],
             lambda f: 255 - f, lambda f: f[..., [2, 0, 1]][:, ::-1], lambda f: f[:, f.shape[1] // 2:],
             lambda f: (f.astype(np.uint16) * 3 // 4).astype(np.uint8), lambda f: f[::-1, ::-1],
             lambda f: np.ascontiguousarray(f[..., ::-1])]
    return looks[i % len(looks)]


def _make_video(job: tuple[Path, int, int, int]) -> Path:
    import cv2
    import decord
    import numpy as np

    out, i, seconds, fps = job
    if not out.is_file():
        vr = decord.VideoReader(str(MEDIA / ("cockatoo.mp4", "realshort.mp4")[i % 2]))
        step = max(int(round(vr.get_avg_fps() / fps)), 1)
        look = _transform(i)
        frames = [np.ascontiguousarray(look(f)) for f in vr.get_batch(list(range(0, len(vr), step))).asnumpy()]
        h = 540
        w = int(round(frames[0].shape[1] * h / frames[0].shape[0] / 2)) * 2
        writer = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
        for k in range(seconds * fps):
            writer.write(cv2.resize(frames[k % len(frames)][..., ::-1], (w, h), interpolation=cv2.INTER_AREA))
        writer.release()
    return out


def make_videos(out_dir: Path, n: int, min_s: float = 61.0, max_s: float = 287.0, fps: int = 10) -> list[Path]:
    """Write ``n`` distinct looped videos of ``min_s`` .. ``max_s`` seconds (evenly spread) from the bundled clips.

    OpenCV writes them (MPEG-4 Part 2, ``mp4v``; the GPU machine has OpenCV but no ffmpeg), 540 px high at ``fps``
    frames per second, one process per video; each video has its own look (:func:`_transform`) and source clip."""
    from multiprocessing import Pool

    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(out_dir / f"v{i:02d}_{round(min_s + (max_s - min_s) * i / max(n - 1, 1))}s.mp4", i,
             round(min_s + (max_s - min_s) * i / max(n - 1, 1)), fps) for i in range(n)]
    with Pool(min(n, os.cpu_count() or 1)) as pool:
        made = pool.map(_make_video, jobs)
    for out in made:
        print(out, f"{out.stat().st_size / 1e6:.1f} MB")
    return made


def write_benchmark(root: Path, videos: list[Path], copies: int = 1) -> None:
    """A Video-MME-format root: ``videomme/test-bench.parquet`` (3 questions per video) and ``videos/<id>.mp4``;
    ``copies`` > 1: each video that many times, as videos ``<stem>_c<k>`` (links to the same file), so that a run
    has many videos in flight as a benchmark does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "videomme").mkdir(parents=True, exist_ok=True)
    (root / "videos").mkdir(exist_ok=True)
    rows = []
    named = [(v, v.stem if copies == 1 else f"{v.stem}_c{k}") for k in range(copies) for v in videos]
    for i, (v, name) in enumerate(named):
        link = root / "videos" / f"{name}.mp4"   # Video-MME's layout names every file .mp4 (a VP9 .webm too)
        if not link.exists():
            link.symlink_to(v.resolve())
        for q in range(3):
            rows.append({"video_id": f"{i:03d}", "duration": "medium", "domain": "Bench", "sub_category": "Bench",
                         "url": "", "videoID": name, "question_id": f"{i:03d}-{q + 1}", "task_type": "Bench",
                         "question": ["What is the main subject of the video?", "What happens at the end?",
                                      "Where was the video filmed?"][q],
                         "options": ["A. A bird.", "B. A car.", "C. A house.", "D. A tree."], "answer": "A"})
    pq.write_table(pa.Table.from_pylist(rows), root / "videomme" / "test-bench.parquet")


def write_checkpoint(out: Path) -> float:
    """Full-size random VideoLLaMA3-7B + qbase checkpoint directory (bf16 safetensors); returns seconds."""
    sys.path.insert(0, str(REPO / "bench"))
    from qa_throughput import build_bench_model  # noqa: E402

    from models.videollama3.weight_files import QBASE_DIR

    t0 = time.perf_counter()
    vlm = build_bench_model("sdpa", "frame_batched")
    out.mkdir(parents=True, exist_ok=True)
    vlm.model.save_pretrained(out)
    vlm.tokenizer.save_pretrained(out)
    vlm.video_processor.save_pretrained(out)
    vlm.compressor.save_pretrained(out / QBASE_DIR)
    del vlm
    return time.perf_counter() - t0


def run_predict(ckpt: Path, root: Path, out: Path, config: str, extra: list[str]) -> tuple[dict, float]:
    cmd = [sys.executable, str(REPO / "evaluate.py"), "predict", "--config", str(REPO / config),
           f"--model.init_args.model_path={ckpt}", f"--data.init_args.root={root}",
           f"--trainer.callbacks.init_args.out_dir={out}", *extra]
    if os.environ.get("BENCH_STEP_PROFILE"):   # these steps under the profiler, then again alone (StepProfile)
        steps = [int(x) for x in os.environ["BENCH_STEP_PROFILE"].split(",")]
        spec = {"class_path": "callbacks.step_profile.StepProfile",
                "init_args": {"steps": steps, "path": str(out / "step_profile.json")}}
        cmd.append("--trainer.callbacks+=" + json.dumps(spec))
    if os.environ.get("BENCH_START_SAMPLE"):   # the start's every-thread sampler (bench/start_sampler.py)
        cmd[1:2] = [str(REPO / "bench" / "start_sampler.py"), "--out", os.environ["BENCH_START_SAMPLE"],
                    "--until-s", os.environ.get("BENCH_START_SAMPLE_UNTIL", "30"), "--", str(REPO / "evaluate.py")]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    timing = json.loads((out / "timing_rank0.json").read_text())
    if (out / "step_profile.json").is_file():
        timing["step_profile"] = json.loads((out / "step_profile.json").read_text())["steps"]
    return timing, time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make-videos", default=None, help="only write the distinct videos to this folder")
    ap.add_argument("--n-videos", type=int, default=12)
    ap.add_argument("--videos", default=str(REPO / "bench" / "media" / "distinct"))
    ap.add_argument("--work", default="/tmp/cli_throughput")
    ap.add_argument("--config", default="configs/predict/videomme.yaml")
    ap.add_argument("--tiny", action="store_true", help="tiny model, demo config, CPU (smoke test)")
    ap.add_argument("extra", nargs="*", help="more evaluate.py options (e.g. --model.init_args.budgets=[4096])")
    args = ap.parse_args(argv)
    if args.make_videos:
        make_videos(Path(args.make_videos), args.n_videos)
        return
    work = Path(args.work)
    videos = sorted(Path(args.videos).glob("*.mp4"))[: args.n_videos]
    if args.tiny:
        from models.videollama3.tiny import build_tiny_videollama3

        videos = videos or [MEDIA / "cockatoo.mp4", MEDIA / "realshort.mp4"]
        ckpt, ckpt_s = build_tiny_videollama3(work / "tiny"), 0.0
        config = "configs/predict/demo.yaml"
        extra = ["--trainer.accelerator=cpu", "--data.init_args.num_workers=1", "--data.init_args.loader_kwargs={}",
                 *args.extra]
    else:
        if not videos:
            raise SystemExit(f"no videos in {args.videos}: run --make-videos first")
        ckpt = work / "videollama3-7b-random"
        ckpt_s = 0.0 if (ckpt / "config.json").is_file() else write_checkpoint(ckpt)
        config, extra = args.config, list(args.extra)
    root = work / "root"
    write_benchmark(root, videos)
    out = work / f"out_{int(time.time())}"
    timing, total_s = run_predict(ckpt, root, out, config, extra)
    report(out, timing, total_s, ckpt_s)


def report(out: Path, timing: dict, total_s: float, ckpt_s: float) -> None:
    """Print the run's figures: from its records in ``out`` and its ``timing_rank0.json`` (``timing``); ``total_s``
    is the process's wall time, ``ckpt_s`` the seconds spent writing the checkpoint.

    Raises:
        SystemExit: no answered record (every figure would time error records only).
    """
    records = [json.loads(line) for f in sorted(out.glob("*/*/rank*.jsonl")) for line in f.read_text().splitlines()]
    errors = [r for r in records if r.get("error")]
    if errors:
        print(f"{len(errors)} of {len(records)} records are errors, e.g. {errors[0]['error']}")
    if not records or len(errors) == len(records):
        raise SystemExit("no answered record: the timings would mean nothing")
    steps = timing["step_s"]
    load = timing["stages_s"]["load"]
    rest = steps[1:]
    steady_wall = (timing["wall_s"] - load - timing["first_wait_s"] - steps[0]) / max(len(rest), 1)
    rows = [("videos", f"{timing['videos']}"), ("records (errors)", f"{len(records)} ({len(errors)})"), ("checkpoint written (s)", f"{ckpt_s:.1f}"),
            ("model load (s)", f"{load:.1f}"), ("first-video wait (s)", f"{timing['first_wait_s']:.2f}"),
            ("first video = warm-up (s)", f"{steps[0]:.2f}"),
            ("first answer after process start (s)", f"{timing.get('timeline_s', {}).get('first_answer', float('nan')):.1f}"),
            ("steady step per video, mean (s)", f"{statistics.mean(rest):.3f}" if rest else "-"),
            ("steady step per video, median (s)", f"{statistics.median(rest):.3f}" if rest else "-"),
            ("steady wall per video after the first (s)", f"{steady_wall:.3f}"),
            ("wait share", f"{timing['stages_share']['wait']:.1%}"), ("process wall (s)", f"{total_s:.1f}")]
    w = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{w}}  {v}" for k, v in rows))
    print("steps (s):", " ".join(f"{s:.2f}" for s in steps))
    print("stages (s):", json.dumps(timing["stages_s"]))
    if timing.get("timeline_s"):   # seconds after the process started: imports, set-up, load, first video, answer
        print("timeline (s after process start):", json.dumps(timing["timeline_s"]))
    if timing.get("warmup"):   # the first step's wait for the early compilation, and graphs it still compiled
        print("warm-up:", json.dumps(timing["warmup"]))


if __name__ == "__main__":
    main()
