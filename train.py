"""Training entry point for turn heads on cached causal features: ``python train.py fit|test|validate --config ...``.

    python train.py fit  --config configs/fit/turn_head.yaml
    python train.py test --config configs/fit/turn_head.yaml --ckpt_path <run dir>/checkpoints/best.ckpt

Model and data are given as ``class_path``/``init_args`` (LightningCLI subclass mode, like ``evaluate.py``); seeds
default to 0. W&B: ``AutoWandbLogger`` runs offline unless an API key is configured (``WANDB_API_KEY`` or a
``api.wandb.ai`` entry in ``~/.netrc``) or ``offline: false`` is given; a set ``WANDB_MODE`` (``disabled``,
``offline``...) decides instead.
The resolved config is sent to W&B (``WandbConfigCallback``). Sweeps: ``configs/sweeps/*.yaml``.
``test`` / ``validate`` need ``--ckpt_path`` (the checkpoint ``fit`` prints; ``RequireCheckpoint``); an unreadable
checkpoint file is named in a one-line error before anything runs.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger

from algorithms.errors import CheckpointError, SettingError

ROOT = Path(__file__).resolve().parent


def wandb_key_configured() -> bool:
    """True when a W&B API key is available without contacting the network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


class AutoWandbLogger(WandbLogger):
    """``WandbLogger`` that is offline by default and online when a key is configured.

    Args:
        offline: ``None`` = offline unless :func:`wandb_key_configured` or ``WANDB_MODE`` is set (then wandb
            follows ``WANDB_MODE``, e.g. ``disabled`` writes nothing); ``True``/``False`` force it.
        Other arguments as ``lightning.pytorch.loggers.WandbLogger``.
    """

    def __init__(self, name: str | None = None, save_dir: str = ".", version: str | None = None,
                 offline: bool | None = None, project: str | None = None, log_model: bool | str = False,
                 group: str | None = None, tags: list[str] | None = None, **kwargs: Any):
        if offline is None:   # Lightning's offline=True would overwrite WANDB_MODE with "dryrun"
            offline = not (wandb_key_configured() or os.environ.get("WANDB_MODE"))
        if group is not None:
            kwargs["group"] = group
        if tags is not None:
            kwargs["tags"] = tags
        super().__init__(name=name, save_dir=save_dir, version=version, offline=offline, project=project,
                         log_model=log_model, **kwargs)

    @property
    def experiment(self) -> Any:
        if self._experiment is None and self._save_dir:
            Path(self._save_dir).mkdir(parents=True, exist_ok=True)  # only once a run really starts
        return WandbLogger.experiment.fget(self)


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
    cli = build_cli(args, run, save_config_callback=WandbConfigCallback,
                    save_config_kwargs={"save_to_log_dir": False, "overwrite": True},
                    trainer_defaults={"callbacks": [RequireCheckpoint()]})
    ckpt = cli.trainer.checkpoint_callback if run and cli.subcommand == "fit" else None
    if ckpt is not None and ckpt.best_model_path and cli.trainer.is_global_zero:
        print(f"best checkpoint: {ckpt.best_model_path}  (test: python train.py test --config ... "
              f"--ckpt_path={ckpt.best_model_path})", flush=True)
    return cli


if __name__ == "__main__":
    from evaluate import main

    main(cli_main)
