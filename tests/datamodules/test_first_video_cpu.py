"""``data.first_video_cpu_mpx``: with ``decoder: auto`` where NVDEC may run, the rank's first video is read on the CPU
when it is small.

The CPU reader is the reference the NVDEC path is checked against, so the only fields that may change are the
reader's (``video_info.decoder`` / ``decoder_fallback``); the choice itself is hand-checked case by case.
"""
from __future__ import annotations

import pytest

from algorithms.errors import SettingError
from datamodules.decode import decode_video
from datamodules.decode.video import SMALL_ON_CPU, source_megapixels
from datamodules.video_items import VideoQADataset, VideoTask
from datamodules.videoqa import FIRST_VIDEO_CPU_MPX, VideoQADataModule, first_video_on_cpu
from tests.conftest import MEDIA


def test_which_task_goes_to_the_cpu():
    assert first_video_on_cpu("auto", 16, True, [1, 0], 1000.0) == 1        # the first of the run order
    for decoder, workers, may_run, order, mpx in (("cpu", 16, True, [1], 1000.0), ("nvdec", 16, True, [1], 1000.0),
                                                  ("auto", 0, True, [1], 1000.0), ("auto", 16, False, [1], 1000.0),
                                                  ("auto", 16, True, [], 1000.0), ("auto", 16, True, [1], 0),
                                                  ("auto", 16, True, [1], None)):
        assert first_video_on_cpu(decoder, workers, may_run, order, mpx) is None, (decoder, workers, may_run, mpx)
    assert FIRST_VIDEO_CPU_MPX == 1000.0


def test_the_setting_is_checked():
    for bad in (-1, float("nan"), True, "64"):
        with pytest.raises(SettingError, match="data.first_video_cpu_mpx must be a finite number >= 0 .megapixels."):
            VideoQADataModule(first_video_cpu_mpx=bad)
    assert VideoQADataModule(first_video_cpu_mpx=None).first_video_cpu_mpx is None


class _Probe:   # what source_megapixels reads
    def __init__(self, frames, h, w):
        self.pts, self.height, self.width = list(range(frames)), h, w


def test_source_megapixels_by_hand():
    # the workload set's first video: 90 s at 25 fps, 640 x 360 -> 2250 x 230,400 px = 518.4 Mpx
    assert source_megapixels(_Probe(2250, 360, 640)) == pytest.approx(518.4)
    assert source_megapixels(_Probe(1800, 1080, 1920)) == pytest.approx(3732.48)   # 60 s of 1080p30


def _nvdec_read_raises(monkeypatch) -> None:
    """``decode_video``'s planned read raises "the NVDEC reader was asked" for ``nvdec`` (this machine has no GPU)
    and reads as before otherwise."""
    import datamodules.decode.video as video

    real_read = video._read_planned

    def read(path, probe, plan, name, *a):
        if name == "nvdec":
            raise RuntimeError("the NVDEC reader was asked")
        return real_read(path, probe, plan, name, *a)

    monkeypatch.setattr(video, "_read_planned", read)


def test_decode_video_reads_a_small_file_on_the_cpu_only_where_nvdec_would(monkeypatch):
    """``cpu_below_mpx``: a file NVDEC would read (forced here: no GPU) goes to the CPU reader when its source
    megapixels are at most the limit, with the reason; a larger one stays with NVDEC; a file ``auto`` sends to the CPU
    anyway keeps its own reason. The frames are the CPU reader's in every case."""
    import datamodules.decode.video as video

    clip = MEDIA / "realshort.mp4"
    ref = decode_video(clip, 256, decoder="cpu")
    mpx = source_megapixels(video.probe_video(clip))
    monkeypatch.setattr(video, "resolve_decoder", lambda decoder, *a, **kw: ("nvdec", None))
    _nvdec_read_raises(monkeypatch)
    small = decode_video(clip, 256, decoder="auto", cpu_below_mpx=mpx)
    assert small.info["decoder_fallback"] == SMALL_ON_CPU and small.info["decoder"] == ref.info["decoder"]
    assert small.frames.equal(ref.frames) and small.times_s == ref.times_s
    assert {k: v for k, v in small.info.items() if k != "decoder_fallback"} == ref.info
    for limit in (mpx - 1e-6, None):       # too big, or no limit: the NVDEC reader is asked
        with pytest.raises(RuntimeError, match="the NVDEC reader was asked"):
            decode_video(clip, 256, decoder="auto", cpu_below_mpx=limit)
    monkeypatch.setattr(video, "resolve_decoder", lambda decoder, *a, **kw: ("cpu", "own reason") if a else ("cpu", None))
    own = decode_video(clip, 256, decoder="auto", cpu_below_mpx=mpx)
    assert own.info["decoder_fallback"] == "own reason"


