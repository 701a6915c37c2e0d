"""The packet filter (``datamodules/decode/packet_filter.py``): NAL classification on hand-built bytes, the
needed-packet rule on hand-built GOPs, and exactness on real encodes: FFmpeg's software decoder (PyAV) fed only the
kept packets gives the sampled frames' planes byte for byte as a full decode does (x264 with 3 B-frames and
b-pyramid, GOP 60 / 250, closed and open GOP; x265 with B-frames, closed GOP, open GOP (CRA) and temporal layers).

The classification is also checked against FFmpeg's own: with ``skip_frame=NONREF`` its decoder drops exactly the
H.264 pictures with ``nal_ref_idc == 0`` and the HEVC sub-layer non-reference types, so the frames it still outputs
are the reference packets :func:`reference_flags` counts (HEVC with temporal layers: ours keeps, on top, the
non-reference pictures below the highest sub-layer, which a higher layer may predict from).
"""
from __future__ import annotations

import subprocess

import pytest

from datamodules.decode import packet_filter as pf
from tests.media_factory import ffmpeg_exe

X264 = "bframes=3:b-pyramid=normal:scenecut=0"
# name: (lavfi source, seconds, encoder arguments)
CLIPS = {
    "h264_g60_closed.mp4": ("testsrc2=size=128x72:rate=25", 14,
                            ["-c:v", "libx264", "-x264-params", f"{X264}:keyint=60:min-keyint=60"]),
    "h264_g60_open.mp4": ("testsrc2=size=128x72:rate=25", 14,
                          ["-c:v", "libx264", "-x264-params", f"{X264}:keyint=60:min-keyint=60:open-gop=1"]),
    "h264_g250_closed.mp4": ("testsrc2=size=128x72:rate=30", 20,
                             ["-c:v", "libx264", "-x264-params", f"{X264}:keyint=250:min-keyint=250"]),
    "hevc_g60_closed.mp4": ("testsrc2=size=128x72:rate=25", 12,
                            ["-c:v", "libx265", "-x265-params",
                             "log-level=error:bframes=4:keyint=60:min-keyint=60:scenecut=0:open-gop=0"]),
    "hevc_g60_open.mp4": ("testsrc2=size=128x72:rate=25", 12,
                          ["-c:v", "libx265", "-x265-params", "log-level=error:bframes=4:keyint=60"]),
    "hevc_temporal_layers.mp4": ("testsrc2=size=128x72:rate=25", 12,
                                 ["-c:v", "libx265", "-x265-params",
                                  "log-level=error:bframes=4:keyint=60:temporal-layers=3:b-pyramid=1"]),
}


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    out = tmp_path_factory.mktemp("packet_filter")
    for name, (src, secs, args) in CLIPS.items():
        subprocess.run([ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i", src, "-t", str(secs), "-pix_fmt",
                        "yuv420p", *args, str(out / name)], check=True)
    return {name: out / name for name in CLIPS}


# --------------------------------------------------------------------------------------- hand-built byte strings

def test_nal_length_size_from_records():
    avcc = bytes([1, 0x64, 0, 0x1F, 0xFF, 0xE1]) + b"\x00\x04" + b"\x67\x64\x00\x1f"
    assert pf.nal_length_size("h264", avcc) == 4                      # 0xFF: lengthSizeMinusOne = 3
    assert pf.nal_length_size("h264", bytes([1, 0x64, 0, 0x1F, 0xFD, 0xE0])) == 2
    hvcc = bytes([1] + [0] * 20 + [0x0F] + [0])                        # byte 21 = ...11 -> 4 bytes
    assert pf.nal_length_size("hevc", hvcc) == 4
    assert pf.nal_length_size("hevc", bytes([1] + [0] * 20 + [0x0C, 0])) == 1
    assert pf.nal_length_size("h264", b"") is None
    assert pf.nal_length_size("h264", b"\x00\x00\x00\x01\x67\x64") is None   # Annex-B extradata
    with pytest.raises(pf.PacketFilterError, match="lengthSizeMinusOne = 2"):
        pf.nal_length_size("h264", bytes([1, 0x64, 0, 0x1F, 0xFE, 0xE0]))
    with pytest.raises(pf.PacketFilterError, match="not a version-1"):
        pf.nal_length_size("h264", bytes([2, 0x64, 0, 0x1F, 0xFF]))
    with pytest.raises(pf.PacketFilterError, match="codec vp9"):
        pf.nal_length_size("vp9", b"")


