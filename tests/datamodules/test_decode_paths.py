"""The CPU readers give the same frames (issue 31 §2): PyAV's skipping reader (``skip_frame=NONREF`` on packets no
sampled frame is, seeking over spans with a key frame) equals decord bit for bit where the CPU path uses it, and
frames decoded from damaged data are flagged (issue 35 item 4)."""
from __future__ import annotations

import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

from datamodules import decode as D
from datamodules.decode import cpu, pyav_skip
from tests.conftest import REPO
from tests.media_factory import MediaFactory, decode_with_ffmpeg, run_ffmpeg, seed_ffmpeg_command


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> MediaFactory:
    return MediaFactory(tmp_path_factory.mktemp("paths"))


def _both(path: Path, budget: int, **kw):
    probe = D.probe_video(path)
    plan = D.plan_decode(path, probe, budget)
    dh, dw = plan.decode_hw
    ref = cpu._read_frames(path, plan.unique, probe.height, probe.width, dh, dw, 1)
    return ref, pyav_skip._pyav_skip_reader(path, probe, dh, dw, 2, **kw)(plan.unique)


@pytest.mark.parametrize("kw", [{}, {"seek": False}, {"skip_nonref": False}])
@pytest.mark.parametrize("budget", [64, 16384])   # 8 frames of 61.7 s (seeks over key frames) / 1 fps
def test_skipping_reader_equals_decord(media, budget, kw):
    path = media.digits(61.7, "30000/1001", "x264")            # B-frames, GOP 250
    ref, got = _both(path, budget, **kw)
    assert np.array_equal(got, ref)


def test_skipping_reader_on_real_and_gop_clips(media, tmp_path):
    path = tmp_path / "g12.mp4"   # moving content, GOP 12 with B-frames: every sampled frame's GOP is sought
    run_ffmpeg("-f", "lavfi", "-i", "testsrc2=size=160x90:rate=25,hue=H=t", "-t", "20", "-c:v", "libx264",
               "-preset", "faster", "-bf", "3", "-g", "12", "-pix_fmt", "yuv420p", str(path))
    for p, b in ((path, 64), (path, 16384), (REPO / "assets/media/realshort.mp4", 16384)):
        ref, got = _both(p, b)
        assert np.array_equal(got, ref), p


def test_cpu_reader_choice(media):
    good = D.probe_video(media.get("good"))
    assert D.cpu_reader_for(good, (48, 64)) == "pyav_skip"
    assert D.cpu_reader_for(good, (24, 32)) == "pyav_sws"                     # reduced size: decord's scaler
    assert D.cpu_reader_for(D.probe_video(media.get("yuv420p10")), (48, 64)) == "decord"
    assert D.cpu_reader_for(D.probe_video(media.get("yuv420p10")), (24, 32)) == "decord"
    assert D.cpu_reader_for(D.probe_video(media.get("webm")), (48, 64)) == "pyav_sws"   # VP9
    assert D.cpu_reader_for(D.probe_video(media.get("avi")), (48, 64)) == "decord"      # MPEG-4: IDCT not exact
    assert D.cpu_reader_for(D.probe_video(media.get("rotated")), (24, 32)) == "decord"  # decord's rotation
    assert D.cpu_reader_for(D.probe_video(media.get("pts_equal")), (48, 64)) == "pyav"
    assert D.decode_video(media.get("good"), 1024).info["decoder"] == "pyav_skip"


def _sws_vs_decord(path: Path, budget: int, max_side: int | None, threads: int = 1):
    probe = D.probe_video(path)
    plan = D.plan_decode(path, probe, budget, native_decode_bytes=1 if max_side else 2e9,
                         decode_max_side=max_side or 896)
    dh, dw = plan.decode_hw
    ref = cpu._read_frames(path, plan.unique, probe.height, probe.width, dh, dw, 1)
    read = pyav_skip._pyav_sws_reader(path, probe, dh, dw, threads)
    return ref, read(plan.unique), read


@pytest.mark.parametrize("max_side", [None, 40])
def test_sws_reader_equals_decord(media, tmp_path, max_side):
    """``pyav_sws`` (PyAV's decode, decord's own libswscale) gives decord's frames byte for byte, native and
    reduced sizes: H.264 with B-frames (every GOP read, and 8 frames of 20 s with GOP 12: seeks), VP9, a real
    clip, with 1 and 2 decoder threads."""
    g12 = tmp_path / "g12.mp4"
    run_ffmpeg("-f", "lavfi", "-i", "testsrc2=size=160x90:rate=25,hue=H=t", "-t", "20", "-c:v", "libx264",
               "-preset", "faster", "-bf", "3", "-g", "12", "-pix_fmt", "yuv420p", str(g12))
    cases = [(g12, 64, 1), (g12, 16384, 2), (media.get("webm"), 1024, 1), (media.get("webm"), 1024, 2),
             (REPO / "assets/media/realshort.mp4", 16384, 1), (media.get("good"), 1024, 1)]
    for path, budget, threads in cases:
        ref, got, read = _sws_vs_decord(path, budget, max_side, threads)
        assert got.shape == ref.shape and np.array_equal(got, ref), (path.name, budget, threads)
        assert read.concealed == set()


