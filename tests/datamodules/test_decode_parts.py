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


# ------------------------------------------------------------------ the join equals the whole decode
def _equal_frames(a, b) -> bool:
    if isinstance(a, EncoderFrames) or isinstance(b, EncoderFrames):
        return (isinstance(a, EncoderFrames) and isinstance(b, EncoderFrames) and a.shape == b.shape
                and a.held.keys() == b.held.keys()
                and all(torch.equal(a.held[g][0], b.held[g][0]) and a.held[g][1] == b.held[g][1] for g in a.held))
    return torch.equal(a, b)


def _items(path, parts, budget=64, **kw):
    """The dataset's part items of ``path`` (decode windows made up: part k from 5 + k to 6 + k s)."""
    out = []
    for k in range(parts):
        dec = decode_video(path, budget, **kw, part=(k, parts))
        out.append({"video_path": str(path), "task": 0, "part": (k, parts), "part_bounds": dec.part,
                    "frames": dec.frames, "times_s": dec.times_s, "video_info": dec.info, "error": None,
                    "decode_s": 1.0, "decoded_unix": 10.0 + k, "decode_boot_s": (5.0 + k, 6.0 + k),
                    "worker_start_boot_s": 1.0 + k})
    return out


@pytest.mark.parametrize("parts", [2, 3, 7])
@pytest.mark.parametrize("held", [False, True])
def test_joined_parts_equal_the_whole_decode(tiny_vlm, clip, parts, held):
    sizing = EncoderSizing((64, 256), 256, "phase3", 256, tiny_vlm.video_processor) if held else None
    kw = dict(budget=256, sizing=sizing, decode_max_side=200, native_decode_bytes=0)
    whole = decode_video(clip, 256, sizing=sizing, decode_max_side=200, native_decode_bytes=0)
    assert whole.info["n_frames"] == 30 and isinstance(whole.frames, EncoderFrames) == held
    joined = join_items(_items(clip, parts, **kw))
    assert _equal_frames(joined["frames"], whole.frames)
    assert joined["times_s"] == whole.times_s and joined["video_info"] == whole.info
    assert list(joined["video_info"]) == list(whole.info)
    assert joined["decode_parts"] == parts and joined["decode_s"] == parts
    assert joined["decode_boot_s"] == (5.0, 5.0 + parts) and joined["worker_start_boot_s"] == 1.0
    assert not {"part", "part_bounds", "task"} & joined.keys()


def test_more_parts_than_frames(clip):
    # 30 planned frames in 40 parts: 10 parts are empty, and the join is still the whole decode
    whole = decode_video(clip, 256)
    items = _items(clip, 40, budget=256)
    assert sum(len(it["frames"]) == 0 for it in items) == 10
    joined = join_items(items)
    assert torch.equal(joined["frames"], whole.frames) and joined["video_info"] == whole.info
    # an empty part's reader and flags are not the video's (NVDEC would have been tried on it alone)
    for it in items:
        if len(it["frames"]) == 0:
            it["video_info"] = {**it["video_info"], "decoder": "nvdec", "concealment_checked": False}
    assert join_items(items)["video_info"] == whole.info


class _Whole:
    """A dataset stand-in for the join's way out: ``whole_item`` records its calls."""

    def __init__(self, item):
        self.item, self.calls, self.tasks = {"decode_s": 2.0, **item}, [], []

    def whole_item(self, t):
        self.calls.append(t)
        return dict(self.item)