def test_a_small_first_video_asks_only_the_streams_reasons(monkeypatch):
    """The rank's small first video is read on the CPU whatever NVDEC's device query says, so only the NVDEC
    reader's ``stream_supports`` is asked (no CUDA call, which waited ~3 s in the driver beside 15 workers' first
    NVDEC calls on the H100): its reason when the stream rules NVDEC out, else ``SMALL_ON_CPU``; a video above the
    limit is asked the whole ``supports`` (the device's part too). Frames are the CPU reader's."""
    import datamodules.decode.readers as readers
    import datamodules.decode.video as video

    clip = MEDIA / "realshort.mp4"
    ref = decode_video(clip, 256, decoder="cpu")
    mpx = source_megapixels(video.probe_video(clip))
    asked = []

    def fake_reader(*a, **kw):
        raise AssertionError("not called: _read_planned stands in")

    _nvdec_read_raises(monkeypatch)
    fake_reader.supports = lambda probe, path: asked.append("device") or None
    fake_reader.stream_supports = lambda probe, path: asked.append("stream") or stream_reason[0]
    monkeypatch.setitem(readers.READERS, "nvdec", fake_reader)
    stream_reason = [None]
    small = decode_video(clip, 256, decoder="auto", cpu_below_mpx=mpx)
    assert asked == ["stream"] and small.info["decoder_fallback"] == SMALL_ON_CPU
    assert small.frames.equal(ref.frames)
    asked.clear()
    stream_reason[0] = "codec x (NVDEC here: h264)"
    own = decode_video(clip, 256, decoder="auto", cpu_below_mpx=mpx)
    assert asked == ["stream"] and own.info["decoder_fallback"] == "codec x (NVDEC here: h264)"
    asked.clear()
    with pytest.raises(RuntimeError, match="the NVDEC reader was asked"):
        decode_video(clip, 256, decoder="auto", cpu_below_mpx=mpx - 1e-6)
    assert asked == ["device"]


def test_the_dataset_passes_the_limit_for_that_task_only(monkeypatch):
    import datamodules.video_items as vi
    from datamodules.decode import DecodedVideo

    seen = []

    def fake_decode(path, *a, num_threads, decoder, part, cpu_below_mpx, **kw):
        seen.append((path, decoder, part, cpu_below_mpx, num_threads))
        return DecodedVideo(frames=None, times_s=[], info={})

    monkeypatch.setattr(vi, "decode_video", fake_decode)
    tasks = [VideoTask(f"v{i}", f"/v{i}.mp4", "videomme", []) for i in range(3)]
    ds = VideoQADataset(tasks, 1024, decoder="auto", cpu_task=1, cpu_task_mpx=500.0)
    for i in range(3):
        ds[i]
    assert seen == [("/v0.mp4", "auto", None, None, 1), ("/v1.mp4", "auto", None, 500.0, 2),
                    ("/v2.mp4", "auto", None, None, 1)]
    seen.clear()   # each part of that task too (data.first_video_parts), with the limit and the thread count
    ds = VideoQADataset(tasks, 1024, decoder="auto", parts=[1, 2, 1], cpu_task=1, cpu_task_threads=3)
    ds[1], ds[2], ds[3]
    assert seen == [("/v1.mp4", "auto", (0, 2), 1000.0, 3), ("/v1.mp4", "auto", (1, 2), 1000.0, 3),
                    ("/v2.mp4", "auto", None, None, 1)]
    seen.clear()   # data.first_video_threads: that task's read gets its own thread count, the others keep theirs
    ds = VideoQADataset(tasks, 1024, decoder="auto", cpu_task=1, cpu_task_mpx=500.0, cpu_task_threads=6)
    ds[1], ds[2]
    assert seen == [("/v1.mp4", "auto", None, 500.0, 6), ("/v2.mp4", "auto", None, None, 1)]
    seen.clear()   # decoder cpu: nothing to choose
    VideoQADataset(tasks, 1024, decoder="cpu", cpu_task=0)[0]
    assert seen == [("/v0.mp4", "cpu", None, None, 1)]


