"""One CLI run of ``bench/workload.py --cli --json`` over time, as a PNG: what the engines, the SMs and the CPUs were
doing (top), and each video's decode window and GPU step (bottom), in seconds after the process start.

    python bench/plot_cli_run.py bench/results/s7call3_cli_copies_h100_2026-12-06.json --label auto -o run.png

Top panel: the NVDEC, SM and CPU busy shares the run's ``UtilSampler`` took (``util.series``; runs saved before
2026-12-06 session 7 have no series, and the panel then says so), with the run's timeline marks (weights loaded,
first answer). Bottom panel: the report's per-video timeline (one row per video in the order the GPU took them: its
decode window, a video in parts from its first part's start to its last part's end; the step's wait in red; the
step). So a glance says whether a gap in the steps is a decode that ended late (red after a long grey bar) or an
engine that was already full (NVDEC at 100 % above it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_run(path: Path, label: str | None = None) -> tuple[str, dict]:
    """``(label, run)`` of a workload json's CLI run named ``label`` (its last run when None).

    Raises:
        SystemExit: the file has no CLI run, or none of that label (the labels it has are named)."""
    data = json.loads(path.read_text())
    runs = data.get("cli_runs") or ({"cli": data["timing"]} if data.get("timing") else {})
    if not runs:
        raise SystemExit(f"{path}: no CLI run (a bench/workload.py --cli --json file is needed)")
    if label is None:
        label = list(runs)[-1]
    if label not in runs:
        raise SystemExit(f"{path}: no CLI run {label!r}; it has {sorted(runs)}")
    return label, runs[label]


def rows_in_step_order(run: dict) -> list[dict]:
    """The run's per-video rows that have a decode window and a step start (a run without workers has no
    windows), sorted by step start (the order the GPU took them)."""
    rows = [r for r in (run.get("per_video") or []) if "decode_start" in r and "step_start" in r]
    return sorted(rows, key=lambda r: r["step_start"])


def smoothed(points: list[list[float]], column: int, window_s: float = 2.0) -> tuple[list[float], list[float]]:
    """``(times, percent)``: column ``column`` of ``[t, ...]`` samples as a trailing mean over ``window_s`` seconds
    (busy shares sampled every 0.25 s are noise drawn raw on a run of minutes), in percent."""
    ts, out, acc, lo = [p[0] for p in points], [], 0.0, 0
    for i, p in enumerate(points):
        acc += p[column]
        while ts[lo] < p[0] - window_s:
            acc -= points[lo][column]
            lo += 1
        out.append(100 * acc / (i - lo + 1))
    return ts, out


def plot(run: dict, label: str, out: Path) -> Path:
    """Write the two panels of ``run`` to ``out`` (PNG); returns ``out``. The bottom panel is the report's own
    per-video timeline (:func:`callbacks.scoring.plots.draw_timeline`)."""
    from matplotlib.figure import Figure

    from callbacks.scoring.plots import MAX_TIMELINE_ROWS, draw_timeline, figure_png

    every = rows_in_step_order(run)
    rows = every[:MAX_TIMELINE_ROWS]
    util = run.get("util") or {}
    series = util.get("series") or {}
    marks = run.get("timeline_s") or {}
    fig = Figure(layout="constrained", figsize=(11, min(3.5 + 0.25 * max(len(rows), 4), 16.0)))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, max(1.2, 0.12 * len(rows))]}
                               if len(rows) <= 40 else {"height_ratios": [1, 4]})
    g, c = series.get("gpu") or [], series.get("cpu") or []
    for points, column, name in ((g, 2, "NVDEC"), (g, 1, "SM"), (c, 1, "CPU")):
        if points:
            line, = top.plot(*smoothed(points, column), label=f"{name} (2 s mean)", lw=1.2)
            top.plot([p[0] for p in points], [100 * p[column] for p in points], lw=0.5, alpha=0.25,
                     color=line.get_color())
    if g or c:
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        top.text(0.5, 0.5, "no busy series in this run's json (saved before they were recorded)"
                 if "series" not in util else "no busy samples in this run",
                 ha="center", va="center", transform=top.transAxes, fontsize=9)
    top.set_ylim(0, 105)
    top.set_ylabel("busy %")
    for mark, style in (("model_loaded", ":"), ("first_answer", "--")):
        if marks.get(mark) is not None:
            top.axvline(marks[mark], color="k", linestyle=style, linewidth=1)
    waits = run.get("steady_wait_share")
    draw_timeline(bottom, run, rows, f"CLI run {label}: {len(every)} videos"
                  + (f" (the first {len(rows)} drawn)" if len(every) > len(rows) else "")
                  + (f", GPU wait after the first video {100 * waits:.1f} %" if waits is not None else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(figure_png(fig))
    return out


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a bench/workload.py --cli --json file")
    ap.add_argument("--label", default=None, help="which CLI run (e.g. 'auto#2'; default the last)")
    ap.add_argument("-o", "--out", type=Path, default=None, help="PNG path (default: beside the json)")
    args = ap.parse_args(argv)
    label, run = load_run(args.run, args.label)
    safe = "".join(ch if ch.isalnum() else "_" for ch in label)
    out = plot(run, label, args.out or args.run.with_name(f"{args.run.stem}_{safe}.png"))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
