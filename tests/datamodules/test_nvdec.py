"""NVDEC reader (``datamodules/decode/nvdec.py``): decord's own swscale conversion, the per-file fallback
reasons, and the split over sessions.

CPU cases: the conversion is proven on the CPU by feeding it the 4:2:0 planes of FFmpeg's software decoder (PyAV),
which are the planes NVDEC returns for H.264 / HEVC / VP9 (bit-exact decoding; the ``gpu`` cases check that), and
comparing the RGB with decord's ``get_batch`` (the CPU path's reader), byte for byte. ``gpu`` cases (opt-in
``-m gpu``, need PyNvVideoCodec and an NVDEC GPU): :func:`read_nvdec` against decord on the same clips.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from datamodules.decode import nvdec  # before decord (see datamodules.decode.nvdec._import_nvc)
from tests.media_factory import ffmpeg_exe

REPO = Path(__file__).resolve().parents[2]

# name: (ffmpeg arguments after the lavfi input, expected probe fields)
CLIPS = {
    "h264_642x362.mp4": ("testsrc2=size=642x362:rate=30", ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-bf", "3",
                                                          "-g", "12"]),
    "h264_320x180_bt709.mp4": ("testsrc2=size=320x180:rate=25", ["-c:v", "libx264", "-pix_fmt", "yuv420p",
                                                                 "-colorspace", "bt709", "-color_primaries", "bt709",
                                                                 "-color_trc", "bt709"]),
    "h264_jpeg_256x144.mp4": ("testsrc2=size=256x144:rate=25", ["-c:v", "libx264", "-pix_fmt", "yuvj420p"]),
    "hevc_320x240.mp4": ("testsrc2=size=320x240:rate=25", ["-c:v", "libx265", "-x265-params", "log-level=error",
                                                           "-pix_fmt", "yuv420p"]),
    "vp9_320x240.webm": ("testsrc2=size=320x240:rate=25", ["-c:v", "libvpx-vp9", "-pix_fmt", "yuv420p"]),
    "mpeg4_320x240.mp4": ("testsrc2=size=320x240:rate=25", ["-c:v", "mpeg4", "-q:v", "5"]),
    "h264_yuv444_160x120.mp4": ("testsrc2=size=160x120:rate=25", ["-c:v", "libx264", "-pix_fmt", "yuv444p"]),
    "vp9_161x121.webm": ("testsrc2=size=162x122:rate=25", ["-vf", "scale=161:121", "-c:v", "libvpx-vp9",
                                                          "-pix_fmt", "yuv420p"]),
}
EXACT = ["h264_642x362.mp4", "h264_320x180_bt709.mp4", "h264_jpeg_256x144.mp4", "hevc_320x240.mp4",
         "vp9_320x240.webm"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    """The clips, made with ffmpeg; or, where there is no ffmpeg (the GPU machine), those of a folder made here
    before (``NVDEC_TEST_CLIPS``, the files this fixture wrote)."""
    given = os.environ.get("NVDEC_TEST_CLIPS")
    if given:
        return {name: Path(given) / name for name in CLIPS}
    return write_clips(tmp_path_factory.mktemp("nvdec_clips"))


def write_clips(out: Path) -> dict[str, Path]:
    """:data:`CLIPS` written to ``out`` with ffmpeg (``bench/make_nvdec_clips.py`` writes them for the GPU machine)."""
    made = {}
    for name, (src, args) in CLIPS.items():
        path = out / name
        subprocess.run([ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i", src, "-t", "1", *args, str(path)],
                       check=True)
        made[name] = path
    return made


def _planes(path: Path, n: int) -> tuple[list[list[np.ndarray]], object]:
    """The first ``n`` frames' (Y, U, V) planes from FFmpeg's software decoder (PyAV), and the first frame."""
    import av

    out, first = [], None
    with av.open(str(path)) as c:
        for f in c.decode(c.streams.video[0]):
            first = first or f
            out.append([np.frombuffer(bytes(p), np.uint8).reshape(p.height, p.line_size)[:, : p.width].copy()
                        for p in f.planes])
            if len(out) == n:
                break
    return out, first


def _decord(path: Path, idx: list[int], dh: int, dw: int, h: int, w: int) -> np.ndarray:
    import decord

    same = (dh, dw) == (h, w)
    vr = decord.VideoReader(str(path), num_threads=1, width=-1 if same else dw, height=-1 if same else dh)
    return vr.get_batch(idx).asnumpy()


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("scale", [1.0, 0.6])
def test_conversion_equals_decord(clips, name, scale):
    """Software-decoded planes -> Yuv420ToRgb == decord's RGB, byte for byte, native and reduced (bilinear) sizes,
    for BT.601 untagged, BT.709-tagged and full-range (yuvj420p) streams."""
    planes, first = _planes(clips[name], 12)
    h, w = first.height, first.width
    dh, dw = (h, w) if scale == 1.0 else (2 * round(h * scale / 2), 2 * round(w * scale / 2))
    conv = nvdec.Yuv420ToRgb(w, h, first.format.name, (dh, dw), first.colorspace, first.color_range)
    got = np.stack([conv(*p) for p in planes])
    ref = _decord(clips[name], list(range(len(planes))), dh, dw, h, w)
    assert got.shape == ref.shape == (len(planes), dh, dw, 3)
    assert np.array_equal(got, ref), f"{name} {scale}: max |diff| {np.abs(got.astype(int) - ref).max()}"


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("scale", [1.0, 0.6])
def test_conversion_equals_ffmpeg_cli(clips, name, scale):
    """The same frames as the ffmpeg binary's ``scale=W:H`` with ``-sws_flags bilinear`` (vf_scale's default flags
    in decord's FFmpeg 4.1) and ``-pix_fmt rgb24``: an independent reference (FFmpeg 9's swscale) for the
    conversion. (Its own default, bicubic, differs at reduced sizes: mean 0.6-1.3, max 49-56 on these clips.)"""
    planes, first = _planes(clips[name], 6)
    h, w = first.height, first.width
    dh, dw = (h, w) if scale == 1.0 else (2 * round(h * scale / 2), 2 * round(w * scale / 2))
    raw = subprocess.run([ffmpeg_exe(), "-v", "error", "-i", str(clips[name]), "-sws_flags", "bilinear", "-vf",
                          f"scale={dw}:{dh}", "-frames:v", "6", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                         capture_output=True, check=True).stdout
    cli = np.frombuffer(raw, np.uint8).reshape(-1, dh, dw, 3)
    conv = nvdec.Yuv420ToRgb(w, h, first.format.name, (dh, dw), first.colorspace, first.color_range)
    assert np.array_equal(np.stack([conv(*p) for p in planes]), cli)


def test_colour_tags_matter(clips):
    """The BT.709 tag changes the conversion (so the test above would catch a converter ignoring it): converting
    the BT.709 clip's planes as untagged (BT.601) differs from decord."""
    planes, first = _planes(clips["h264_320x180_bt709.mp4"], 2)
    assert first.colorspace == 1   # AVCOL_SPC_BT709
    conv = nvdec.Yuv420ToRgb(first.width, first.height, "yuv420p", (first.height, first.width), 2, 0)
    ref = _decord(clips["h264_320x180_bt709.mp4"], [0, 1], first.height, first.width, first.height, first.width)
    assert not np.array_equal(np.stack([conv(*p) for p in planes]), ref)


