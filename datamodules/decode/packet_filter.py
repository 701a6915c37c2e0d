"""Which compressed packets the sampled frames need: drop the rest before they reach a decoder (issue 31 §2).

Exact by construction: a frame's pixels depend only on the reference pictures it predicts from, so a decoder fed
the sampled frames' packets plus every reference picture before them (in decode order, back to the random access
point) outputs the sampled frames bit for bit as a full decode does. Two rules drop what no sampled frame needs:

1. **Non-reference pictures** that are not themselves sampled. H.264 (ITU-T H.264 §7.4.1): "nal_ref_idc equal to 0
   for a NAL unit containing a slice ... indicates that the slice ... is part of a non-reference picture", and a
   non-reference picture carries no ``dec_ref_pic_marking`` and does not advance ``frame_num`` (§7.4.3: the next
   picture's ``frame_num`` is ``PrevRefFrameNum + 1`` either way), so dropping it leaves every other picture's
   decoding unchanged. HEVC (ITU-T H.265 §7.4.2.2): the sub-layer non-reference types TRAIL_N, TSA_N, STSA_N,
   RADL_N, RASL_N, RSV_VCL_N10/12/14 (the even ``nal_unit_type`` values 0..14) are "not used for reference by
   pictures of the same sub-layer"; pictures of a *higher* sub-layer may still reference them, so one is dropped
   only when its ``TemporalId`` is the stream's highest (then nothing may reference it). Such a picture is also
   never ``prevTid0Pic`` (§8.3.1), so the picture order counts of the rest do not change.
2. **Whole closed GOPs, and the tail of a GOP.** An IDR picture (H.264 ``nal_unit_type`` 5; HEVC IDR_W_RADL 19 /
   IDR_N_LP 20) empties the decoded picture buffer: nothing after it in decode order predicts from anything before
   it. So the packets of an IDR period (an IDR up to the next IDR, in decode order) that holds no sampled frame are
   all dropped, and in a period that holds one, every packet after its last sampled frame (in decode order) is
   dropped. Open-GOP random access points (H.264 recovery-point I pictures, HEVC CRA / BLA) are not IDRs: RASL /
   leading pictures after them predict from the previous period, so the periods are cut at IDRs only.

Kept whatever the rules say: packets with parameter sets (SPS / PPS / VPS: later pictures may use them), packets
with no slice at all, and anything this module cannot parse (counted as reference). VP9 and other codecs are not
classified here (every packet is a reference: only rule 2's "after the last sampled frame" tail could apply, and
VP9's hidden / superframe packets do not map one to one onto shown frames, so the caller does not filter them).

The classification (:func:`nal_length_size`, :func:`nal_headers`, :func:`classify`, :func:`reference_flags`,
:func:`needed_packets`, :func:`plan`) is pure: bytes in, booleans out. :func:`scan` demuxes a file with PyAV (no
decoding) and classifies its packets; :mod:`datamodules.decode.nvdec` feeds the kept packets to NVDEC, and
:func:`decode_planes_pyav` feeds them to FFmpeg's software decoder (the CPU proof,
``tests/datamodules/test_packet_filter.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

H264_SLICE, H264_IDR, H264_SPS, H264_PPS = 1, 5, 7, 8
H264_VCL = (1, 2, 3, 4, 5)                     # coded slice (partitions A/B/C), IDR slice
H264_PARAM = (7, 8, 13, 15)                    # SPS, PPS, SPS extension, subset SPS
HEVC_IDR = (19, 20)                            # IDR_W_RADL, IDR_N_LP
HEVC_PARAM = (32, 33, 34)                      # VPS, SPS, PPS
HEVC_SUBLAYER_NONREF = (0, 2, 4, 6, 8, 10, 12, 14)   # TRAIL_N TSA_N STSA_N RADL_N RASL_N RSV_VCL_N10/12/14
FILTERED_CODECS = ("h264", "hevc")


class PacketFilterError(ValueError):
    """A payload or extradata that cannot be parsed (the message says which field)."""


class DamagedPacket(PacketFilterError):
    """A packet whose NAL unit lengths contradict its size (ISO/IEC 14496-15 length prefixes): the stream's bytes are
    damaged, which no valid encoder writes. FFmpeg's decoder refuses or conceals such data, so the NVDEC reader
    sends the file to the CPU, whose reader flags what FFmpeg's decoder conceals (issue 42 item 1)."""


