"""The decode workers' fork server, started at the interpreter's start (issue 41, first answer).

On a CUDA machine the DataLoader workers are forked from a ``forkserver`` (one clean process, no CUDA
context, that imports :data:`WORKER_PRELOAD` once: :func:`datamodules.videoqa.decode_worker_context`). Started at the
data module's set-up, that server imported its modules while the main process loaded the weights, and was ready
only ~9 s later on the H200 (2026-12-04: set-up at 12.7 s, first worker at 22.0 s, so the first video reached the
step 2.8 s after the weights). :func:`start_early`, called by ``evaluate.py`` before it imports anything heavy,
starts the same server beside the main process's own imports, where a predict run on a machine with an NVIDIA
device may use one. This module imports nothing but the standard library (and :mod:`models.device_start`, which
imports no more).
"""
from __future__ import annotations

# what a decode worker started by the fork server finds imported (in this order: PyNvVideoCodec before decord)
WORKER_PRELOAD = ("datamodules.decode.nvdec", "datamodules.video_items")
# the video processor's module, which the pickled dataset holds (VideoLLaMA3's)
VL3_PROCESSOR_MODULE = "transformers.models.video_llama_3.video_processing_video_llama_3"
ENV_SWITCH = "TOKENBUDGET_EARLY_WORKER_SERVER"   # "0": start the server at the data module's set-up instead


def start_early(argv: list[str]) -> bool:
    """Start the workers' fork server now when ``argv`` is a ``predict`` run on a machine with an NVIDIA device node
    and ``TOKENBUDGET_EARLY_WORKER_SERVER`` is not ``0``. A run without workers (or without a CUDA device after all)
    leaves the server idle; one that uses it (every decoder, ``cpu`` included, on CUDA) finds it ready.

    Returns:
        whether the server was started here.
    """
    from models.device_start import predict_on_nvidia_machine   # (standard library only)

    if not predict_on_nvidia_machine(argv, ENV_SWITCH):
        return False
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload([*WORKER_PRELOAD, VL3_PROCESSOR_MODULE])
    forkserver.ensure_running()
    global _STARTED_EARLY
    _STARTED_EARLY = True
    return True


_STARTED_EARLY = False


def started_early() -> bool:
    """Whether :func:`start_early` started this process's fork server (its preload list is then fixed: a later
    ``set_forkserver_preload`` does not reach a running server)."""
    return _STARTED_EARLY
