"""A long video decoded in parts and joined (``data.decode_part_mb``): the join is the whole decode.

The reference is the whole decode (``decode_video`` without ``part``) on the same file: frames, labels and
``video_info`` must be equal, on the CPU readers, held at the encoder's sizes or not, for part counts that do and do
not divide the planned frames, and with more parts than frames.
"""
from __future__ import annotations

import pytest
import torch

from datamodules.decode import EncoderFrames, EncoderSizing, decode_video
from datamodules.decode.parts import (INFO_ORDER, PartMismatch, join_frames, join_info, part_bounds, part_grids,
                                      plan_part)
from datamodules.decode.plan import DecodePlan
from datamodules.part_join import JoiningLoader, PartSampler, decode_parts, join_items, max_parts
from tests.media_factory import make_testsrc_clip


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """30 s of testsrc2 at 4 fps (120 native frames), 320x180, GOP 8."""
    return make_testsrc_clip(tmp_path_factory.mktemp("parts") / "clip.mp4", 30, 4, 320, 180)


# ------------------------------------------------------------------ hand-computed pieces
def test_part_bounds_tile_the_plan():
    # 10 frames in 3 parts: 0-3, 3-6, 6-10 (lo = k T // K); 2 frames in 4 parts: two empty parts
    assert [part_bounds(10, k, 3) for k in range(3)] == [(0, 3), (3, 6), (6, 10)]
    assert [part_bounds(2, k, 4) for k in range(4)] == [(0, 0), (0, 1), (1, 1), (1, 2)]
    for bad in ((0, 0), (3, 3), (-1, 2)):
        with pytest.raises(ValueError, match="part"):
            part_bounds(10, *bad)


def test_plan_part_and_part_grids():
    # repeated native indices (the fps filter's repeat): a part's unique frames are its own
    plan = DecodePlan([0, 0, 3, 5, 5, 9], [0, 3, 5, 9], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 1.0, (18, 32))
    p = plan_part(plan, 1, 4)
    assert (p.idx, p.unique, p.times_s, p.decode_hw) == ([0, 3, 5], [0, 3, 5], [1.0, 2.0, 3.0], (18, 32))
    grids = {(6, 10): ([0, 2, 4, 5], 64), (3, 5): ([1], 16)}
    assert part_grids(grids, 2, 6) == {(6, 10): ([0, 2, 3], 64)}     # (3, 5) has no position in 2..5: left out
    assert part_grids(grids, 0, 2) == {(6, 10): ([0], 64), (3, 5): ([1], 16)}


def test_join_info_shifts_positions_and_names_the_odd_reader():
    base = {"duration_s": 30.0, "native_hw": [180, 320], "decode_hw": [180, 320], "n_frames": 9, "fps": 4.0,
            "sample_fps": 1.0, "fps_ok": True, "vfr": False}
    a = {**base, "decoder": "nvdec", "concealment_checked": False}
    b = {**base, "decoder": "pyav_skip", "decoder_fallback": "nvdec: counts differ"}
    c = {**base, "decoder": "nvdec", "frames_concealed": [1], "concealment_checked": False}
    out = join_info([a, b, c], [0, 3, 6])
    assert out == {**base, "decoder": "pyav_skip", "decoder_fallback": "nvdec: counts differ",
                   "frames_concealed": [7], "concealment_checked": False}
    assert list(out) == [k for k in INFO_ORDER if k in out]
    assert join_info([a, a], [0, 4]) == a
    with pytest.raises(PartMismatch, match="part 1 planned other n_frames"):
        join_info([a, {**a, "n_frames": 10}], [0, 4])
    # damaged frames read on the CPU: a repeat of "the last frame given" may reach into the part before
    with pytest.raises(PartMismatch, match="part 1, read by pyav_skip, lists frames_concealed"):
        join_info([a, {**b, "frames_concealed": [0]}], [0, 4])


