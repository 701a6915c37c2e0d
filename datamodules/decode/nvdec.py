"""NVDEC decoding of the sampled frames with the CPU path's exact RGB (issue 31 §2).

What is exact, and why. H.264 / HEVC / VP9 / MPEG-4 decoding is bit-exact by the standards, so NVDEC's decoded
4:2:0 planes are the planes FFmpeg's software decoder gives (``tests/datamodules/test_nvdec.py`` checks that on the
GPU). Only the YUV -> RGB conversion (and the reduced-size scaling) could differ, and it is not re-implemented here:
the planes go through the *same* libswscale the CPU path runs, with the parameters decord's filter graph gives it
(:mod:`datamodules.decode.swscale` says how, and on which clips the frames were checked equal to decord's).

What falls back to the CPU (:func:`nvdec_unsupported` says why, per file) and how a video's sampled frames are cut
over sessions: :mod:`datamodules.decode.nvdec_plan`.

Several engines at once. :func:`read_nvdec` splits a video's sampled indices into contiguous runs and decodes each
run in its own NVDEC session (one ``PyNvVideoCodec.SimpleDecoder`` per thread; each seeks to the key frame at or
before its first index, so a run costs at most one GOP more than its own frames), and the driver spreads the
sessions over the GPU's engines (the H200 has 7). DataLoader workers that each call it add more sessions; a
worker that uses CUDA must be started with ``multiprocessing_context="spawn"`` (CUDA does not survive ``fork``
after the parent initialised it).

Decoding only what the sampled frames need (``read_nvdec(..., nvdec_skip_nonref=True)``, the default). For H.264
and HEVC, one PyAV demux pass (no decoding) classifies every packet from its NAL headers, and each session is fed
only the packets :func:`datamodules.decode.packet_filter.needed_packets` keeps: the sampled frames, and the reference
pictures before them back to their IDR; non-reference pictures that are not sampled, IDR periods without a sampled
frame and the packets after a period's last sampled frame are never sent (the module says why that is exact;
``tests/datamodules/test_packet_filter.py`` proves it with FFmpeg's software decoder fed the same packets). The
session is a packet-fed ``PyNvDecoder`` on ``PyNvVideoCodec.CreateDemuxer``'s packets (checked against PyAV's
pts, one by one); frames are taken by pts. The runs are then cut at IDR periods (:func:`split_runs_at_periods`),
so no reference picture is decoded by two sessions (an open-GOP stream, one period, is one session). Where anything in that fails (or the stream is VP9), the run is decoded
by ``SimpleDecoder`` as before and ``stats`` says why.

Damaged data (issue 42 item 1). PyNvVideoCodec reports no per-picture decode status: its ``NvDecoder``
(``HandlePictureDisplay``) calls ``cuvidGetDecodeStatus`` and only prints "Decode Error occurred for picture
%d" on ``cuvidDecodeStatus_Error`` / ``_Error_Concealed``; ``DecodedFrame`` has no status field (2.2.4: its
``timestamp``, ``format``, SEI and decode-statistics (QP, CU type, motion vector) members). So the frames NVDEC
decodes are not checked for concealment: :func:`datamodules.decode.decode_video` records them
``concealment_checked: False``, and under ``strict_frames`` reads every file on the CPU (docs/deviations.md). The
one damage this path sees for free is the packet scan's: a payload whose NAL unit lengths contradict its size
(:class:`datamodules.decode.packet_filter.DamagedPacket`) makes :func:`read_nvdec` raise :class:`NvdecError`, so
the file is read on the CPU, whose reader flags what FFmpeg's decoder conceals. Damage inside slice data passes
the scan (no demuxer signal shows it: ``packet.is_corrupt`` stays unset on every corrupt test clip).

Frame identity. ``SimpleDecoder`` indexes frames in presentation order as decord does; its count is checked
against the container's per file (a mismatch is an :class:`NvdecError`, so a CPU fallback), and the frames of every
test clip and workload video are equal to decord's at the same indices. Variable-frame-rate files are not tested
on this path: until they are, the caller should give NVDEC only constant-rate files (``info["vfr"]`` False).

Interface for ``datamodules.decode.READERS``: :func:`register` (run on import) adds :func:`reader`;
:func:`nvdec_unsupported` and :func:`read_nvdec`; :func:`read_with_fallback` is the per-file fallback with the
decoder used and why.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from datamodules.decode import packet_filter as pf
from datamodules.decode.errors import NvdecError
from datamodules.decode.convert import ConvertPool
from datamodules.decode.swscale import Yuv420ToRgb, nv12_planes
# (importing nvdec_plan imports PyNvVideoCodec, which must come before decord in a process: see _import_nvc there)
from datamodules.decode.nvdec_plan import (  # noqa: F401 - re-exported: this module's interface
    DEFAULT_SESSIONS, EXACT_CODECS, FRAMES_PER_SESSION, MAX_SESSIONS, MIN_SEGMENT_FRAMES, NVDEC_CODECS, StreamProbe,
    _import_nvc, _nvc, _reason_from_probe, auto_sessions, available, nvdec_unsupported, probe, split_runs,
    split_runs_at_periods)


# ----------------------------------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------------------------------


def _decode_run(path: str, run: list[int], gpu_id: int, p: StreamProbe, convert: Yuv420ToRgb,
                out: np.ndarray, offset: int, sink: "ConvertPool | None" = None) -> dict:
    """Decode ``run`` (ascending native indices) in one NVDEC session into ``out[offset: offset + len(run)]``
    (converted here by ``convert``, or handed to ``sink`` as host NV12 surfaces to convert off this thread)."""
    import torch

    nvc = _nvc()
    dec = nvc.SimpleDecoder(path, gpu_id=gpu_id, use_device_memory=True,
                            output_color_type=nvc.OutputColorType.NATIVE)
    total = len(dec)
    if p.frames and total != p.frames:   # its index would not be the CPU path's (decord counts the container's)
        raise NvdecError(f"{path}: NVDEC counts {total} frames, the container {p.frames}")
    if run and run[-1] >= total:
        raise NvdecError(f"{path}: NVDEC counts {total} frames, index {run[-1]} asked")
    t0 = time.perf_counter()
    frames = dec.get_batch_frames_by_index(run)
    info: dict = {"frames": len(run), "decode_s": round(time.perf_counter() - t0, 4)}
    if len(frames) != len(run):
        raise NvdecError(f"{path}: NVDEC returned {len(frames)} of {len(run)} frames")
    with torch.cuda.device(gpu_id):
        for k, frame in enumerate(frames):
            surface = torch.from_dlpack(frame)
            if k == 0:
                info["surface_shape"] = tuple(surface.shape)
            host = surface.cpu().numpy()
            if sink is not None:
                sink.put(host, offset + k)
            else:
                y, u, v = nv12_planes(host, p.height, p.width)
                out[offset + k] = convert(y, u, v)
    del frames, dec
    return info


def _packet_decoder(nvc, gpu_id: int, codec_id):
    """A packet-fed NVDEC session: ``PyNvVideoCodec.CreateDecoder`` where the wheel has it (1.x / 2.0), else the
    ``PyNvDecoder`` class it wraps (2.2.4 binds only the class; same keyword names in its docstring)."""
    kwargs = dict(gpuid=gpu_id, codec=codec_id, cudacontext=0, cudastream=0, usedevicememory=True,
                  outputColorType=nvc.OutputColorType.NATIVE)
    factory = getattr(nvc, "CreateDecoder", None) or nvc.PyNvDecoder
    try:
        return factory(**kwargs)
    except TypeError:   # keyword names differ between wheels: the docstring's order (gpu, codec, ctx, stream, ...)
        return factory(gpu_id, codec_id, 0, 0, True)


def _frame_pts(frame) -> int:
    get = getattr(frame, "getPTS", None)
    return int(get() if callable(get) else frame.timestamp)


def _decode_run_packets(path: str, run: list[int], gpu_id: int, p: StreamProbe, convert: Yuv420ToRgb,
                        out: np.ndarray, offset: int, scanned: pf.StreamScan, sink: "ConvertPool | None" = None
                        ) -> dict:
    """Decode ``run`` in one NVDEC session fed only the packets :func:`datamodules.decode.packet_filter.needed_packets`
    keeps (``PyNvVideoCodec.CreateDemuxer`` packets, Annex-B, in the order PyAV demuxed them: checked by pts).
    Frames are identified by pts (frame ``i`` = the ``i``-th smallest packet pts), so a frame that does not come
    out, or a packet order that differs from the scan's, is an :class:`NvdecError`, never a wrong frame. Each
    wanted surface is copied to the host at once (the decoder reuses its surfaces) and converted here by
    ``convert``, or by ``sink`` on its own threads, so that this session goes back to feeding its engine."""
    import torch

    t_start = time.perf_counter()
    keep, counts = scanned.plan(run)
    ordered = sorted(scanned.pts)
    want = {ordered[i]: k for k, i in enumerate(run)}
    last = max(j for j, k in enumerate(keep) if k)
    nvc = _nvc()
    dmx = nvc.CreateDemuxer(path)
    dec = _packet_decoder(nvc, gpu_id, dmx.GetNvCodecId())
    done = [False] * len(run)
    info: dict = {"frames": len(run), "path": "packets", **counts}
    clock = {"demux_s": 0.0, "decode_s": 0.0, "copy_s": 0.0, "convert_s": 0.0, "packets_read": 0}

    def take(frames) -> None:
        for frame in frames:
            k = want.get(_frame_pts(frame))
            if k is None or done[k]:
                continue
            t0 = time.perf_counter()
            if "first_frame_s" not in info:   # the session's start to its first wanted frame (decoder set-up)
                info["first_frame_s"] = round(t0 - t_start, 4)
            surface = torch.from_dlpack(frame)
            info.setdefault("surface_shape", tuple(surface.shape))
            host = surface.cpu().numpy()
            t1 = time.perf_counter()
            clock["copy_s"] += t1 - t0
            if sink is not None:
                sink.put(host, offset + k)        # blocks only while the pool holds its most frames
            else:
                y, u, v = nv12_planes(host, p.height, p.width)
                out[offset + k] = convert(y, u, v)
            clock["convert_s"] += time.perf_counter() - t1
            done[k] = True

    def decode(packet):
        t0 = time.perf_counter()
        frames = dec.Decode(packet)
        clock["decode_s"] += time.perf_counter() - t0
        take(frames)

    with torch.cuda.device(gpu_id):
        j = 0
        t_read = time.perf_counter()
        for packet in dmx:
            clock["demux_s"] += time.perf_counter() - t_read
            clock["packets_read"] += 1
            if int(packet.bsl) == 0:                    # end of stream: flush what the decoder holds
                decode(packet)
                break
            if j >= len(scanned.pts) or int(packet.pts) != scanned.pts[j]:
                raise NvdecError(f"{path}: NVDEC's demuxer packet {j} has pts {packet.pts}, PyAV's "
                                 f"{scanned.pts[j] if j < len(scanned.pts) else 'none'}")
            if keep[j]:
                decode(packet)
            j += 1
            if j > last:     # nothing after the last kept packet is fed: flush now rather than read to the end
                break
            t_read = time.perf_counter()
        if not all(done):
            decode(nvc.PacketData())                    # an empty packet is the end-of-stream flush
        if not all(done):    # (if it was not one: the demuxer's own end-of-stream packet, as before the early stop)
            t_read = time.perf_counter()
            for packet in dmx:
                clock["demux_s"] += time.perf_counter() - t_read
                clock["packets_read"] += 1
                if int(packet.bsl) == 0:
                    decode(packet)
                    break
                t_read = time.perf_counter()
            info["flushed_at_end"] = True
    if not all(done):
        missing = [run[k] for k, d in enumerate(done) if not d]
        raise NvdecError(f"{path}: frames {missing[:5]} did not come out of the packet-fed NVDEC session")
    del dec, dmx
    info.update({k: round(v, 4) if isinstance(v, float) else v for k, v in clock.items()})
    return info


def _decode_run_any(path, run, gpu_id, p, convert, out, offset, scanned, sink=None) -> dict:
    """The packet-fed session where the stream was scanned, falling back (per run, recorded) to SimpleDecoder."""
    if scanned is not None:
        try:
            return _decode_run_packets(path, run, gpu_id, p, convert, out, offset, scanned, sink)
        except Exception as e:  # noqa: BLE001 - PyNvVideoCodec raises its own types; SimpleDecoder is the fallback
            why = f"{type(e).__name__}: {e}".splitlines()[0]
            info = _decode_run(path, run, gpu_id, p, convert, out, offset, sink)
            return {**info, "path": "simple", "skip_fallback": why}
    return {**_decode_run(path, run, gpu_id, p, convert, out, offset, sink), "path": "simple"}


def read_nvdec(path: str | Path, indices: list[int], decode_hw: tuple[int, int], gpu_id: int = 0,
               sessions: int | None = None, probed: StreamProbe | None = None,
               stats: dict | None = None, nvdec_skip_nonref: bool = True,
               convert_threads: int | None = None) -> np.ndarray:
    """``(len(indices), dh, dw, 3)`` uint8 RGB frames at ascending native presentation-order ``indices``, decoded
    by NVDEC and converted by decord's own swscale (equal to the CPU path's frames, see the module docstring).

    Args:
        path: the video file.
        indices: ascending native frame indices (presentation order, as decord counts them).
        decode_hw: ``(dh, dw)`` decode size; the native size or a reduced one (bilinear, as decord).
        gpu_id: CUDA device whose NVDEC engines decode.
        sessions: NVDEC sessions (threads) the indices are split over (:func:`split_runs`); ``None``:
            :func:`auto_sessions` of the frame count.
        probed: a :func:`probe` of ``path`` already made (else probed here).
        stats: filled with ``runs`` (per session: frames, surface shape, ``path`` ``"packets"`` or ``"simple"``,
            its packet counts, ``skip_fallback``: why a packet-fed session fell back), ``skip`` (why the packets
            were not filtered, or ``None``), ``packets`` (the stream's), ``frames_fed`` (packets fed to NVDEC, all
            sessions) and ``frames_skipped`` (``packets - frames_fed``; below the SimpleDecoder path's true saving
            when several sessions re-decode a shared stretch) when given.
        nvdec_skip_nonref: feed NVDEC only the packets the sampled frames need
            (:mod:`datamodules.decode.packet_filter`: non-reference pictures that are not sampled, IDR periods without a
            sampled frame, and period tails are dropped; exact, so on by default) for H.264 / HEVC; else, and where
            the scan or a packet-fed session fails, ``SimpleDecoder`` decodes every frame of the run's GOPs.
        convert_threads: threads converting the frames to RGB (:class:`ConvertPool`), off the sessions' threads
            (default: one per session).

    Raises:
        NvdecError: the file is not one NVDEC decodes exactly (:func:`nvdec_unsupported`'s reasons, checked from
            the probe), the packet scan found a damaged packet (:class:`~datamodules.decode.packet_filter.
            DamagedPacket`: NVDEC would conceal it unflagged), or decoding failed; the message names the file. The
            caller then uses the CPU path.
    """
    path = str(path)
    idx = [int(i) for i in indices]
    if any(b <= a for a, b in zip(idx, idx[1:])) or (idx and idx[0] < 0):
        raise ValueError(f"{path}: indices must be ascending and >= 0")
    p = probed or probe(path)
    reason = _reason_from_probe(p)
    if reason:
        raise NvdecError(f"{path}: {reason}")
    if isinstance(_nvc(), str):
        raise NvdecError(f"{path}: {_nvc()}")
    dh, dw = int(decode_hw[0]), int(decode_hw[1])
    out = np.empty((len(idx), dh, dw, 3), np.uint8)
    if not idx:
        return out
    scanned, skip_why = None, "off (nvdec_skip_nonref=False)"
    if nvdec_skip_nonref:
        if p.codec not in pf.FILTERED_CODECS:
            skip_why = f"codec {p.codec}: packets not filtered (only {', '.join(pf.FILTERED_CODECS)})"
        else:
            try:
                t_scan = time.perf_counter()
                scanned = pf.scan(path)
                if stats is not None:
                    stats["scan_s"] = round(time.perf_counter() - t_scan, 4)
                skip_why = None
                if p.frames and len(scanned.pts) != p.frames:
                    scanned, skip_why = None, f"{len(scanned.pts)} packets, the container counts {p.frames} frames"
                elif idx[-1] >= len(scanned.pts):
                    raise NvdecError(f"{path}: {len(scanned.pts)} frames, index {idx[-1]} asked")
            except pf.DamagedPacket as e:   # NVDEC would conceal unflagged: FFmpeg's decoder flags it (module doc)
                raise NvdecError(f"{e} (damaged stream: read on the CPU, whose decoder flags concealed frames)") \
                    from e
            except pf.PacketFilterError as e:
                scanned, skip_why = None, str(e)
    if sessions is None:
        sessions = auto_sessions(len(idx))
    if scanned is not None:   # cut at IDR periods: no reference picture is decoded by two sessions
        period = scanned.periods()
        runs = split_runs_at_periods(idx, [period[i] for i in idx], sessions)
    else:
        runs = split_runs(idx, sessions)
    offsets = np.cumsum([0] + [len(r) for r in runs[:-1]]).tolist()
    sink = ConvertPool(lambda: Yuv420ToRgb(p.width, p.height, p.pix_fmt, (dh, dw), p.colorspace, p.color_range),
                       p.height, p.width, out, convert_threads or len(runs))
    try:
        if len(runs) == 1:
            infos = [_decode_run_any(path, runs[0], gpu_id, p, None, out, 0, scanned, sink)]
        else:
            with ThreadPoolExecutor(len(runs)) as pool:
                futures = [pool.submit(_decode_run_any, path, r, gpu_id, p, None, out, o, scanned, sink)
                           for r, o in zip(runs, offsets)]
                infos = [f.result() for f in futures]
        sink.finish()
    except NvdecError:
        raise
    except Exception as e:  # noqa: BLE001 - PyNvVideoCodec raises its own exception types
        raise NvdecError(f"{path}: NVDEC decoding failed ({type(e).__name__}: {e})") from e
    finally:
        sink.close()
    if stats is not None:
        stats["runs"] = infos
        stats["skip"] = skip_why
        stats["convert_s"] = round(sink.convert_s, 4)   # conversion threads' seconds (off the sessions)
        if scanned is not None:
            fed = sum(i.get("kept", 0) if i.get("path") == "packets" else 0 for i in infos)
            stats["packets"] = len(scanned.pts)
            stats["frames_fed"] = fed
            stats["frames_skipped"] = len(scanned.pts) - fed if all(i.get("path") == "packets" for i in infos) \
                else None
    return out


def read_with_fallback(path: str | Path, indices: list[int], decode_hw: tuple[int, int], cpu_read,
                       gpu_id: int = 0, sessions: int | None = None, nvdec_skip_nonref: bool = True,
                       stats: dict | None = None) -> tuple[np.ndarray, str, str | None]:
    """NVDEC where it decodes ``path`` exactly, else ``cpu_read(path, indices, decode_hw)``.

    Returns:
        ``(frames, decoder, why)``: ``decoder`` is ``"nvdec"`` or ``"cpu"``; ``why`` is ``None`` for NVDEC, else
        the reason the file went to the CPU (recorded as ``info["decoder"]`` / the fallback reason). ``stats``
        and ``nvdec_skip_nonref`` are :func:`read_nvdec`'s.
    """
    t0 = time.perf_counter()
    why = nvdec_unsupported(path, gpu_id)
    if stats is not None:
        stats["check_s"] = round(time.perf_counter() - t0, 4)
    if why is None:
        try:
            return read_nvdec(path, indices, decode_hw, gpu_id, sessions, stats=stats,
                              nvdec_skip_nonref=nvdec_skip_nonref), "nvdec", None
        except NvdecError as e:
            why = str(e)
    return cpu_read(path, indices, decode_hw), "cpu", why



def _gpu_id() -> int:
    """The GPU of this process's rank (``LOCAL_RANK``, which Lightning's DDP sets and DataLoader workers inherit):
    :func:`models.device_start.rank_gpu` (standard library only)."""
    from models.device_start import rank_gpu

    return rank_gpu()


def reader(path, probe, dh: int, dw: int, num_threads: int):
    """``datamodules.decode.READERS["nvdec"]``: ``read(ascending native indices) -> (n, dh, dw, 3)`` uint8 RGB by
    :func:`read_nvdec` on this rank's GPU.

    ``whole_video``: ``decode_video`` reads every planned frame in one call (the sessions decode the stream once;
    the decode-size frames of one video, at most ``native_decode_bytes`` or ``max_frames x 896-side`` frames, are
    held until they are resized). A file NVDEC fails on at run time is read by the CPU reader instead
    (``read.fallback = (cpu reader name, reason)``, recorded as ``video_info.decoder`` / ``decoder_fallback``)."""
    from datamodules import decode

    def read(idx: list[int]) -> np.ndarray:
        if read.fallback is None:
            try:
                return read_nvdec(path, idx, (dh, dw), gpu_id=_gpu_id())
            except NvdecError as e:
                name = decode.cpu_reader_for(probe, (dh, dw))
                read.fallback = (name, str(e))
                read.cpu = decode.READERS[name](path, probe, dh, dw, num_threads)
        return read.cpu(idx)

    read.fallback, read.cpu = None, None
    return read


def _supports(probe, path) -> str | None:
    """``None`` when NVDEC decodes ``path`` with the CPU path's exact frames, else the reason it goes to the CPU
    (:func:`nvdec_unsupported`; also variable frame rate, whose frames this reader does not index by pts)."""
    return nvdec_unsupported(path, _gpu_id()) if path is not None else None


def _stream_supports(probe, path) -> str | None:
    """:func:`_supports` without the device's part (no CUDA call): what the stream alone rules out."""
    return nvdec_unsupported(path, _gpu_id(), device_checks=False) if path is not None else None


reader.supports = _supports
reader.stream_supports = _stream_supports
reader.whole_video = True


def register() -> None:
    """Make ``data.decoder: nvdec | auto`` use this module (``datamodules.decode.READERS["nvdec"]``)."""
    from datamodules import decode

    decode.READERS["nvdec"] = reader


register()


__all__ = ["auto_sessions", "ConvertPool", "available", "register", "reader", "NVDEC_CODECS", "NvdecError", "StreamProbe", "Yuv420ToRgb", "nv12_planes", "nvdec_unsupported",
           "probe", "read_nvdec", "read_with_fallback", "split_runs", "split_runs_at_periods"]
