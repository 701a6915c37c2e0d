"""A CUDA MPS control daemon of the run's own, so that the decode workers' NVDEC contexts and the step's context share
the GPU as one (on by default where the control program is; ``TOKENBUDGET_MPS=0`` turns it off).

Why: without MPS, work of different CUDA contexts never runs at the same time on a GPU; the GPU switches between
them. Each NVDEC worker is a context of its own, and NVDEC runs a small CUDA kernel in it for every frame it hands
out (``cuvidMapVideoFrame``'s block-linear to pitch-linear copy), thousands a second across a pool of 16 workers,
so the step's kernels are switched out for them again and again. Under MPS the clients' work goes through one
server context and runs beside the step's. Nothing changes what a kernel computes: the same records.
Measured on the H100, whole workload-shaped set (``bench/device_s17_call{1,2,3}.sh``): a step beside the decoding
pool ran its kernels x1.24 slower than alone without MPS, x1.00 under it; steady step per video 2.14-2.17 s (4 runs)
against 2.50-2.59 s (4 runs); records identical (36 of 36). Two runs at once, each with a daemon of its own, share
the GPU, and a device-side assert in one client leaves another running (``bench/mps_probe.py``).

:func:`start_mps` (called by ``evaluate.py`` first thing, before any process of the run touches CUDA) starts
``nvidia-cuda-mps-control -d`` with a pipe and log folder of its own in the system's temporary folder, and points
this process at it (``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``), so the decode workers and any DDP
ranks Lightning launches (which inherit the environment) are its clients; other programs on the machine are not.
When the run's process has ended (its exit, Ctrl-C, or killed outright) the daemon is told to quit and its folder
removed, by a detached shell watching it (:func:`watch_and_stop`).

``TOKENBUDGET_MPS``: unset or ``auto`` (default): started where ``nvidia-cuda-mps-control`` is on ``PATH`` (nothing
said where it is not); ``1``: the same, and a missing program is one line; ``0``: never. Not started either where
the daemon fails (one line says why; the run goes on without MPS, e.g. the GPU is in an exclusive compute mode held
by another process) or the process is already an MPS client (``CUDA_MPS_PIPE_DIRECTORY`` set: a DDP rank of a run
that started one, or the user's own daemon). Standard library only.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from models.device_start import predict_on_nvidia_machine

ENV_SWITCH = "TOKENBUDGET_MPS"   # "auto" (default) / "1": the run starts an MPS control daemon of its own; "0": not
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
CONTROL = "nvidia-cuda-mps-control"
START_TIMEOUT_S = 15.0
POLL_S = 1.0       # the watcher's look at the run's process: the daemon quits at most this long after the run


def start_mps(argv: list[str], control: str | None = None) -> str | None:
    """Start the run's MPS control daemon when ``argv`` is a ``predict`` run on a machine with an NVIDIA device node
    and ``TOKENBUDGET_MPS`` is not ``0`` (see the module docstring); call before anything in the process uses CUDA.

    Args:
        argv: the command line after the program.
        control: the control program (default: ``nvidia-cuda-mps-control`` found on ``PATH``).

    Returns:
        The daemon's pipe folder (now this process's ``CUDA_MPS_PIPE_DIRECTORY``), or ``None`` where no daemon was
        started (the reason printed on stderr, except for a missing program under ``auto``). Never raises for a
        daemon that cannot start.

    Raises:
        ValueError: ``TOKENBUDGET_MPS`` is none of ``auto``, ``1``, ``0``.
    """
    mode = os.environ.get(ENV_SWITCH, "auto").strip().lower() or "auto"
    if mode not in ("auto", "1", "0"):
        raise ValueError(f"{ENV_SWITCH}={os.environ[ENV_SWITCH]!r}: auto (default), 1 or 0")
    if mode == "0" or not predict_on_nvidia_machine(argv, ENV_SWITCH):
        return None
    if os.environ.get(PIPE_ENV):
        return None    # already a client of a daemon (this run's, in a DDP rank, or the user's own)
    exe = control or shutil.which(CONTROL)
    if exe is None:
        if mode == "1":
            print(f"{ENV_SWITCH}=1: no {CONTROL} on PATH; running without MPS", file=sys.stderr)
        return None
    folder = tempfile.mkdtemp(prefix="tokenbudget-mps-")
    env = {**os.environ, PIPE_ENV: folder, LOG_ENV: folder}
    try:
        done = subprocess.run([exe, "-d"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=START_TIMEOUT_S)
        ok = done.returncode == 0
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] if not ok else []
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, [f"{type(e).__name__}: {e}"]
    if not ok:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"{ENV_SWITCH}={mode}: {CONTROL} -d did not start ({'; '.join(why) or 'no message'}); "
              "running without MPS", file=sys.stderr)
        return None
    os.environ[PIPE_ENV], os.environ[LOG_ENV] = folder, folder
    watch_and_stop(exe, folder, os.getpid())
    return folder


def watch_and_stop(exe: str, folder: str, pid: int, poll_s: float = POLL_S) -> subprocess.Popen | None:
    """A detached ``sh`` that waits for process ``pid`` to end (``kill -0`` every ``poll_s`` s), then tells the
    daemon of ``folder`` to quit and removes the folder.

    So the daemon ends with the run however the run ends: at its exit, on Ctrl-C, and also killed outright (out of
    memory, a scheduler's ``SIGKILL``), where an exit handler never runs and the daemon's server would otherwise keep
    its GPU context until the machine restarts. In a session of its own: a Ctrl-C to the run's terminal does not
    reach it.

    Measured on the H100 (session 17): with ``quit`` sent and waited for in the run's exit handler (at most 15 s),
    runs under MPS exited 14-15 s later than without (call 3, ``predict_end`` to the exit 29 s against 14-15 s);
    handed to a detached shell, the next run exited 15.2 s after ``predict_end`` (call 4). Sent by another process
    while a client lived, ``quit`` returned at once (``bench/mps_probe.py``): what held it in the exit handler, the
    run's own process being a client, is inferred, not seen; the delay matched the timeout.

    Returns:
        The watcher (tests wait on it), or ``None`` where it could not be started (the daemon then ends with the
        machine or by hand: ``echo quit | CUDA_MPS_PIPE_DIRECTORY=<folder> nvidia-cuda-mps-control``).
    """
    script = f'while kill -0 {int(pid)} 2>/dev/null; do sleep {poll_s:g}; done; echo quit | "$0"; rm -rf -- "$1"'
    try:
        return subprocess.Popen(["sh", "-c", script, exe, folder],
                                env={**os.environ, PIPE_ENV: folder, LOG_ENV: folder}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None