def test_nal_headers_length_prefixed_and_annexb():
    payload = b"\x00\x00\x00\x03\x06\x05\x80" + b"\x00\x00\x00\x02\x01\x9a" + b"\x00\x00\x00\x00"
    assert pf.nal_headers(payload, 4) == [b"\x06\x05", b"\x01\x9a"]   # a zero-length NAL is skipped
    assert pf.nal_headers(b"\x00\x01\x65" + b"\x00\x02\x41\x9a", 2) == [b"\x65", b"\x41\x9a"]
    annexb = b"\x00\x00\x00\x01\x09\xf0" + b"\x00\x00\x01\x65\x88\x84" + b"\x00\x00\x01\x01\x9e"
    assert pf.nal_headers(annexb, None) == [b"\x09\xf0", b"\x65\x88", b"\x01\x9e"]
    with pytest.raises(pf.PacketFilterError, match="runs past the packet's 6 bytes"):
        pf.nal_headers(b"\x00\x00\x00\x09\x65\x88", 4)


def _avcc(*nals: bytes) -> bytes:
    return b"".join(len(n).to_bytes(4, "big") + n for n in nals)


def test_classify_h264():
    # header byte: forbidden(1) nal_ref_idc(2) nal_unit_type(5)
    idr = pf.classify("h264", _avcc(b"\x65\x88"), 4)                   # ref_idc 3, type 5
    assert idr == pf.PacketKind(vcl=True, reference=True, idr=True, param_sets=False)
    b_nonref = pf.classify("h264", _avcc(b"\x06\x05", b"\x01\x9e"), 4)  # SEI + slice with ref_idc 0
    assert b_nonref == pf.PacketKind(vcl=True, reference=False, idr=False, param_sets=False)
    b_ref = pf.classify("h264", _avcc(b"\x21\x9e"), 4)                  # ref_idc 1 (a b-pyramid reference B)
    assert b_ref.reference and not b_ref.idr
    two_slices = pf.classify("h264", _avcc(b"\x01\x9e", b"\x41\x9e"), 4)   # one slice referenced: reference
    assert two_slices.reference
    params = pf.classify("h264", _avcc(b"\x67\x64", b"\x68\xee", b"\x01\x9e"), 4)
    assert params.param_sets and not params.reference
    assert not pf.classify("h264", _avcc(b"\x09\xf0"), 4).vcl         # an access unit delimiter alone


def _hevc(t: int, tid: int = 0) -> bytes:
    # forbidden(1) nal_unit_type(6) nuh_layer_id(6) nuh_temporal_id_plus1(3)
    return bytes([t << 1, tid + 1])


@pytest.mark.parametrize("t, reference, idr", [
    (0, False, False), (1, True, False), (2, False, False), (8, False, False), (9, True, False),
    (14, False, False), (19, True, True), (20, True, True), (21, True, False), (16, True, False),
])
def test_classify_hevc_types(t, reference, idr):
    """TRAIL_N 0, TRAIL_R 1, TSA_N 2, RASL_N 8, RASL_R 9, RSV_VCL_N14, IDR_W_RADL 19, IDR_N_LP 20, CRA 21,
    BLA_W_LP 16 (a BLA / CRA is not an IDR: RASL pictures after it predict from before it)."""
    k = pf.classify("hevc", _avcc(_hevc(t, 1)), 4)
    assert (k.vcl, k.reference, k.idr, k.temporal_id) == (True, reference, idr, 1)