def test_nv12_planes_split():
    """An NV12 surface of a 4x6 frame: 4 luma rows, then 2 rows of interleaved U, V (padded to 8 columns)."""
    surf = np.zeros((6, 8), np.uint8)
    surf[:4, :6] = np.arange(24).reshape(4, 6)
    surf[4:, :6] = [[100, 200, 101, 201, 102, 202], [103, 203, 104, 204, 105, 205]]
    y, u, v = nvdec.nv12_planes(surf, 4, 6)
    assert np.array_equal(y, np.arange(24).reshape(4, 6))
    assert np.array_equal(u, [[100, 101, 102], [103, 104, 105]])
    assert np.array_equal(v, [[200, 201, 202], [203, 204, 205]])
    with pytest.raises(nvdec.NvdecError, match="does not hold"):
        nvdec.nv12_planes(surf[:5], 4, 6)


def test_split_runs():
    idx = list(range(0, 100, 2))   # 50 frames
    assert nvdec.split_runs(idx, 1) == [idx]
    runs = nvdec.split_runs(idx, 4, min_frames=10)
    assert [len(r) for r in runs] == [12, 13, 12, 13] and sum(runs, []) == idx
    assert nvdec.split_runs(idx, 7, min_frames=16) == [idx[:16], idx[16:33], idx[33:]]   # 50 // 16 = 3 runs: 0, 16, 33, 50
    assert nvdec.split_runs(idx[:5], 4) == [idx[:5]]


