"""Step 2 of a decode: which native frames to read and at what size, and how many decoder threads.

:func:`plan_decode` makes seed 001's frame choice from a :class:`~datamodules.decode.probe.VideoProbe` exactly as
FFmpeg's ``fps=fps:round=down`` does (:func:`algorithms.budget.fps_filter_frames`, checked index by index against
imageio-ffmpeg's binary in ``tests/datamodules/test_frame_identity.py``) and the decode size
(:func:`decode_frame_size`): native size while the seed's estimate ``n_est * h * w * 3`` stays within
``native_decode_bytes`` (2e9 bytes, seed 001's ``NATIVE_DECODE_BYTES``), larger videos at a reduced size *inside the
decoder* (decord's ``width``/``height``), at most ``decode_max_side`` pixels on the long side (default 896 = 32
merged cells), so host memory stays bounded (an hour of 1080p at B = 16384 is 2048 frames: 12.7 GB native, 2.8 GB
reduced). :func:`auto_decode_threads` and :func:`auto_num_workers` size the decoders of a host (:func:`host_share`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from algorithms.budget import max_frames, sample_frames
from datamodules.decode.errors import DecodeError
from datamodules.decode.probe import VideoProbe


NATIVE_DECODE_BYTES = 2e9  # seed 001: "decode at native size (processor resizes, as in training) below this"


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup"), own: Path = Path("/proc/self/cgroup")) -> int | None:
    """The CPUs this process's cgroup may use by its CPU quota, rounded up: cgroup v2's ``cpu.max`` of the process's
    own cgroup (``/proc/self/cgroup``'s ``0::`` path) and of each parent, the smallest; else v1's
    ``cpu.cfs_quota_us / cpu.cfs_period_us``. ``None`` where there is no quota or none can be read (a container's
    ``--cpus``, a Kubernetes CPU limit or a ``systemd-run -p CPUQuota=`` shows here, not in the affinity mask).
    ``root`` / ``own``: the cgroup mount and this process's cgroup file (for tests)."""
    import math

    def ratio(quota: str, period: str) -> int | None:
        q, p = (None if quota == "max" else int(quota)), int(period)
        return None if q is None or q <= 0 or p <= 0 else max(1, math.ceil(q / p))

    limits = []
    try:
        rel = next((ln[3:].strip() for ln in own.read_text().splitlines() if ln.startswith("0::")), "/")
    except OSError:
        rel = "/"
    d = root / rel.lstrip("/")
    for folder in [d, *d.parents]:
        if not folder.is_relative_to(root):
            break
        try:
            limit = ratio(*(folder / "cpu.max").read_text().split()[:2])
        except (OSError, ValueError, TypeError):
            continue
        if limit is not None:
            limits.append(limit)
    if limits:
        return min(limits)
    try:
        return ratio((root / "cpu" / "cpu.cfs_quota_us").read_text().strip(),
                     (root / "cpu" / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return None


def host_share(local_processes: int) -> tuple[int, int]:
    """``(CPUs, processes sharing them)`` for sizing this host's decoders: the CPUs are this process's affinity
    mask, capped by its cgroup quota (:func:`cgroup_cpus`), shared by ``local_processes``, except where SLURM bound
    each task to its own CPUs: ``SLURM_LOCALID`` set by ``srun``, not a job Lightning treats as interactive (named
    ``bash`` / ``interactive``), a binding that is not ``none``, and masks that fit the host side by side (mask x
    processes <= the host's CPUs). A container's ``--cpuset-cpus``, ``torchrun`` inside one SLURM task, or
    ``--cpu-bind=none`` give every rank the same mask, which is then shared."""
    host = os.cpu_count() or 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else host
    quota = cgroup_cpus()
    procs = max(local_processes, 1)
    pinned = (cpus < host and "SLURM_LOCALID" in os.environ
              and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")
              and not os.environ.get("SLURM_CPU_BIND_TYPE", "").startswith("none")
              and cpus * procs <= host)
    return (min(cpus, quota) if quota else cpus), (1 if pinned else procs)


def auto_decode_threads(workers: int, local_processes: int = 1, cpus: int | None = None, cap: int = 2) -> int:
    """Decoder threads per video so that all decoders of a host share its CPUs without oversubscribing.

    decord decodes every frame up to the last sampled one (1 fps sampling of an H.264 stream with long GOPs is
    close to a full decode), so one decoder thread is the DataLoader's bottleneck on long videos; FFmpeg's frame
    threading is bit-exact, so more threads change only the speed.

    Args:
        workers: DataLoader workers per process (0 = decoding in the main process, counted as 1).
        local_processes: processes of this host (DDP ranks), each with ``workers`` decoders.
        cpus: CPUs to share (default: :func:`host_share`: the affinity mask capped by the cgroup quota; a rank
            SLURM bound to its own CPUs keeps its mask and ``local_processes`` is ignored).
        cap: most threads per decoder (default 2: decord's threaded decoder fails on some streams above 2,
            dmlc/decord#246 and #314; :func:`decode_video` retries those with one thread).

    Returns:
        ``clip(cpus // (max(workers, 1) * local_processes), 1, cap)``.
    """
    if cpus is None:
        cpus, local_processes = host_share(local_processes)
    return int(min(max(cpus // (max(workers, 1) * max(local_processes, 1)), 1), cap))


def auto_num_workers(local_processes: int = 1, cpus: int | None = None, cap: int = 16) -> int:
    """Decode workers per process when ``data.num_workers`` is ``null``: this host's CPUs shared among its
    processes, at least 2, at most ``cap``.

    Why 16 on a 16-core one-GPU host: the NVDEC workers spend much of each video off the engines (demuxing, packet
    filtering, set-up), so 8 workers left the engines idle half the time while every worker was busy; on 3 copies of
    the workload set (H100, 2026-12-06) 16 workers took the GPU's wait after the first video from 19.5-26.9 % (8) to
    10.6 % (``bench/results/s7call2_cli_workers_h100_2026-12-06.txt``), CPU 57 % busy.

    Args:
        local_processes: processes of this host (DDP ranks), each with its own workers.
        cpus: CPUs to share (default: :func:`host_share`, as in :func:`auto_decode_threads`).
        cap: most workers per process (at least 2).

    Returns:
        ``clip(cpus // local_processes, 2, max(cap, 2))``.
    """
    if cpus is None:
        cpus, local_processes = host_share(local_processes)
    return int(min(max(cpus // max(local_processes, 1), 2), max(cap, 2)))


def decode_size(height: int, width: int, max_side: int) -> tuple[int, int]:
    """Decode size keeping the aspect ratio with the long side ``<= max_side`` (even sizes; unchanged if smaller)."""
    scale = min(1.0, max_side / max(height, width))
    if scale >= 1.0:
        return height, width
    return max(2, 2 * round(height * scale / 2)), max(2, 2 * round(width * scale / 2))


def decode_frame_size(height: int, width: int, n_est: int, native_decode_bytes: float = 2e9,
                      max_side: int = 896) -> tuple[int, int]:
    """Decode size of seed 001's ``decode_video``: ``if n_est * h * w * 3 <= NATIVE_DECODE_BYTES: dw, dh = w, h``,
    else ``bd.frame_size(h, w, tok)`` (not in the seed: the long side at most ``max_side``, :func:`decode_size`).

    Args:
        n_est: the seed's frame estimate, ``min(int(duration * fps) + 1, max_frames)``.

    Returns:
        ``(height, width)`` to decode at.
    """
    if n_est * height * width * 3 <= native_decode_bytes:
        return height, width
    return decode_size(height, width, max_side)


class DecodePlan(NamedTuple):
    """Which native frames a decode reads and at what size (:func:`plan_decode`).

    Attributes:
        idx: native indices (presentation order) of the T returned frames, non-decreasing (the fps filter repeats
            the last frame when the stream ends before the grid does).
        unique: ``sorted(set(idx))``, the frames a reader decodes.
        times_s: T labels, seed 001's ``ts = start + arange(N) / fps`` (thinned like the frames).
        sample_fps: the fps filter's rate (the float of :func:`algorithms.budget.sample_rate`).
        decode_hw: ``(dh, dw)``.
    """

    idx: list[int]
    unique: list[int]
    times_s: list[float]
    sample_fps: float
    decode_hw: tuple[int, int]


def plan_decode(path: Path, probe: VideoProbe, budget_tokens: int, base_fps: float = 1.0,
                native_decode_bytes: float = NATIVE_DECODE_BYTES, decode_max_side: int = 896,
                short_clip_first_frame: bool = False) -> DecodePlan:
    """Seed 001's frame choice and decode size on a probe (:func:`algorithms.budget.sample_frames`,
    :func:`decode_frame_size`).

    Args:
        path: the video (named in the error only).
        probe: its :func:`~datamodules.decode.probe.probe_video`.
        budget_tokens: the run's largest budget (vision tokens; sets the frame cap,
            :func:`algorithms.budget.max_frames`).
        base_fps: the sampling rate before the cap (frames/s; seed 001's ``bd.FPS`` = 1).
        native_decode_bytes, decode_max_side: the decode size rule (:func:`decode_frame_size`).
        short_clip_first_frame: a clip shorter than one sampling step keeps its frame 0 at ``start_s``.

    Returns:
        :class:`DecodePlan`.

    Raises:
        DecodeError: no frame at the sampling rate (the clip ends before the first step; seed 001's
            ``assert T > 0``) unless ``short_clip_first_frame``.
    """
    sample_fps, idx, times = sample_frames(probe.pts, probe.time_base, probe.end_pts, probe.duration_s,
                                           budget_tokens, probe.start_s, base_fps, segments=probe.segments)
    if not idx:
        if not short_clip_first_frame:
            # the clip's span on its own timeline (a stream may start at 10,000 s), and the container's duration
            # when that is not the span's length (Matroska gives its end time: the rate comes from it, as the seed's)
            a = probe.start_s + float(probe.pts[0] * probe.time_base) if probe.pts else probe.start_s
            b = probe.start_s + float(probe.end_pts * probe.time_base)
            said = "" if abs(probe.duration_s - (b - a)) <= 0.5 else \
                f"; the container gives its duration as {probe.duration_s:.3f} s, which sets the rate"
            raise DecodeError(f"{path}: no frame at {sample_fps:g} fps: the clip ({a:.3f}-{b:.3f} s, {b - a:.3f} s "
                              f"long{said}) ends before the first sampling step (set data.short_clip_first_frame to "
                              "keep its first frame)")
        idx, times = [0], [probe.start_s]
    n_est = min(int(probe.duration_s * sample_fps) + 1, max_frames(budget_tokens))
    dh, dw = decode_frame_size(probe.height, probe.width, n_est, native_decode_bytes, decode_max_side)
    return DecodePlan(idx, sorted(set(idx)), times, sample_fps, (dh, dw))
