"""The training console: one line per validation epoch with the monitored score and the best one so far."""
from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from .run_log import note_interrupt


def train_command(args: list[str], ckpt_path: str, subcommand: str | None = None) -> str:
    """The shell-quoted ``python train.py ...`` command line of ``args`` (a run's command-line arguments) with
    ``--ckpt_path`` set to ``ckpt_path`` (any ``--ckpt_path`` given is dropped) and, when ``subcommand`` is given,
    ``fit`` replaced by it."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--ckpt_path":
            skip = True
        elif not a.startswith("--ckpt_path="):
            out.append(a)
    if subcommand is not None and "fit" in out:
        out[out.index("fit")] = subcommand
    return shlex.join(["python", "train.py", *out, f"--ckpt_path={ckpt_path}"])


def last_checkpoint(trainer: Trainer) -> str:
    """The fit's checkpoint of its last finished epoch: a ModelCheckpoint's ``last_model_path`` (``save_last``), else
    the file of a ModelCheckpoint without a monitor (the shipped configs' ``last.ckpt``: its ``best_model_path`` is
    the latest epoch it saved); ``""`` when none was written yet."""
    callbacks = getattr(trainer, "checkpoint_callbacks", None) or [trainer.checkpoint_callback]
    for cb in callbacks:
        if getattr(cb, "last_model_path", ""):
            return cb.last_model_path
    for cb in callbacks:
        if cb is not None and getattr(cb, "monitor", "x") is None and getattr(cb, "best_model_path", ""):
            return cb.best_model_path
    return ""


class EpochScores(Callback):
    """After each fit validation epoch (not the sanity check) print, on rank 0,
    ``epoch 3/49: val/auroc_mean 0.9125 (best 0.9310 at epoch 2)  val/loss 0.4012``.

    The score is the checkpoint callback's ``monitor`` (``mode`` max / min decides "best"; a NaN score is never
    best), so the best epoch printed is the one whose checkpoint ``best.ckpt`` holds. ``best`` / ``best_epoch``
    (epochs counted from 0, as in ``metrics.csv``) are kept in the checkpoint, so a resumed fit continues them.
    Nothing is printed without a monitored checkpoint callback.
    """

    def __init__(self) -> None:
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.monitor: str | None = None

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """A fit stopped by Ctrl-C (or SIGTERM) notes where its last finished epoch is (``last.ckpt``) and the command
        that resumes it (this command with ``--ckpt_path`` at it); ``cli.main`` prints the note."""
        if not isinstance(exception, KeyboardInterrupt) or trainer.state.fn != "fit" or not trainer.is_global_zero:
            return
        last = last_checkpoint(trainer)
        if last and Path(last).is_file():
            note_interrupt(f"the last finished epoch is in {last}; resume it: {train_command(sys.argv[1:], last)}")

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        ckpt = trainer.checkpoint_callback
        if trainer.sanity_checking or trainer.state.fn != "fit" or ckpt is None or not getattr(ckpt, "monitor", None):
            return
        self.monitor = ckpt.monitor
        metrics = trainer.callback_metrics
        if ckpt.monitor not in metrics:
            return
        value = float(metrics[ckpt.monitor])
        better = not math.isnan(value) and (self.best is None or (value > self.best if ckpt.mode == "max"
                                                                  else value < self.best))
        if better:
            self.best, self.best_epoch = value, trainer.current_epoch
        if not trainer.is_global_zero:
            return
        best = "none yet" if self.best is None else f"{self.best:.4f} at epoch {self.best_epoch}"
        line = f"epoch {trainer.current_epoch}/{trainer.max_epochs - 1}: {ckpt.monitor} {value:.4f} (best {best})"
        if "val/loss" in metrics and ckpt.monitor != "val/loss":
            line += f"  val/loss {float(metrics['val/loss']):.4f}"
        bar = trainer.progress_bar_callback
        (bar.print if bar is not None else print)(line)

    def summary(self) -> str | None:
        """``val/auroc_mean 0.9310 at epoch 2`` (the best so far), or None before a scored epoch."""
        if self.best is None:
            return None
        return f"{self.monitor} {self.best:.4f} at epoch {self.best_epoch}"

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "monitor": self.monitor}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.best_epoch = state_dict.get("best"), state_dict.get("best_epoch")
        self.monitor = state_dict.get("monitor")