@dataclass(frozen=True)
class PacketKind:
    """What one packet (access unit) holds.

    Attributes:
        vcl: it holds at least one coded slice.
        reference: H.264: some slice has ``nal_ref_idc != 0``; HEVC: some slice's type is not a sub-layer
            non-reference type. (HEVC sub-layer non-reference pictures of a lower sub-layer are made reference by
            :func:`reference_flags`, which knows the stream's highest ``TemporalId``.)
        idr: some slice is an IDR slice.
        param_sets: it holds an SPS / PPS (H.264) or VPS / SPS / PPS (HEVC).
        temporal_id: HEVC ``nuh_temporal_id_plus1 - 1`` of its slices (the largest); 0 for H.264.
    """

    vcl: bool
    reference: bool
    idr: bool
    param_sets: bool
    temporal_id: int = 0


def nal_length_size(codec: str, extradata: bytes | None) -> int | None:
    """Bytes of each NAL unit's length prefix in a packet, from the stream's extradata, or ``None`` for Annex-B
    (start codes; no extradata or extradata that itself starts with a start code).

    H.264 ``AVCDecoderConfigurationRecord`` (ISO/IEC 14496-15 §5.3.3.1): ``configurationVersion == 1``, byte 4 is
    ``reserved(6) lengthSizeMinusOne(2)``. HEVC ``HEVCDecoderConfigurationRecord`` (§8.3.3.1): byte 21 is
    ``constantFrameRate(2) numTemporalLayers(3) temporalIdNested(1) lengthSizeMinusOne(2)``.

    Raises:
        PacketFilterError: codec not H.264 / HEVC, or a record too short / with length size 3 (not allowed).
    """
    if codec not in FILTERED_CODECS:
        raise PacketFilterError(f"codec {codec}: only {', '.join(FILTERED_CODECS)} packets are classified")
    data = bytes(extradata or b"")
    if not data or data[:3] == b"\x00\x00\x01" or data[:4] == b"\x00\x00\x00\x01":
        return None
    at = 4 if codec == "h264" else 21
    if data[0] != 1 or len(data) <= at:
        raise PacketFilterError(f"{codec} extradata: not a version-1 decoder configuration record "
                                f"({len(data)} bytes, first byte {data[0]})")
    size = (data[at] & 3) + 1
    if size == 3:
        raise PacketFilterError(f"{codec} extradata: lengthSizeMinusOne = 2 (3-byte lengths are not allowed)")
    return size


def nal_headers(payload: bytes, length_size: int | None, header_bytes: int = 2) -> list[bytes]:
    """The first ``header_bytes`` bytes of every NAL unit in ``payload`` (length-prefixed with ``length_size``-byte
    big-endian lengths, or Annex-B start codes ``00 00 01`` / ``00 00 00 01`` when ``length_size`` is ``None``).

    Raises:
        DamagedPacket: a length prefix, or the NAL unit it announces, runs past the payload's end.
    """
    data = memoryview(payload).cast("B") if not isinstance(payload, bytes) else payload
    n = len(data)
    out: list[bytes] = []
    if length_size is None:
        raw = bytes(data)
        i = raw.find(b"\x00\x00\x01")
        while i >= 0:
            start = i + 3
            if start < n:
                out.append(raw[start: start + header_bytes])
            i = raw.find(b"\x00\x00\x01", start)
        return out
    pos = 0
    while pos < n:
        if pos + length_size > n:
            raise DamagedPacket(f"NAL length prefix at byte {pos} runs past the packet's {n} bytes")
        size = int.from_bytes(bytes(data[pos: pos + length_size]), "big")
        pos += length_size
        if size == 0:
            continue
        if pos + size > n:
            raise DamagedPacket(f"NAL unit at byte {pos} of {size} bytes runs past the packet's {n} bytes")
        out.append(bytes(data[pos: pos + min(header_bytes, size)]))
        pos += size
    return out


def classify(codec: str, payload: bytes, length_size: int | None) -> PacketKind:
    """Classify one packet from its NAL unit headers.

    H.264 header (§7.3.1): ``forbidden_zero_bit(1) nal_ref_idc(2) nal_unit_type(5)``. HEVC header (§7.3.1.2):
    ``forbidden_zero_bit(1) nal_unit_type(6) nuh_layer_id(6) nuh_temporal_id_plus1(3)``; VCL types are 0..31.

    Raises:
        PacketFilterError: an unknown codec or a malformed payload (see :func:`nal_headers`).
    """
    heads = nal_headers(payload, length_size)
    vcl = ref = idr = params = False
    tid = 0
    if codec == "h264":
        for h in heads:
            t, ref_idc = h[0] & 0x1F, (h[0] >> 5) & 3
            if t in H264_VCL:
                vcl = True
                ref |= ref_idc != 0
                idr |= t == H264_IDR
            elif t in H264_PARAM:
                params = True
    elif codec == "hevc":
        for h in heads:
            t = (h[0] >> 1) & 0x3F
            if t <= 31:
                vcl = True
                ref |= t not in HEVC_SUBLAYER_NONREF
                idr |= t in HEVC_IDR
                if len(h) > 1:
                    tid = max(tid, (h[1] & 7) - 1)
            elif t in HEVC_PARAM:
                params = True
    else:
        raise PacketFilterError(f"codec {codec}: only {', '.join(FILTERED_CODECS)} packets are classified")
    return PacketKind(vcl, ref, idr, params, tid)