def test_classify_hevc_param_sets_and_sei():
    k = pf.classify("hevc", _avcc(_hevc(32), _hevc(33), _hevc(34), _hevc(39), _hevc(0)), 4)
    assert k.param_sets and k.vcl and not k.reference
    assert not pf.classify("hevc", _avcc(_hevc(39)), 4).vcl          # prefix SEI alone


def test_reference_flags_temporal_layers():
    """A sub-layer non-reference picture below the highest TemporalId stays (a higher layer may predict from it);
    at the highest it goes; parameter sets and slice-less packets always stay."""
    k = pf.PacketKind
    kinds = [k(True, True, True, False, 0), k(True, False, False, False, 1), k(True, False, False, False, 2),
             k(True, True, False, False, 2), k(False, False, False, False, 0), k(True, False, False, True, 2)]
    assert pf.reference_flags(kinds) == [True, True, False, True, True, True]
    assert pf.reference_flags(kinds[:2]) == [True, False]             # now tid 1 is the highest


def test_needed_packets_hand_built():
    """Two closed GOPs, decode order ``I0 P3 b1 B2 | IDR4 P7 b5 b6`` (pts = the presentation index; B2 is a
    reference B, b1 / b5 / b6 are not)."""
    pts = [0, 3, 1, 2, 4, 7, 5, 6]
    ref = [True, True, False, True, True, True, False, False]
    idr = [True, False, False, False, True, False, False, False]
    assert pf.needed_packets(pts, ref, idr, [1]) == [True, True, True, False, False, False, False, False]
    assert pf.needed_packets(pts, ref, idr, [2]) == [True, True, False, True, False, False, False, False]
    assert pf.needed_packets(pts, ref, idr, [0]) == [True] + [False] * 7          # the tail after I0 is dropped
    assert pf.needed_packets(pts, ref, idr, [6]) == [False] * 4 + [True, True, False, True]   # GOP 1 skipped
    # frame 3 is P3 (decode position 1): the reference B2 after it in decode order is not needed
    assert pf.needed_packets(pts, ref, idr, [3, 4]) == [True, True, False, False, True, False, False, False]
    assert pf.needed_packets(pts, ref, idr, []) == [False] * 8
    # no IDR after the first: an open GOP's later I picture does not cut the stream
    assert pf.needed_packets(pts, ref, [True] + [False] * 7, [6]) == [True, True, False, True, True, True, False,
                                                                       True]
    with pytest.raises(pf.PacketFilterError, match="outside the stream's 8 frames"):
        pf.needed_packets(pts, ref, idr, [8])
    with pytest.raises(pf.PacketFilterError, match="not distinct"):
        pf.needed_packets([0, 0], [True, True], [True, False], [0])


# ------------------------------------------------------------------------------- exactness on real encodes (CPU)

def _patterns(n: int, fps: int) -> dict[str, list[int]]:
    return {"1_per_s": list(range(0, n, fps)), "sparse": list(range(3, n, 97)), "last": [n - 1],
            "mid_b": [fps + 1, fps + 2, 2 * fps + 3]}


@pytest.mark.parametrize("name", list(CLIPS))
def test_filtered_decode_equals_full_decode(clips, name):
    """The kept packets -> FFmpeg's software decoder == a full decode, plane bytes of every sampled frame, for
    every sampling pattern; every kept packet yields a frame, and frames are skipped."""
    scan = pf.scan(str(clips[name]))
    n = len(scan.pts)
    fps = int(CLIPS[name][0].rsplit("=", 1)[1])
    for label, idx in _patterns(n, fps).items():
        stats: dict = {}
        got = pf.decode_planes_pyav(str(clips[name]), idx, skip=True, stats=stats)
        ref = pf.decode_planes_pyav(str(clips[name]), idx, skip=False)
        assert got == ref, f"{name} {label}"
        assert stats["decoded"] == stats["kept"] and stats["packets"] == n
        assert stats["skipped"] == stats["skipped_nonref"] + stats["skipped_gop"] > 0, (label, stats)
    one_per_s = pf.decode_planes_pyav(str(clips[name]), _patterns(n, fps)["1_per_s"], stats=(st := {}))
    assert one_per_s and st["skipped_nonref"] > 0


