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

from callbacks.process_clock import mark_interpreter_start

mark_interpreter_start()   # first: timing counts from this interpreter's start, not from a shell that exec'd it

import sys  # noqa: E402

from lightning.pytorch.cli import LightningCLI  # noqa: E402

from callbacks.run_folder import RequireCheckpoint, RunInfo, WandbConfigCallback, WandbSummaryMetric
from callbacks.train_console import EpochScores, train_command
from cli import TrainCLI, build_cli, check_checkpoint_file, ckpt_path_arg, main


def cli_main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """Build (and by default run) the LightningCLI; ``args`` as on the command line (``None``: ``sys.argv``).

    Fails closed, one line, on ``--ckpt_path`` that is not a readable checkpoint (:func:`check_checkpoint_file`)
    and on ``validate`` / ``test`` without a checkpoint (:class:`RequireCheckpoint`)."""
    argv = sys.argv[1:] if args is None else list(args)
    check_checkpoint_file(ckpt_path_arg(argv))
    cli = build_cli(args, run, cli_class=TrainCLI, save_config_callback=WandbConfigCallback,
                    save_config_kwargs={"save_to_log_dir": False, "overwrite": True},
                    trainer_defaults={"callbacks": [RequireCheckpoint(), WandbSummaryMetric(), RunInfo(),
                                                    EpochScores()]})
    ckpt = cli.trainer.checkpoint_callback if run and cli.subcommand == "fit" else None
    if ckpt is not None and ckpt.best_model_path and cli.trainer.is_global_zero:
        scores = next((c for c in cli.trainer.callbacks if isinstance(c, EpochScores)), None)
        best = scores.summary() if scores is not None else None
        print(f"best checkpoint{f' ({best})' if best else ''}: {ckpt.best_model_path}\n"
              f"test it: {command_for_test(argv, ckpt.best_model_path)}", flush=True)
    return cli


def command_for_test(fit_args: list[str], ckpt_path: str) -> str:
    """The ``python train.py test ...`` command line of a fit's arguments: the same configs and options, ``fit``
    replaced by ``test`` and ``--ckpt_path`` set to ``ckpt_path`` (shell-quoted)."""
    return train_command(fit_args, ckpt_path, "test")


if __name__ == "__main__":
    main(cli_main)
