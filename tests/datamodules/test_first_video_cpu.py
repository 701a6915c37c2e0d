"""``data.first_video_cpu_mb``: with ``decoder: auto`` on a CUDA machine the rank's first video is read on the CPU.

The CPU reader is the reference the NVDEC path is checked against, so the only fields that may change are the
reader's (``video_info.decoder`` / ``decoder_fallback``); the choice itself is hand-checked case by case.
"""
from __future__ import annotations

import pytest

from algorithms.errors import SettingError
from datamodules.video_items import FIRST_VIDEO_CPU, VideoQADataset, VideoTask
from datamodules.videoqa import FIRST_VIDEO_CPU_MB, VideoQADataModule, first_video_on_cpu


def test_which_video_goes_to_the_cpu(tmp_path):
    small, big = tmp_path / "small.mp4", tmp_path / "big.mp4"
    small.write_bytes(b"\0" * 2_000_000)           # 2.0 MB
    big.write_bytes(b"\0" * 3_000_000)             # 3.0 MB
    paths = [str(big), str(small), str(tmp_path / "missing.mp4")]
    assert first_video_on_cpu("auto", 16, True, [1, 0], paths, 2.0) == 1      # the first of the order, <= 2 MB
    assert first_video_on_cpu("auto", 16, True, [0, 1], paths, 2.0) is None   # the first is 3 MB
    assert first_video_on_cpu("auto", 16, True, [0, 1], paths, 3.0) == 0
    assert first_video_on_cpu("auto", 16, True, [2, 1], paths, 64) is None    # not stat'ed: left to the decoder
    for decoder, workers, cuda, order, mb in (("cpu", 16, True, [1], 64), ("nvdec", 16, True, [1], 64),
                                              ("auto", 0, True, [1], 64), ("auto", 16, False, [1], 64),
                                              ("auto", 16, True, [], 64), ("auto", 16, True, [1], 0),
                                              ("auto", 16, True, [1], None)):
        assert first_video_on_cpu(decoder, workers, cuda, order, paths, mb) is None, (decoder, workers, cuda, mb)
    assert FIRST_VIDEO_CPU_MB == 64.0


def test_the_setting_is_checked():
    for bad in (-1, float("nan"), True, "64"):
        with pytest.raises(SettingError, match="data.first_video_cpu_mb"):
            VideoQADataModule(first_video_cpu_mb=bad)
    assert VideoQADataModule(first_video_cpu_mb=None).first_video_cpu_mb is None


def test_the_dataset_reads_only_that_task_on_the_cpu_and_says_why(monkeypatch):
    import datamodules.video_items as vi
    from datamodules.decode import DecodedVideo

    seen = []

    def fake_decode(path, *a, decoder, part, **kw):
        seen.append((path, decoder, part))
        return DecodedVideo(frames=None, times_s=[], info={"decoder": "pyav_skip" if decoder == "cpu" else "nvdec"})

    monkeypatch.setattr(vi, "decode_video", fake_decode)
    tasks = [VideoTask(f"v{i}", f"/v{i}.mp4", "videomme", []) for i in range(3)]
    ds = VideoQADataset(tasks, 1024, decoder="auto", cpu_task=1)
    infos = [ds[i]["video_info"] for i in range(3)]
    assert [d for _, d, _ in seen] == ["auto", "cpu", "auto"]
    assert infos[1] == {"decoder": "pyav_skip", "decoder_fallback": FIRST_VIDEO_CPU}
    assert "decoder_fallback" not in infos[0] and "decoder_fallback" not in infos[2]
    # a part of that task (parts are never made for it, but an item of a split video stays with the decoder)
    seen.clear()
    parts = VideoQADataset(tasks, 1024, decoder="auto", parts=[1, 2, 1], cpu_task=1)
    parts[1]
    assert seen == [("/v1.mp4", "auto", (0, 2))]
    # decoder cpu: nothing to say
    seen.clear()
    assert "decoder_fallback" not in VideoQADataset(tasks, 1024, decoder="cpu", cpu_task=0)[0]["video_info"]


def test_predict_records_are_the_cpu_readers_apart_from_the_reason(tiny_vl3_dir, demo_bench, tmp_path, monkeypatch):
    """The user's predict with ``decoder: auto`` and 2 workers, the CUDA condition forced (this machine has no GPU,
    so ``auto`` reads every video on the CPU and says why): the cheapest video's records name the first-video
    reason, every other field of every record is that of the run with the setting off."""
    import datamodules.videoqa as vq
    from tests.conftest import run_predict

    real = vq.first_video_on_cpu
    chosen = []
    monkeypatch.setattr(vq, "first_video_on_cpu",
                        lambda dec, w, cuda, order, paths, mb: chosen.append(r := real(dec, w, True, order, paths, mb))
                        or r)
    args = ["--data.init_args.decoder=auto", "--data.init_args.num_workers=2"]
    off = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "off", budgets=(256,), model_args={"max_new_tokens": 2},
                      extra=[*args, "--data.init_args.first_video_cpu_mb=0"])
    on = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "on", budgets=(256,), model_args={"max_new_tokens": 2},
                     extra=args)
    assert chosen[0] is None and chosen[1] is not None
    first = {r["video"] for r in on if r["video_info"].get("decoder_fallback") == FIRST_VIDEO_CPU}
    assert len(first) == 1 and len(on) == len(off) == 7
    key = lambda r: (r["job"], r["qid"])  # noqa: E731
    for a, b in zip(sorted(off, key=key), sorted(on, key=key)):
        if b["video"] in first:
            assert a["video_info"]["decoder_fallback"] != FIRST_VIDEO_CPU
            a = {**a, "video_info": {k: v for k, v in a["video_info"].items() if k != "decoder_fallback"}}
            b = {**b, "video_info": {k: v for k, v in b["video_info"].items() if k != "decoder_fallback"}}
        assert a == b
