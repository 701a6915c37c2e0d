"""Frame identity with FFmpeg (issue 32 A): the native frames :func:`datamodules.decode.decode_video` keeps are
the very frames seed 001's ffmpeg command emits (``fps=fps:round=down`` at the rate ``format.duration`` picks,
then ``np.linspace`` thinning), compared by **index** on lossless clips whose pixels spell the source frame number
(:meth:`tests.media_factory.MediaFactory.digits`), against imageio-ffmpeg's binary itself."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from algorithms.budget import av_d2q, fps_filter_frames, max_frames, sample_rate, thin_linspace
from datamodules.decode import DecodeError, decode_video, plan_decode, probe_video
from tests.media_factory import MediaFactory, digit_indices, seed_ffmpeg_indices

BUDGETS = (64, 512, 1024, 16384)   # M = 8, 64, 128 (capped) and 2048 (1 fps, uncapped here)


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> MediaFactory:
    return MediaFactory(tmp_path_factory.mktemp("digits"))


def _seed_indices(path, budget: int, duration_s: float) -> list[int]:
    ref = seed_ffmpeg_indices(path, sample_rate(duration_s, budget))
    return [ref[i] for i in thin_linspace(len(ref), max_frames(budget))]


CLIPS = [  # (duration s, rate, codec, audio track length s)
    (1.0, "30000/1001", "x264", None),
    (7.3, "24000/1001", "x264", None),
    (7.3, "60000/1001", "ffv1", None),      # mkv: time base 1/1000, NTSC pts rounded to ms
    (61.7, "30000/1001", "x264", None),
    (61.7, "24000/1001", "ffv1", None),
    (61.7, "25", "x264", None),
    (183.4, "30000/1001", "x264", None),
    (183.4, "30", "ffv1", None),
    (61.7, "30000/1001", "x264", 75.0),     # audio outlasts the video: format.duration (75 s) picks the rate
]


@pytest.mark.parametrize("duration, rate, codec, audio", CLIPS)
def test_frames_are_the_seed_ffmpeg_commands(media, duration, rate, codec, audio):
    path = media.digits(duration, rate, codec, audio)
    probe = probe_video(path)
    if audio is not None:
        assert probe.duration_s == pytest.approx(audio, abs=0.05)   # the container's duration, not the video's
    for b in BUDGETS:
        assert plan_decode(path, probe, b).idx == _seed_indices(path, b, probe.duration_s), (path.name, b)


def test_decoded_pixels_are_those_frames(media):
    """The reader maps the native indices to the frames FFmpeg numbers so (B-frames reordered, capped budget)."""
    path = media.digits(61.7, "30000/1001", "x264")
    dec = decode_video(path, 512)
    want = _seed_indices(path, 512, probe_video(path).duration_s)
    assert digit_indices(dec.frames.numpy()) == want and dec.info["decoder"] == "decord"   # 4:4:4


def test_shorter_than_one_step_is_no_frame_in_both(media):
    path = media.digits(0.3, "30000/1001", "x264")
    assert seed_ffmpeg_indices(path, 1.0) == []
    with pytest.raises(DecodeError, match="ends before the first sampling step"):
        decode_video(path, 1024)


def test_fps_filter_rules_by_hand():
    """vf_fps.c on integer pts: output n shows the last frame whose floor(pts * tb * rate) <= n; the first output
    is the first frame's; the last frame repeats while the rescaled end of stream is past the next output."""
    tb = Fraction(1, 30000)
    pts = [k * 1001 for k in range(90)]                       # 3.003 s at 30000/1001
    # rate 1: frame k floors to floor(k * 1001 / 30000): frame 29 (0.967 s) is the last below 1 s, 59 below 2 s
    assert fps_filter_frames(pts, tb, 90 * 1001, Fraction(1)) == [29, 59, 89]
    # the end (3.003 s) floors to 3 = three outputs; ending at 2.9 s (87 frames) floors to 2: two outputs
    assert fps_filter_frames(pts[:87], tb, 87 * 1001, Fraction(1)) == [29, 59]
    # a gap: frames at 0 and 2.5 s (end 3 s) at 1 fps: outputs 0, 1 repeat frame 0, output 2 is frame 1
    assert fps_filter_frames([0, 2500], Fraction(1, 1000), 3000, Fraction(1)) == [0, 0, 1]
    # first pts 0.6 s: floor = 0, so output 0 is that frame (no earlier output is made up)
    assert fps_filter_frames([600, 1600], Fraction(1, 1000), 2600, Fraction(1)) == [0, 1]
    assert fps_filter_frames([0], Fraction(1, 1000), 500, Fraction(1)) == []


def test_av_d2q_values_from_the_ffmpeg_binary():
    """``fps=N/D`` the binary logs (``-v verbose``) for the seed's float rates: 129/1800 and 2049/3700.1 s."""
    assert av_d2q(1.0) == Fraction(1)
    assert av_d2q(129 / 1800) == Fraction(43, 600)
    assert av_d2q(30000 / 1001) == Fraction(30000, 1001)
    assert av_d2q(0.3) == Fraction(3, 10)
    assert av_d2q(2049 / 3700.1) == Fraction(20490, 37001)


@pytest.mark.slow
def test_an_hour_of_tiny_frames(media):
    path = media.digits(3600.5, "30000/1001", "x264")
    probe = probe_video(path)
    for b in BUDGETS:
        assert plan_decode(path, probe, b).idx == _seed_indices(path, b, probe.duration_s)
