"""The loggers and callbacks of a training run folder (W&B offline by default, CSV beside it, ``run_info.json``).

The W&B logger is offline unless a key is configured; the CSV logger writes into the same run folder; the callbacks
keep ``run_info.json``, the W&B summary metric, the resolved config and the checkpoint requirement of ``validate``
/ ``test``.

Run folder: ``<logger save_dir>/<project>/<run id>/`` holds ``checkpoints/``, ``metrics.csv`` (Lightning's
``CSVLogger``, always on beside W&B, so ``WANDB_MODE=disabled`` still keeps every logged value) and ``run_info.json``
(W&B id, project, group, name); ``train.py`` (through :class:`cli.TrainCLI`) wires them in.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from algorithms.errors import SettingError

def wandb_key_configured() -> bool:
    """True when a W&B API key is available without contacting the network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def new_run_id() -> str:
    """A fresh W&B-style run id (8 lowercase letters / digits), from the OS's randomness (not the seeded RNGs)."""
    import random
    import string

    return "".join(random.SystemRandom().choices(string.ascii_lowercase + string.digits, k=8))


class AutoWandbLogger(WandbLogger):
    """``WandbLogger`` that is offline by default and online when a key is configured.

    Args:
        offline: ``None`` = offline unless :func:`wandb_key_configured` or ``WANDB_MODE`` is set (then wandb
            follows ``WANDB_MODE``, e.g. ``disabled`` writes nothing); ``True``/``False`` force it.
        version: the W&B run id; ``None`` = ``WANDB_RUN_ID`` (set by ``wandb agent``) or a new id, chosen here so
            that the run folder (``save_dir/project/<id>``) is known before the run starts.
        group: W&B group; ``None`` = the run id (so ``train.py test`` runs of its checkpoints join it).
        job_type: W&B job type (``train.py test`` / ``validate`` of a run folder's checkpoint set it).
        Other arguments as ``lightning.pytorch.loggers.WandbLogger``.
    """

    def __init__(self, name: str | None = None, save_dir: str = ".", version: str | None = None,
                 offline: bool | None = None, project: str | None = None, log_model: bool | str = False,
                 group: str | None = None, tags: list[str] | None = None, job_type: str | None = None,
                 **kwargs: Any):
        if offline is None:   # Lightning's offline=True would overwrite WANDB_MODE with "dryrun"
            offline = not (wandb_key_configured() or os.environ.get("WANDB_MODE"))
        if version is None and kwargs.get("id") is None:
            version = os.environ.get("WANDB_RUN_ID") or new_run_id()
        kwargs["group"] = group if group is not None else (version or kwargs.get("id"))
        if job_type is not None:
            kwargs["job_type"] = job_type
        if tags is not None:
            kwargs["tags"] = tags
        super().__init__(name=name, save_dir=save_dir, version=version, offline=offline, project=project,
                         log_model=log_model, **kwargs)
        if self._wandb_init.get("anonymous") is None:   # wandb warns on every run that the setting has no effect
            self._wandb_init.pop("anonymous", None)

    @property
    def experiment(self) -> Any:
        if self._experiment is None and self._save_dir:
            Path(self._save_dir).mkdir(parents=True, exist_ok=True)  # only once a run really starts
        return WandbLogger.experiment.fget(self)


class _KeepingExperimentWriter(ExperimentWriter):
    """Lightning's CSV writer, except that an existing ``metrics.csv`` (a resumed run) is continued, not deleted."""

    def _check_log_dir_exists(self) -> None:
        import csv

        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = list(csv.DictReader(f).fieldnames or [])


class RunFolderCSVLogger(CSVLogger):
    """``CSVLogger`` whose ``metrics.csv`` lands in the run folder of ``follow`` (the trainer's first logger:
    ``save_dir/name/version``, where ModelCheckpoint puts ``checkpoints/``); without ``follow``, Lightning's own
    ``save_dir/lightning_logs/version_<n>``. A resumed run's ``metrics.csv`` is continued."""

    def __init__(self, save_dir: str, follow: Logger | None = None):
        super().__init__(save_dir=save_dir)
        self._follow = follow

    @property
    def log_dir(self) -> str:
        if self._follow is None:
            return super().log_dir
        f = self._follow
        version = f.version if isinstance(f.version, str) else f"version_{f.version}"
        return os.path.join(f.save_dir or self.save_dir, str(f.name), version)

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.log_dir, exist_ok=True)
            self._experiment = _KeepingExperimentWriter(log_dir=self.log_dir)
        return self._experiment