def test_parts_that_do_not_fit_are_decoded_whole(clip, monkeypatch):
    items = _items(clip, 3, budget=256)
    whole = _Whole({"video_path": str(clip), "frames": "whole"})
    bad_plan = [items[0], {**items[1], "video_info": {**items[1]["video_info"], "n_frames": 31}}, items[2]]
    assert join_items(bad_plan, whole)["frames"] == "whole" and whole.calls == [0]
    one_failed = [items[0], {**items[1], "error": f"{clip}: boom"}, items[2]]
    assert join_items(one_failed, whole)["frames"] == "whole" and whole.calls == [0, 0]
    gap = [items[0], items[2]]
    with pytest.raises(PartMismatch, match="do not tile"):
        join_items(gap)
    sizes = [items[0], {**items[1], "frames": items[1]["frames"][:, :10]}, items[2]]
    out = join_items(sizes, whole)
    assert out["frames"] == "whole" and whole.calls == [0, 0, 0] and out["parts_fallback"].startswith("the parts'")
    assert out["decode_s"] == 2.0 + 3 * 1.0    # the whole decode's seconds and the parts' that went for nothing
    odd = [items[0], {k: v for k, v in items[1].items() if k != "times_s"}, items[2]]   # any other join error too
    assert join_items(odd, whole)["parts_fallback"] == "KeyError: 'times_s'" and whole.calls == [0] * 4
    import datamodules.part_join as pj

    def silent(*a):   # an error without a message
        raise RuntimeError()

    monkeypatch.setattr(pj, "join_frames", silent)
    assert join_items(items, whole)["parts_fallback"] == "RuntimeError: " and whole.calls == [0] * 5
    all_failed = [{**it, "error": f"{clip}: gone {k}"} for k, it in enumerate(items)]
    assert join_items(all_failed, whole)["error"] == f"{clip}: gone 0" and whole.calls == [0] * 5


def test_joining_loader_yields_each_video_once_in_any_order():
    from types import SimpleNamespace

    class DS:
        tasks = [SimpleNamespace(video_path=v) for v in "abc"]

        def items_of(self, t):
            return {0: [0, 1], 1: [2], 2: [3, 4, 5]}[t]

    ds = DS()
    # run order 2, 0, 1: the whole video 1 first, then 2 (3 parts); no whole video left, so 0 (2 parts) next
    assert list(PartSampler([2, 0, 1], ds)) == [2, 3, 4, 5, 0, 1] and len(PartSampler([2, 0, 1], ds)) == 6
    joined = []

    def fake_join(items, dataset):
        joined.append([it["part"] for it in items])
        return {"video": items[0]["task"]}

    import datamodules.part_join as pj

    real, pj.join_items = pj.join_items, fake_join
    try:
        arrivals = [{"task": 2, "part": (2, 3)}, {"task": 0, "part": (1, 2)}, {"video": "b"},
                    {"task": 2, "part": (0, 3)}, {"task": 0, "part": (0, 2)}, {"task": 2, "part": (1, 3)}]
        got = list(JoiningLoader(arrivals, ds, 3))
        assert got == [{"video": "b"}, {"video": 0}, {"video": 2}]
        assert joined == [[(0, 2), (1, 2)], [(0, 3), (1, 3), (2, 3)]]   # parts in part order, whatever the arrival
        assert len(JoiningLoader(arrivals, ds, 3)) == 3

        class Loader:   # iter() of the join starts the loader's iterator (its workers) at once
            started = 0

            def __iter__(self):
                Loader.started += 1
                return iter(arrivals)

        it = iter(JoiningLoader(Loader(), ds, 3))
        assert Loader.started == 1 and next(it) == {"video": "b"}
        # Lightning checks that a loader other than a DataLoader is iterable by calling iter() once and dropping it:
        # the loop's own iter() then gets that unread iterator (one set of workers), and a later one a new iterator
        from lightning.pytorch.trainer.connectors.data_connector import _check_dataloader_iterable
        from lightning.pytorch.trainer.states import TrainerFn

        Loader.started = 0
        joining = JoiningLoader(Loader(), ds, 3)
        _check_dataloader_iterable(joining, None, TrainerFn.PREDICTING)
        assert Loader.started == 1
        assert list(joining) == [{"video": "b"}, {"video": 0}, {"video": 2}] and Loader.started == 1
        assert list(joining) == [{"video": "b"}, {"video": 0}, {"video": 2}] and Loader.started == 2
        with pytest.raises(RuntimeError, match="decode parts missing for \\['c', 'a'\\]"):
            list(JoiningLoader(arrivals[:2], ds, 3))
    finally:
        pj.join_items = real


class _Items(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"video": i}


