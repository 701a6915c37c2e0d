"""Evaluation entry point: ``python evaluate.py predict [--config configs/...yaml]``.

With no ``--config``, ``predict`` runs the embedded default (``configs/predict/demo.yaml``: the tiny random
VideoLLaMA3 built by ``python -m models.tiny`` on the bundled real videos). Model and data are given as
``class_path``/``init_args`` (LightningCLI subclass mode), so the same entry runs budgeted QA, layout ablations
and causal omni feature extraction.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

# records are keyed by the benchmark's qid, never by batch index, so Lightning's batch-index inference is not needed
warnings.filterwarnings("ignore", message="Couldn't infer the batch indices")
warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)")

ROOT = Path(__file__).resolve().parent
DEFAULT_PREDICT_CONFIG = ROOT / "configs" / "predict" / "demo.yaml"


def cli_main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """Build (and by default run) the LightningCLI; ``args`` as on the command line (``None``: ``sys.argv``)."""
    return LightningCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args,
        run=run,
        save_config_callback=None,
        seed_everything_default=0,
        parser_kwargs={"predict": {"default_config_files": [str(DEFAULT_PREDICT_CONFIG)]}},
    )


if __name__ == "__main__":
    cli_main()