class WandbSummaryMetric(Callback):
    """``define_metric(monitor, summary="max"|"min")`` on every W&B logger for the checkpoint callback's monitored
    metric, so a run's summary (and a sweep's objective) is its best epoch, not its last."""

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        ckpt = trainer.checkpoint_callback
        if ckpt is None or not getattr(ckpt, "monitor", None):
            return
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                lg.experiment.define_metric(ckpt.monitor, summary="max" if ckpt.mode == "max" else "min")


RUN_INFO = "run_info.json"


class RunInfo(Callback):
    """Write ``run_info.json`` (W&B id, project, group, name) beside ``checkpoints/`` at fit start, so that a resume
    or a ``test`` of one of its checkpoints finds the run."""

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        ckpt = trainer.checkpoint_callback
        wb = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if ckpt is None or not ckpt.dirpath or not wb or not trainer.is_global_zero:
            return
        init = wb[0]._wandb_init
        info = {"id": wb[0].version, "project": wb[0].name, "group": init.get("group"), "name": init.get("name")}
        run_dir = Path(ckpt.dirpath).parent
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_INFO).write_text(json.dumps(info, indent=1))


def run_info_of(ckpt_path: str | None) -> dict | None:
    """The ``run_info.json`` of the run folder holding ``ckpt_path`` (``<run>/checkpoints/x.ckpt``), or None."""
    if not ckpt_path or ckpt_path in ("best", "last", "hpc", "registry"):
        return None
    f = Path(ckpt_path).parent.parent / RUN_INFO
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


class WandbConfigCallback(SaveConfigCallback):
    """Send the full resolved CLI config to every W&B logger (nothing written to the log dir)."""

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                lg.experiment.config.update(self.config.as_dict(), allow_val_change=True)


class RequireCheckpoint(Callback):
    """Refuse ``validate`` / ``test`` of a head that was neither loaded from ``--ckpt_path`` nor trained by this
    trainer: it would score the untrained head (checked once the checkpoint would have been restored)."""

    @staticmethod
    def _check(trainer: Trainer) -> None:
        fn = trainer.state.fn.value if trainer.state.fn is not None else ""
        if fn in ("validate", "test") and trainer.ckpt_path is None and trainer.global_step == 0:
            raise SettingError(f"train.py {fn} needs --ckpt_path=<checkpoint> (the 'best checkpoint:' path that "
                               "train.py fit prints); without it the untrained head would be scored")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check(trainer)

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check(trainer)


def run_paths(trainer: Trainer) -> list[Path]:
    """The folders a training run may create: each W&B logger's ``save_dir`` / ``save_dir/project`` / run folder
    ``save_dir/project/<id>`` and ``save_dir/wandb`` (read without starting the W&B run), outermost first."""
    out: list[Path] = []
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger) and lg.save_dir:
            root = Path(lg.save_dir)
            out += [root, root / str(lg.name), root / str(lg.name) / str(lg.version), root / "wandb"]
    return out


def discard_failed_run(trainer: Trainer, created: list[Path]) -> None:
    """After a fit / validate / test that failed before any training step: finish its W&B run, delete its offline
    run files (``wandb/offline-run-*-<id>``) and the folders of ``created`` (folders that did not exist before the
    run, from :func:`run_paths`: all they hold is this run's), so a failed run leaves no run and no run folder. A
    run that trained a step keeps everything (its checkpoints may be resumed)."""
    import shutil

    if trainer.global_step > 0:
        return
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger) and lg._experiment is not None:
            run = lg._experiment
            files = Path(run.dir).parent if getattr(run, "dir", None) else None
            offline = getattr(getattr(run, "settings", None), "mode", None) in ("offline", "dryrun")
            run.finish(exit_code=1)
            lg._experiment = None
            if offline and files is not None and files.name.startswith("offline-run-"):
                shutil.rmtree(files, ignore_errors=True)
    for d in sorted(created, key=lambda q: -len(q.parts)):          # innermost first
        shutil.rmtree(d, ignore_errors=True)                       # made by this run: nothing else is inside
