"""The decode of one video, end to end: :func:`decode_video` (probe, plan, reader, retries, held frames; the
VideoLLaMA3 jobs), :func:`decode_at_indices` (explicit indices; the Omni jobs) and :func:`decord_frame_count`.
The pipeline is described in :mod:`datamodules.decode`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from datamodules.decode.cpu_slots import ON_CPU_SLOT, CpuSlots
from datamodules.decode.cpu import _read_frames, cpu_reader_for, decord_decodes, pyav_sws_reads
from datamodules.decode.pyav_skip import concealed_frames
from datamodules.decode.errors import DecodeError, FrameSizeChange, _check_file, _open_error
from datamodules.decode.held import HOLD_CHUNK_BYTES, EncoderFrames, EncoderSizing, _decode_held, held_bytes
from datamodules.decode.parts import part_bounds, part_grids, plan_part
from datamodules.decode.plan import NATIVE_DECODE_BYTES, decode_frame_size, plan_decode
from datamodules.decode.probe import is_variable_frame_rate, probe_video
from datamodules.decode.readers import READERS, resolve_decoder
from datamodules.decode.retry import MAX_REPLACED_FRAC, _decode_unique, replace_unreadable

STRICT_FRAMES = False   # seed 001: an error record only when ffmpeg exits non-zero or gives no frame
# why ``strict_frames`` reads a file NVDEC could decode on the CPU (``video_info.decoder_fallback``; issue 42 item 1)
NVDEC_UNCHECKED = ("data.strict_frames: NVDEC frames are not checked for concealment (PyNvVideoCodec reports no "
                   "decode status), so the CPU reader decodes and flags them")
# why a small file NVDEC could decode was read on the CPU (``decode_video(cpu_below_mpx=...)``: the rank's first video,
# ``data.first_video_cpu_mpx``)
SMALL_ON_CPU = ("data.first_video_cpu_mpx: the rank's first video is small enough to be ready sooner from the CPU "
                "reader than from a worker's first NVDEC session")


def source_megapixels(probe) -> float:
    """The decode work of a whole file in megapixels: its frames (``len(probe.pts)``) x displayed width x height /
    1e6 (the CPU readers decode about every frame up to the last sampled one at 1 fps sampling)."""
    return len(probe.pts) * probe.width * probe.height / 1e6


@dataclass
class DecodedVideo:
    """Frames of one video.

    Attributes:
        frames: (T, H, W, 3) uint8 RGB at the decode size, upright (display rotation applied).
        times_s: T frame labels in seconds: the sampling grid ``j / sample_fps`` (seed 001
            ``ts = (start + np.arange(len(frames)) / fps)``), not the source frames' own times.
        info: ``duration_s, native_hw, decode_hw, n_frames, fps, sample_fps, fps_ok, vfr``, ``decoder``; and
            :func:`decode_video`'s optional keys (``frames_concealed``, ``concealment_checked``, ...).
        part: ``None`` for a whole video; for one part (``decode_video(part=...)``) the planned positions
            ``(lo, hi)`` its ``frames`` and ``times_s`` are (``info`` is the whole plan's, except that its position
            lists count from ``lo``; :mod:`datamodules.decode.parts` joins the parts).
    """

    frames: torch.Tensor
    times_s: list[float]
    info: dict = field(default_factory=dict)
    part: tuple[int, int] | None = None   # (lo, hi): the planned positions these frames are (``decode_video(part=)``)


def decode_video(path: str | Path, budget_tokens: int, decode_max_side: int = 896, base_fps: float = 1.0,
                 num_threads: int = 1, native_decode_bytes: float = NATIVE_DECODE_BYTES,
                 short_clip_first_frame: bool = False,
                 max_replaced_frac: float = MAX_REPLACED_FRAC, sizing: EncoderSizing | None = None,
                 hold_chunk_bytes: float = HOLD_CHUNK_BYTES, decoder: str = "cpu",
                 strict_frames: bool = STRICT_FRAMES, part: tuple[int, int] | None = None,
                 cpu_below_mpx: float | None = None, cpu_slots: CpuSlots | None = None) -> DecodedVideo:
    """Decode the frames the largest budget of a run needs, as seed 001's ``decode_video`` chooses them.

    Three steps: (a) the plan, :func:`probe_video` and :func:`plan_decode`: seed 001's ``duration =
    float(probe["format"]["duration"])`` picks the rate ``fps = bd.FPS if int(duration * bd.FPS) + 1 <=
    max_frames else (max_frames + 1) / duration``; the frames are those FFmpeg's ``fps=fps:round=down`` emits
    (:func:`algorithms.budget.fps_filter_frames` on the stream's integer pts, the rate ``av_d2q(fps, INT_MAX)``),
    thinned by ``np.linspace(0, len(frames) - 1, max_frames, dtype=int)`` and labelled ``ts = (start +
    np.arange(len(frames)) / fps)``; (b) a reader (:data:`READERS`) decodes those native frames; (c) the retries,
    replacement rule and encoder-size holding below work on any reader.

    Size (seed 001: ``if n_est * h * w * 3 <= NATIVE_DECODE_BYTES: dw, dh = w, h else: dh, dw =
    bd.frame_size(h, w, tok)``, with ``n_est = min(int(duration * fps) + 1, max_frames)``): native size when the
    estimated frames fit ``native_decode_bytes``, else the long side at most ``decode_max_side`` (``bd.frame_size``
    is not in the seed; this keeps the project's earlier reduced size).

    Args:
        path: video file.
        budget_tokens: the largest budget (sets the frame cap, :func:`algorithms.budget.sample_frames`).
        decode_max_side: longest decoded side in pixels when the native decode would exceed
            ``native_decode_bytes``.
        base_fps: sampling rate before the cap (1 fps in seed 001, ``bd.FPS``).
        num_threads: decoder threads. A decode that fails with several threads is retried with one: decord's
            threaded decoder fails on some streams that decode fine single-threaded ("Error sending packet",
            dmlc/decord#246 and #314); only a video that also fails with one thread is an error.
        native_decode_bytes: largest ``n_est * h * w * 3`` decoded at native size (seed: 2e9).
        short_clip_first_frame: a clip that ends before the first sampling step gives no frame in the seed (an
            error here, as there); ``True`` keeps its frame at 0 s instead (deviation, off by default).
        max_replaced_frac: 0 (default, seed 001: any decode error makes the video an error record). Above 0
            (deviation): when the batch read fails (corrupt packets), every sampled frame is re-read alone and
            each unreadable one is replaced by the nearest readable sampled frame (native index distance, the
            earlier on a tie), listed in ``info["frames_replaced"]`` (positions in the returned frames); the video
            is an error only when more than this fraction of its sampled frames is unreadable.
        sizing: ``None``: ``frames`` is the ``(T, H, W, 3)`` decode. Else the video is decoded in chunks of about
            ``hold_chunk_bytes`` (decode-size bytes) and each chunk is at once resized, by the processor's own
            resize, to every grid :meth:`EncoderSizing.grids` lists for its frames; ``frames`` is then an
            :class:`EncoderFrames` (the decode size never exists for all frames at once), unless those sizes take
            no fewer bytes than the decode (:func:`held_bytes`; small videos the encoder upsamples): then
            ``frames`` is the decode-size tensor as without ``sizing``. The frames are decoded
            exactly as without it (same decoder calls per frame, same fallbacks), so the encoder's inputs are the
            same: bit-identical on the CPU (``tests/datamodules/test_hold_sizes.py``).
        hold_chunk_bytes: decode-size bytes per chunk with ``sizing``.
        decoder: ``cpu`` (decord), ``nvdec`` or ``auto`` (:func:`resolve_decoder`); ``info["decoder"]`` records
            the reader that decoded the video.
        strict_frames: ``False`` (default, seed 001:1038 ``out, _ = ffmpeg.run(...)`` and 1064 ``except Exception``:
            an error record only on a non-zero exit or ``assert T > 0``; the ffmpeg CLI skips packets its decoder
            refuses, conceals damaged pictures and exits 0): the video is answered with the frames the decoder
            gives, concealed ones included, and a sampled frame the decoder gives nothing for is the last frame it
            gave before (the ``fps`` filter's repeat); ``info["frames_concealed"]`` lists the positions (in the
            returned frames) of the frames concealed or repeated (:func:`concealed_frames` for the readers that
            report nothing: decord, PyAV in decode order, NVDEC's CPU fallback). Frames NVDEC decodes are not
            checked (PyNvVideoCodec reports no decode status; :mod:`datamodules.decode.nvdec`):
            ``info["concealment_checked"]`` is ``False`` for them (deviation, docs/deviations.md; a packet the
            NVDEC path's scan finds damaged sends the file to the CPU reader, which flags). A file decord cannot
            read through (a refused packet fails its whole batch) is read by PyAV (``info["decoder_fallback"]``
            names why; ``pyav_sws`` where it reads the file, else ``pyav_skip``: a reduced size then by
            :func:`_resize`, not decord's scaler). ``True`` (deviation, the rule before issue 42): a concealed or
            missing sampled frame is unreadable, so the video is an error record unless ``max_replaced_frac``
            allows replacing it. The rule needs the flags, so with ``decoder`` ``nvdec`` / ``auto`` every file is
            read on the CPU (``info["decoder_fallback"]`` says why: :data:`NVDEC_UNCHECKED`).
        part: ``(k, K)``: decode only part ``k`` of ``K`` of the planned frames (the positions of
            :func:`datamodules.decode.parts.part_bounds`; the plan is made whole, the reader is the whole video's,
            the held grids are the whole video's restricted to the part). ``None``: the whole video.
        cpu_below_mpx: a file NVDEC would decode is read by the CPU reader instead when its
            :func:`source_megapixels` are at most this (``info["decoder_fallback"]``: :data:`SMALL_ON_CPU`); the
            CPU reader is the reference NVDEC's frames are checked against. ``None``: no such rule.
        cpu_slots: where NVDEC would read the file: the CPU reader reads it instead (``cpu_slots.threads`` decoder
            threads; ``info["decoder_fallback"]``: :data:`~datamodules.decode.cpu_slots.ON_CPU_SLOT`) when one of
            these slots is free and the read has at most ``cpu_slots.max_mpx`` source megapixels (a part: its share
            of the file's), held while it reads (:mod:`datamodules.decode.cpu_slots`). ``None``: no slots.

    Raises:
        DecodeError: missing, empty, truncated, corrupted or unreadable file, no video stream, no frame at the
            sampling rate, or no decodable frame; the message starts with the file path.
        ValueError: a bad ``max_replaced_frac``, ``decoder`` or ``part``.
    """
    if not 0.0 <= max_replaced_frac < 1.0:
        raise ValueError(f"max_replaced_frac must be in [0, 1), got {max_replaced_frac!r}")
    resolve_decoder(decoder)   # a bad setting fails before any file is read
    if part is not None:
        part_bounds(1, *part)   # checks 0 <= k < K
    return _decode_video(Path(path), budget_tokens, decode_max_side, base_fps, num_threads, native_decode_bytes,
                         short_clip_first_frame, max_replaced_frac, sizing, hold_chunk_bytes, decoder,
                         bool(strict_frames), part, cpu_below_mpx, cpu_slots)


def _decode_video(path: Path, budget_tokens: int, decode_max_side: int, base_fps: float, num_threads: int,
                  native_decode_bytes: float, short_clip_first_frame: bool,
                  max_replaced_frac: float = 0.0, sizing: EncoderSizing | None = None,
                  hold_chunk_bytes: float = HOLD_CHUNK_BYTES, decoder: str = "cpu",
                  strict_frames: bool = STRICT_FRAMES, part: tuple[int, int] | None = None,
                  cpu_below_mpx: float | None = None, cpu_slots: CpuSlots | None = None) -> DecodedVideo:
    _check_file(path)
    probe = probe_video(path)
    plan = plan_decode(path, probe, budget_tokens, base_fps, native_decode_bytes, decode_max_side,
                       short_clip_first_frame)
    small_first = cpu_below_mpx is not None and source_megapixels(probe) <= cpu_below_mpx
    # a small first video is read on the CPU whatever NVDEC's device query would say: that query (a CUDA context and
    # NVDEC's capabilities, 0.2 s alone) waited ~3 s in the driver beside the other workers' first NVDEC calls
    # (H100, bench/worker_start_probe.py, 15 workers), on the first answer's path; only the stream's reasons asked
    name, fallback = resolve_decoder(decoder, probe, path, device_checks=not small_first)
    if strict_frames and name == "nvdec":   # the rule needs concealment flags, which NVDEC's frames lack
        name, fallback = "cpu", NVDEC_UNCHECKED
    if small_first and name == "nvdec":
        name, fallback = "cpu", SMALL_ON_CPU
    on_slot = False
    with contextlib.ExitStack() as held:
        if cpu_slots is not None and name == "nvdec":   # an idle core free: the CPU reader, the same frames
            on_slot = held.enter_context(cpu_slots.take(_read_megapixels(probe, plan, part)))
        if on_slot:
            name, fallback, num_threads = "cpu", ON_CPU_SLOT, cpu_slots.threads
        if name == "cpu":
            name = cpu_reader_for(probe, plan.decode_hw)
        try:
            try:
                frames, replaced, made, concealed = _read_planned(path, probe, plan, name, num_threads,
                                                                  max_replaced_frac, sizing, hold_chunk_bytes,
                                                                  strict_frames, _bounds(plan, part))
            except FrameSizeChange as e:   # the CLI rebuilds its filter graph there: plan again on the decoder's
                probe = probe_video(path, timeline=str(e))   # timeline, with a new fps filter per size (issue 44)
                plan = plan_decode(path, probe, budget_tokens, base_fps, native_decode_bytes, decode_max_side,
                                   short_clip_first_frame)
                if name == "nvdec":
                    fallback = f"nvdec: {e}"
                name = "pyav"
                frames, replaced, made, concealed = _read_planned(path, probe, plan, name, num_threads,
                                                                  max_replaced_frac, sizing, hold_chunk_bytes,
                                                                  strict_frames, _bounds(plan, part))
        except DecodeError as e:
            if strict_frames or name not in ("decord", "nvdec") or probe.timestamps_unusable:
                raise
            # decord fails a whole batch on one refused packet, where the ffmpeg CLI skips it: PyAV reads the file
            alt = "pyav_sws" if pyav_sws_reads(probe) else "pyav_skip"
            frames, replaced, made, concealed = _read_planned(path, probe, plan, alt, num_threads,
                                                              max_replaced_frac, sizing, hold_chunk_bytes, False,
                                                              _bounds(plan, part))
            fallback = f"{name} failed: {str(e)[len(str(path)) + 2:][:200]}"
            name = alt
    h, w = probe.height, probe.width
    n_planned = len(plan.idx)
    bounds = _bounds(plan, part)
    if bounds is not None:   # the part's positions (its position lists count from its first, lo)
        plan = plan_part(plan, *bounds)
    (dh, dw), idx, unique = plan.decode_hw, plan.idx, plan.unique
    fps_ok = probe.fps > 0
    vfr = (not probe.timestamps_unusable) and is_variable_frame_rate(probe.pts, probe.time_base, probe.fps)
    native_fps = probe.fps if (fps_ok and not vfr) else len(probe.pts) / probe.duration_s
    info = {"duration_s": round(probe.duration_s, 6), "native_hw": [int(h), int(w)], "decode_hw": [int(dh), int(dw)],
            "n_frames": n_planned, "fps": round(native_fps, 4), "sample_fps": round(plan.sample_fps, 4),
            "fps_ok": bool(fps_ok), "vfr": bool(vfr), "decoder": name}
    late = next((r.fallback for r in reversed(made) if getattr(r, "fallback", None)), None)
    if late:   # the NVDEC reader failed on this file and read it on the CPU
        info["decoder"], fallback = late
        cpu = next(r.cpu for r in reversed(made) if getattr(r, "fallback", None))
        concealed = set(cpu.concealed) if hasattr(cpu, "concealed") else \
            concealed_frames(path, probe, unique, num_threads)
        if strict_frames and concealed:
            raise DecodeError(f"{path}: the decoder concealed damaged data in native frames "
                              f"{sorted(concealed)[:5]} (data.strict_frames)")
    if fallback:
        info["decoder_fallback"] = fallback
    if probe.timestamps_unusable:
        info["timestamps_unusable"] = True
    if probe.decoded_timeline:   # the frames are numbered and timed as the CLI's decoder outputs them
        info["timestamps_from_decoder"] = probe.decoded_timeline
    if replaced:   # positions in the returned frames whose native frame could not be read
        bad_native = {unique[k] for k in replaced}
        info["frames_replaced"] = [j for j, k in enumerate(idx) if k in bad_native]
    if concealed and not strict_frames:   # positions of the frames decoded from damaged data or repeated
        info["frames_concealed"] = [j for j, k in enumerate(idx) if k in concealed]
    if info["decoder"] == "nvdec":   # NVDEC's own frames: no decoder flags, no check pass (module nvdec)
        info["concealment_checked"] = False
    return DecodedVideo(frames=frames, times_s=plan.times_s, info=info, part=bounds)


def _read_megapixels(probe, plan, part: tuple[int, int] | None) -> float:
    """The source megapixels a read of ``part`` of ``plan`` covers: the file's (:func:`source_megapixels`) times the
    part's share of the planned frames (the whole file's for ``None``)."""
    mpx = source_megapixels(probe)
    if part is None or not plan.idx:
        return mpx
    lo, hi = part_bounds(len(plan.idx), *part)
    return mpx * (hi - lo) / len(plan.idx)


def _bounds(plan, part: tuple[int, int] | None) -> tuple[int, int] | None:
    """The planned positions ``(lo, hi)`` of ``part`` = ``(k, K)`` (``None``: the whole video)."""
    return None if part is None else part_bounds(len(plan.idx), *part)


def _failing_on(opener, concealed: set[int]):
    """``opener`` whose reads fail (``RuntimeError``, so the retries and replacement rule apply) when they include
    a frame of ``concealed`` (``strict_frames``)."""
    def open_strict(threads: int):
        read = opener(threads)

        def strict_read(ix):
            bad = sorted(set(ix) & concealed)
            if bad:
                raise RuntimeError(f"the decoder reported errors (concealed) in native frames {bad[:5]}")
            return read(ix)
        return strict_read
    return open_strict


def _read_planned(path: Path, probe, plan, name: str, num_threads: int, max_replaced_frac: float,
                  sizing: EncoderSizing | None, hold_chunk_bytes: float, strict_frames: bool,
                  bounds: tuple[int, int] | None = None):
    """``(frames, replaced positions, readers opened, concealed native indices)`` of the planned frames read by
    reader ``name`` (the retries, replacement rule and held sizes of :func:`_decode_unique` / :func:`_decode_held`).
    ``pyav_skip`` / ``pyav_sws`` flag concealment in their own pass; ``decord`` and ``pyav`` are checked first by
    :func:`concealed_frames`
    (under ``strict_frames`` a read that includes a concealed frame then fails, so the replacement rule applies);
    ``nvdec`` is checked only where it falls back to the CPU (the caller), and never runs under ``strict_frames``.
    ``bounds`` = ``(lo, hi)``: only the planned positions ``lo <= j < hi`` (a part; the held grids and whether to
    hold are the whole plan's, so every part of a video holds as the whole would)."""
    factory = READERS[name]
    if name in ("pyav_skip", "pyav_sws"):
        factory = partial(factory, strict=strict_frames)
    h, w = probe.height, probe.width
    n_planned, (dh, dw) = len(plan.idx), plan.decode_hw
    grids = sizing.grids(n_planned, dh, dw) if sizing is not None else None
    hold = grids is not None and held_bytes(grids) < n_planned * dh * dw * 3   # else holding saves no memory
    if bounds is not None:
        plan = plan_part(plan, *bounds)
        grids = part_grids(grids, *bounds) if grids is not None else None
    idx, unique = plan.idx, plan.unique
    if not idx:   # a part with no planned position (a video with fewer sampled frames than parts)
        empty = torch.empty((0, dh, dw, 3), dtype=torch.uint8)
        return (EncoderFrames(empty.shape, {}) if hold else empty), [], [], set()
    made: list = []   # the readers opened (a reader may fall back to the CPU mid-file: ``read.fallback``)
    checked = concealed_frames(path, probe, unique, num_threads) if name in ("decord", "pyav") else set()

    def open_reader(threads: int):
        made.append(factory(path, probe, dh, dw, threads))
        return made[-1]

    opener = (lambda threads: lambda ix: _read_frames(path, ix, h, w, dh, dw, threads)) if name == "decord" else \
        open_reader
    if strict_frames and checked:
        opener = _failing_on(opener, checked)
    if getattr(factory, "whole_video", False):   # one read of every planned frame (NVDEC decodes the stream once)
        hold_chunk_bytes = max(hold_chunk_bytes, float(len(unique) * dh * dw * 3))
    if not hold:
        frames, replaced = _decode_unique(path, unique, h, w, dh, dw, num_threads, max_replaced_frac,
                                          opener=opener)
        if len(unique) != len(idx):
            pos = {k: i for i, k in enumerate(unique)}
            frames = np.ascontiguousarray(frames[[pos[k] for k in idx]])
        frames = torch.from_numpy(frames)
    else:
        frames, replaced = _decode_held(path, unique, idx, h, w, dh, dw, num_threads, max_replaced_frac, sizing,
                                        grids, hold_chunk_bytes, opener=opener,
                                        chunk_opener=None if (name == "decord" and not strict_frames) else opener)
    concealed = set(checked)
    for r in made:
        concealed |= set(getattr(r, "concealed", ()))
    if replaced:   # replaced frames are no longer the concealed ones
        concealed -= {unique[k] for k in replaced}
    return frames, replaced, made, concealed


def decord_frame_count(path: str | Path) -> tuple[int, float]:
    """``(len(vr), vr.get_avg_fps())`` of ``decord.VideoReader(path)``: the ``total_frames`` and ``video_fps`` that
    qwen_omni_utils' frame choice starts from (QwenLM/Qwen2.5-Omni@f8bf58c6:qwen-omni-utils/src/qwen_omni_utils/
    v2_5/vision_process.py:_read_video_decord, ``total_frames, video_fps = len(vr), vr.get_avg_fps()``; decord's
    count is the container's frame count, e.g. mp4's sample count, else its duration-times-rate estimate).

    A codec decord has no decoder for (AV1: decord cannot open the stream, "cannot find video stream with wanted
    index: -1") is counted the same way from PyAV: the container's frame count (``nb_frames``), else the video
    packets, and the average rate.

    Raises:
        DecodeError: the file is missing or decord cannot open it.
    """
    import decord

    path = Path(path)
    _check_file(path)
    try:
        vr = decord.VideoReader(str(path), num_threads=1)
        return len(vr), float(vr.get_avg_fps())
    except Exception as e:  # noqa: BLE001 - decord raises its own error type for every open failure
        probe = None
        try:
            probe = probe_video(path)
        except DecodeError:
            pass
        if probe is None or decord_decodes(probe.codec_family or probe.codec):
            raise _open_error(path, e) from e
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        n = int(stream.frames or 0) or len(probe.pts)
    return n, float(probe.fps)


def decode_at_indices(path: str | Path, indices: list[int], max_side: int = 896, num_threads: int = 1,
                      native_decode_bytes: float = NATIVE_DECODE_BYTES, max_replaced_frac: float = MAX_REPLACED_FRAC,
                      video_fps: float | None = None, strict_frames: bool = STRICT_FRAMES) -> DecodedVideo:
    """The frames at explicit native (presentation-order) indices ``indices``, as ``vr.get_batch(idx)`` reads them
    in qwen_omni_utils' ``_read_video_decord`` (the frame choice is the caller's, e.g.
    :func:`algorithms.omni_sampling.qwen_omni_frame_indices`).

    The reader is decord (:func:`_frame_reader`: the release's reader, with its rotation fix; ``pyav_sws``, decord's
    frames and the concealment flags in one PyAV pass, where :func:`pyav_sws_reads` and every index is one of the
    stream's frames; ``pyav_skip`` for a codec decord has no decoder for), or PyAV in decode
    order for a file whose timestamps are unusable (:func:`cpu_reader_for`'s rule: decord's seeking returns wrong
    frames there); the size as :func:`decode_frame_size` with ``n_est = len(indices)`` (native while the frames take
    at most ``native_decode_bytes``, else the long side at most ``max_side``, inside the decoder); the retry with
    one thread and ``max_replaced_frac`` as :func:`decode_video`. Repeated indices are decoded once.

    Legacy containers (issue 44 item 3): where the packets carry no pts (AVI with B-frames: MPEG-4 ASP, H.264) or
    pts = dts with B-frames, :func:`decode_video` numbers and times the frames by the decoder's output
    (``probe.decoded_timeline``, the ffmpeg CLI's frames). This path does not: its reference is decord itself
    (qwen_omni_utils' ``_read_video_decord``: ``total_frames = len(vr)``, ``vr.get_batch(idx)``), so the indices,
    chosen from decord's count, are read by decord and give decord's frames, even where decord's numbering is
    not the decoder's (on an MPEG-4 ASP AVI with B-frames decord's frame 18 is a display frame 8; on a pts = dts
    mp4 its frames come out of temporal order; on an H.264 AVI with B-frames decord is not even repeatable: the same
    index gave one of two frames from one fresh reader to the next, so no reader reproduces the reference there).
    ``info["decord_numbering"]`` then says so (the probe's reason).
    A file whose timestamps are unusable (pts all equal or running backwards) is the one exception, read by PyAV in
    decode order (docs/deviations.md, "omni QA decord failure").

    Args:
        video_fps: the rate the indices were chosen at: ``times_s = index / video_fps`` (``None``: the stream's
            average rate, ``avg_frame_rate``, which decord's ``get_avg_fps`` reads; 1 when unknown).
        strict_frames: as :func:`decode_video`: ``False`` lists the concealed frames (``info["frames_concealed"]``,
            by the PyAV reader's own pass, else :func:`concealed_frames`); ``True`` makes them unreadable (then
            ``max_replaced_frac`` applies). A file decord reads and cannot read through stays an error here (no
            PyAV fallback on this path).

    Returns:
        :class:`DecodedVideo`; ``info``: ``duration_s`` (``format.duration``), ``native_hw``, ``decode_hw``,
        ``n_frames``, ``decoder``, ``frames_replaced`` when some frame was replaced, ``timestamps_unusable`` when
        set, ``decord_numbering`` (why decord's index is not the decoder's output order) for a legacy container
        read by decord.

    Raises:
        DecodeError: as :func:`decode_video` (an index past the stream's last frame fails the read).
        ValueError: no index, a negative one, or a bad ``max_replaced_frac``.
    """
    if not indices or min(indices) < 0:
        raise ValueError(f"indices must be a non-empty list of frame indices >= 0, got {list(indices)[:8]}")
    if not 0.0 <= max_replaced_frac < 1.0:
        raise ValueError(f"max_replaced_frac must be in [0, 1), got {max_replaced_frac!r}")
    path = Path(path)
    _check_file(path)
    probe = probe_video(path)
    idx = [int(k) for k in indices]
    h, w = probe.height, probe.width
    dh, dw = decode_frame_size(h, w, len(idx), native_decode_bytes, max_side)
    name = "pyav" if probe.timestamps_unusable else "decord"
    if name == "decord" and not decord_decodes(probe.codec_family or probe.codec):
        name = "pyav_skip"   # decord has no decoder for it (AV1): PyAV's FFmpeg has (frames matched by pts)
    elif name == "decord" and pyav_sws_reads(probe) and max(idx) < len(probe.pts) and not probe.decoded_timeline:
        # decord's frames, and the concealment flags from the same pass (no second decode); not for a legacy
        # container, where decord's numbering (the reference here) is not the decoder timeline pyav_sws reads by
        name = "pyav_sws"
    unique = sorted(set(idx))
    made: list = []

    def open_reader(threads: int):
        kw = {"strict": strict_frames} if name in ("pyav_skip", "pyav_sws") else {}
        made.append(READERS[name](path, probe, dh, dw, threads, **kw))
        return made[-1]

    opener = (lambda threads: lambda ix: _read_frames(path, ix, h, w, dh, dw, threads)) if name == "decord" else \
        open_reader
    concealed = concealed_frames(path, probe, unique, num_threads) if name in ("decord", "pyav") else set()
    if strict_frames and concealed:
        opener = _failing_on(opener, concealed)
    frames, replaced = _decode_unique(path, unique, h, w, dh, dw, num_threads, max_replaced_frac, opener=opener)
    for r in made:
        concealed |= set(getattr(r, "concealed", ()))
    if replaced:   # replaced frames are no longer the concealed ones
        concealed -= {unique[k] for k in replaced}
    if len(unique) != len(idx):
        pos = {k: i for i, k in enumerate(unique)}
        frames = np.ascontiguousarray(frames[[pos[k] for k in idx]])
    rate = video_fps if video_fps is not None else probe.fps
    times = [k / rate for k in idx] if rate and rate > 0 else [float(k) for k in idx]
    info = {"duration_s": round(probe.duration_s, 6), "native_hw": [int(h), int(w)], "decode_hw": [int(dh), int(dw)],
            "n_frames": len(idx), "decoder": name}
    if probe.timestamps_unusable:
        info["timestamps_unusable"] = True
    if probe.decoded_timeline and name == "decord":   # the release's numbering, kept (see above)
        info["decord_numbering"] = probe.decoded_timeline
    if replaced:
        bad_native = {unique[k] for k in replaced}
        info["frames_replaced"] = [j for j, k in enumerate(idx) if k in bad_native]
    if concealed and not strict_frames:
        info["frames_concealed"] = [j for j, k in enumerate(idx) if k in concealed]
    return DecodedVideo(frames=torch.from_numpy(frames), times_s=times, info=info)
