"""Bad and unusual media (issue 8 §1): each case decodes correctly or gives a DecodeError naming the file, and a
predict run over all of them records an error per bad video while the others are answered.

The media are made with ffmpeg by :mod:`tests.media_factory` (tiny, once per session). Behaviours are documented
in :mod:`datamodules.decoding`.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from datamodules.decoding import DecodeError, decode_video
from tests.conftest import REPO
from tests.media_factory import MediaFactory, decode_with_ffmpeg


@pytest.fixture(scope="session")
def media(tmp_path_factory) -> MediaFactory:
    return MediaFactory(tmp_path_factory.mktemp("media"))


def _close_to_reference(path, frames: np.ndarray, tol: float = 8.0) -> None:
    """The first decoded frame matches ffmpeg's own decode (autorotated) of frame 0."""
    h, w = frames.shape[1:3]
    ref = decode_with_ffmpeg(path, w, h)
    diff = np.abs(frames[0].astype(int) - ref[0].astype(int)).mean()
    assert diff < tol, f"{path.name}: mean abs difference {diff:.1f} to ffmpeg's decode"


# ------------------------------------------------------------------------------------------ errors
ERRORS = {
    "missing": "video file not found",
    "zero_bytes": r"empty \(0 bytes\)",
    "truncated": "cannot read the container",
    "truncated_tail": "cannot read the container",
    "garbage": "cannot read the container",
    "corrupt_middle": r"decoding \d+ frames failed \(corrupted or truncated stream|cannot read the container",
    "audio_only": "has no video stream",
}


@pytest.mark.parametrize("kind", sorted(ERRORS))
def test_broken_media_raise_decode_error_naming_the_file(media, kind):
    path = media.get(kind)
    with pytest.raises(DecodeError, match=ERRORS[kind]) as e:
        decode_video(path, 1024)
    assert str(e.value).startswith(str(path))


def test_directory_is_not_a_video(media, tmp_path):
    with pytest.raises(DecodeError, match="is not a regular file"):
        decode_video(tmp_path, 256)


# ------------------------------------------------------------------------------------------ decodable oddities
def test_single_frame(media):
    dec = decode_video(media.get("single_frame"), 1024)
    assert dec.frames.shape == (1, 48, 64, 3) and dec.times_s == [0.0] and dec.info["n_frames"] == 1


def test_shorter_than_one_sampling_step(media):
    dec = decode_video(media.get("sub_step"), 1024)
    assert dec.frames.shape[0] == 1 and dec.times_s == [0.0]
    assert 0 < dec.info["duration_s"] < 1.0


def test_very_long_tiny_video_is_capped(media):
    dec = decode_video(media.get("long_tiny"), 1024)  # max_frames(1024) = 128
    assert dec.frames.shape == (128, 24, 32, 3)
    assert dec.info["duration_s"] == 1800.0 and dec.info["sample_fps"] < 1.0
    t = np.array(dec.times_s)
    assert (np.diff(t) > 0).all() and t[0] == 0.0 and t[-1] > 1700


def test_variable_frame_rate_uses_frame_timestamps(media):
    path = media.get("vfr")  # frames at 0, 0.1, ..., 1.9, then 2, 3, 4, 5 s
    dec = decode_video(path, 1024)
    assert dec.info["vfr"] is True
    assert dec.times_s == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], abs=1e-3)
    # the frame kept for t = 3 s is the one shown at 3 s (native index 21), not index floor(3 * average fps)
    ref = decode_with_ffmpeg(path, 64, 48)
    assert np.abs(dec.frames[3].numpy().astype(int) - ref[21].astype(int)).mean() < 8


def test_constant_frame_rate_unchanged(media):
    dec = decode_video(media.get("good"), 1024)
    assert dec.info["vfr"] is False and dec.times_s == [0.0, 1.0, 2.0, 3.0] and dec.info["fps"] == 8.0


@pytest.mark.parametrize("degrees", [90, 270])
def test_rotation_metadata_applied(media, degrees):
    from tests.media_factory import run_ffmpeg

    path = media.root / f"rot{degrees}.mp4"
    if not path.exists():
        run_ffmpeg("-display_rotation:v:0", str(degrees), "-i", str(media.get("pattern")), "-c", "copy", str(path))
    dec = decode_video(path, 1024)
    assert dec.frames.shape[1:] == (64, 48, 3) and dec.info["native_hw"] == [64, 48]  # upright portrait
    _close_to_reference(path, dec.frames.numpy())