def test_split_runs_at_periods():
    """50 sampled frames, 5 per IDR period (periods 0..9): split_runs' cuts 12 / 25 / 37 move to the nearest period
    starts 10 / 25 / 35; one period gives one run; cuts that meet merge; out-of-order periods keep the plain
    cuts."""
    idx = list(range(0, 100, 2))
    period = [k // 5 for k in range(50)]
    runs = nvdec.split_runs_at_periods(idx, period, 4, min_frames=10)
    assert [len(r) for r in runs] == [10, 15, 10, 15] and sum(runs, []) == idx
    assert all(len({period[idx.index(i)] for i in r} & {period[idx.index(i)] for i in s}) == 0
               for r, s in zip(runs, runs[1:]))
    assert nvdec.split_runs_at_periods(idx, [0] * 50, 4, min_frames=10) == [idx]
    two = [0] * 40 + [1] * 10                                     # every cut snaps to 40: two runs
    assert [len(r) for r in nvdec.split_runs_at_periods(idx, two, 4, min_frames=10)] == [40, 10]
    shuffled = period[:]
    shuffled[3], shuffled[7] = shuffled[7], shuffled[3]
    assert nvdec.split_runs_at_periods(idx, shuffled, 4, min_frames=10) == nvdec.split_runs(idx, 4, min_frames=10)
    with pytest.raises(ValueError, match="3 periods for 50"):
        nvdec.split_runs_at_periods(idx, [0, 0, 0], 4)


@pytest.mark.parametrize("name, reason", [
    ("mpeg4_320x240.mp4", "codec mpeg4: its decoding is not bit-exact"),
    ("h264_yuv444_160x120.mp4", "pixel format yuv444p"),
    ("vp9_161x121.webm", "odd size 161x121"),
])
def test_unsupported_reasons(clips, name, reason):
    """Files NVDEC must not decode (they would not give the CPU path's frames) are named with the reason, before
    any GPU is asked, and read_nvdec refuses them naming the file."""
    assert nvdec.nvdec_unsupported(clips[name]).startswith(reason)
    with pytest.raises(nvdec.NvdecError, match=name):
        nvdec.read_nvdec(clips[name], [0], (120, 160))


def test_unreadable_file_reason(tmp_path):
    bad = tmp_path / "garbage.mp4"
    bad.write_bytes(b"\x00not a video" * 100)
    assert "cannot probe" in nvdec.nvdec_unsupported(bad)


def test_decord_first_is_refused(tmp_path):
    """decord imported before PyNvVideoCodec makes PyNvVideoCodec's demuxer segfault (H200, 2.2.4): the module
    then refuses NVDEC for the process (a reason, not a crash). The package must be there for that reason to be
    the one given (a stand-in package here, never imported); where it is not, the reason says so."""
    import importlib.util

    (tmp_path / "PyNvVideoCodec").mkdir()
    (tmp_path / "PyNvVideoCodec" / "__init__.py").write_text("raise ImportError('the stand-in was imported')\n")
    code = ("import importlib, sys; sys.path.insert(0, '.'); import decord; from datamodules.decode import nvdec, "
            "nvdec_plan; print(nvdec_plan._nvc_or_reason()); sys.path.insert(0, {!r}); importlib.invalidate_caches(); "
            "print(nvdec.nvdec_unsupported('x.mp4') or '', nvdec_plan._nvc_or_reason())")
    out = subprocess.run([sys.executable, "-c", code.format(str(tmp_path))], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert "decord was imported before PyNvVideoCodec" in out[-1] and "stand-in" not in out[-1]
    if importlib.util.find_spec("PyNvVideoCodec") is None:   # this machine: the reason is the missing package
        assert "PyNvVideoCodec is not installed" in out[0] and "decord was imported" not in out[0]


@pytest.mark.parametrize("given, seen", [(None, "ERROR"), ("WARN", "WARN")])
def test_nvc_logger_level_set_before_import(tmp_path, monkeypatch, given, seen):
    """PyNvVideoCodec's console logger reads ``LOGGER_LEVEL``: the import sets ``ERROR`` where it is unset (its
    WARN lines, one per WebM session, carry nothing a run acts on) and keeps a user's value. A stand-in package
    (first on the path) records what it found at its own import; the process's environment, which the decode
    workers inherit, keeps it."""
    from datamodules.decode import nvdec_plan

    (tmp_path / "PyNvVideoCodec").mkdir()
    (tmp_path / "PyNvVideoCodec" / "__init__.py").write_text("import os\nSEEN = os.environ.get('LOGGER_LEVEL')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LOGGER_LEVEL", "x")      # (so that the teardown restores the variable's first state)
    if given is None:
        monkeypatch.delenv("LOGGER_LEVEL")
    else:
        monkeypatch.setenv("LOGGER_LEVEL", given)
    held = sys.modules.pop("PyNvVideoCodec", None)
    try:
        stand_in = nvdec_plan._import_nvc()
        assert (stand_in.__file__, stand_in.SEEN, os.environ["LOGGER_LEVEL"]) == (
            str(tmp_path / "PyNvVideoCodec" / "__init__.py"), seen, seen)
    finally:
        sys.modules.pop("PyNvVideoCodec", None)
        if held is not None:
            sys.modules["PyNvVideoCodec"] = held


def test_fallback_records_why(clips):
    """read_with_fallback sends what NVDEC cannot decode exactly to the CPU reader, with the reason."""
    calls = []

    def cpu(path, idx, hw):
        calls.append((path, idx, hw))
        return np.zeros((len(idx), *hw, 3), np.uint8)

    frames, used, why = nvdec.read_with_fallback(clips["mpeg4_320x240.mp4"], [0, 3], (240, 320), cpu)
    assert used == "cpu" and why.startswith("codec mpeg4") and frames.shape == (2, 240, 320, 3)
    assert calls == [(clips["mpeg4_320x240.mp4"], [0, 3], (240, 320))]


# ---------------------------------------------------------------------------------------------- GPU (opt-in)

def _nvdec_ready() -> bool:
    return not isinstance(nvdec._nvc(), str) and __import__("torch").cuda.is_available()


@pytest.mark.gpu
@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("scale, sessions", [(1.0, 1), (0.6, 3)])
def test_read_nvdec_equals_decord(clips, name, scale, sessions):
    """NVDEC + decord's swscale == decord, byte for byte, on every sampled frame (native and reduced sizes, one
    and several sessions)."""
    if not _nvdec_ready():
        pytest.skip(f"NVDEC not usable here: {nvdec._nvc()}")
    assert nvdec.nvdec_unsupported(clips[name]) is None
    p = nvdec.probe(clips[name])
    h, w = p.height, p.width
    dh, dw = (h, w) if scale == 1.0 else (2 * round(h * scale / 2), 2 * round(w * scale / 2))
    idx = list(range(0, 24, 1))
    got = nvdec.read_nvdec(clips[name], idx, (dh, dw), sessions=sessions)
    ref = _decord(clips[name], idx, dh, dw, h, w)
    assert np.array_equal(got, ref), f"{name}: max |diff| {np.abs(got.astype(int) - ref).max()}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["h264_642x362.mp4", "h264_320x180_bt709.mp4", "h264_jpeg_256x144.mp4",
                                  "hevc_320x240.mp4"])