def test_join_frames_keeps_pinned_memory_and_checks_counts(monkeypatch):
    x, y = torch.arange(2 * 12, dtype=torch.uint8).view(2, 2, 2, 3), torch.ones(3, 2, 2, 3, dtype=torch.uint8)
    assert torch.equal(join_frames([x, y], [0, 2], 5), torch.cat([x, y]))
    with pytest.raises(PartMismatch, match="5 frames, the plan 6"):
        join_frames([x, y], [0, 2], 6)
    pins = []
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: pins.append(kw.get("pin_memory")) or
                        real_empty(*a, **{**kw, "pin_memory": False}))
    join_frames([x, y], [0, 2], 5)
    assert pins == [True]       # pinned parts are joined into page-locked memory
    # held frames: each grid's frames and positions in part order, shifted by the part's first position
    e1 = EncoderFrames((2, 8, 8, 3), {(1, 1): (x, [0, 1])})
    e2 = EncoderFrames((3, 8, 8, 3), {(1, 1): (y[:1], [2]), (2, 2): (y[1:], [0, 1])})
    j = join_frames([e1, e2], [0, 2], 5)
    assert j.shape == torch.Size((5, 8, 8, 3)) and j.held[(1, 1)][1] == [0, 1, 4] and j.held[(2, 2)][1] == [2, 3]
    assert torch.equal(j.held[(1, 1)][0], torch.cat([x, y[:1]]))
    with pytest.raises(PartMismatch, match="mix"):
        join_frames([e1, y], [0, 2], 5)


def test_decode_parts_by_file_size(tmp_path):
    big, small = tmp_path / "big.mp4", tmp_path / "small.mp4"
    big.write_bytes(b"\0" * 2_500_000)
    small.write_bytes(b"\0" * 100)
    # 2.5 MB at 1 MB a part: 3 parts; capped at 2 workers; a missing file: 1; off: 1 each
    assert decode_parts([str(big), str(small), str(tmp_path / "gone.mp4")], 1.0, 8) == [3, 1, 1]
    assert decode_parts([str(big)], 1.0, 2) == [2]
    assert decode_parts([str(big)], None, 8) == decode_parts([str(big)], 0, 8) == [1]
    # at most half the workers, at least 2: the other half decodes the videos around a long one
    assert [max_parts(w) for w in (2, 3, 8, 16)] == [2, 2, 4, 8]


def test_parts_take_only_spare_workers():
    """Extra parts (k - 1 each) add up to at most workers - videos, the videos asking for most parts served first
    (ties by position), each up to what it asks; none where the videos fill the workers."""
    from datamodules.part_join import within_spare_workers

    assert within_spare_workers([4, 1, 3], 8) == [4, 1, 3]      # 5 spare, 5 asked
    assert within_spare_workers([4, 1, 3], 6) == [4, 1, 1]      # 3 spare: the 4-part video's 3 extra
    assert within_spare_workers([3, 1, 4], 7) == [2, 1, 4]      # 4 spare: 3 to the 4-part video, 1 left for the 3
    assert within_spare_workers([2, 2, 2], 5) == [2, 2, 1]      # 2 spare: ties by position
    assert within_spare_workers([4, 4] + [1] * 14, 16) == [1] * 16   # 16 videos, 16 workers (call 2's set): none
    assert within_spare_workers([8, 3, 2, 1, 1, 1], 16) == [8, 3, 2, 1, 1, 1]   # the 6-video set, 16 workers
    assert within_spare_workers([], 4) == []


def test_auto_num_workers_shares_the_host():
    """``data.num_workers: null``: CPUs // local processes, at least 2, at most 16; a process pinned to fewer CPUs
    than the host keeps its own share (its mask is per rank already)."""
    from datamodules.decode import auto_num_workers

    assert auto_num_workers(1, cpus=16) == 16
    assert auto_num_workers(1, cpus=64) == 16
    assert auto_num_workers(8, cpus=64) == 8
    assert auto_num_workers(8, cpus=128) == 16
    assert auto_num_workers(4, cpus=6) == 2
    assert auto_num_workers(1, cpus=2) == 2
    assert auto_num_workers(1, cpus=48, cap=32) == 32
    assert auto_num_workers(1, cpus=48, cap=0) == 2          # never below 2