def test_joining_loader_under_lightning_starts_one_set_of_workers_and_shuts_it_down(tmp_path):
    """``trainer.predict`` over a join: one DataLoader iterator per call (Lightning's iterability check included),
    every item once; a run that fails in ``on_predict_start`` (where the weights load) before its first item leaves
    no worker behind, and the next call runs."""
    import multiprocessing

    import lightning.pytorch as pl
    from torch.utils.data import DataLoader
    from torch.utils.data import dataloader as dl

    made = []
    real = dl._MultiProcessingDataLoaderIter.__init__

    def counted(self, loader):
        made.append(1)
        real(self, loader)

    class Module(pl.LightningModule):
        fail = False

        def on_predict_start(self):
            if self.fail:
                raise RuntimeError("load failed")

        def predict_step(self, item, idx):
            return item["video"]

    class Data(pl.LightningDataModule):
        def predict_dataloader(self):
            return JoiningLoader(DataLoader(_Items(), batch_size=None, num_workers=2), None, 4)

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    module, data = Module(), Data()
    dl._MultiProcessingDataLoaderIter.__init__ = counted
    try:
        assert sorted(trainer.predict(module, datamodule=data)) == [0, 1, 2, 3] and len(made) == 1
        module.fail = True
        with pytest.raises(RuntimeError, match="load failed"):
            trainer.predict(module, datamodule=data)
        assert len(made) == 2 and multiprocessing.active_children() == []
        module.fail = False
        assert sorted(trainer.predict(module, datamodule=data)) == [0, 1, 2, 3] and len(made) == 3
    finally:
        dl._MultiProcessingDataLoaderIter.__init__ = real


def test_interleave_parts_by_hand():
    """After a video of k parts the next k whole videos, the run order kept within each kind, the first video whole;
    what is left of one kind once the other runs out follows in order."""
    from datamodules.part_join import interleave_parts

    counts = {0: 1, 1: 4, 2: 1, 3: 4, 4: 1, 5: 2, 6: 1, 7: 1, 8: 1, 9: 3}
    # run order (cheapest, dearest, ...): 0 1 2 3 4 5 6 9 7 8 -> wholes 0 2 4 6 7 8, splits 1 3 5 9
    order = [0, 1, 2, 3, 4, 5, 6, 9, 7, 8]
    assert interleave_parts(order, counts) == [0, 1, 2, 4, 6, 7, 3, 8, 5, 9]
    assert interleave_parts([1, 3], {1: 2, 3: 4}) == [1, 3]                  # no whole video
    assert interleave_parts([2, 0], {0: 1, 2: 1}) == [2, 0]                  # no split one: the order as given
    assert interleave_parts([3, 0, 1], {0: 1, 1: 1, 3: 2}) == [0, 3, 1]
    assert interleave_parts([], {}) == []


def test_predict_records_equal_with_and_without_parts(tiny_vl3_dir, demo_bench, clip, tmp_path, monkeypatch):
    """The user's predict with the videos decoded in parts by 2 workers (forced here: parts are made only where NVDEC
    may decode) writes the records of the whole decodes, each question once; every video is joined, none decoded
    again whole. (The demo's cockatoo.mp4 has key frames that are not clean starts: it is replaced by a closed-GOP
    clip here, and ``test_a_stream_whose_key_frames_are_not_clean_starts_is_decoded_whole`` covers it.)"""
    import shutil

    import datamodules.part_join as pj
    import datamodules.videoqa as vq
    from datamodules.video_items import VideoQADataset
    from datamodules.videoqa import VideoQADataModule
    from tests.conftest import run_predict

    shutil.copy(clip, demo_bench / "videos" / "cockatoo.mp4")
    whole = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "whole", budgets=(256, 1024),
                        model_args={"max_new_tokens": 2}, extra=["--data.init_args.decoder=auto"])
    joined, again = [], []
    real = pj.join_items
    monkeypatch.setattr(pj, "join_items", lambda items, ds=None: joined.append(len(items)) or real(items, ds))
    real_whole = VideoQADataset.whole_item
    monkeypatch.setattr(VideoQADataset, "whole_item", lambda self, t: again.append(t) or real_whole(self, t))
    monkeypatch.setattr(VideoQADataModule, "_splits", lambda self: True)
    prefetch = []
    real_loader = vq.video_loader
    monkeypatch.setattr(vq, "video_loader", lambda ds, sampler, workers, pf, *a: prefetch.append(pf) or
                        real_loader(ds, sampler, workers, pf, *a))
    # the clip is 0.19 MB, realshort.mp4 0.10 MB: at 0.05 MB a part, both are split in 2 (at most half of the 4
    # workers each), using the 2 workers the 2 videos leave spare (within_spare_workers)
    parts = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "parts", budgets=(256, 1024),
                        model_args={"max_new_tokens": 2},
                        extra=["--data.init_args.num_workers=4", "--data.init_args.decode_part_mb=0.05",
                               "--data.init_args.decoder=auto"])
    assert joined == [2, 2] and again == [] and prefetch == [1]   # one item per worker at a time when split
    key = lambda r: (r["job"], r["qid"])  # noqa: E731
    assert len(whole) == 14 and sorted(parts, key=key) == sorted(whole, key=key)
    # 2 videos for 2 workers: no worker is spare, so nothing is split (the plain loader, 2 items ahead per worker)
    run_predict(tiny_vl3_dir, demo_bench, tmp_path / "full", budgets=(256,), model_args={"max_new_tokens": 2},
                extra=["--data.init_args.num_workers=2", "--data.init_args.decode_part_mb=0.05",
                       "--data.init_args.decoder=auto"])
    assert joined == [2, 2] and prefetch == [1, 2]