def reference_flags(kinds: list[PacketKind]) -> list[bool]:
    """Per packet: must it be decoded for others' sake? True for reference pictures, parameter sets, packets with
    no slice, and HEVC sub-layer non-reference pictures below the stream's highest ``TemporalId`` (a picture of a
    higher sub-layer may predict from them)."""
    top = max((k.temporal_id for k in kinds if k.vcl), default=0)
    return [k.reference or k.param_sets or not k.vcl or k.temporal_id < top for k in kinds]


def needed_packets(pts: list[int], reference: list[bool], idr: list[bool], sampled: list[int],
                   _span: list[bool] | None = None) -> list[bool]:
    """Which packets (in decode order) a decoder must be fed so that it outputs the ``sampled`` frames exactly.

    Args:
        pts: each packet's presentation timestamp, in decode order (distinct); frame ``i`` in presentation order
            is the packet with the ``i``-th smallest pts.
        reference: :func:`reference_flags` per packet.
        idr: per packet, an IDR picture (a closed random access point: nothing after it predicts from before it).
        sampled: ascending presentation-order frame indices wanted.

    Returns:
        per packet, whether to feed it: the sampled packets, and in each IDR period that holds a sampled packet,
        the reference packets up to its last sampled packet in decode order.

    Raises:
        PacketFilterError: pts not distinct, lists of different lengths, or an index out of range.
    """
    n = len(pts)
    if len(reference) != n or len(idr) != n:
        raise PacketFilterError(f"{n} pts, {len(reference)} reference flags, {len(idr)} IDR flags")
    if len(set(pts)) != n:
        raise PacketFilterError("packet pts are not distinct: frames cannot be identified by pts")
    order = sorted(range(n), key=pts.__getitem__)          # presentation index -> decode position
    span = _span if _span is not None else [False] * n     # decoded stretches (for the counts)
    want = [False] * n
    for i in sampled:
        if not 0 <= int(i) < n:
            raise PacketFilterError(f"frame index {i} outside the stream's {n} frames")
        want[order[int(i)]] = True
    keep = [False] * n
    starts = [j for j in range(n) if idr[j] and j > 0]
    for s, e in zip([0] + starts, starts + [n]):
        last = next((j for j in range(e - 1, s - 1, -1) if want[j]), None)
        if last is None:
            continue
        for j in range(s, last + 1):
            keep[j] = want[j] or reference[j]
            span[j] = True
    return keep


def plan(codec: str, extradata: bytes | None, packets: list[tuple[int, bytes]], sampled: list[int]
         ) -> tuple[list[bool], dict]:
    """:func:`needed_packets` for ``packets`` = ``[(pts, payload), ...]`` in decode order of an H.264 / HEVC
    stream. Returns ``(keep, counts)``; ``counts`` has ``packets``, ``kept``, ``skipped``, ``skipped_nonref``
    (non-reference packets dropped inside needed periods) and ``skipped_gop`` (the rest: whole IDR periods and
    period tails).

    Raises:
        PacketFilterError: see :func:`nal_length_size`, :func:`classify`, :func:`needed_packets`.
    """
    size = nal_length_size(codec, extradata)
    kinds = [classify(codec, payload, size) for _, payload in packets]
    return StreamScan(codec, [p for p, _ in packets], reference_flags(kinds), [k.idr for k in kinds]).plan(sampled)


@dataclass(frozen=True)
class StreamScan:
    """One demux pass over a file's first video stream (no decoding): per packet in decode order, its pts and the
    flags :func:`needed_packets` takes. ``codec`` is FFmpeg's name; ``counts`` holds ``packets``."""

    codec: str
    pts: list[int]
    reference: list[bool]
    idr: list[bool]

    def periods(self) -> list[int]:
        """Per presentation-order frame, the IDR period (0, 1, ...) its packet lies in (decode order)."""
        period, k = [0] * len(self.pts), -1
        for j, is_idr in enumerate(self.idr):
            k += bool(is_idr) or j == 0
            period[j] = k
        order = sorted(range(len(self.pts)), key=self.pts.__getitem__)
        return [period[j] for j in order]

    def plan(self, sampled: list[int]) -> tuple[list[bool], dict]:
        """``(keep, counts)`` for ``sampled`` (see :func:`plan`)."""
        span = [False] * len(self.pts)
        keep = needed_packets(self.pts, self.reference, self.idr, sampled, _span=span)
        nonref = sum(1 for k, s in zip(keep, span) if s and not k)
        skipped = len(keep) - sum(keep)
        return keep, {"packets": len(keep), "kept": sum(keep), "skipped": skipped, "skipped_nonref": nonref,
                      "skipped_gop": skipped - nonref}


