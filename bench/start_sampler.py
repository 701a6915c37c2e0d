"""Where a process's first seconds go, every thread of it at once: a sampling profiler around ``evaluate.py``.

cProfile sees one thread and its overhead bends a start that is mostly imports; this samples the Python stacks of
every thread of the process (``sys._current_frames``; not its DataLoader workers, which are processes of their own)
every ``--interval-ms`` from the interpreter's start until ``--until-s`` seconds (process age,
:func:`callbacks.process_clock.process_age_s`, the clock of ``timeline_s``), then writes the samples as JSON. A thread
waiting in C (a CUDA call, a file read, a lock) shows the Python frame that called it.

    python bench/start_sampler.py --out /tmp/start.json [--until-s 30] -- evaluate.py predict --config ...
    python bench/start_sampler.py --summary /tmp/start.json [--timing out/timing_rank0.json] [--bins 1.0]

``bench/cli_throughput.run_predict`` wraps the CLI in it when ``BENCH_START_SAMPLE`` names the output file
(``bench/workload.py --cli-decoders auto/env.BENCH_START_SAMPLE=/tmp/s.json``). The summary prints, for each
thread and each time bin, the share of samples and the innermost frames that took most of them, and, for each span
between two ``timeline_s`` marks (``--timing``), the main thread's inclusive top frames.
"""
from __future__ import annotations

import argparse
import collections
import json
import runpy
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# frames that say nothing about what a thread waits for (the innermost frame outside them is shown)
PLUMBING = ("threading.py", "queue.py", "selectors.py", "<frozen importlib._bootstrap", "connection.py",
            "start_sampler.py", "runpy.py")


def frame_key(code) -> str:
    """``file:function`` of a code object, the file shortened to its package path (``torch/cuda/__init__.py``)."""
    f = code.co_filename
    for cut in ("site-packages/", "lib/python3", str(REPO) + "/"):
        if cut in f:
            f = f.split(cut, 1)[1]
            break
    return f"{f}:{code.co_name}"


class Sampler(threading.Thread):
    """Samples every thread's stack (outermost first, at most ``depth`` frames kept from the innermost) every
    ``interval_s`` until the process age passes ``until_s``; ``samples``: ``[age_s, thread name, stack id]``,
    ``stacks``: the distinct stacks, each a list of :func:`frame_key` strings."""

    def __init__(self, interval_s: float, until_s: float, out: Path | None = None, depth: int = 60):
        super().__init__(name="start-sampler", daemon=True)
        self.interval_s, self.until_s, self.out, self.depth = interval_s, until_s, out, depth
        self.samples: list[list] = []
        self.stacks: list[list[str]] = []
        self._ids: dict[tuple, int] = {}

    def run(self) -> None:
        import time

        from callbacks.process_clock import process_age_s

        me = threading.get_ident()
        while True:
            age = process_age_s() or 0.0
            if age > self.until_s:
                if self.out is not None:
                    self.dump(self.out)   # (again at the script's end: a run that ends first has it too)
                return
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                keys = []
                while frame is not None and len(keys) < self.depth:
                    keys.append(frame_key(frame.f_code))
                    frame = frame.f_back
                stack = tuple(reversed(keys))
                sid = self._ids.setdefault(stack, len(self._ids))
                if sid == len(self.stacks):
                    self.stacks.append(list(stack))
                self.samples.append([round(age, 4), names.get(ident, str(ident)), sid])
            time.sleep(self.interval_s)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({"interval_s": self.interval_s, "samples": self.samples, "stacks": self.stacks}))


def leaf(stack: list[str]) -> str:
    """The innermost frame of a stack outside :data:`PLUMBING` (the stack's innermost where all is plumbing)."""
    for k in reversed(stack):
        if not any(p in k for p in PLUMBING):
            return k
    return stack[-1] if stack else "?"