def test_a_stream_whose_key_frames_are_not_clean_starts_is_decoded_whole(caplog):
    """cockatoo.mp4: its frames after a mid-stream key frame differ from a decode from the start, so a part read on
    the CPU comes with its frames flagged; the join decodes the video whole (the record's source) and says why."""
    from datamodules.video_items import VideoQADataset, VideoTask
    from tests.conftest import MEDIA

    path = MEDIA / "cockatoo.mp4"
    ds = VideoQADataset([VideoTask("001", str(path), "videomme", [], {})], 1024, parts=[2])
    items = [ds[i] for i in ds.items_of(0)]
    assert all(it["error"] is None for it in items)
    assert items[1]["video_info"].get("frames_concealed")     # the second part starts at an unclean key frame
    out = join_items(items, ds)
    whole = decode_video(path, 1024)
    assert torch.equal(out["frames"], whole.frames) and out["video_info"] == whole.info
    assert out["parts_fallback"].startswith("part 1, read by") and out["decode_parts"] == 1
    assert "decoding it whole in the main process" in caplog.text and str(path) in caplog.text


def test_the_setting_is_checked():
    from algorithms.errors import SettingError
    from datamodules.videoqa import VideoQADataModule

    for bad in (-1, float("nan"), float("inf"), True, "256"):
        with pytest.raises(SettingError, match="data.decode_part_mb must be a finite number >= 0"):
            VideoQADataModule(decode_part_mb=bad)
    assert VideoQADataModule(decode_part_mb=None).decode_part_mb is None
    assert VideoQADataModule().decode_part_mb == 256.0


def test_a_truncated_file_gives_the_same_error_every_time(tmp_path):
    """PyAV folds a log line repeated back to back; the second open of the same truncated file in a process named
    PyAV's exception instead of FFmpeg's cause, so the parts of one video (and a resumed run) disagreed."""
    import av.logging

    from datamodules.decode import DecodeError
    from tests.conftest import MEDIA

    bad = tmp_path / "bad.mp4"
    bad.write_bytes((MEDIA / "cockatoo.mp4").read_bytes()[:200_000])
    before = av.logging.get_skip_repeated()
    seen = set()
    for _ in range(3):
        with pytest.raises(DecodeError) as e:
            decode_video(bad, 256)
        seen.add(str(e.value))
    assert seen == {f"{bad}: cannot read the container (truncated, corrupted or not a video file; moov atom not found)"}
    assert av.logging.get_skip_repeated() == before


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
    assert dm.workers == 7 and seen == [1, 4]     # read once per process count (the mask and cgroup files)
    assert vq.VideoQADataModule(num_workers=3).workers == 3
    with pytest.raises(SettingError, match="data.num_workers"):
        vq.VideoQADataModule(num_workers=-1)