def test_odd_dimensions(media):
    path = media.get("odd_dims")
    dec = decode_video(path, 256)
    assert dec.frames.shape[1:] == (47, 63, 3)
    _close_to_reference(path, dec.frames.numpy())


@pytest.mark.parametrize("kind", ["yuv444", "yuv420p10", "mkv", "webm", "avi", "unicode_path"])
def test_formats_containers_and_paths(media, kind):
    path = media.get(kind)
    dec = decode_video(path, 1024)
    assert dec.frames.shape[1:] == (48, 64, 3) and dec.frames.shape[0] >= 2
    _close_to_reference(path, dec.frames.numpy())


def test_4k_decoded_small_with_bounded_memory(media):
    path = media.get("uhd")
    code = textwrap.dedent(f"""
        import json, resource
        from datamodules.decoding import decode_video
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        dec = decode_video({str(path)!r}, 1024, base_fps=5.0)   # all 10 frames
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"shape": list(dec.frames.shape), "info": dec.info, "grew_mb": (peak - base) / 1024}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(REPO))
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["shape"] == [10, 504, 896, 3] and res["info"]["native_hw"] == [2160, 3840]
    full_size_mb = 10 * 2160 * 3840 * 3 / 2**20  # 237 MB if the frames were decoded at full size
    assert res["grew_mb"] < 0.6 * full_size_mb, res


# ------------------------------------------------------------------------------------------ the run goes on
BAD = ["missing", "zero_bytes", "truncated", "truncated_tail", "corrupt_middle", "garbage", "audio_only"]
ODD = ["good", "single_frame", "sub_step", "vfr", "rotated", "odd_dims", "yuv444", "yuv420p10", "mkv", "webm",
       "avi", "unicode_path", "uhd"]


def test_dataset_item_carries_the_error(media):
    from datamodules.benchmarks import Question
    from datamodules.videoqa import VideoQADataset, VideoTask

    tasks = [VideoTask(k, str(media.get(k)), "lvb", [Question(f"{k}_q", k, str(media.get(k)), "Q?", ["a", "b"], "A")],
                       {f"{k}_q": ["b128"]}) for k in ("truncated", "good")]
    ds = VideoQADataset(tasks, 128)
    bad, good = ds[0], ds[1]
    assert bad["error"].startswith(str(media.get("truncated"))) and "frames" not in bad
    assert good["error"] is None and good["frames"].shape[0] == 4


def test_predict_records_errors_and_goes_on(media, tiny_vl3_dir, tmp_path):
    """One LongVideoBench-format run over every bad and odd file: an error record per bad video (naming it), a
    normal record for every other one, in one uninterrupted run."""
    from tests.conftest import run_predict

    root = tmp_path / "bench"
    (root / "videos").mkdir(parents=True)
    rows = []
    for k in BAD + ODD:
        src = media.get(k)
        rel = src.relative_to(media.root) if src.exists() else src.name
        if src.exists():
            (root / "videos" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, root / "videos" / rel)
        rows.append({"id": k, "video_id": k, "video_path": str(rel), "question": f"What is shown in {k}?",
                     "candidates": ["a test pattern", "a cat"], "correct_choice": 0})
    (root / "lvb_val.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    recs = run_predict(tiny_vl3_dir, root, tmp_path / "out", budgets=(128,),
                       extra=["--data.init_args.benchmark=lvb"], model_args={"max_new_tokens": 2})
    by = {r["qid"]: r for r in recs}
    assert sorted(by) == sorted(BAD + ODD) and len(recs) == len(BAD + ODD)
    for k in BAD:
        assert "error" in by[k] and by[k]["error"].startswith(str(root / "videos")), by[k]
        assert by[k]["error"].split(":")[0].endswith(str(rows[(BAD + ODD).index(k)]["video_path"]))
    for k in ODD:
        assert "error" not in by[k] and by[k]["response"] is not None and by[k]["vision_tokens"] <= 128, by[k]
    assert by["rotated"]["video_info"]["native_hw"] == [64, 48]
    assert by["uhd"]["video_info"]["native_hw"] == [2160, 3840]