@pytest.mark.parametrize("scale", [1.0, 0.6])
def test_read_nvdec_packet_filter_equals_decord(clips, name, scale):
    """NVDEC fed only the packets the sampled frames need (``nvdec_skip_nonref``, the default) == decord, byte
    for byte; the session is the packet-fed one (no SimpleDecoder fallback) and frames were skipped; with the
    filter off, SimpleDecoder gives the same frames."""
    if not _nvdec_ready():
        pytest.skip(f"NVDEC not usable here: {nvdec._nvc()}")
    p = nvdec.probe(clips[name])
    h, w = p.height, p.width
    dh, dw = (h, w) if scale == 1.0 else (2 * round(h * scale / 2), 2 * round(w * scale / 2))
    idx = [1, 5, 11, 14, 23]
    stats: dict = {}
    got = nvdec.read_nvdec(clips[name], idx, (dh, dw), sessions=1, stats=stats)
    ref = _decord(clips[name], idx, dh, dw, h, w)
    assert stats["skip"] is None, stats
    assert [r["path"] for r in stats["runs"]] == ["packets"], stats["runs"]
    assert np.array_equal(got, ref), f"{name}: max |diff| {np.abs(got.astype(int) - ref).max()}"
    assert 0 < stats["frames_skipped"] < stats["packets"]
    off: dict = {}
    full = nvdec.read_nvdec(clips[name], idx, (dh, dw), sessions=1, stats=off, nvdec_skip_nonref=False)
    assert np.array_equal(full, ref) and [r["path"] for r in off["runs"]] == ["simple"]


@pytest.mark.parametrize("name", ["h264_642x362.mp4", "h264_320x180_bt709.mp4", "h264_jpeg_256x144.mp4",
                                  "hevc_320x240.mp4"])
def test_packet_filter_cpu_twin(clips, name):
    """The CPU twin of the GPU case above: on the same clips and indices, FFmpeg's software decoder fed only the
    kept packets gives the full decode's planes, and frames are skipped (so the GPU case's count is not empty)."""
    from datamodules.decode import packet_filter as pf

    idx = [1, 5, 11, 14, 23]
    stats: dict = {}
    assert pf.decode_planes_pyav(str(clips[name]), idx, stats=stats) == \
        pf.decode_planes_pyav(str(clips[name]), idx, skip=False)
    assert 0 < stats["skipped"] < stats["packets"]


class _FakeNvc:
    """PyNvVideoCodec's packet API played by FFmpeg's software decoder (PyAV), to run the packet-fed session's
    control flow on the CPU: ``CreateDemuxer`` yields the container's packets (``pts``, ``bsl``) then an empty
    end-of-stream packet; ``PyNvDecoder(...).Decode`` decodes one and returns NV12 surfaces with ``getPTS``."""

    class OutputColorType:
        NATIVE = 0

    def __init__(self, pts_shift: int = 0):
        self.fed, self.pts_shift = 0, pts_shift

    def CreateDemuxer(self, path):  # noqa: N802 - PyNvVideoCodec's names
        import av
        from types import SimpleNamespace

        fake = self
        container = av.open(str(path))
        stream = container.streams.video[0]

        class Demuxer:
            def GetNvCodecId(self):  # noqa: N802
                return stream.codec_context

            def __iter__(self):
                for pk in container.demux(stream):
                    if pk.size:
                        yield SimpleNamespace(pts=pk.pts + fake.pts_shift, bsl=pk.size, av=pk)
                yield SimpleNamespace(pts=0, bsl=0, av=None)

        return Demuxer()

    def PacketData(self):  # noqa: N802
        from types import SimpleNamespace

        return SimpleNamespace(pts=0, bsl=0, av=None)

    def PyNvDecoder(self, gpuid, codec, cudacontext, cudastream, usedevicememory, outputColorType):  # noqa: N802, N803
        import torch

        fake = self

        class Surface:
            def __init__(self, f):
                y, u, v = (np.frombuffer(memoryview(pl).cast("B"), np.uint8).reshape(pl.height, pl.line_size)
                           [:, : pl.width] for pl in f.planes)
                uv = np.stack([u, v], axis=-1).reshape(u.shape[0], -1)
                self.t, self.pts = torch.from_numpy(np.ascontiguousarray(np.concatenate([y, uv]))), f.pts

            def __dlpack__(self, **kw):
                return self.t.__dlpack__(**kw)

            def __dlpack_device__(self):
                return self.t.__dlpack_device__()

            def getPTS(self):  # noqa: N802
                return self.pts

        class Decoder:
            def Decode(self, packet):  # noqa: N802
                fake.fed += packet.bsl > 0
                return [Surface(f) for f in codec.decode(packet.av)]

        return Decoder()