def test_rotated_frames_equal_the_cli(media):
    """decord mis-sizes 90-degree rotated buffers and resizes back; PyAV's frame rotated equals the CLI exactly."""
    path = media.root / "good_rot90.mp4"   # 4 s at 8 fps, yuv420p
    run_ffmpeg("-display_rotation:v:0", "90", "-i", str(media.get("good")), "-c", "copy", str(path))
    dec = D.decode_video(path, 1024)
    ref = decode_with_ffmpeg(path, 48, 64)
    assert dec.info["decoder"] == "pyav_skip" and dec.frames.shape[1:] == (64, 48, 3)
    assert np.array_equal(dec.frames.numpy(), ref[[7, 15, 23, 31]])   # round=down at 1 fps: frames 8 j + 7


def _damaged_idr(media, offset: int, name: str) -> Path:
    import av

    good = media.get("good")
    data = bytearray(good.read_bytes())
    with av.open(str(good)) as c:
        first = next(iter(c.demux(video=0)))
    rng = random.Random(3)
    for i in range(first.pos + offset, first.pos + first.size):
        data[i] = rng.randrange(256)
    p = media.root / name
    p.write_bytes(bytes(data))
    return p


def _seed_frames(path):
    """``(exit code, frames)`` of seed 001's exact ffmpeg command at 1 fps on a 64x48 clip."""
    res = subprocess.run(seed_ffmpeg_command(path, 1.0), capture_output=True)
    return res.returncode, np.frombuffer(res.stdout, np.uint8).reshape(-1, 48, 64, 3)


@pytest.mark.parametrize("offset, cause", [(800, "concealed"), (40, "Invalid data|Error splitting")])
def test_damaged_first_idr_strict(media, offset, cause):
    """The first IDR's slice data overwritten: the decoder conceals (decord returns those frames unflagged) or
    fails; under ``strict_frames`` the video is an error, with ``max_replaced_frac`` frame 0 (GOP 0) replaced."""
    path = _damaged_idr(media, offset, f"idr_{offset}.mp4")
    with pytest.raises(D.DecodeError, match=cause) as e:
        D.decode_video(path, 1024, strict_frames=True)
    assert str(e.value).startswith(str(path))
    dec = D.decode_video(path, 1024, max_replaced_frac=0.5, strict_frames=True)
    assert dec.info["frames_replaced"] == [0] and dec.frames.shape[0] == 4


@pytest.mark.parametrize("kw", [{}, {"native_decode_bytes": 1, "decode_max_side": 32}])
def test_damaged_first_idr_concealed_as_seed_ffmpeg(media, kw):
    """Default (seed 001): FFmpeg conceals the damaged IDR and exits 0 with 4 frames; the video is answered and
    the positions where FFmpeg's frames differ from its decode of the undamaged file are listed, on PyAV's reader
    (native size) and on ``pyav_sws`` (reduced size: decord's frames, flagged by the same pass).
    The undamaged frames equal FFmpeg's; the concealed picture itself is not compared (FFmpeg's concealment
    output differs with the decoder's threads and skipped pictures)."""
    path = _damaged_idr(media, 800, "idr_800.mp4")
    rc, ref = _seed_frames(path)
    _, clean = _seed_frames(media.get("good"))
    damaged = [j for j in range(4) if not np.array_equal(ref[j], clean[j])]
    assert rc == 0 and len(ref) == 4 and damaged == [0]
    dec = D.decode_video(path, 1024, **kw)
    assert dec.info["frames_concealed"] == damaged
    assert dec.info["decoder"] == ("pyav_sws" if kw else "pyav_skip")
    if not kw:
        assert np.array_equal(dec.frames.numpy()[1:], ref[1:])
    with pytest.raises(D.DecodeError, match="concealed"):
        D.decode_video(path, 1024, strict_frames=True, **kw)
    assert D.decode_video(path, 1024, strict_frames=True, max_replaced_frac=0.5, **kw).info["frames_replaced"] == [0]