def test_auto_num_workers_reads_the_mask_the_quota_and_slurm_binding(monkeypatch):
    """Without ``cpus``: the affinity mask capped by the cgroup quota, shared by the host's ranks unless SLURM bound
    this task to its own CPUs (a container's cpuset gives every rank the same mask: shared)."""
    import os

    import datamodules.decode.plan as plan
    from datamodules.decode import auto_num_workers

    for k in ("SLURM_LOCALID", "SLURM_CPU_BIND_TYPE", "SLURM_CPUS_PER_TASK", "SLURM_JOB_NAME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(plan, "cgroup_cpus", lambda: None)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert auto_num_workers(8) == 8                          # 64 CPUs, 8 ranks
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert auto_num_workers(8) == 2                          # a 16-CPU cpuset seen by all 8 ranks: 16 // 8
    monkeypatch.setenv("SLURM_LOCALID", "3")
    monkeypatch.setenv("SLURM_CPU_BIND_TYPE", "mask_cpu:")
    assert auto_num_workers(4) == 16                         # srun bound each of 4 ranks to its 16: its own share
    assert auto_num_workers(8) == 2                          # 8 x 16 > 64: the masks overlap, so it is shared
    monkeypatch.setenv("SLURM_CPU_BIND_TYPE", "none")
    assert auto_num_workers(4) == 4                          # --cpu-bind=none: shared
    monkeypatch.setenv("SLURM_CPU_BIND_TYPE", "mask_cpu:")
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")
    assert auto_num_workers(4) == 4                          # Lightning's interactive job: it starts the ranks
    monkeypatch.delenv("SLURM_JOB_NAME")
    monkeypatch.delenv("SLURM_LOCALID")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(plan, "cgroup_cpus", lambda: 4)
    assert auto_num_workers(1) == 4                          # a 4-CPU pod on a 64-core node


def test_cgroup_cpus_reads_the_quota_of_the_process_cgroup_and_its_parents(tmp_path):
    """v2: ``cpu.max`` "quota period" rounded up, of the process's own cgroup (``/proc/self/cgroup``'s ``0::`` path)
    and every parent up to the mount, the smallest; "max", a zero or negative quota or period, junk: no limit
    there; v1's cfs files where v2 has none; nothing readable: None."""
    from datamodules.decode.plan import cgroup_cpus

    root, own = tmp_path / "cg", tmp_path / "self_cgroup"
    leaf = root / "user.slice" / "job7"
    leaf.mkdir(parents=True)
    own.write_text("0::/user.slice/job7\n")
    assert cgroup_cpus(root, own) is None                                   # no file anywhere
    (leaf / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpus(root, own) == 3                                      # 2.5 CPUs, rounded up
    (root / "user.slice" / "cpu.max").write_text("200000 100000")
    assert cgroup_cpus(root, own) == 2                                      # a parent's smaller limit
    (root / "cpu.max").write_text("max 100000")                             # the root: no limit
    assert cgroup_cpus(root, own) == 2
    for text in ("max 100000", "100000 0", "-1 100000", "junk"):
        (leaf / "cpu.max").write_text(text)
        (root / "user.slice" / "cpu.max").write_text(text)
        assert cgroup_cpus(root, own) is None, text
    own.write_text("0::/\n")
    (root / "cpu.max").write_text("150000 100000")
    assert cgroup_cpus(root, own) == 2                                      # a container's own namespace: the mount
    (root / "cpu.max").unlink()
    (root / "cpu").mkdir()
    (root / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(root, own) == 4                                      # v1
    (root / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpus(root, tmp_path / "absent") is None


def test_num_workers_null_is_the_hosts_share(monkeypatch):
    """``num_workers: null`` resolves through auto_num_workers with the trainer's devices as the host's processes;
    a number is kept; a negative one is refused naming the field."""
    from types import SimpleNamespace

    import datamodules.videoqa as vq
    from algorithms.errors import SettingError

    seen = []
    monkeypatch.setattr(vq, "auto_num_workers", lambda procs: seen.append(procs) or 7)
    dm = vq.VideoQADataModule(num_workers=None)
    assert dm.workers == 7 and seen == [1]
    dm.trainer = SimpleNamespace(num_devices=4)   # Lightning's trainer attribute, as the loop sets it
    assert dm.workers == 7 and seen == [1, 4]
    assert vq.VideoQADataModule(num_workers=3).workers == 3
    with pytest.raises(SettingError, match="data.num_workers"):
        vq.VideoQADataModule(num_workers=-1)
