"""qwen_omni_utils' frame choice (qwen-omni-utils 0.0.9 vision_process.py smart_nframes / _read_video_torchvision),
cases worked out by hand from its formulas."""
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
