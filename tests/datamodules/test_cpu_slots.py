"""``data.cpu_slots``: idle cores read files NVDEC would read, while a slot is free (datamodules/decode/cpu_slots.py).

The CPU reader is the reference NVDEC's frames are checked against, so what may change is who reads (the reader's
fields); what each case gives is hand-checked: a slot held by another process is not free, a process's end gives
its slot back, a read above the megapixel limit takes none.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from algorithms.errors import SettingError
from datamodules.decode import decode_video
from datamodules.decode.cpu_slots import ON_CPU_SLOT, CpuSlots
from datamodules.decode.video import _read_megapixels, source_megapixels
from datamodules.video_items import VideoQADataset, VideoTask
from datamodules.videoqa import VideoQADataModule
from tests.conftest import MEDIA
from tests.datamodules.test_first_video_cpu import _nvdec_read_raises

HOLD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("cpu_slots", sys.argv[3])   # the module alone (no torch import: fast)
mod = sys.modules["cpu_slots"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
with mod.CpuSlots(sys.argv[1], int(sys.argv[2])).take(1.0) as got:
    print("held" if got else "none", flush=True)
    time.sleep(60)
"""


def test_slots_are_taken_up_to_their_count_and_given_back(tmp_path):
    slots = CpuSlots(str(tmp_path / "s"), 2, threads=3, max_mpx=100.0)
    with slots.take(100.0) as a, slots.take(5.0) as b, slots.take(5.0) as c:
        assert (a, b, c) == (True, True, False)           # two slots: the third read waits for none
    with slots.take(100.000001) as big:
        assert big is False                                # above max_mpx: never on a slot
    with slots.take(1.0) as again:
        assert again is True                               # the slots given back at the ends of the `with`s
    with CpuSlots(str(tmp_path / "none"), 0).take(1.0) as zero:
        assert zero is False                               # data.cpu_slots = 0: off
    (tmp_path / "g").write_text("a file in the folder's place")
    with CpuSlots(str(tmp_path / "g" / "s"), 1).take(1.0) as blocked:
        assert blocked is False                            # a folder that cannot be made: no slot, no error
    for bad in ((-1, 2, 1.0), (1, 0, 1.0), (1, 2, 0.0)):
        with pytest.raises(ValueError, match="CpuSlots: count >= 0"):
            CpuSlots(str(tmp_path), *bad)


