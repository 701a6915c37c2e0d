"""qwen_omni_utils' frame choice end to end (issue 32 C2): decord's frame count and rate, ``smart_nframes`` +
``linspace(...).round()`` indices worked out by hand, and :func:`datamodules.decode.decode_at_indices` giving the
very frames the release's ``vr.get_batch(idx)`` gives, checked by **index** on lossless clips whose pixels spell the
source frame number (:meth:`tests.media_factory.MediaFactory.digits`)."""
from __future__ import annotations

import numpy as np
import pytest

from algorithms.omni_sampling import qwen_omni_frame_indices, qwen_omni_sample_fps
from datamodules.decode import DecodeError, decode_at_indices, decord_frame_count
from tests.media_factory import MediaFactory, digit_indices

NTSC = 30000 / 1001


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> MediaFactory:
    return MediaFactory(tmp_path_factory.mktemp("omni_frames"))


def test_indices_by_hand_and_the_decoded_frames_are_those(media):
    """7.3 s at 30000/1001 (x264 lossless, B-frames): decord counts 219 frames at 29.97 fps. 1 fps: 219 / 29.97 =
    7.31 -> 6 frames, linspace(0, 218, 6) = 0, 43.6, 87.2, 130.8, 174.4, 218; 2 fps (the package default): 14.6 ->
    14, step 218 / 13 = 16.77."""
    path = media.digits(7.3, "30000/1001", "x264")
    total, rate = decord_frame_count(path)
    assert total == 219 and rate == pytest.approx(NTSC)
    one = qwen_omni_frame_indices(total, rate, fps=1.0, max_frames=128)
    assert one == [0, 44, 87, 131, 174, 218]
    two = qwen_omni_frame_indices(total, rate)
    assert two == [0, 17, 34, 50, 67, 84, 101, 117, 134, 151, 168, 184, 201, 218]
    assert qwen_omni_sample_fps(6, total, rate) == pytest.approx(6 / 219 * NTSC)
    for idx in (one, two):
        dec = decode_at_indices(path, idx, video_fps=rate)
        assert digit_indices(dec.frames.numpy()) == idx
        assert dec.times_s == [k / rate for k in idx] and dec.info["decoder"] == "decord"
        assert dec.info["n_frames"] == len(idx) and dec.info["decode_hw"] == [16, 80]


def test_equal_to_the_release_decord_path(media):
    """The release's reader (``_read_video_decord``): ``vr = decord.VideoReader(path)``, ``len(vr)``,
    ``vr.get_avg_fps()``, ``vr.get_batch(idx).asnumpy()`` -- byte-equal frames on an NTSC mkv (time base 1/1000,
    rounded pts) and a capped mp4 (61.7 s, 1850 frames, at most 16: step 1849 / 15 = 123.27)."""
    import decord

    for args, max_frames, want in (((7.3, "24000/1001", "ffv1"), 128, [0, 35, 70, 105, 140, 175]),
                                   ((61.7, "30000/1001", "x264"), 16,
                                    [0, 123, 247, 370, 493, 616, 740, 863, 986, 1109, 1233, 1356, 1479, 1602, 1726,
                                     1849])):
        path = media.digits(*args)
        vr = decord.VideoReader(str(path))
        assert decord_frame_count(path) == (len(vr), vr.get_avg_fps())
        idx = qwen_omni_frame_indices(len(vr), vr.get_avg_fps(), fps=1.0, max_frames=max_frames)
        assert idx == want, args
        ref = vr.get_batch(idx).asnumpy()
        dec = decode_at_indices(path, idx)
        assert np.array_equal(dec.frames.numpy(), ref) and digit_indices(ref) == idx


def test_repeated_and_unsorted_indices_and_errors(media, tmp_path):
    path = media.digits(7.3, "30000/1001", "x264")
    dec = decode_at_indices(path, [5, 5, 2])
    assert digit_indices(dec.frames.numpy()) == [5, 5, 2]
    assert dec.times_s == pytest.approx([5 / NTSC, 5 / NTSC, 2 / NTSC])   # the stream's average rate by default
    with pytest.raises(ValueError, match="non-empty"):
        decode_at_indices(path, [])
    with pytest.raises(DecodeError, match="decoding 1 frames failed"):
        decode_at_indices(path, [219])                  # past the last frame
    with pytest.raises(DecodeError, match="video file not found"):
        decord_frame_count(tmp_path / "missing.mp4")
    with pytest.raises(DecodeError, match="cannot read the container"):
        decord_frame_count(media.get("garbage"))


def test_unusable_timestamps_decode_in_decode_order(media):
    """pts all equal: decord's seeking is wrong there, so PyAV decodes in decode order (as ``decode_video``)."""
    path = media.get("pts_equal")
    assert decord_frame_count(path) == (24, 8.0)
    idx = qwen_omni_frame_indices(24, 8.0, fps=1.0, max_frames=128)
    assert idx == [0, 8, 15, 23]              # 3 s at 1 fps -> FPS_MIN_FRAMES 4; linspace(0, 23, 4) = 0, 7.67, 15.33, 23
    dec = decode_at_indices(path, idx)
    assert dec.info["decoder"] == "pyav" and dec.info["timestamps_unusable"] and len(dec.frames) == 4


def test_omni_dataset_omnizip_items(media):
    """The dataset's ``omnizip`` item: the indices, ``sample_fps``, TMRoPE spacing and records' fields; a one-frame
    video is an error as in the release (``nframes should in interval [2, 1]``)."""
    from datamodules.omni_qa import OmniQADataset

    path = media.digits(7.3, "30000/1001", "x264")
    item = OmniQADataset([]).load(str(path))
    info = item["video_info"]
    assert digit_indices(item["frames"].numpy()) == [0, 44, 87, 131, 174, 218]
    assert info["frame_sampling"] == "omnizip" and info["nframes"] == 6 and info["total_frames"] == 219
    assert info["sample_fps"] == round(6 / 219 * NTSC, 6) and info["frame_interval_s"] == 1 / (6 / 219 * NTSC)
    assert info["capped"] is False and "processor_fps" not in info
    capped = OmniQADataset([], max_frames=4).load(str(path))["video_info"]
    assert capped["capped"] is True and capped["nframes"] == 4
    fixed = OmniQADataset([], processor_fps=2.0).load(str(path))["video_info"]
    assert fixed["frame_interval_s"] == 0.5 and fixed["processor_fps"] == 2.0
    old = OmniQADataset([], frame_sampling="ffmpeg_rate").load(str(path))["video_info"]
    assert old["frame_sampling"] == "ffmpeg_rate" and old["nframes"] == 7 and old["frame_interval_s"] == 1.0
    with pytest.raises(DecodeError, match=r"nframes should in interval \[2, 1\]"):
        OmniQADataset([]).load(str(media.get("single_frame")))
    with pytest.raises(ValueError, match="frame_sampling must be one of omnizip, ffmpeg_rate"):
        OmniQADataset([], frame_sampling="uniform")
