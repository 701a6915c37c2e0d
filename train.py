"""Training entry point for turn heads on cached causal features: ``python train.py fit|test|validate --config ...``.

    python train.py fit  --config configs/fit/turn_head.yaml
    python train.py test --config configs/fit/turn_head.yaml --ckpt_path <run dir>/checkpoints/best.ckpt

Model and data are given as ``class_path``/``init_args`` (LightningCLI subclass mode, like ``evaluate.py``); seeds
default to 0. W&B: ``AutoWandbLogger`` runs offline unless an API key is configured (``WANDB_API_KEY`` or a
``api.wandb.ai`` entry in ``~/.netrc``) or ``offline: false`` is given; a set ``WANDB_MODE`` (``disabled``,
``offline``...) decides instead.
The resolved config is sent to W&B (``WandbConfigCallback``). Sweeps: ``configs/sweeps/*.yaml``
(``turn_head_demo.yaml`` on the synthetic features).

Run folder: ``<logger save_dir>/<project>/<run id>/`` holds ``checkpoints/``, ``metrics.csv`` (Lightning's
``CSVLogger``, always on beside W&B, so ``WANDB_MODE=disabled`` still keeps every logged value) and ``run_info.json``
(W&B id, project, group, name). W&B gets ``define_metric(<monitor>, summary="max"|"min")`` for the checkpoint's
monitored metric (sweeps then rank runs by their best epoch, not their last). ``fit --ckpt_path=<run>/checkpoints/
last.ckpt`` resumes the same W&B run id and run folder, so ModelCheckpoint restores ``best_model_score`` /
``best_model_path`` and ``metrics.csv`` keeps the earlier rows. ``test`` / ``validate`` with a checkpoint of a run
folder log to a new W&B run in the fit's group (``job_type`` test / validate); a fit without ``group`` is its own
group (its run id).
``test`` / ``validate`` need ``--ckpt_path`` (the checkpoint ``fit`` prints; ``RequireCheckpoint``); an unreadable
checkpoint file is named in a one-line error before anything runs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from algorithms.errors import CheckpointError, SettingError

ROOT = Path(__file__).resolve().parent


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


class TrainCLI(LightningCLI):
    """LightningCLI that adds :class:`RunFolderCSVLogger` beside the configured loggers and, for a checkpoint of a
    run folder, resumes (``fit``) or joins (``test`` / ``validate``) that run's W&B id / group."""

    def before_instantiate_classes(self) -> None:
        cfg = self.config.get(self.subcommand) if self.subcommand else None
        if cfg is None:
            return
        info = run_info_of(cfg.get("ckpt_path"))
        logger = cfg.get("trainer", {}).get("logger") if info else None
        if not info or not hasattr(logger, "class_path") or not str(logger.class_path).endswith("WandbLogger"):
            return
        args = logger.init_args
        if self.subcommand == "fit":
            if args.get("version") is None and args.get("id") is None:
                args["version"] = info["id"]
            if args.get("group") is None:
                args["group"] = info.get("group")
        else:
            if args.get("group") is None:
                args["group"] = info.get("group") or info["id"]
            args["job_type"] = self.subcommand
            if args.get("name") is None:
                args["name"] = f"{info.get('name') or info['id']}-{self.subcommand}"

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        if not any(isinstance(lg, CSVLogger) for lg in trainer.loggers):
            follow = trainer.loggers[0] if trainer.loggers else None
            trainer.loggers = [*trainer.loggers, RunFolderCSVLogger(trainer.default_root_dir, follow)]
        return trainer


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


def ckpt_path_arg(args: list[str]) -> str | None:
    """The ``--ckpt_path`` value on the command line ``args`` (``--ckpt_path=X`` or ``--ckpt_path X``), or None."""
    for i, a in enumerate(args):
        if a.startswith("--ckpt_path="):
            return a.split("=", 1)[1]
        if a == "--ckpt_path" and i + 1 < len(args):
            return args[i + 1]
    return None


def check_checkpoint_file(path: str | None) -> None:
    """Fail with a one-line error naming ``path`` when it is a file but not a readable checkpoint archive (Lightning
    checkpoints are zip archives; a truncated copy loses the zip's central directory, which torch reports as
    "PytorchStreamReader failed reading zip archive" without the file). A missing file is left to Lightning.

    Raises:
        CheckpointError: naming the file.
    """
    import zipfile

    if not path or not Path(path).is_file():   # "best" / "last" / a missing file: Lightning's own errors
        return
    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"--ckpt_path={path}: not a readable checkpoint (truncated or not a .ckpt written by "
                              f"train.py fit; {type(e).__name__}: {e})") from e


def cli_main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """Build (and by default run) the LightningCLI; ``args`` as on the command line (``None``: ``sys.argv``).

    Fails closed, one line, on ``--ckpt_path`` that is not a readable checkpoint (:func:`check_checkpoint_file`)
    and on ``validate`` / ``test`` without a checkpoint (:class:`RequireCheckpoint`)."""
    import sys

    from evaluate import build_cli

    check_checkpoint_file(ckpt_path_arg(sys.argv[1:] if args is None else list(args)))
    cli = build_cli(args, run, cli_class=TrainCLI, save_config_callback=WandbConfigCallback,
                    save_config_kwargs={"save_to_log_dir": False, "overwrite": True},
                    trainer_defaults={"callbacks": [RequireCheckpoint(), WandbSummaryMetric(), RunInfo()]})
    ckpt = cli.trainer.checkpoint_callback if run and cli.subcommand == "fit" else None
    if ckpt is not None and ckpt.best_model_path and cli.trainer.is_global_zero:
        print(f"best checkpoint: {ckpt.best_model_path}  (test: python train.py test --config ... "
              f"--ckpt_path={ckpt.best_model_path})", flush=True)
    return cli


if __name__ == "__main__":
    from evaluate import main

    main(cli_main)