@pytest.mark.parametrize("name", list(CLIPS))
def test_reference_count_equals_ffmpeg_nonref_skip(clips, name):
    """Our reference packets == the frames FFmpeg's decoder still outputs with ``skip_frame=NONREF`` (its own
    nal_ref_idc / sub-layer non-reference test); with temporal layers ours keeps more (the lower layers'
    non-reference pictures)."""
    import av

    scan = pf.scan(str(clips[name]))
    with av.open(str(clips[name])) as c:
        s = c.streams.video[0]
        s.codec_context.skip_frame = "NONREF"
        ffmpeg_kept = sum(1 for _ in c.decode(s))
    ours = sum(scan.reference)
    assert ours < len(scan.pts)
    if name == "hevc_temporal_layers.mp4":
        assert ours > ffmpeg_kept
    else:
        assert ours == ffmpeg_kept


def test_closed_gops_are_cut_at_idr(clips):
    """The closed-GOP clips have an IDR every 60 (250) packets; the open-GOP ones only the first."""
    assert [j for j, x in enumerate(pf.scan(str(clips["h264_g60_closed.mp4"])).idr) if x] == [0, 60, 120, 180,
                                                                                                240, 300]
    assert [j for j, x in enumerate(pf.scan(str(clips["h264_g250_closed.mp4"])).idr) if x] == [0, 250, 500]
    assert [j for j, x in enumerate(pf.scan(str(clips["h264_g60_open.mp4"])).idr) if x] == [0]
    assert [j for j, x in enumerate(pf.scan(str(clips["hevc_g60_open.mp4"])).idr) if x] == [0]


def test_periods_in_presentation_order(clips):
    """Closed GOPs of 60 (250): frame k lies in IDR period k // 60 (k // 250), in presentation order too (the
    B-frames shown just before an IDR are decoded before it); an open-GOP stream is one period."""
    for name, gop in (("h264_g60_closed.mp4", 60), ("h264_g250_closed.mp4", 250), ("hevc_g60_closed.mp4", 60)):
        periods = pf.scan(str(clips[name])).periods()
        assert periods == [k // gop for k in range(len(periods))], name
    assert set(pf.scan(str(clips["hevc_g60_open.mp4"])).periods()) == {0}


def test_dropping_a_needed_reference_changes_the_frame(clips):
    """The equality above can fail: feed the kept packets minus one reference picture that a sampled frame
    predicts from (the P picture right after the IDR) and that frame's planes differ from the full decode's."""
    import av

    path = str(clips["h264_g60_closed.mp4"])
    scan = pf.scan(path)
    idx = [30]
    keep, _ = scan.plan(idx)
    ordered = sorted(scan.pts)
    target = ordered[30]
    victim = next(j for j in range(1, len(keep)) if keep[j] and scan.reference[j] and scan.pts[j] != target)
    keep[victim] = False
    got = None
    with av.open(path) as c:
        s = c.streams.video[0]
        packets = [p for p in c.demux(s) if p.size]
        for p, k in zip(packets, keep):
            if k:
                for f in s.codec_context.decode(p):
                    got = pf._plane_bytes(f.planes[0]) if f.pts == target else got
        for f in s.codec_context.decode(None):
            got = pf._plane_bytes(f.planes[0]) if f.pts == target else got
    ref = pf.decode_planes_pyav(path, idx, skip=False)[0][0]
    assert got is not None and got != ref


def test_scan_errors_name_the_file(tmp_path, clips):
    bad = tmp_path / "garbage.mp4"
    bad.write_bytes(b"\x00not a video" * 50)
    with pytest.raises(pf.PacketFilterError, match="garbage.mp4: cannot demux"):
        pf.scan(str(bad))
    with pytest.raises(pf.PacketFilterError, match="outside the stream's"):
        pf.decode_planes_pyav(str(clips["hevc_g60_open.mp4"]), [10_000])