def test_a_slot_held_by_another_process_is_not_free_and_comes_back_when_it_is_killed(tmp_path):
    folder = str(tmp_path / "s")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    import datamodules.decode.cpu_slots as module

    holder = subprocess.Popen([sys.executable, "-c", HOLD, folder, "1", module.__file__], stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        with CpuSlots(folder, 1).take(1.0) as got:
            assert got is False                           # the other worker's read holds the one slot
    finally:
        holder.kill()                                     # SIGKILL: no `with` ends; the kernel drops the lock
        holder.wait()
    deadline = time.monotonic() + 5
    while True:
        with CpuSlots(folder, 1).take(1.0) as got:
            if got or time.monotonic() > deadline:
                break
    assert got is True


def test_a_parts_megapixels_are_its_share_of_the_files():
    class Probe:
        pts, height, width = list(range(2250)), 360, 640          # 90 s at 25 fps: 518.4 Mpx

    class Plan:
        idx = list(range(10))

    assert _read_megapixels(Probe, Plan, None) == pytest.approx(518.4)
    # part_bounds(10, 1, 4) = (2, 5): 3 of the 10 planned frames
    assert _read_megapixels(Probe, Plan, (1, 4)) == pytest.approx(518.4 * 3 / 10)


def test_decode_video_reads_on_a_free_slot_with_the_cpu_readers_frames(monkeypatch, tmp_path):
    """A file NVDEC would read (forced here: no GPU) is read by the CPU reader while a slot is free, with the
    slot's threads and the reason; with the only slot held, or above the limit, NVDEC is asked."""
    import datamodules.decode.video as video

    clip = MEDIA / "realshort.mp4"
    ref = decode_video(clip, 256, decoder="cpu")
    mpx = source_megapixels(video.probe_video(clip))
    monkeypatch.setattr(video, "resolve_decoder", lambda decoder, *a, **kw: ("nvdec", None))
    _nvdec_read_raises(monkeypatch)
    threads = []
    real = video._read_planned
    monkeypatch.setattr(video, "_read_planned", lambda path, probe, plan, name, n, *a:
                        threads.append(n) or real(path, probe, plan, name, n, *a))
    slots = CpuSlots(str(tmp_path / "s"), 1, threads=3, max_mpx=mpx)
    got = decode_video(clip, 256, decoder="auto", cpu_slots=slots)
    assert got.info["decoder_fallback"] == ON_CPU_SLOT and threads == [3]
    assert got.frames.equal(ref.frames) and got.times_s == ref.times_s
    assert {k: v for k, v in got.info.items() if k != "decoder_fallback"} == ref.info
    with slots.take(1.0):                                  # the one slot held (another worker's read)
        with pytest.raises(RuntimeError, match="the NVDEC reader was asked"):
            decode_video(clip, 256, decoder="auto", cpu_slots=slots)
    with pytest.raises(RuntimeError, match="the NVDEC reader was asked"):
        decode_video(clip, 256, decoder="auto", cpu_slots=CpuSlots(str(tmp_path / "s"), 1, max_mpx=mpx - 1e-6))
    with slots.take(1.0) as free:
        assert free is True                                # the decode gave its slot back
    monkeypatch.setattr(video, "resolve_decoder", lambda decoder, *a, **kw: ("cpu", "own reason"))
    own = decode_video(clip, 256, decoder="auto", cpu_slots=slots)      # a file NVDEC would not read: no slot
    assert own.info["decoder_fallback"] == "own reason"


def test_the_dataset_passes_the_slots_except_to_the_first_videos_cpu_read(monkeypatch, tmp_path):
    import datamodules.video_items as vi
    from datamodules.decode import DecodedVideo

    seen = []

    def fake_decode(path, *a, cpu_below_mpx, cpu_slots=None, **kw):
        seen.append((path, cpu_below_mpx, cpu_slots))
        return DecodedVideo(frames=None, times_s=[], info={})

    monkeypatch.setattr(vi, "decode_video", fake_decode)
    slots = CpuSlots(str(tmp_path), 2)
    tasks = [VideoTask(f"v{i}", f"/v{i}.mp4", "videomme", []) for i in range(3)]
    ds = VideoQADataset(tasks, 256, decoder="auto", cpu_task=1, cpu_task_mpx=50.0, cpu_slots=slots)
    for i in range(3):
        ds[i]
    assert seen == [("/v0.mp4", None, slots), ("/v1.mp4", 50.0, None), ("/v2.mp4", None, slots)]


def test_the_settings_are_checked_and_off_without_cuda(tmp_path):
    for name, bad, msg in (("cpu_slots", -1, "data.cpu_slots"), ("cpu_slots", 1.5, "data.cpu_slots"),
                           ("cpu_slots", None, "^data.cpu_slots=null: expected an integer >= 0$"),
                           ("cpu_slot_threads", 0, "data.cpu_slot_threads"),
                           ("cpu_slot_mpx", 0, "data.cpu_slot_mpx must be a finite number > 0"),
                           ("cpu_slot_mpx", float("inf"), "data.cpu_slot_mpx"),
                           ("cpu_slot_mpx", True, "data.cpu_slot_mpx")):
        with pytest.raises(SettingError, match=msg):
            VideoQADataModule(**{name: bad})
    dm = VideoQADataModule(decoder="auto", num_workers=2, cpu_slots=3)
    assert dm.cpu_slots == 3 and dm.cpu_slot_threads == 2 and dm.cpu_slot_mpx == 30000.0
    assert dm._cpu_slots_of_run(0) is None                 # this machine has no CUDA: NVDEC reads nothing
    assert VideoQADataModule(decoder="cpu", num_workers=2, cpu_slots=3)._cpu_slots_of_run(0) is None
