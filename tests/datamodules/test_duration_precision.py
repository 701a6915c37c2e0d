"""Video durations keep ffprobe's six decimals (issue 42 item 5).

Seed 001:1021 ``duration = float(probe["format"]["duration"])`` (ffprobe prints ``%f``: six decimals) and 001:1360
``fps = min(bd.FPS, len(idx) / max(info["duration"], 1e-6))``, recorded as ``round(fps, 4)``. A duration rounded
to 3 decimals first moves that fps by 1e-4 for some values (377 of 200,000 in the audit), e.g. 8 frames of
14.001501 s: 8 / 14.001501 = 0.571367 -> 0.5714, but 8 / 14.002 = 0.571347 -> 0.5713.
"""
from __future__ import annotations

import pytest

from algorithms.budget import budget_fps
from datamodules import decode as D
from datamodules.decode import video as V
from tests.conftest import MEDIA

FFPROBE_DURATION = 14.001501          # a format.duration as ffprobe prints it (six decimals)


def test_budget_fps_from_the_six_decimal_duration():
    # hand-computed from the seed's formula (module docstring)
    assert budget_fps(8, FFPROBE_DURATION) == (0.5714, True)
    assert budget_fps(8, round(FFPROBE_DURATION, 3)) == (0.5713, True)   # what a 3-decimal duration gives


def test_video_info_keeps_ffprobes_duration(monkeypatch):
    """The decoded video's ``duration_s`` is the probe's ``format.duration`` unrounded, so the per-budget fps of
    the records (``lightning_modules.budgeted_qa.qa_record``: ``budget_fps(n_frames, duration_s)``) is the seed's."""
    real = D.probe_video

    def probe(path):
        return real(path)._replace(duration_s=FFPROBE_DURATION)

    monkeypatch.setattr(V, "probe_video", probe)   # where decode_video looks it up
    video = D.decode_video(MEDIA / "cockatoo.mp4", 64)                  # 8 frames (max_frames(64))
    assert video.info["n_frames"] == 8
    assert video.info["duration_s"] == FFPROBE_DURATION
    assert budget_fps(video.info["n_frames"], video.info["duration_s"]) == (0.5714, True)