def summary(data: dict, timing: dict | None, bin_s: float, top: int = 3, top_frames: int = 25) -> str:
    """The report described in the module docstring, as text."""
    stacks, dt = data["stacks"], data["interval_s"]
    lines = []
    by_thread: dict[str, list] = collections.defaultdict(list)
    for age, name, sid in data["samples"]:
        by_thread[name].append((age, sid))
    for name, rows in sorted(by_thread.items(), key=lambda kv: kv[1][0][0]):
        lines.append(f"## thread {name}: {rows[0][0]:.2f}-{rows[-1][0]:.2f} s, {len(rows)} samples")
        bins: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        for age, sid in rows:   # a sample waiting (activity None: a lock, a queue, a sleep) is named as such
            key = leaf(stacks[sid])
            bins[int(age // bin_s)][key if activity(stacks[sid]) is not None else f"(waiting) {key}"] += 1
        for b in sorted(bins):
            c = bins[b]
            n = sum(c.values())
            lines.append(f"  {b * bin_s:6.1f} s  " + "; ".join(f"{k} {v / n:.0%}" for k, v in c.most_common(top)))
    marks = sorted(((v, k) for k, v in ((timing or {}).get("timeline_s") or {}).items()), key=lambda x: x[0])
    main = [(a, s) for a, n, s in data["samples"] if n == "MainThread"]
    edges = [(0.0, "start")] + marks
    for (a, ka), (b, kb) in zip(edges, edges[1:]):
        inside = [s for t, s in main if a <= t < b]
        if b - a < 0.2 or not inside:
            continue
        incl: collections.Counter = collections.Counter()
        depth: dict[str, int] = {}
        for s in inside:
            incl.update(set(stacks[s]))
            for i, k in enumerate(stacks[s]):
                depth[k] = min(depth.get(k, i), i)
        lines.append(f"## main thread {ka} {a:.2f} -> {kb} {b:.2f} s ({b - a:.2f} s, {len(inside)} samples): "
                     "inclusive frames, outermost first among equal shares (only the innermost of a run of frames "
                     "that all samples share)")
        ranked = sorted(incl.items(), key=lambda kv: (-kv[1], depth[kv[0]]))
        whole = [k for k, v in ranked if v == len(inside)]
        shown = whole[-1:] + [k for k, v in ranked if v < len(inside)]
        for k in [k for k in shown if not any(p in k for p in PLUMBING)][:top_frames]:
            lines.append(f"    {incl[k] / len(inside):5.0%}  {k}")
    return "\n".join(lines)


# what a sample is doing, by the frames of its stack (the first rule that matches wins)
ACTIVITIES = (
    ("waits", ("threading.py:wait", "threading.py:join", "threading.py:_wait_for_tstate_lock", "queues.py:get",
               "selectors.py:select", "connection.py:_poll", "connection.py:wait", "streams.py:synchronize",
               "cuda/__init__.py:synchronize", "warm.py:wait_for", "forkserver.py:read_signed",
               "dataloader.py:_try_get_data", "_monitor.py:run", "queues.py:_feed", "pin_memory.py:",
               "start_sampler.py")),
    ("imports", ("_find_and_load",)),
    ("weight read", ("weight_reader.py:",)),
    ("Triton", ("triton/",)),
    ("the step", ("budgeted_qa.py:predict_step", "budgeted_qa.py:_answer_video")),
    ("model load", ("encoding.py:from_pretrained", "qbase.py:from_pretrained")),
    ("warm-up", ("warm.py:",)),
    ("data set-up", ("datamodules/",)),
)
COLORS = {"imports": "#d62728", "weight read": "#1f77b4", "Triton": "#9467bd", "the step": "#2ca02c",
          "model load": "#17becf", "warm-up": "#bcbd22", "data set-up": "#ff7f0e", "other": "#7f7f7f"}


def activity(stack: list[str]) -> str | None:
    """The :data:`ACTIVITIES` name of a stack (``None``: waiting), ``"other"`` where none matches."""
    inner = stack[-1] if stack else ""
    for name, keys in ACTIVITIES:
        hit = any(k in inner for k in keys) if name == "waits" else any(k in f for f in stack for k in keys)
        if hit:
            return None if name == "waits" else name
    return "other"


def plot(data: dict, timing: dict | None, path: Path, until_s: float | None = None) -> None:
    """One row per thread (the weight reader's threads as one row), each sample a bar coloured by :func:`activity`
    (waits left blank), the ``timeline_s`` marks as lines: where the start's seconds go, thread by thread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stacks, dt = data["stacks"], data["interval_s"]
    rows: dict[str, list] = collections.defaultdict(list)
    for age, name, sid in data["samples"]:
        if until_s is not None and age > until_s:
            continue
        row = "weight readers" if name.startswith("weight-reader-") else name
        kind = activity(stacks[sid])
        if kind is not None:
            rows[row].append((age, kind))
    names = [n for n, v in sorted(rows.items(), key=lambda kv: kv[1][0][0]) if len(v) >= 3]
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(names) + 1.6))
    for y, n in enumerate(names):
        by_kind: dict[str, list] = collections.defaultdict(list)
        for age, kind in rows[n]:
            by_kind[kind].append((age, dt * 1.05))
        for kind, spans in by_kind.items():
            ax.broken_barh(spans, (y - 0.35, 0.7), color=COLORS.get(kind, "#7f7f7f"))
    marks = [(k, v) for k, v in sorted(((timing or {}).get("timeline_s") or {}).items(), key=lambda kv: kv[1])
             if until_s is None or v <= until_s]
    span = max([v for _, v in marks] + [a for r in rows.values() for a, _ in r] + [1.0])
    ends: list[float] = []          # per label height, where its last label ends (s): marks close together stack up
    for k, v in marks:
        ax.axvline(v, color="k", lw=0.6, ls=":")
        level = next((i for i, e in enumerate(ends) if e <= v), len(ends))
        if level == len(ends):
            ends.append(0.0)
        ends[level] = v + span * 0.0075 * len(k)     # a 6.5-pt label's width, roughly, in seconds
        ax.text(v, len(names) - 0.4 + 0.55 * level, k, fontsize=6.5, va="bottom", ha="left")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("seconds after the interpreter's start")
    ax.set_ylim(-0.6, len(names) + 0.6 + 0.55 * max(len(ends), 1) + 1.2)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()], labels=list(COLORS),
              ncol=len(COLORS), fontsize=7, loc="upper left")
    ax.set_title("what each thread of the CLI does, sampled every "
                 f"{dt * 1000:.0f} ms (blank: waiting)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                 usage="%(prog)s --out S.json [options] -- SCRIPT [ARGS ...]\n"
                                       "       %(prog)s --summary S.json [--timing timing_rank0.json] [--plot P.png]")
    ap.add_argument("--out", type=Path, help="sampling: write the samples here (JSON)")
    ap.add_argument("--until-s", type=float, default=30.0, help="sampling: stop at this process age (s)")
    ap.add_argument("--interval-ms", type=float, default=10.0, help="sampling: time between two samples (ms)")
    ap.add_argument("--summary", type=Path, help="print the summary of a samples file (no script is run)")
    ap.add_argument("--timing", type=Path, help="with --summary: the run's timing_rank0.json (its timeline_s marks "
                                                 "the spans)")
    ap.add_argument("--bins", type=float, default=1.0, help="with --summary: time bin of the per-thread view (s)")
    ap.add_argument("--plot", type=Path, help="with --summary: also draw the threads' activity (PNG)")
    ap.add_argument("--plot-until-s", type=float, default=None, help="with --plot: the plot's last second")
    ap.add_argument("script", nargs="*", help="after --: the script and its arguments (run as __main__)")
    args = ap.parse_args(argv)
    if args.summary:
        timing = json.loads(args.timing.read_text()) if args.timing else None
        data = json.loads(args.summary.read_text())
        print(summary(data, timing, args.bins))
        if args.plot:
            plot(data, timing, args.plot, args.plot_until_s)
        return
    if not args.out or not args.script:
        ap.error("--out and a script to run (after --) are needed")
    sampler = Sampler(args.interval_ms / 1000.0, args.until_s, args.out)
    sampler.start()
    sys.argv = list(args.script)
    try:
        runpy.run_path(args.script[0], run_name="__main__")
    finally:
        sampler.dump(args.out)
        print(f"start_sampler: {len(sampler.samples)} samples of {len({n for _, n, _ in sampler.samples})} threads "
              f"in {args.out} (read them with --summary {args.out})", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from callbacks.process_clock import mark_interpreter_start

    mark_interpreter_start()
    main()