@pytest.mark.parametrize("name", ["h264_642x362.mp4", "hevc_320x240.mp4"])
def test_packet_session_control_flow_on_cpu(clips, name, monkeypatch):
    """The packet-fed session (``_decode_run_packets``) with PyNvVideoCodec played by PyAV: the frames equal
    decord's, exactly the kept packets are fed, and a demuxer whose packets' pts differ from the scan's is an
    NvdecError (the run then falls back to SimpleDecoder), not a wrong frame."""
    import contextlib

    import torch

    from datamodules.decode import packet_filter as pf

    monkeypatch.setattr(torch.cuda, "device", lambda _gpu: contextlib.nullcontext())
    fake = _FakeNvc()
    monkeypatch.setattr(nvdec, "_nvc", lambda: fake)
    p = nvdec.probe(clips[name])
    run = [1, 5, 11, 14, 23]
    conv = nvdec.Yuv420ToRgb(p.width, p.height, p.pix_fmt, (p.height, p.width), p.colorspace, p.color_range)
    out = np.zeros((len(run), p.height, p.width, 3), np.uint8)
    scan = pf.scan(str(clips[name]))
    t0 = time.perf_counter()
    info = nvdec._decode_run_packets(str(clips[name]), run, 0, p, conv, out, 0, scan)
    elapsed = time.perf_counter() - t0
    assert np.array_equal(out, _decord(clips[name], run, p.height, p.width, p.height, p.width))
    assert info["path"] == "packets" and fake.fed == info["kept"] < info["packets"] == len(scan.pts)
    assert 0 <= info["first_frame_s"] <= elapsed   # the session's start to its first wanted frame
    monkeypatch.setattr(nvdec, "_nvc", lambda: _FakeNvc(pts_shift=1))
    with pytest.raises(nvdec.NvdecError, match="demuxer packet 0 has pts"):
        nvdec._decode_run_packets(str(clips[name]), run, 0, p, conv, out, 0, scan)


def test_read_nvdec_stats_with_packet_sessions_on_cpu(clips, monkeypatch):
    """read_nvdec with the packet filter on (the default), PyNvVideoCodec played by PyAV: decord's frames at a
    reduced size, one packet-fed run, and the skipped-frame count = the stream's packets - the packets fed."""
    import contextlib

    import torch

    monkeypatch.setattr(torch.cuda, "device", lambda _gpu: contextlib.nullcontext())
    fake = _FakeNvc()
    monkeypatch.setattr(nvdec, "_nvc", lambda: fake)
    name = "h264_642x362.mp4"
    idx = [0, 7, 12, 13, 29]
    stats: dict = {}
    got = nvdec.read_nvdec(clips[name], idx, (218, 386), stats=stats)
    assert np.array_equal(got, _decord(clips[name], idx, 218, 386, 362, 642))
    assert stats["skip"] is None and [r["path"] for r in stats["runs"]] == ["packets"]
    assert stats["packets"] == 30 and stats["frames_fed"] == fake.fed
    assert stats["frames_skipped"] == 30 - fake.fed > 0


