"""Per-stage time breakdown of a predict run: waiting for data, encode, plan/build, answer.

``wait`` is the time between the end of one ``predict_step`` and the start of the next (the DataLoader workers
had not decoded the next video yet), plus the first batch's wait after the model load. ``load`` is the module's
``load_seconds`` (``BudgetedQA`` loads its model in ``on_predict_start``, while the workers decode the first
videos). The module's stage times come from
``pl_module.last_stage_seconds`` (set by :class:`lightning_modules.budgeted_qa.BudgetedQA`). Shown on the tqdm
progress bar as a postfix, printed as a table and written to ``<out_dir>/timing_rank<r>.json`` at the end.

The file keeps every run of the folder: the latest run's figures at the top level (the keys below, as a single-run
file always had them) and the earlier runs', oldest first, under ``previous_runs`` (:func:`write_timing`), so a
resumed run (an added budget) loses none of the first run's timings; a file of the old single-run format becomes
the first entry of ``previous_runs``.

``timeline_s`` in that file gives milestones in seconds after the process started (:func:`process_age_s`:
interpreter start, so imports and the CLI's set-up count): ``predict_start``, ``model_loaded``, ``first_video``
(the first decoded video reached the step), ``first_answer`` (the first video's step ended: its records are
written next), ``predict_end``. ``first_answer`` is the cold-start figure a user waits for. Where they are known
also: ``first_worker_start`` (the first video's DataLoader worker process started), ``first_decode_start`` /
``first_decode_end`` (its decode window in that worker, on the machine's boot clock), and the module's own
``timeline_marks`` (``BudgetedQA``: ``module_built``, ``setup``, ``early_compile_start``, ``early_compile_end``;
``VideoQADataModule`` adds ``loader_built``: Lightning had the loader, its workers start next).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback, TQDMProgressBar

from callbacks.process_clock import boot_s, process_age_s  # noqa: F401 - process_age_s is this module's API too


PREVIOUS_RUNS = "previous_runs"
# the workers hint speaks from this many videos (3 after the first, the pipeline fill): from 2 (one unreadable, one
# decoded in 2 workers of a 2-core host) it advised more workers than the host has
MIN_HINT_VIDEOS = 4


def timing_runs(data) -> list[dict]:
    """Every run of a ``timing_rank<r>.json``'s content, oldest first, the latest last (each without
    ``previous_runs``); a file of the old single-run format is one run. ``[]`` for anything else."""
    if not isinstance(data, dict):
        return []
    earlier = [r for r in data.get(PREVIOUS_RUNS) or [] if isinstance(r, dict)]
    return [*earlier, {k: v for k, v in data.items() if k != PREVIOUS_RUNS}]


def write_timing(path: Path, summary: dict) -> dict:
    """Write ``summary`` (this run's figures) to ``path`` atomically, keeping what the file held: its runs go to
    ``previous_runs`` (oldest first; :func:`timing_runs`). A file that cannot be parsed is kept beside as
    ``<name>.unreadable`` instead of being overwritten. Returns the content written."""
    previous: list[dict] = []
    if path.is_file():
        try:
            previous = timing_runs(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            os.replace(path, path.with_name(path.name + ".unreadable"))
    content = {**summary, PREVIOUS_RUNS: previous}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(content, indent=2), encoding="utf-8")
    os.replace(tmp, path)
    return content


class StageTimer(Callback):
    """Accumulate stage seconds per rank.

    Args:
        out_dir: where ``timing_rank<r>.json`` goes (default: the prediction writer's ``out_dir``).
    """

    STAGES = ("load", "wait", "encode", "plan_build", "answer")

    def __init__(self, out_dir: str | None = None):
        self.out_dir = out_dir
        self._reset()
        self._mark: float | None = None

    def _reset(self) -> None:
        self.totals = dict.fromkeys(self.STAGES, 0.0)
        self.videos = 0
        self.decode_worker_s = 0.0      # decoding seconds spent in DataLoader workers (off the GPU's path)
        self.first_wait_s = 0.0         # the pipeline fill left after the load (more workers do not shorten it)
        self.step_s: list[float] = []   # per video, in order: seconds of its predict step (encode + plan + answer)
        self.per_video: list[dict] = []   # per video, in order: decode window, step start, wait (_video_row), step and stage seconds
        self._step_start: float | None = None
        self._start = 0.0
        self.timeline: dict[str, float] = {}   # seconds after the process started (process_age_s), milestones
        self._t0: float | None = None          # perf_counter() at the process start
        self._ended = False                    # this run's figures written at predict end (on_predict_end)

    def _stamp(self, name: str) -> None:
        if self._t0 is not None and name not in self.timeline:
            self.timeline[name] = round(time.perf_counter() - self._t0, 3)

    def on_predict_start(self, trainer, pl_module) -> None:
        self._reset()
        self._start = self._mark = time.perf_counter()
        age = process_age_s()
        self._t0 = None if age is None else self._start - age
        self._stamp("predict_start")

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        now = time.perf_counter()
        if self._mark is not None:
            load = 0.0
            if self.videos == 0:   # the module's hooks ran after ours: its model load is inside this interval
                load = float(getattr(pl_module, "load_seconds", 0.0) or 0.0)
                self.totals["load"] += load
                self.first_wait_s = max(now - self._mark - load, 0.0)
                if self._t0 is not None:
                    self.timeline["model_loaded"] = round(self._mark + load - self._t0, 3)
                self._stamp("first_video")
                self._first_worker_marks(batch)
            wait = max(now - self._mark - load, 0.0)
            self.totals["wait"] += wait
            self._video_row(batch, now, wait)
        self._step_start = now

    def _video_row(self, batch, now: float, wait: float) -> None:
        """One ``per_video`` row: the video, its decode window in its worker and when its step started (seconds
        after the process start), and how long the step waited for it, so that a wait can be traced to the video
        that caused it; the step's seconds (``step_s``) and its stages' (``stages_s``: encode, plan_build, answer)
        are added when it ends."""
        if not isinstance(batch, dict):
            return
        row = {"video_id": batch.get("video_id"), "wait_s": round(wait, 4)}
        if self._t0 is not None:
            row["step_start"] = round(now - self._t0, 3)
            window = batch.get("decode_boot_s")
            if window:
                origin = self._boot_origin()
                row["decode_start"] = round(float(window[0]) - origin, 3)
                row["decode_end"] = round(float(window[1]) - origin, 3)
        if batch.get("decode_parts", 1) > 1:   # decoded in parts by as many workers (data.decode_part_mb)
            row["decode_parts"] = int(batch["decode_parts"])
        if batch.get("parts_fallback"):        # its parts did not fit: decoded whole in the main process
            row["parts_fallback"] = str(batch["parts_fallback"])
        self.per_video.append(row)

    def _boot_origin(self) -> float:
        """This process's start on the boot clock (the workers' stamps are on it; ``timeline_s`` counts from it)."""
        return boot_s() - (time.perf_counter() - self._t0)

    def _first_worker_marks(self, batch) -> None:
        """The first video's worker on this timeline: when its process started (``first_worker_start``; absent for
        the main process, ``data.num_workers = 0``) and its decode window (``first_decode_start`` / ``_end``), from
        the item's boot-clock stamps (:mod:`callbacks.process_clock`)."""
        if self._t0 is None or not isinstance(batch, dict):
            return
        origin = self._boot_origin()
        window = batch.get("decode_boot_s")
        if window:
            self.timeline["first_decode_start"] = round(float(window[0]) - origin, 3)
            self.timeline["first_decode_end"] = round(float(window[1]) - origin, 3)
        worker = batch.get("worker_start_boot_s")
        if worker is not None and float(worker) > origin + 0.05:    # a DataLoader worker, not this process
            self.timeline["first_worker_start"] = round(float(worker) - origin, 3)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        stages = dict(getattr(pl_module, "last_stage_seconds", {}))
        for k, v in stages.items():
            self.totals[k] = self.totals.get(k, 0.0) + v
        if stages and self.per_video and "stages_s" not in self.per_video[-1]:
            # this video's stages: a first step's extra seconds show where they went (encode, plan, answer)
            self.per_video[-1]["stages_s"] = {k: round(v, 4) for k, v in stages.items()}
        if hasattr(pl_module, "last_stage_seconds"):
            pl_module.last_stage_seconds = {}
        self.videos += 1
        if self._step_start is not None:
            self.step_s.append(round(time.perf_counter() - self._step_start, 4))
            if self.per_video and "step_s" not in self.per_video[-1]:
                self.per_video[-1]["step_s"] = self.step_s[-1]
        self._stamp("first_answer")
        if isinstance(batch, dict):
            self.decode_worker_s += float(batch.get("decode_s") or 0.0)
        pb = trainer.progress_bar_callback
        if isinstance(pb, TQDMProgressBar) and getattr(pb, "_predict_progress_bar", None) is not None:
            wall = max(time.perf_counter() - self._start, 1e-9)
            pb.predict_progress_bar.set_postfix({k: f"{100 * self.totals[k] / wall:.0f}%" for k in self.STAGES},
                                                refresh=False)
        self._mark = time.perf_counter()

    def summary(self) -> dict:
        wall = max(time.perf_counter() - self._start, 1e-9)
        return {"videos": self.videos, "wall_s": round(wall, 4),
                "stages_s": {k: round(v, 4) for k, v in self.totals.items()},
                "stages_share": {k: round(v / wall, 4) for k, v in self.totals.items()},
                "decode_worker_s": round(self.decode_worker_s, 4), "first_wait_s": round(self.first_wait_s, 4),
                "step_s": list(self.step_s), "timeline_s": dict(self.timeline), "per_video": list(self.per_video)}

    def _write(self, trainer, s: dict) -> None:
        """``timing_rank<r>.json`` in the run's folder (this callback's ``out_dir``, else the writer's), the earlier
        runs kept (:func:`write_timing`); a folder that cannot take it is one warning, never a stop."""
        # the CUDA MPS daemon this run's processes are clients of (models.mps: the run's own by default), or None
        s["cuda_mps_pipe"] = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        s["device_type"] = trainer.strategy.root_device.type     # "cuda" or "cpu" (MPS means nothing on the CPU)
        out = self.out_dir
        if out is None:
            for cb in trainer.callbacks:
                if hasattr(cb, "out_dir") and cb is not self:
                    out = cb.out_dir
                    break
        if out is None:
            return
        path = Path(out) / f"timing_rank{trainer.global_rank}.json"
        try:
            write_timing(path, s)   # earlier runs kept
        except OSError as e:        # a full disk or read-only folder: the stage times are not worth a stop
            print(f"warning: {e.filename or path}: timing not written ({e.strerror or e})", file=sys.stderr)
            try:
                path.with_suffix(".json.tmp").unlink(missing_ok=True)
            except OSError:
                pass

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """A run stopped by Ctrl-C (or SIGTERM) keeps the figures of the videos it did, marked ``interrupted``, so
        that the resumed run's file lists it under ``previous_runs`` as the README says (it was lost before). An
        interrupt after predict end (while the scores are written) changes nothing: the run's figures were written
        whole then, and a second write would list the same run twice."""
        if not isinstance(exception, KeyboardInterrupt) or not self._start or not self.per_video or self._ended:
            return
        self._stamp("interrupted")
        self._module_marks(pl_module)
        self._write(trainer, {**self.summary(), "interrupted": True})

    def _module_marks(self, pl_module) -> None:
        for name, age in (getattr(pl_module, "timeline_marks", None) or {}).items():   # e.g. module_built, setup
            if age is not None:
                self.timeline.setdefault(name, round(float(age), 3))

    def on_predict_end(self, trainer, pl_module) -> None:
        self._stamp("predict_end")
        self._module_marks(pl_module)
        s = self.summary()
        if getattr(pl_module, "warmup_report", None):   # BudgetedQA: the first step's compile wait and graphs
            s["warmup"] = pl_module.warmup_report
        self._write(trainer, s)
        self._ended = True
        rows = "  ".join(f"{k} {s['stages_s'][k]:.2f}s ({100 * s['stages_share'][k]:.0f}%)" for k in self.STAGES)
        print(f"[rank {trainer.global_rank}] {s['videos']} video{'' if s['videos'] == 1 else 's'} in "
              f"{s['wall_s']:.2f}s: {rows}")
        dm = trainer.datamodule
        hint = self.wait_hint(s, getattr(dm, "workers", getattr(dm, "num_workers", None)) if dm else None,
                              chosen=dm is not None and hasattr(dm, "workers") and dm.num_workers is None)
        if hint:
            print(f"[rank {trainer.global_rank}] {hint}")
        waits = self.longest_waits(s)
        if waits:
            print(f"[rank {trainer.global_rank}] {waits}")

    @staticmethod
    def longest_waits(s: dict, top: int = 3, min_s: float = 0.5) -> str | None:
        """The videos the GPU waited longest for after the first one (the first is the pipeline fill), each with
        its decode window in seconds after the process start: ``None`` when no wait reached ``min_s`` seconds."""
        rows = sorted((r for r in (s.get("per_video") or [])[1:] if r.get("wait_s", 0.0) >= min_s),
                      key=lambda r: -r["wait_s"])[:top]
        if not rows:
            return None

        def window(r):
            if "decode_start" not in r:
                return ""
            return f" (decoded {r['decode_start']:.1f}-{r['decode_end']:.1f} s, its step at {r['step_start']:.1f} s)"

        return "longest data waits: " + "; ".join(f"{r['video_id']} {r['wait_s']:.2f} s{window(r)}" for r in rows)

    @staticmethod
    def steady_wait(s: dict) -> tuple[float, float]:
        """``(seconds the steps waited for data after the first video, the wall after it)``: the first video's wait
        (the pipeline fill) and its step are left out, as is the load. ``bench/workload.py`` reports the same
        share (``steady_wait_share``)."""
        stages = s.get("stages_s") or {}
        first = s.get("first_wait_s", 0.0)
        steps = s.get("step_s") or []
        span = s["wall_s"] - stages.get("load", 0.0) - first - (steps[0] if steps else 0.0)
        return max(stages.get("wait", 0.0) - first, 0.0), span

    @staticmethod
    def wait_hint(s: dict, workers: int | None, threshold: float = 0.05, chosen: bool = False) -> str | None:
        """A sizing hint when, after the first video (the pipeline fill, which more workers do not shorten), the GPU
        waited for data more than ``threshold`` of the wall time AND decoding is the bottleneck: ``decode seconds
        per video / workers`` above the GPU seconds per video. Names the worker count that would keep up;
        ``chosen``: ``workers`` came from ``data.num_workers: null`` (this host's CPUs), which the hint says."""
        n = s["videos"]
        stages = s["stages_s"]
        busy = sum(v for k, v in stages.items() if k not in ("load", "wait"))
        steady, span = StageTimer.steady_wait(s)
        if n < MIN_HINT_VIDEOS or span < 1.0 or busy / n < 0.01 or steady / span <= threshold:
            return None   # (too few videos to say, or no GPU work: e.g. every video failed to decode)
        per_video, gpu = s["decode_worker_s"] / n, busy / n
        decoders = max(workers or 0, 1)
        if per_video / decoders <= gpu:
            return None
        where = f"one of {workers} workers" if workers else "the main process (data.num_workers = 0)"
        return (f"the step waited for data {100 * steady / span:.0f}% of the time after the first video: decoding "
                f"took {per_video:.2f}s per video in {where} against {gpu:.2f}s of model work per video; about "
                f"{math.ceil(per_video / gpu)} workers would keep up (data.num_workers"
                + (f": null chose {workers} from this host's CPUs" if chosen else "")
                + "; data.decode_threads sets the decoder threads of each) if the host has the CPUs")
