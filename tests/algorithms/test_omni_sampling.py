"""qwen_omni_utils' frame choice (QwenLM/Qwen2.5-Omni@f8bf58c6:qwen-omni-utils/src/qwen_omni_utils/v2_5/
vision_process.py:smart_nframes, _read_video_decord; the same lines in PyPI's qwen-omni-utils 0.0.9, where
``calculate_video_frame_range`` gives ``(0, total_frames - 1, total_frames)`` without start/end), cases worked out by
hand from its formulas."""
import pytest

from algorithms.omni_sampling import qwen_omni_frame_indices, qwen_omni_nframes


def test_nframes_hand_cases():
    # 10 s at 30 fps, 1 fps: 300 / 30 * 1 = 10 -> floor_by_factor(10, 2) = 10
    assert qwen_omni_nframes(300, 30.0, fps=1.0, max_frames=128) == 10
    # 11.5 s at 24 fps (276 frames), 1 fps: 11.5 -> floor to even 10
    assert qwen_omni_nframes(276, 24.0, fps=1.0, max_frames=128) == 10
    # an hour at 25 fps, 1 fps: 3600 > max_frames 128 -> 128 (seed 003: at most 128 frames)
    assert qwen_omni_nframes(90000, 25.0, fps=1.0, max_frames=128) == 128
    # max_frames is floored to even: 127 -> 126
    assert qwen_omni_nframes(90000, 25.0, fps=1.0, max_frames=127) == 126
    # 1 s at 30 fps: 1 frame wanted, min_frames 4 -> 4; package defaults (2 fps, cap min(768, T))
    assert qwen_omni_nframes(30, 30.0, fps=1.0) == 4
    assert qwen_omni_nframes(3000, 30.0) == 200
    with pytest.raises(ValueError, match=r"nframes should in interval \[2, 1\]"):
        qwen_omni_nframes(1, 30.0, fps=1.0)           # a one-frame video: the release raises too


def test_indices_rounded():
    # (n - 1 is odd for even n, so no index lands on an exact .5: half-to-even never decides)
    # linspace(0, 299, 10): step 299/9 = 33.22 -> 0, 33.2, 66.4, 99.7, 132.9, 166.1, 199.3, 232.6, 265.8, 299
    assert qwen_omni_frame_indices(300, 30.0, fps=1.0, max_frames=128) == [0, 33, 66, 100, 133, 166, 199, 233, 266, 299]
    # linspace(0, 5, 4) = 0, 5/3, 10/3, 5 -> 0, 2, 3, 5 ; linspace(0, 3, 4) = 0, 1, 2, 3
    assert qwen_omni_frame_indices(6, 1.0, fps=1.0, min_frames=4, max_frames=4) == [0, 2, 3, 5]
    # linspace(0, 9, 4) = 0, 3, 6, 9; linspace(0, 7, 6) = 0, 1.4, 2.8, 4.2, 5.6, 7 -> 0, 1, 3, 4, 6, 7
    assert qwen_omni_frame_indices(8, 1.0, fps=1.0, max_frames=6) == [0, 1, 3, 4, 6, 7]


def test_brief_case_300_frames_at_30_fps():
    """10 s at 30 fps (300 frames): 1 fps -> 300 / 30 * 1 = 10 frames; the package default 2 fps -> 20 (both even,
    under the caps); ``sample_fps = nframes / 300 * 30``: exactly the asked rate."""
    from algorithms.omni_sampling import qwen_omni_sample_fps

    assert qwen_omni_nframes(300, 30.0, fps=1.0, max_frames=128) == 10
    assert qwen_omni_nframes(300, 30.0) == 20                       # FPS = 2.0, cap min(768, 300)
    # linspace(0, 299, 20): step 299 / 19 = 15.7368 -> 15.74, 31.47, 47.21, 62.95, 78.68, 94.42, 110.16, 125.89,
    # 141.63, 157.37, 173.11, 188.84, 204.58, 220.32, 236.05, 251.79, 267.53, 283.26, 299
    assert qwen_omni_frame_indices(300, 30.0) == [0, 16, 31, 47, 63, 79, 94, 110, 126, 142, 157, 173, 189, 205, 220,
                                                  236, 252, 268, 283, 299]
    assert qwen_omni_sample_fps(10, 300, 30.0) == 1.0 and qwen_omni_sample_fps(20, 300, 30.0) == 2.0
    # 11.5 s at 24 fps -> 10 frames: sample_fps = 10 / 276 * 24 = 0.8696 (not the asked 1 fps: floor to even)
    assert qwen_omni_sample_fps(10, 276, 24.0) == pytest.approx(0.869565, abs=1e-6)
    # an hour at 25 fps capped at 128: 128 / 90000 * 25 = 0.03556 fps, a temporal patch (2 frames) spans 56.25 s
    assert 2 / qwen_omni_sample_fps(128, 90000, 25.0) == pytest.approx(56.25)


def test_short_clip_gets_the_minimum_four_frames():
    """1.2 s at 30.02 fps (the demo's realshort.mp4: 36 frames): 1.2 frames wanted -> FPS_MIN_FRAMES 4; linspace(0,
    35, 4) = 0, 11.67, 23.33, 35; sample_fps = 4 / 36 * 30.02 = 3.336 (4 frames spread over 1.2 s)."""
    from algorithms.omni_sampling import frame_times, qwen_omni_sample_fps

    rate = 30.020013342228154
    assert qwen_omni_frame_indices(36, rate, fps=1.0, max_frames=128) == [0, 12, 23, 35]
    assert qwen_omni_sample_fps(4, 36, rate) == pytest.approx(3.335557, abs=1e-6)
    assert frame_times([0, 12, 23, 35], 30.0) == [0.0, 0.4, 23 / 30, 35 / 30]
    # 3 frames: 4 wanted, but at most total_frames, floored to even -> 2
    assert qwen_omni_frame_indices(3, 30.0, fps=1.0, max_frames=128) == [0, 2]
    with pytest.raises(ValueError, match="video_fps must be > 0"):
        qwen_omni_nframes(30, 0.0)