@pytest.mark.parametrize("first_parts", [1, 2])
def test_predict_records_are_the_cpu_readers_apart_from_the_reason(tiny_vl3_dir, demo_bench, tmp_path, monkeypatch,
                                                                    first_parts):
    """The user's predict with ``decoder: auto`` and 2 workers, NVDEC taken as able to run and as the reader of every
    file (this machine has no GPU): the first video of the order is read on the CPU with the reason, every other
    video fails on the stand-in NVDEC reader, and every field of the CPU-read video's records is that of a
    ``decoder: cpu`` run apart from ``decoder_fallback``. With ``first_video_parts: 2`` that video is read on the CPU
    in 2 parts by the 2 workers and joined (none decoded again whole): the same records."""
    import datamodules.decode.readers as readers
    import datamodules.part_join as pj
    import datamodules.videoqa as vq
    from datamodules.video_items import VideoQADataset
    from tests.conftest import run_predict

    joined, again = [], []
    real_join, real_whole = pj.join_items, VideoQADataset.whole_item
    monkeypatch.setattr(pj, "join_items", lambda items, ds=None: joined.append(
        (len(items), {it["video_info"]["decoder_fallback"] for it in items})) or real_join(items, ds))
    monkeypatch.setattr(VideoQADataset, "whole_item", lambda self, t: again.append(t) or real_whole(self, t))

    real = vq.first_video_on_cpu
    chosen = []
    monkeypatch.setattr(vq, "first_video_on_cpu", lambda dec, w, may, order, mpx:
                        chosen.append(r := real(dec, w, True, order, mpx)) or r)
    ref = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "cpu", budgets=(256,), model_args={"max_new_tokens": 2},
                      extra=["--data.init_args.num_workers=2"])
    real_resolve = readers.resolve_decoder
    monkeypatch.setattr(readers, "resolve_decoder", lambda decoder, *a, **kw: ("nvdec", None)
                        if a and decoder == "auto" else real_resolve(decoder, *a, **kw))
    import datamodules.decode.video as video

    monkeypatch.setattr(video, "resolve_decoder", readers.resolve_decoder)
    on = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "on", budgets=(256,), model_args={"max_new_tokens": 2},
                     extra=["--data.init_args.decoder=auto", "--data.init_args.num_workers=2",
                            f"--data.init_args.first_video_parts={first_parts}"])
    assert chosen[0] is None and chosen[1] is not None          # decoder cpu: none; auto: the order's first
    assert joined == ([(2, {SMALL_ON_CPU})] if first_parts == 2 else []) and again == []
    first = {r["video"] for r in on if r["video_info"].get("decoder_fallback") == SMALL_ON_CPU}
    assert len(first) == 1 and len(on) == len(ref) == 7
    key = lambda r: (r["job"], r["qid"])  # noqa: E731
    by_key = {key(r): r for r in ref}
    for b in on:   # the other video went to the NVDEC reader, which sent it to the CPU with its own reason
        a = by_key[key(b)]
        assert (b["video_info"]["decoder_fallback"] == SMALL_ON_CPU) == (b["video"] in first)
        assert a == {**b, "video_info": {k: v for k, v in b["video_info"].items() if k != "decoder_fallback"}}


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4", None])
def test_first_video_parts_is_checked_before_anything_runs(bad):
    with pytest.raises(SettingError, match="data.first_video_parts"):
        VideoQADataModule(first_video_parts=bad)
    assert VideoQADataModule().first_video_parts == 1 and VideoQADataModule(first_video_parts=3).first_video_parts == 3


def test_the_first_video_in_parts_still_goes_first():
    """``interleave_parts``' ``lead``: the rank's first video read on the CPU in parts keeps its place; the others
    follow as after any split video (the next ``k`` whole videos, then the next split one)."""
    from datamodules.part_join import PartSampler, interleave_parts

    counts = {0: 1, 1: 1, 3: 2, 4: 3, 5: 1, 6: 1, 7: 1}
    assert interleave_parts([3, 0, 1], counts) == [0, 3, 1]                   # before: a whole video first
    assert interleave_parts([3, 0, 1], counts, lead=3) == [3, 0, 1]
    # after the lead's 2 parts, 2 whole videos, then the 3-part one, then 3 whole ones
    assert interleave_parts([4, 3, 0, 1, 5, 6, 7], counts, lead=3) == [3, 0, 1, 4, 5, 6, 7]
    ds = VideoQADataset([VideoTask(f"v{i}", f"/v{i}.mp4", "videomme", []) for i in range(3)], 1024,
                        decoder="auto", parts=[1, 1, 2], cpu_task=2)
    assert list(PartSampler([2, 0, 1], ds)) == [2, 3, 0, 1]                  # task 2's items first
    ds.cpu_task = None
    assert list(PartSampler([2, 0, 1], ds)) == [0, 2, 3, 1]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_first_video_threads_is_checked_before_anything_runs(bad):
    with pytest.raises(SettingError, match="data.first_video_threads"):
        VideoQADataModule(first_video_threads=bad)
    assert VideoQADataModule().first_video_threads == 6          # the default since session 13
    assert VideoQADataModule(first_video_threads=None).first_video_threads is None
    assert VideoQADataModule(first_video_threads=4).first_video_threads == 4
