"""Writes causal omni feature files (``datamodules.features`` format) and per-session timeline plots.

``FeatureWriter`` saves each ``OmniFeatureExtractor.predict_step`` record atomically to
``<out_dir>/<session>.<mode>[.<memory_policy>].safetensors`` (keyed by session, never by position or rank;
the policy only when not ``window``) and, with ``plot=True``,
redraws ``<out_dir>/<session>.timeline.png`` from whichever mode files of that session exist. A session that failed
(an error record: unreadable media, or an extraction error) gets ``<session>.<mode>[.<policy>].error.json`` with the
message instead; a later successful run of it removes that file. Features already written are never touched by a
failure.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import BasePredictionWriter

from algorithms.streaming import MODES
from callbacks.process_clock import process_age_s
from datamodules.features import atomic_write_bytes, error_path, feature_path, load_features, save_features


class FeatureWriter(BasePredictionWriter):
    """Args:
        out_dir: folder for feature files and plots.
        plot: also write the session's timeline PNG.
        overwrite: replace an existing file (else keep it and skip the write).
    """

    def __init__(self, out_dir: str = "outputs/features", plot: bool = True, overwrite: bool = True):
        super().__init__(write_interval="batch")
        self.out_dir = Path(out_dir)
        self.plot = plot
        self.overwrite = overwrite
        self.written: list[Path] = []
        self.kept: list[dict[str, Any]] = []  # session + meta of the files written in this run (summary; no tensors)
        self.skipped: list[Path] = []         # existing files left alone (overwrite=False)
        self.errors: list[dict[str, Any]] = []  # error records of this run
        self._t0: float | None = None           # perf_counter at the predict setup (before the model's own setup)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "predict":
            self._t0 = time.perf_counter()

    def write_on_batch_end(self, trainer, pl_module, prediction: dict[str, Any] | list[dict[str, Any]],
                           batch_indices, batch, batch_idx, dataloader_idx) -> None:
        for record in prediction if isinstance(prediction, list) else [prediction]:  # lockstep batches: a list
            policy = record["meta"].get("memory_policy", "window")
            path = feature_path(self.out_dir, record["session"], record["mode"], policy)
            failed = error_path(path)
            if "error" in record:
                self._write_error(failed, record, policy)
                self.errors.append({"session": record["session"], "error": record["error"]})
                continue
            failed.unlink(missing_ok=True)                  # this run succeeded: an earlier failure is resolved
            if path.exists() and not self.overwrite:
                self.skipped.append(path)
                continue
            save_features(path, record["tensors"], record["meta"])
            self.written.append(path)
            if self.plot:
                plot_session_timeline(self.out_dir, record["session"], memory_policy=policy)
            self.kept.append({"session": record["session"], "meta": record["meta"]})   # a long run keeps no states

    @staticmethod
    def _write_error(path: Path, record: dict[str, Any], policy: str) -> None:
        """``<feature file>.error.json`` (atomic): session, mode, memory policy and the message."""
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps({"session": record["session"], "mode": record["mode"],
                                             "memory_policy": policy, "error": record["error"]}, indent=1).encode())

    def on_predict_start(self, trainer, pl_module) -> None:
        self.kept, self.skipped, self.errors = [], [], []
        if self._t0 is None:
            self._t0 = time.perf_counter()

    def on_predict_end(self, trainer, pl_module) -> None:
        """A summary per rank: files written, timeline seconds, the run's wall time (from the predict setup to its
        end: decoding, the model's steps, writing), the seconds since the process started (what the user waited for
        the command, imports and model loading included; :func:`callbacks.process_clock.process_age_s`), the model's
        own per-session step seconds (``wall_time_s`` of the feature files), the cache_replay checks, files kept (``overwrite=False``) and the sessions that
        failed, with their messages."""
        kept, skipped, errors, rank = self.kept, self.skipped, self.errors, trainer.global_rank
        run_s = time.perf_counter() - self._t0 if self._t0 is not None else float("nan")
        self._t0 = None
        if not kept:
            print(f"[rank {rank}] no feature file written to {self.out_dir}"
                  + (f" ({len(skipped)} already there, kept: overwrite=False)" if skipped else ""))
        else:
            rows = sum(int(r["meta"].get("num_rows", 0)) for r in kept)
            wall = sum(float(r["meta"].get("wall_time_s", 0.0)) for r in kept)
            replays = [(r["session"], v["cache_replay"]) for r in kept
                       for v in [r["meta"].get("verification", {})]
                       if isinstance(v, dict) and isinstance(v.get("cache_replay"), dict)]
            failed = [session for session, c in replays if not c["passed"]]
            n_checked = sum(int(c.get("checked_rows", 0)) for _, c in replays)
            asked = getattr(getattr(pl_module, "hparams", None), "verify_rows", None)
            verdict = ("FAILED for " + ", ".join(failed) if failed else f"passed ({n_checked} rows checked)"
                       if n_checked else "not checked (verify_rows = 0)" if asked == 0 else "no row to check")
            age = process_age_s()          # the whole command: imports, model load and set-up count too
            since = f" ({age:.1f} s since the command started)" if age is not None else ""
            print(f"[rank {rank}] wrote {len(kept)} feature file(s) to {self.out_dir} ({rows} rows = "
                  f"{rows / 5:.1f} s of session timeline in {run_s:.1f} s{since}, of which model steps {wall:.1f} s; "
                  f"cache_replay {verdict})"
                  + (f"; {len(skipped)} already there, kept (overwrite=False)" if skipped else ""))
        if errors:
            print(f"[rank {rank}] {len(errors)} session(s) FAILED (see *.error.json in {self.out_dir}; a re-run "
                  "retries them):")
            for r in errors:
                print(f"  {r['session']}: {str(r['error']).splitlines()[0][:300]}")



def plot_session_timeline(out_dir: str | Path, session: str, png: str | Path | None = None,
                          max_rows: int | None = 150, memory_policy: str = "window") -> Path | None:
    """Draw the three modes of one session one above the other (PNG): per 5 Hz row, state updates, payload
    commits, native boundaries and initialization rows. Modes without a file are drawn empty and labelled so.

    Args:
        out_dir: folder holding ``<session>.<mode>.safetensors`` files.
        png: output path (default ``<out_dir>/<session>.timeline.png``; ``<session>.<policy>.timeline.png`` for a
            memory policy other than ``window``).
        memory_policy: which policy's files to draw.
        max_rows: show only the first ``max_rows`` rows (None: all).

    Returns:
        The PNG path, or None when no mode file of the session exists.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    files = {m: feature_path(out_dir, session, m, memory_policy) for m in MODES}
    if not any(p.exists() for p in files.values()):
        return None
    fig, axes = plt.subplots(len(MODES), 1, figsize=(12, 2.2 * len(MODES)), sharex=True, squeeze=False)
    lanes = [("initialization_mask", "init", "0.6"), ("state_update_mask", "state update", "tab:blue"),
             ("payload_commit_mask", "payload commit", "tab:green"), ("native_boundary_mask", "native boundary",
                                                                      "tab:red")]
    for ax, mode in zip(axes[:, 0], MODES):
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([lab for _, lab, _ in lanes])
        ax.set_ylim(-0.6, len(lanes) - 0.4)
        if not files[mode].exists():
            ax.set_title(f"{mode}: no file", fontsize=9)
            continue
        tensors, meta = load_features(files[mode])
        t = tensors["row_times"].numpy()
        n = len(t) if max_rows is None else min(len(t), max_rows)
        for y, (key, _, color) in enumerate(lanes):
            on = tensors[key].numpy()[:n].astype(bool)
            ax.scatter(t[:n][on], [y] * int(on.sum()), marker="|", s=120, color=color)
        ax.set_title(f"{mode}: {meta['production_processor_calls']} processor calls, "
                     f"{meta['production_prepared_media_seconds']:.1f} s prepared, memory {meta['memory_s']:g} s "
                     f"({meta.get('memory_policy', 'window')}), "
                     f"layer {meta['layer']}", fontsize=9)
    axes[-1, 0].set_xlabel("session time t_i (s), right-edged 5 Hz rows")
    fig.suptitle(f"{session}: causal omni feature timeline")
    fig.tight_layout()
    tag = session if memory_policy == "window" else f"{session}.{memory_policy}"
    png = Path(png) if png is not None else out_dir / f"{tag}.timeline.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return png