class _FakeNvcSimple(_FakeNvc):
    """:class:`_FakeNvc` plus ``SimpleDecoder``: NVDEC decoding whatever it is given without a word, played by grey
    NV12 surfaces (``len`` = the container's frames), as NVDEC returns its own concealment of a damaged picture
    unflagged (PyNvVideoCodec 2.2.4 reports no decode status; module ``nvdec``)."""

    def SimpleDecoder(self, path, gpu_id=0, use_device_memory=True, output_color_type=None):  # noqa: N802
        import torch

        p = nvdec.probe(path)

        class Decoder:
            def __len__(self):
                return p.frames

            def get_batch_frames_by_index(self, run):
                return [torch.full((p.height * 3 // 2, p.width), 128, dtype=torch.uint8) for _ in run]

        return Decoder()


def _damaged(src: Path, dst: Path, start: int | float, stop: int | None = None, packet: int = 0) -> Path:
    """``src`` with the bytes ``start..stop`` of its video packet ``packet`` (decode order; ``start`` a float: that
    fraction of the packet; ``stop`` default: the packet's end) replaced by random bytes (``random.Random(3)``, as
    ``test_decode_paths._damaged_idr``)."""
    import random

    import av

    data = bytearray(src.read_bytes())
    with av.open(str(src)) as c:
        pk = [p for p in c.demux(video=0) if p.size][packet]
    start = int(pk.size * start) if isinstance(start, float) else start
    stop = pk.size if stop is None else stop
    rng = random.Random(3)
    for i in range(pk.pos + start, pk.pos + stop):
        data[i] = rng.randrange(256)
    dst.write_bytes(bytes(data))
    return dst


def _pyav_h264(path: Path, n: int = 32, fps: int = 8, width: int = 128, height: int = 96, gop: int = 8) -> Path:
    """An H.264 mp4 made with PyAV's libx264 (the GPU machine has no ffmpeg binary): ``n`` frames of a moving
    colour gradient at ``fps``, a key frame every ``gop`` frames, no B-frames (packet ``j`` is frame ``j``)."""
    from fractions import Fraction

    import av

    yy, xx = np.mgrid[0:height, 0:width]
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=Fraction(fps, 1))
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"preset": "veryfast", "crf": "23",
                     "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0"}
        for k in range(n):
            rgb = np.stack([(2 * xx + 5 * k) % 256, (2 * yy + 3 * k) % 256, (xx + yy + 7 * k) % 256], -1)
            for pkt in s.encode(av.VideoFrame.from_ndarray(rgb.astype(np.uint8), format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)
    return path


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict[str, Path]:
    """The corrupt clips of the CPU readers' tests (64x48 H.264, 4 s at 8 fps, GOP 8 as ``media_factory``'s
    ``good``) and the flags the CPU path gives them at budget 1024 (hand-checked against seed 001's ffmpeg command
    in tests/datamodules/test_bad_media.py and test_decode_paths.py): ``corrupt_middle`` [1, 2], the first IDR's
    slice data overwritten from byte 800 [0] (concealed), from byte 40 [0] (its NAL length destroyed: refused)."""
    from tests.media_factory import MediaFactory

    media = MediaFactory(tmp_path_factory.mktemp("nvdec_broken"))
    good = media.get("good")
    return {"good": good, "corrupt_middle": media.get("corrupt_middle"),
            "idr_800": _damaged(good, media.root / "idr_800.mp4", 800),
            "idr_40": _damaged(good, media.root / "idr_40.mp4", 40)}


def _fake_nvdec(monkeypatch, fake=None):
    """PyNvVideoCodec played by :class:`_FakeNvcSimple` and every file taken by the NVDEC reader (no GPU here)."""
    import contextlib

    import torch

    monkeypatch.setattr(torch.cuda, "device", lambda _gpu: contextlib.nullcontext())
    monkeypatch.setattr(nvdec, "_nvc", lambda: fake or _FakeNvcSimple())
    monkeypatch.setattr(nvdec.reader, "supports", lambda probe, path: None)


def test_damaged_packet_sends_the_file_to_the_cpu_reader(broken, monkeypatch):
    """Issue 42 item 1, the one damage the NVDEC path sees for free: a packet whose NAL unit lengths contradict its
    size (found by the packet scan it already makes) is an NvdecError, so the file is read by the CPU reader, with
    the CPU path's frames and concealment flags (``corrupt_middle``: [1, 2], hand-known above), instead of NVDEC's
    unflagged concealment (the fake's grey frames, which the SimpleDecoder fallback of a failed scan gave before).
    (``idr_40``, whose first packet is refused, already goes to the CPU: NVDEC's probe cannot decode its first
    frame.)"""
    from datamodules.decode import decode_video

    path, flags = broken["corrupt_middle"], [1, 2]
    assert "cannot probe" in nvdec.nvdec_unsupported(broken["idr_40"])
    _fake_nvdec(monkeypatch)
    with pytest.raises(nvdec.NvdecError, match=r"runs past the packet's \d+ bytes \(damaged stream: read on the CPU"):
        nvdec.read_nvdec(path, [7, 15], (48, 64))
    dec = decode_video(path, 1024, decoder="nvdec")
    ref = decode_video(path, 1024)
    assert dec.info["decoder"] == ref.info["decoder"] == "pyav_skip"
    assert dec.info["frames_concealed"] == ref.info["frames_concealed"] == flags
    assert "damaged stream" in dec.info["decoder_fallback"] and "concealment_checked" not in dec.info
    assert np.array_equal(dec.frames.numpy(), ref.frames.numpy())


def test_nvdec_frames_are_recorded_unchecked(broken, monkeypatch):
    """What the NVDEC path cannot see (issue 42 item 1: PyNvVideoCodec reports no decode status): damage inside
    slice data passes the packet scan, so NVDEC's frames come back unflagged, and the record says so
    (``concealment_checked: False``) where the CPU path lists frame 0 as concealed; an undamaged file decoded by
    the packet-fed session (played by FFmpeg's decoder) gives the CPU path's frames, also marked unchecked."""
    from datamodules.decode import decode_video

    _fake_nvdec(monkeypatch)
    dec = decode_video(broken["idr_800"], 1024, decoder="nvdec")
    assert dec.info["decoder"] == "nvdec" and dec.info["concealment_checked"] is False
    assert "frames_concealed" not in dec.info and "decoder_fallback" not in dec.info
    assert decode_video(broken["idr_800"], 1024).info["frames_concealed"] == [0]   # the CPU path's flag
    good = decode_video(broken["good"], 1024, decoder="nvdec")
    ref = decode_video(broken["good"], 1024)
    assert good.info["decoder"] == "nvdec" and good.info["concealment_checked"] is False
    assert np.array_equal(good.frames.numpy(), ref.frames.numpy()) and "concealment_checked" not in ref.info


@pytest.mark.gpu
def test_damaged_clips_on_nvdec(tmp_path):
    """On the GPU (issue 42 item 1), clips made with PyAV's encoder (128x96, 4 s at 8 fps, GOP 8; at budget 1024
    the sampled frames are native 7, 15, 23, 31) and damaged in the packet of native frame 12 (a P picture of the
    GOP holding native 15):

    * its NAL length prefix destroyed: the packet scan refuses it, so ``decoder: nvdec`` reads the file on the CPU:
      the CPU path's frames and flags exactly (position 1, native 15, listed), the reason recorded;
    * its second half (slice data: one slice NAL unit) overwritten: the scan passes; NVDEC either decodes it, and
      the record then lists nothing and says ``concealment_checked: False`` (PyNvVideoCodec reports no decode
      status), or fails on it, and the file is the CPU path's as above. The CPU path itself lists position 1
      (checked on the CPU by ``test_damaged_clip_flags_on_the_cpu``)."""
    from datamodules.decode import decode_video

    if not _nvdec_ready():
        pytest.skip(f"NVDEC not usable here: {nvdec._nvc()}")
    good = _pyav_h264(tmp_path / "good.mp4")
    assert nvdec.nvdec_unsupported(good) is None
    clean = decode_video(good, 1024, decoder="nvdec")
    assert clean.info["decoder"] == "nvdec" and clean.info["concealment_checked"] is False
    assert np.array_equal(clean.frames.numpy(), decode_video(good, 1024).frames.numpy())
    length = _damaged(good, tmp_path / "length.mp4", 0, 4, packet=12)
    dec, ref = decode_video(length, 1024, decoder="nvdec"), decode_video(length, 1024)
    assert dec.info["decoder"] == ref.info["decoder"] and "damaged stream" in dec.info["decoder_fallback"]
    assert dec.info["frames_concealed"] == ref.info["frames_concealed"] and 1 in ref.info["frames_concealed"]
    assert np.array_equal(dec.frames.numpy(), ref.frames.numpy())
    sliced = _damaged(good, tmp_path / "slice.mp4", 0.5, packet=12)
    dec, ref = decode_video(sliced, 1024, decoder="nvdec"), decode_video(sliced, 1024)
    assert 1 in ref.info["frames_concealed"]
    if dec.info["decoder"] == "nvdec":
        assert dec.info["concealment_checked"] is False and "frames_concealed" not in dec.info
        assert np.array_equal(dec.frames.numpy()[[0]], ref.frames.numpy()[[0]])   # native 7: GOP 0, undamaged
    else:
        assert dec.info["decoder"] == ref.info["decoder"] and "decoder_fallback" in dec.info
        assert dec.info["frames_concealed"] == ref.info["frames_concealed"]
        assert np.array_equal(dec.frames.numpy(), ref.frames.numpy())


def test_damaged_clip_flags_on_the_cpu(tmp_path, monkeypatch):
    """The CPU half of ``test_damaged_clips_on_nvdec`` (the clips it makes, the CPU path's flags it relies on), with
    NVDEC played by :class:`_FakeNvcSimple`: the length-damaged clip goes to the CPU reader with the CPU path's
    flags (position 1, native 15); the slice-damaged one passes the scan, so its NVDEC record is unchecked."""
    from datamodules.decode import decode_video

    good = _pyav_h264(tmp_path / "good.mp4")
    length = _damaged(good, tmp_path / "length.mp4", 0, 4, packet=12)
    sliced = _damaged(good, tmp_path / "slice.mp4", 0.5, packet=12)
    refs = {p.name: decode_video(p, 1024) for p in (length, sliced)}
    assert [refs[k].info["frames_concealed"] for k in ("length.mp4", "slice.mp4")] == [[1], [1]]
    _fake_nvdec(monkeypatch)
    dec = decode_video(length, 1024, decoder="nvdec")
    assert "damaged stream" in dec.info["decoder_fallback"] and dec.info["frames_concealed"] == [1]
    assert np.array_equal(dec.frames.numpy(), refs["length.mp4"].frames.numpy())
    dec = decode_video(sliced, 1024, decoder="nvdec")
    assert dec.info["decoder"] == "nvdec" and dec.info["concealment_checked"] is False
    assert "frames_concealed" not in dec.info


def test_conversion_pool_off_the_sessions_equals_decord(clips, monkeypatch):
    """read_nvdec with two packet-fed sessions handing their surfaces to three conversion threads
    (:class:`ConvertPool`, at most 2 surfaces pending): decord's frames, byte for byte, at every index; the
    conversion seconds are reported apart from the sessions'."""
    import contextlib

    import torch

    monkeypatch.setattr(torch.cuda, "device", lambda _gpu: contextlib.nullcontext())
    monkeypatch.setattr(nvdec, "_nvc", lambda: _FakeNvc())
    monkeypatch.setattr(nvdec, "MIN_SEGMENT_FRAMES", 2)
    monkeypatch.setattr(nvdec, "split_runs_at_periods", lambda idx, period, sessions: nvdec.split_runs(idx, 2, 2))
    name = "h264_642x362.mp4"
    idx = [0, 3, 7, 12, 13, 20, 29]
    stats: dict = {}
    got = nvdec.read_nvdec(clips[name], idx, (218, 386), sessions=2, stats=stats, convert_threads=3)
    assert np.array_equal(got, _decord(clips[name], idx, 218, 386, 362, 642))
    assert [r["frames"] for r in stats["runs"]] == [3, 4] and stats["convert_s"] > 0


def test_conversion_pool_bounds_pending_and_raises():
    """ConvertPool: ``put`` blocks once ``max_pending`` surfaces wait (host memory bounded), every frame lands in
    its own row whatever the thread order, and a conversion's error comes out of ``finish``."""
    import threading

    gate = threading.Event()

    class Conv:
        def __call__(self, y, u, v):
            gate.wait(5)
            if y[0, 0] == 255:
                raise ValueError("bad frame")
            return np.full((2, 2, 3), y[0, 0], np.uint8)

        def close(self):
            pass

    out = np.zeros((6, 2, 2, 3), np.uint8)
    pool = nvdec.ConvertPool(Conv, 2, 2, out, threads=2, max_pending=2)
    surf = [np.full((3, 2), k, np.uint8) for k in range(6)]   # NV12 of 2x2: 2 luma rows + 1 chroma row
    pool.put(surf[0], 5)
    pool.put(surf[1], 4)
    blocked = threading.Thread(target=pool.put, args=(surf[2], 3))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()            # a third surface waits for a slot
    gate.set()
    blocked.join(5)
    for k in (3, 4, 5):
        pool.put(surf[k], 5 - k)
    pool.finish()
    assert [int(out[i, 0, 0, 0]) for i in range(6)] == [5, 4, 3, 2, 1, 0]
    pool = nvdec.ConvertPool(Conv, 2, 2, out, threads=1)
    pool.put(np.full((3, 2), 255, np.uint8), 0)
    with pytest.raises(ValueError, match="bad frame"):
        pool.finish()


if __name__ == "__main__":   # write the clips for a machine without ffmpeg: python -m tests.datamodules.test_nvdec DIR
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    for clip, (source, arguments) in CLIPS.items():
        subprocess.run([ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i", source, "-t", "1", *arguments,
                        str(dest / clip)], check=True)
    print(f"{len(CLIPS)} clips -> {dest}")


def test_check_and_read_probe_once_and_caps_once_per_kind(clips, monkeypatch):
    """The capability check asks PyNvVideoCodec's limits once per (GPU, codec, pixel format) in a process, not per
    video (no demuxer opened per file), and a file's PyAV probe is made once for the check and the read."""
    import torch

    from datamodules.decode import nvdec_plan

    asked, opened = [], []

    class Nvc:
        def CreateDemuxer(self, path):  # noqa: N802 - PyNvVideoCodec's names
            opened.append(path)
            return type("D", (), {"GetNvCodecId": lambda s: 4, "ChromaFormat": lambda s: 1, "BitDepth": lambda s: 8})()

        def GetDecoderCaps(self, gpu, codec, chroma, depth):  # noqa: N802
            asked.append((gpu, codec, chroma, depth))
            return {"supported": True, "width_min": 48, "width_max": 4096, "height_min": 16, "height_max": 4096,
                    "mb_num_max": 65536}

    monkeypatch.setattr(nvdec_plan, "_nvc", lambda: Nvc())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(nvdec_plan, "_CAPS", {})
    monkeypatch.setattr(nvdec_plan, "_PROBES", {})
    probed = []
    real = nvdec_plan._probe_uncached
    monkeypatch.setattr(nvdec_plan, "_probe_uncached", lambda p: probed.append(str(p)) or real(p))
    a, b = clips["h264_642x362.mp4"], clips["h264_320x180_bt709.mp4"]
    assert nvdec.nvdec_unsupported(a) is None and nvdec.nvdec_unsupported(b) is None
    assert asked == [(0, 4, 1, 8)] and opened == [str(a)]
    assert nvdec.probe(a) is nvdec.probe(a) and probed == [str(a), str(b)]
    # a size outside the (cached) limits is still refused per file
    monkeypatch.setattr(nvdec_plan, "_CAPS", {(0, "h264", "yuv420p"): ({"supported": True, "width_min": 48,
                        "width_max": 400, "height_min": 16, "height_max": 4096, "mb_num_max": 65536}, None)})
    assert nvdec.nvdec_unsupported(a).startswith("size 642x362 outside NVDEC's 48..400")
    assert nvdec.nvdec_unsupported(b) is None