def scan(path: str) -> StreamScan:
    """Demux ``path``'s first video stream with PyAV and classify every packet (:func:`classify`; the payload is
    read through the packet's buffer, not copied, for length-prefixed streams).

    Raises:
        PacketFilterError: not H.264 / HEVC, a packet without pts, or a payload that cannot be parsed (the message
            names the file and the packet); :class:`DamagedPacket` when a payload's NAL lengths contradict its size.
    """
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            codec = stream.codec_context.name
            size = nal_length_size(codec, stream.codec_context.extradata)
            pts, kinds = [], []
            for j, p in enumerate(container.demux(stream)):
                if not p.size:
                    continue
                if p.pts is None:
                    raise PacketFilterError(f"packet {j} has no pts")
                pts.append(int(p.pts))
                try:
                    kinds.append(classify(codec, memoryview(p), size))
                except PacketFilterError as e:
                    raise type(e)(f"packet {j} (pts {p.pts}): {e}") from e
    except PacketFilterError as e:
        raise type(e)(f"{path}: {e}") from e
    except Exception as e:  # noqa: BLE001 - PyAV's errors for unreadable files
        raise PacketFilterError(f"{path}: cannot demux ({type(e).__name__}: {e})") from e
    return StreamScan(codec, pts, reference_flags(kinds), [k.idr for k in kinds])


def decode_planes_pyav(path: str, indices: list[int], skip: bool = True, stats: dict | None = None
                       ) -> list[list[bytes]]:
    """FFmpeg's software decoder (PyAV) fed only :func:`plan`'s kept packets (``skip``) or every packet: the
    ``(Y, U, V)`` planes' bytes (``height`` rows of ``width`` / ``ceil(width / 2)`` bytes) of the frames at
    ascending presentation-order ``indices`` (the CPU proof that the filter is exact; also a CPU reader).

    Raises:
        PacketFilterError: the file's stream is not H.264 / HEVC, a packet has no pts, a sampled frame did not come
            out, or a payload cannot be parsed (the message names the file).
    """
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        codec = stream.codec_context.name
        packets = [p for p in container.demux(stream) if p.size]
        if any(p.pts is None for p in packets):
            raise PacketFilterError(f"{path}: a packet has no pts")
        pts = [int(p.pts) for p in packets]
        try:
            if skip:
                keep, counts = plan(codec, stream.codec_context.extradata, [(q, bytes(p)) for q, p in
                                                                         zip(pts, packets)], indices)
            else:
                keep, counts = [True] * len(packets), {"packets": len(packets), "kept": len(packets), "skipped": 0}
        except PacketFilterError as e:
            raise type(e)(f"{path}: {e}") from e
        ordered = sorted(pts)
        wanted = {ordered[int(i)]: k for k, i in enumerate(indices)}
        out: list[list[bytes] | None] = [None] * len(indices)
        ctx = stream.codec_context
        decoded = 0

        def take(frames):
            nonlocal decoded
            for f in frames:
                decoded += 1
                k = wanted.get(f.pts)
                if k is not None:
                    out[k] = [_plane_bytes(pl) for pl in f.planes]

        for p, k in zip(packets, keep):
            if k:
                take(ctx.decode(p))
        take(ctx.decode(None))
    missing = [indices[k] for k, o in enumerate(out) if o is None]
    if missing:
        raise PacketFilterError(f"{path}: frames {missing[:5]} did not come out of the decoder")
    if stats is not None:
        stats.update(counts, decoded=decoded)
    return out  # type: ignore[return-value]


def _plane_bytes(plane) -> bytes:
    import numpy as np

    a = np.frombuffer(memoryview(plane).cast("B"), np.uint8).reshape(plane.height, plane.line_size)
    return a[:, : plane.width].tobytes()


__all__ = ["DamagedPacket", "FILTERED_CODECS", "PacketFilterError", "PacketKind", "StreamScan", "classify",
           "decode_planes_pyav", "nal_headers", "nal_length_size", "needed_packets", "plan", "reference_flags", "scan"]
