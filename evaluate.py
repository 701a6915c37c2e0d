"""Evaluation entry point: ``python evaluate.py predict [--config configs/...yaml]``.

With no ``--config``, ``predict`` runs the embedded default (``configs/predict/demo.yaml``: the tiny random
VideoLLaMA3 built by ``python -m models.videollama3.tiny`` on the bundled real videos). Model and data are given as
``class_path``/``init_args`` (LightningCLI subclass mode), so the same entry runs budgeted QA, layout ablations
and causal omni feature extraction.
"""
from __future__ import annotations

from callbacks.process_clock import mark_interpreter_start

mark_interpreter_start()   # first: timeline_s counts from this interpreter's start, not from a shell that exec'd it

from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning.pytorch.cli import LightningCLI

# Lightning and the CLI are imported inside the functions: a DataLoader worker started with ``spawn`` (the NVDEC
# decoders) re-imports this module as its ``__mp_main__``, and Lightning's import there cost each worker seconds
# before its first decode.
ROOT = Path(__file__).resolve().parent
DEFAULT_PREDICT_CONFIG = ROOT / "configs" / "predict" / "demo.yaml"


def cli_main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """Build (and by default run) the LightningCLI; ``args`` as on the command line (``None``: ``sys.argv``)."""
    from cli import build_cli

    return build_cli(args, run,
                     parser_kwargs={"predict": {"default_config_files": [str(DEFAULT_PREDICT_CONFIG)]}})


def _exit_while_starting(signum, frame) -> None:
    """SIGINT's handler while ``evaluate.py`` imports: the line and status 130 at once. A ``KeyboardInterrupt`` raised
    there can surface inside a C++ extension's callback into Python, where pybind11 aborts the process
    ("terminate called after throwing an instance of 'pybind11::error_already_set'", status -6: seen once in the
    test suite); nothing of the run has been written yet, and the processes started so far (the workers' fork
    server, the MPS daemon's watcher) end with this one."""
    import os
    import sys

    print("interrupted while starting: nothing was run or written", file=sys.stderr, flush=True)
    os._exit(130)


if __name__ == "__main__":
    import signal
    import sys

    default_sigint = signal.signal(signal.SIGINT, _exit_while_starting)
    try:
        from models.mps import start_mps

        try:
            start_mps(sys.argv[1:])     # the run's own MPS daemon, before any process of the run touches CUDA
        except ValueError as e:         # TOKENBUDGET_MPS set to none of auto / 1 / 0
            print(f"evaluate.py: {e}; nothing was run or written", file=sys.stderr)
            raise SystemExit(2) from None
        from datamodules.worker_server import start_early

        start_early(sys.argv[1:])   # the decode workers' fork server imports beside this process's imports
        import torch  # noqa: F401 - first, so that the CUDA context is made beside the imports after it

        from models.device_start import start_cuda_early

        start_cuda_early(sys.argv[1:])
        from models.early_weights import start_weights_early

        start_weights_early(sys.argv[1:], DEFAULT_PREDICT_CONFIG)   # the checkpoint's reads, beside the imports too
        from cli import main
    finally:   # (Ctrl-C until here is _exit_while_starting's; from here on Lightning's and cli.main's)
        signal.signal(signal.SIGINT, default_sigint)

    main(cli_main)
