"""``data.decode_timeout_s``: a decode that does not end in time is given up, its video becomes an error item naming
the file and the setting, and the next video decodes as usual (a stuck decoder costs one video, not the run)."""
from __future__ import annotations

import threading

import pytest

from datamodules.benchmarks import Question
from datamodules.video_items import (DECODE_TIMEOUT_S, DecodeTimeout, VideoQADataset, VideoTask, call_with_timeout,
                                     decode_video)
from datamodules.videoqa import VideoQADataModule
from tests.conftest import MEDIA


def test_call_with_timeout_gives_the_value_the_error_or_up():
    assert call_with_timeout(lambda: threading.current_thread(), None) is threading.current_thread()   # no limit
    assert call_with_timeout(lambda: threading.current_thread(), 5.0) is not threading.current_thread()
    assert call_with_timeout(lambda: 7, 5.0) == 7
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 5.0)
    release = threading.Event()
    with pytest.raises(DecodeTimeout, match="did not end within 0.2 s"):
        call_with_timeout(release.wait, 0.2)
    release.set()


def _task(video_id: str, path: str) -> VideoTask:
    return VideoTask(video_id, path, "videomme", [Question("q" + video_id, video_id, path, "Q?", ["a", "b"], "A")])


def test_a_stuck_decode_is_an_error_item_and_the_next_video_decodes(monkeypatch, tmp_path):
    stuck, fine = str(tmp_path / "stuck.mp4"), str(MEDIA / "realshort.mp4")
    release, started = threading.Event(), []

    def decode(path, *args, **kwargs):
        if path == stuck:
            started.append(path)
            release.wait(30)                       # a decoder that never returns (until the test ends)
            raise RuntimeError("released")
        return decode_video(path, *args, **kwargs)

    monkeypatch.setattr("datamodules.video_items.decode_video", decode)
    ds = VideoQADataset([_task("s", stuck), _task("f", fine)], 128, decode_timeout_s=0.3)
    try:
        item = ds[0]
        assert started == [stuck] and "frames" not in item
        assert item["error"].startswith(f"{stuck}: the decode did not end within 0.3 s (data.decode_timeout_s)")
        nxt = ds[1]
        assert nxt["error"] is None and len(nxt["frames"]) == len(nxt["times_s"]) > 0
        # the same frames as a decode without the limit (the thread changes nothing)
        plain = VideoQADataset([_task("f", fine)], 128, decode_timeout_s=None)[0]
        assert nxt["times_s"] == plain["times_s"] and (nxt["frames"] == plain["frames"]).all()
    finally:
        release.set()


def test_the_setting_is_checked_and_defaults_to_half_an_hour():
    assert VideoQADataModule(num_workers=0).decode_timeout_s == DECODE_TIMEOUT_S == 1800.0
    assert VideoQADataModule(num_workers=0, decode_timeout_s=None).decode_timeout_s is None
    for bad in (0, -5, True, "10", float("inf"), float("nan")):
        with pytest.raises(Exception, match="data.decode_timeout_s must be a number of seconds > 0"):
            VideoQADataModule(num_workers=0, decode_timeout_s=bad)
