"""Issue 44 items 2-4: the frames of legacy containers, mirrored display matrices, a frame size change mid-stream and
AV1 are seed 001's ffmpeg command's frames, checked as ``test_frame_identity.py`` checks them: the pixels spell the
source frame number (:meth:`tests.media_factory.MediaFactory.digits`'s pattern, read back by
:func:`tests.media_factory.digit_indices`) and the reference is imageio-ffmpeg's binary running the seed's command
(:func:`tests.media_factory.seed_ffmpeg_command`), thinned as the seed thins. Every clip is 80x16 (or 64x48), a few
seconds."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from algorithms.budget import cfr_sync, max_frames, sample_rate, thin_linspace
from datamodules.decode import decode_at_indices, decode_video, probe_video
from datamodules.decode.cpu import decord_decodes
from datamodules.decode.display import IDENTITY, apply_ops, autorotate_ops
from tests.media_factory import digit_indices, run_ffmpeg, seed_ffmpeg_command

_DIGITS = "geq=lum='16+13*mod(floor((N+{k})/pow(16\\,floor(X/16)))\\,16)':cb=128:cr=128"


def _digits_src(seconds: float, rate: int, first: int = 0) -> list[str]:
    """lavfi input: 80x16 frames whose pixels spell ``first + n`` (see the module docstring)."""
    return ["-f", "lavfi", "-i", f"color=black:s=80x16:r={rate}:d={seconds},format=yuv444p,"
            + _DIGITS.format(k=first)]


def _seed_frames(path, budget: int, h: int, w: int) -> np.ndarray:
    """Seed 001's ``decode_video`` frames at native size: its ffmpeg command at the rate ``format.duration`` picks,
    then ``np.linspace`` thinning to ``max_frames``."""
    fps = sample_rate(probe_video(path).duration_s, budget)
    out = subprocess.run(seed_ffmpeg_command(path, fps), capture_output=True, check=True).stdout
    frames = np.frombuffer(out, np.uint8).reshape(-1, h, w, 3)
    return frames[thin_linspace(len(frames), max_frames(budget))]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("legacy")
    made = {}

    def get(name: str):
        if name not in made:
            p = root / name
            {"asp.avi": lambda: run_ffmpeg(*_digits_src(4, 25), "-c:v", "mpeg4", "-bf", "2", "-q:v", "2",
                                           "-pix_fmt", "yuv420p", str(p)),
             "h264.avi": lambda: run_ffmpeg(*_digits_src(4, 25), "-c:v", "libx264", "-crf", "12", "-bf", "2",
                                            "-x264-params", "b-adapt=0", "-threads", "1", "-pix_fmt", "yuv420p",
                                            str(p)),
             "pts_dts.mp4": lambda: run_ffmpeg(*_digits_src(4, 25), "-c:v", "libx264", "-crf", "12", "-bf", "2",
                                               "-x264-params", "b-adapt=0", "-threads", "1", "-pix_fmt", "yuv420p",
                                               "-video_track_timescale", "1", str(p)),
             "av1.mp4": lambda: run_ffmpeg(*_digits_src(3, 10), "-c:v", "libaom-av1", "-cpu-used", "8", "-crf",
                                           "20", "-pix_fmt", "yuv420p", str(p)),
             "size_change.ts": lambda: _size_change(root, p),
             "size_there_and_back.ts": lambda: _size_there_and_back(root, p),
             }[name]()
            made[name] = p
        return made[name]
    return get


def _size_change(root, path) -> None:
    """3 s at 80x16 then 3 s at 160x32 (frames 30-59, the digits scaled 2x), 10 fps, one MPEG-TS (``cat``)."""
    a, b = root / "a.ts", root / "b.ts"
    ts = ["-c:v", "libx264", "-crf", "10", "-bf", "0", "-threads", "1", "-pix_fmt", "yuv420p", "-muxdelay", "0",
          "-muxpreload", "0", "-f", "mpegts"]
    run_ffmpeg(*_digits_src(3, 10), *ts, str(a))
    src = _digits_src(3, 10, first=30)
    src[-1] += ",scale=160:32:flags=neighbor"
    run_ffmpeg(*src, *ts, "-output_ts_offset", "3", str(b))
    path.write_bytes(a.read_bytes() + b.read_bytes())


def _size_there_and_back(root, path) -> None:
    """2 s at 80x16, 0.5 s at 160x32 (frames 20-24), 2.5 s at 80x16 (frames 25-49), 10 fps, one MPEG-TS: at 1 fps
    no sampled frame lies in the 160x32 span and ``pyav_skip`` seeks from frame 19 to the key frame 25."""
    ts = ["-c:v", "libx264", "-crf", "10", "-bf", "0", "-threads", "1", "-pix_fmt", "yuv420p", "-muxdelay", "0",
          "-muxpreload", "0", "-f", "mpegts"]
    parts = []
    for k, (seconds, first, big) in enumerate(((2.0, 0, False), (0.5, 20, True), (2.5, 25, False))):
        src = _digits_src(seconds, 10, first=first)
        if big:
            src[-1] += ",scale=160:32:flags=neighbor"
        parts.append(root / f"there_and_back_{k}.ts")
        run_ffmpeg(*src, *ts, *(["-output_ts_offset", str(first / 10)] if first else []), str(parts[-1]))
    path.write_bytes(b"".join(q.read_bytes() for q in parts))


# ------------------------------------------------------------------------------------------------ item 2

@pytest.mark.parametrize("name", ["asp.avi", "h264.avi", "pts_dts.mp4"])
def test_legacy_container_frames_are_the_cli_s(clips, name):
    """DivX-style MPEG-4 ASP with B-frames in AVI (decord returned other frames), H.264 with B-frames in AVI (the
    packets carry no pts: PyAV's made-up pts put frames one off) and pts = dts with B-frames in mp4
    (``-video_track_timescale 1``: frames came out of temporal order): the CLI's frames, index by index."""
    path = clips(name)
    for budget in (64, 16384):
        want = digit_indices(_seed_frames(path, budget, 16, 80))
        dec = decode_video(path, budget)
        assert digit_indices(dec.frames.numpy()) == want, (name, budget)
        assert dec.info["decoder"] == "pyav"
        assert "timestamps_from_decoder" in dec.info   # the record says the frames are numbered by the decoder


# ------------------------------------------------------------------------------------------------ item 3

@pytest.fixture(scope="module")
def patterns(tmp_path_factory):
    """64x48 quadrants (red, green / blue, white), H.264 (lossless) and MPEG-4 Part 2 (decord's codec before)."""
    root = tmp_path_factory.mktemp("display")
    src = ("color=c=red:s=32x24:r=4:d=2[a];color=c=lime:s=32x24:r=4:d=2[b];color=c=blue:s=32x24:r=4:d=2[c];"
           "color=c=white:s=32x24:r=4:d=2[d];[a][b]hstack[top];[c][d]hstack[bot];[top][bot]vstack")
    base = {"h264": root / "pat_h264.mp4", "mpeg4": root / "pat_mpeg4.mp4"}
    run_ffmpeg("-f", "lavfi", "-i", src, "-c:v", "libx264", "-qp", "0", "-pix_fmt", "yuv420p", "-threads", "1",
               str(base["h264"]))
    run_ffmpeg("-f", "lavfi", "-i", src, "-c:v", "mpeg4", "-q:v", "2", "-pix_fmt", "yuv420p", str(base["mpeg4"]))

    def get(codec: str, display: tuple[str, ...]):
        p = root / f"{codec}_{'_'.join(display).replace('-', '')}.mp4"
        if not p.exists():
            run_ffmpeg(*display, "-i", str(base[codec]), "-c", "copy", str(p))
        return p
    return get


MIRRORED = [("-display_hflip",), ("-display_vflip",), ("-display_rotation", "270", "-display_hflip"),
            ("-display_rotation", "90", "-display_hflip")]


@pytest.mark.parametrize("codec", ["h264", "mpeg4"])
@pytest.mark.parametrize("display", MIRRORED + [("-display_rotation", "90",), ("-display_rotation", "180",)])
def test_display_matrix_frames_are_the_cli_s(patterns, codec, display):
    """The CLI's autorotation applies the whole matrix, flips included; the decoded frames are its frames, pixel
    for pixel (H.264 went to pyav_skip and MPEG-4 to decord, each flipped on the other axis before)."""
    path = patterns(codec, display)
    probe = probe_video(path)
    want = _seed_frames(path, 64, probe.height, probe.width)
    got = decode_video(path, 64).frames.numpy()
    assert got.shape == want.shape and np.array_equal(got, want), display


def test_autorotate_ops_by_hand():
    """fftools' rule on hand matrices (16.16; ``-display_hflip`` negates the first column: theta 180 with
    m[0] < 0, m[4] > 0 is an hflip alone, not a 180-degree turn)."""
    one = 65536
    assert autorotate_ops(None) == () and autorotate_ops(IDENTITY) == ()
    assert autorotate_ops((-one, 0, 0, 0, one, 0, 0, 0, 1 << 30)) == ("hflip",)
    assert autorotate_ops((one, 0, 0, 0, -one, 0, 0, 0, 1 << 30)) == ("vflip",)
    assert autorotate_ops((-one, 0, 0, 0, -one, 0, 0, 0, 1 << 30)) == ("hflip", "vflip")   # 180 degrees
    assert autorotate_ops((0, -one, 0, one, 0, 0, 0, 0, 1 << 30)) == ("cclock",)             # -display_rotation 90
    assert autorotate_ops((0, one, 0, one, 0, 0, 0, 0, 1 << 30)) == ("cclock_flip",)         # 270 + hflip
    assert autorotate_ops((0, -one, 0, -one, 0, 0, 0, 0, 1 << 30)) == ("clock_flip",)        # 90 + hflip
    x = np.arange(6).reshape(2, 3, 1)   # [[0 1 2], [3 4 5]]
    assert apply_ops(x, ("hflip",))[..., 0].tolist() == [[2, 1, 0], [5, 4, 3]]
    assert apply_ops(x, ("vflip",))[..., 0].tolist() == [[3, 4, 5], [0, 1, 2]]
    assert apply_ops(x, ("cclock_flip",))[..., 0].tolist() == [[0, 3], [1, 4], [2, 5]]   # transpose
    assert apply_ops(x, ("clock_flip",))[..., 0].tolist() == [[5, 2], [4, 1], [3, 0]]    # anti-transpose
    assert apply_ops(x, ("clock",))[..., 0].tolist() == [[3, 0], [4, 1], [5, 2]]


# ------------------------------------------------------------------------------------------------ item 4

def test_frame_size_change_is_the_cli_s(clips):
    """80x16 then 160x32 in one MPEG-TS (answered on 2026-12-02, then "all input arrays must have the same shape"):
    the CLI rebuilds its filter graph at the new size (a new fps filter; the old one's buffered frame 29 is lost)
    and scales to the first size (``-autoscale``, bicubic); its CFR output sync fills the lost output with the next
    frame: 9, 19, 39, 39, 49, 59 at 1 fps, the same pixels."""
    path = clips("size_change.ts")
    want = _seed_frames(path, 16384, 16, 80)
    dec = decode_video(path, 16384)
    got = dec.frames.numpy()
    assert digit_indices(want) == [9, 19, 39, 39, 49, 59] == digit_indices(got)
    assert np.array_equal(got, want)
    assert "frame size changes" in dec.info["timestamps_from_decoder"]


def test_frame_size_change_no_reader_decodes_is_the_cli_s(clips):
    """Issue 44 item 5: 80x16, 160x32 for half a second, 80x16 again, in one MPEG-TS. The CLI rebuilds its filter
    graph twice (frame 19's output is lost, filled by 29): 9, 29, 29, 39, 49. No sampled frame is 160x32, so
    neither ``pyav_skip`` (native size: it seeks over the span) nor decord (a reduced size) saw the change and both
    kept the one-filter plan (9, 19, 29, 39, 49). The probe decodes the key frames of such containers: the plan is
    made on the decoder's timeline, read by ``pyav``, and the record says why."""
    from datamodules.decode.cpu import _resize

    path = clips("size_there_and_back.ts")
    assert "frame size changes" in probe_video(path).decoded_timeline
    want = _seed_frames(path, 16384, 16, 80)
    dec = decode_video(path, 16384)
    assert digit_indices(want) == [9, 29, 29, 39, 49] == digit_indices(dec.frames.numpy())
    assert np.array_equal(dec.frames.numpy(), want)
    assert dec.info["decoder"] == "pyav" and "key frames of 80x16, 160x32" in dec.info["timestamps_from_decoder"]
    small = decode_video(path, 16384, decode_max_side=40, native_decode_bytes=1)   # decord's case before
    assert small.info["decoder"] == "pyav" and small.info["decode_hw"] == [8, 40]
    assert np.array_equal(small.frames.numpy(), _resize(want, 8, 40))


def test_cfr_sync_by_hand():
    """video_sync_process (VSYNC_CFR): a gap of one output writes the next frame twice; of two, the previous frame
    once more and the next twice (llrint(2 - 0.6) = 1 of 3); an overlap of one is written; of three, dropped."""
    assert cfr_sync([(0, 10), (1, 11), (3, 13)]) == [10, 11, 13, 13]
    assert cfr_sync([(0, 10), (3, 13)]) == [10, 10, 13, 13]
    assert cfr_sync([(5, 10), (6, 11), (6, 12)]) == [10, 11, 12]
    assert cfr_sync([(5, 10), (6, 11), (4, 12)]) == [10, 11]


def test_av1_is_read_by_pyav(clips):
    """decord has no AV1 decoder ("cannot find video stream with wanted index: -1"); PyAV's FFmpeg has: the file
    goes to PyAV at once (no decord failure to fall back from), on both paths."""
    assert not decord_decodes("av1") and decord_decodes("h264") and decord_decodes("mpeg4")
    path = clips("av1.mp4")
    dec = decode_video(path, 64, strict_frames=True)
    assert dec.info["decoder"] == "pyav_skip" and "decoder_fallback" not in dec.info
    assert digit_indices(dec.frames.numpy()) == digit_indices(_seed_frames(path, 64, 16, 80)) == [9, 19, 29]
    assert digit_indices(decode_at_indices(path, [0, 5, 29]).frames.numpy()) == [0, 5, 29]


def test_av1_frame_count_for_the_omni_path(clips):
    """qwen_omni_utils' ``len(vr), vr.get_avg_fps()`` for an AV1 file decord cannot open: the container's count."""
    from datamodules.decode import decord_frame_count

    assert decord_frame_count(clips("av1.mp4")) == (30, 10.0)


@pytest.mark.parametrize("name", ["asp.avi", "h264.avi", "pts_dts.mp4"])
def test_omni_path_keeps_decord_s_numbering_in_legacy_containers(clips, name):
    """The omni path's reference reader is decord itself (qwen_omni_utils' ``_read_video_decord``: ``len(vr)``,
    ``vr.get_batch(idx)``), so on the legacy containers ``decode_at_indices`` gives decord's very frames for
    qwen_omni_utils' indices, not the decoder timeline's that ``decode_video`` uses, and the record says so
    (``decord_numbering``). On the MPEG-4 ASP AVI decord's frames are not the indices asked for. On the H.264 AVI
    decord itself is not repeatable (the last of [0, 33, 66, 99] came out as frame 66 in 6 of 8 fresh readers, 99
    in 2): there only the reader and the flag are checked."""
    import decord

    from algorithms.omni_sampling import qwen_omni_frame_indices
    from datamodules.decode import decord_frame_count

    path = clips(name)
    vr = decord.VideoReader(str(path), num_threads=1)
    total, rate = decord_frame_count(path)
    idx = qwen_omni_frame_indices(total, rate, fps=1.0, max_frames=128)
    ref = vr.get_batch(idx).asnumpy()
    dec = decode_at_indices(path, idx, video_fps=rate)
    assert dec.info["decoder"] == "decord"
    if name != "h264.avi":
        assert np.array_equal(dec.frames.numpy(), ref)
    assert dec.info["decord_numbering"] == probe_video(path).decoded_timeline != ""
    if name == "asp.avi":
        assert digit_indices(ref) != idx
