"""Evaluation entry point: ``python evaluate.py predict [--config configs/...yaml]``.

With no ``--config``, ``predict`` runs the embedded default (``configs/predict/demo.yaml``: the tiny random
VideoLLaMA3 built by ``python -m models.videollama3.tiny`` on the bundled real videos). Model and data are given as
``class_path``/``init_args`` (LightningCLI subclass mode), so the same entry runs budgeted QA, layout ablations
and causal omni feature extraction.
"""
from __future__ import annotations

from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from cli import build_cli, main

ROOT = Path(__file__).resolve().parent
DEFAULT_PREDICT_CONFIG = ROOT / "configs" / "predict" / "demo.yaml"


def cli_main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """Build (and by default run) the LightningCLI; ``args`` as on the command line (``None``: ``sys.argv``)."""
    return build_cli(args, run,
                     parser_kwargs={"predict": {"default_config_files": [str(DEFAULT_PREDICT_CONFIG)]}})


if __name__ == "__main__":
    main(cli_main)
