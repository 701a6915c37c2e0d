"""The GPU's CUDA context, created beside the CLI's imports (issue 41, first answer).

A predict run's first use of CUDA was the early start of :class:`lightning_modules.budgeted_qa.BudgetedQA` (the
weight load and the kernels' warm-up, begun when the module is built, ~7-8 s after the process start on the H100):
the driver's initialisation and the device's primary context were made there, on the path to the first answer.
:func:`start_cuda_early`, called by ``evaluate.py`` right after torch is imported and before Lightning, the CLI and
transformers are, makes them in a daemon thread while those imports run (the tensor allocation that creates the
context releases the GIL). Nothing else changes: the same device (``LOCAL_RANK``'s, else 0, as the module's early
start and Lightning's DDP ranks pick), the same context, the same numerics. ``TOKENBUDGET_EARLY_CUDA=0`` leaves it
to the module as before.

Only the standard library and torch are imported here.
"""
from __future__ import annotations

import os
import threading
import time

ENV_SWITCH = "TOKENBUDGET_EARLY_CUDA"   # "0": no early context (the module's early start makes it, as before)
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0")

_THREAD: threading.Thread | None = None
_MARKS: dict[str, float | str] = {}


def rank_gpu() -> int:
    """This process's GPU index: ``LOCAL_RANK`` (a DDP rank Lightning launched), else 0 (standard library only)."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def predict_on_nvidia_machine(argv: list[str], switch: str) -> bool:
    """Whether ``argv`` is a ``predict`` run on a machine with an NVIDIA device node and the environment variable
    ``switch`` is not ``0``: when the entry point starts work early (this module's CUDA context; the decode workers'
    fork server, :func:`datamodules.worker_server.start_early`). Standard library only."""
    if not argv or argv[0] != "predict" or os.environ.get(switch, "1") == "0":
        return False
    return any(os.path.exists(n) for n in GPU_NODES)


def start_cuda_early(argv: list[str]) -> threading.Thread | None:
    """Create the CUDA context of this process's device in a daemon thread when ``argv`` is a ``predict`` run on a
    machine with an NVIDIA device node and ``TOKENBUDGET_EARLY_CUDA`` is not ``0``; ``None`` otherwise (and when
    torch finds no CUDA device: nothing is started).

    The device is ``LOCAL_RANK`` (a DDP rank Lightning launched), else 0: the one the run's module picks before the
    trainer says otherwise. A failure in the thread is kept for :func:`early_cuda_marks` and never raised: the
    module's own first CUDA call then reports it as it would have.

    Returns:
        The started thread, or ``None``.
    """
    global _THREAD
    _MARKS.clear()
    if not predict_on_nvidia_machine(argv, ENV_SWITCH):
        return None
    _MARKS["cuda_start"] = time.perf_counter()

    def run() -> None:
        try:
            import torch

            if not torch.cuda.is_available():
                _MARKS["cuda_failed"] = "no CUDA device"
                return
            device = torch.device("cuda", rank_gpu())
            torch.cuda.set_device(device)
            torch.empty(1, device=device)   # the primary context, made here (the allocation releases the GIL)
            torch.cuda.synchronize(device)
            _MARKS["cuda_ready"] = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - the run's own first CUDA call reports it
            _MARKS["cuda_failed"] = f"{type(e).__name__}: {e}"

    _THREAD = threading.Thread(target=run, name="cuda-start", daemon=True)
    _THREAD.start()
    return _THREAD


def early_cuda_marks() -> dict[str, float]:
    """``cuda_start`` / ``cuda_ready`` of :func:`start_cuda_early` as ``time.perf_counter()`` values (the caller puts
    them on its timeline) once its thread has ended; ``{}`` when it was not started, is still running or failed
    (``cuda_failed`` is left out: a timeline holds times only)."""
    if _THREAD is None or _THREAD.is_alive() or "cuda_ready" not in _MARKS:
        return {}
    return {k: v for k, v in _MARKS.items() if k in ("cuda_start", "cuda_ready")}