@pytest.mark.parametrize("kw", [{}, {"native_decode_bytes": 1, "decode_max_side": 32}])
def test_refused_first_idr_as_seed_ffmpeg(media, kw):
    """FFmpeg refuses the first IDR (frames 0-7 never decoded) and exits 0 with 4 frames: its constant-rate output
    duplicates the first frame the ``fps`` filter gives (slot 1, native 15) back to slot 0, so the frames are
    native 15, 15, 23, 31 of the undamaged ``good``; position 0 is listed as repeated."""
    path = _damaged_idr(media, 40, "idr_40.mp4")
    rc, ref = _seed_frames(path)
    _, clean = _seed_frames(media.get("good"))
    assert rc == 0 and len(ref) == 4
    assert all(np.array_equal(ref[j], clean[k]) for j, k in enumerate([1, 1, 2, 3]))   # native 15, 15, 23, 31
    dec = D.decode_video(path, 1024, **kw)
    assert dec.info["frames_concealed"] == [0] and dec.frames.shape[0] == 4
    if not kw:
        assert dec.info["decoder"] == "pyav_skip" and np.array_equal(dec.frames.numpy(), ref)
    else:   # decord's scaler on FFmpeg's frames: position 0 is position 1's frame
        assert dec.info["decoder"] == "pyav_sws" and np.array_equal(dec.frames[0], dec.frames[1])


@pytest.mark.parametrize("threads", [2, 4])
def test_damaged_first_idr_is_flagged_with_decoder_threads(media, threads):
    """With frame threads the decoder's log is not read; the frames FFmpeg marks corrupt
    (``AV_FRAME_FLAG_CORRUPT`` / ``decode_error_flags``, PyAV's ``Frame.is_corrupt``) still flag frame 0: listed
    by default, an error under ``strict_frames``."""
    path = _damaged_idr(media, 800, f"idr_t{threads}.mp4")
    with pytest.raises(D.DecodeError, match="concealed|corrupt"):
        D.decode_video(path, 1024, num_threads=threads, strict_frames=True)
    dec = D.decode_video(path, 1024, num_threads=threads, max_replaced_frac=0.5, strict_frames=True)
    assert dec.info["frames_replaced"] == [0]
    assert D.decode_video(path, 1024, num_threads=threads).info["frames_concealed"] == [0]


def test_decode_at_indices_flags_concealed_frames(media):
    """The Omni path (decord's frames at explicit indices, by ``pyav_sws``) lists the concealed frame as
    ``decode_video`` does (native 7, in the damaged IDR's GOP, the frame FFmpeg conceals above) and fails on it
    under ``strict_frames``."""
    path = _damaged_idr(media, 800, "idr_800.mp4")
    dec = D.decode_at_indices(path, [7, 15, 23, 31])
    assert dec.info["decoder"] == "pyav_sws" and dec.info["frames_concealed"] == [0]
    with pytest.raises(D.DecodeError, match="concealed"):
        D.decode_at_indices(path, [7, 15, 23, 31], strict_frames=True)
    assert "frames_concealed" not in D.decode_at_indices(media.get("good"), [7, 15, 23, 31]).info


def _corrupt_fixtures(media) -> list[Path]:
    return [media.get("corrupt_middle"), _damaged_idr(media, 800, "idr_800.mp4"), _damaged_idr(media, 40, "idr_40.mp4")]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("max_side", [None, 32])
def test_one_pass_flags_equal_the_check(media, monkeypatch, threads, max_side):
    """Issue 42 leftovers: the one-pass readers' flags are the flags of the old path's second decode
    (:func:`concealed_frames`) on every corrupt fixture, native and reduced size, 1 and 2 decoder threads; and
    ``decord`` + that check (forced: the reader of other codecs) lists the same positions. Hand-known values
    (the seed's FFmpeg output vs its decode of ``good``: test_corrupt_middle_as_seed_ffmpeg and
    test_damaged_first_idr_concealed_as_seed_ffmpeg, test_refused_first_idr_as_seed_ffmpeg): ``corrupt_middle``
    [1, 2], ``idr_800`` [0], ``idr_40`` [0]."""
    from datamodules.decode import video

    kw = {"native_decode_bytes": 1, "decode_max_side": max_side} if max_side else {}
    expect = {"corrupt_middle.mp4": [1, 2], "idr_800.mp4": [0], "idr_40.mp4": [0]}
    for path in _corrupt_fixtures(media):
        probe = D.probe_video(path)
        plan = D.plan_decode(path, probe, 1024, **kw)
        old = D.concealed_frames(path, probe, plan.unique, threads)
        dec = D.decode_video(path, 1024, num_threads=threads, **kw)
        assert dec.info["decoder"] == ("pyav_sws" if max_side else "pyav_skip")
        got = dec.info.get("frames_concealed", [])
        assert got == [j for j, k in enumerate(plan.idx) if k in old], path.name
        if path.name in expect:
            assert got == expect[path.name]
        with monkeypatch.context() as m:
            m.setattr(video, "cpu_reader_for", lambda probe, hw: "decord")
            forced = D.decode_video(path, 1024, num_threads=threads, **kw)
        assert forced.info.get("frames_concealed", []) == got, path.name
