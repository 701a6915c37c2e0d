"""Step 3 of a decode, on the CPU: PyAV's skipping reader and the concealment flags (issue 31 §2, issue 42 item 1).

``pyav_skip`` (:func:`_pyav_skip_reader`) decodes only what the sampled frames need and flags the frames FFmpeg's
decoder concealed; ``pyav_sws`` (:func:`_pyav_sws_reader`) is the same pass with each sampled frame converted by
decord's own libswscale (:class:`datamodules.decode.swscale.Yuv420ToRgb`), so it gives decord's frames at any
decode size together with the flags; :func:`concealed_frames` is the flags alone, for the frames another reader
decoded (decord on other codecs, PyAV in decode order, NVDEC's CPU fallback). Which reader a file gets:
:func:`datamodules.decode.cpu.cpu_reader_for`.
"""
from __future__ import annotations

import bisect
import re
from pathlib import Path

import numpy as np

from datamodules.decode.cpu import PYAV_SKIP_CODECS, _frame_to_rgb, _resize
from datamodules.decode.display import autorotate_ops, swaps_axes
from datamodules.decode.errors import ffmpeg_log_unfolded
from datamodules.decode.probe import VideoProbe
from datamodules.decode.readers import READERS
from datamodules.decode.swscale import Yuv420ToRgb


def _pyav_skip_reader(path: Path, probe: VideoProbe, dh: int, dw: int, num_threads: int,
                      skip_nonref: bool | None = None, seek: bool = True, strict: bool = False,
                      check_only: bool = False, convert=None, codec_options: dict | None = None):
    """``read(idx)`` with PyAV that decodes only what the sampled frames need (issue 31 §2), at native size.

    Damaged data (issue 42 item 1). ``strict=False`` (``data.strict_frames: false``, the default of a run, seed 001:
    ``ffmpeg.run`` fails only on a non-zero exit): as the ffmpeg CLI, a packet the decoder refuses is skipped and
    decoding goes on, pictures decoded from damaged data (concealed) are kept, and a sampled frame the decoder
    gives nothing for is the last frame it gave before it (the ``fps`` filter repeats the previous frame over a
    gap), or, before the first frame it gives at all (a refused first IDR), the first sampled frame it gives (the
    CLI's constant-rate output, ``-fps_mode cfr`` for rawvideo, fills the start by duplicating the filter's first
    frame: seed 001's command answers such a file with 4 frames, native 15, 15, 23, 31 of ``good``; exact where
    that first output is a sampled frame, always when the plan is not thinned to the frame cap); ``read.concealed``
    collects the native indices of the sampled frames so concealed (in a GOP the decoder
    reported an error in: a refused packet, a frame marked corrupt, a concealment logged) or repeated.
    ``strict=True``: any of these raises ``RuntimeError`` (the caller's retries and replacement rule apply).
    ``check_only``: no RGB conversion; ``read`` returns ``(n, 1, 1, 3)`` zeros and fills ``read.concealed`` only
    (:func:`concealed_frames`).

    * ``seek``: where a key frame lies between the last frame decoded and the next sampled frame, the demuxer
      seeks to the key frame at or before that frame (``probe.keyframes``; the decoder is flushed) instead of
      decoding through;
    * ``skip_nonref``: every packet whose pts is not a sampled frame's is decoded with ``skip_frame = "NONREF"``
      (FFmpeg then drops the non-reference pictures no other frame predicts from; a sampled frame that is itself
      non-reference is decoded, with ``DEFAULT``);
    * frames are matched to native indices by their pts (``probe.pts`` minus ``probe.pts_offset``);
    * ``skip_nonref=None``: on for :data:`PYAV_SKIP_CODECS` only (another codec's ``NONREF`` is not known to drop
      only unreferenced pictures).

    ``convert``: ``frame -> (dh, dw, 3)`` uint8 in place of the CLI's conversion (``pyav_sws``: decord's
    libswscale); the decode, and so the flags, are the same whatever it is. ``codec_options``: FFmpeg decoder
    options (measurements only: ``bench/conceal_check.py`` tries ``skip_loop_filter``).

    H.264/HEVC decoding is exact whatever is skipped (the skipped pictures are not referenced), so the frames are
    the full decode's; RGB by ``to_ndarray(format="rgb24")`` (the same swscale conversion as decord and the ffmpeg
    CLI at native size); the display matrix applied as the CLI applies it (:func:`_frame_to_rgb`). A decoded frame
    of another size than the first raises :class:`FrameSizeChange` (the caller plans again on the decoder's
    timeline). Raises ``DecodeError`` naming the frames it could not get.
    """
    import av
    import av.logging

    if skip_nonref is None:
        skip_nonref = probe.codec in PYAV_SKIP_CODECS
    keyframes = probe.keyframes
    to_rgb = _frame_to_rgb(probe, resize_other_sizes=False)
    conv = convert or to_rgb
    first_hw = (probe.width, probe.height) if swaps_axes(autorotate_ops(probe.display_matrix)) else \
        (probe.height, probe.width)

    def _rgb(frame) -> np.ndarray:
        if check_only:
            return np.zeros((1, 1, 3), np.uint8)
        return conv(frame)

    def _read(idx: list[int]) -> np.ndarray:
        off = probe.pts_offset
        raw = {probe.pts[k] - off: k for k in idx}
        out: dict[int, np.ndarray] = {}
        todo = sorted(set(idx))
        t = 0                                   # todo[t]: the next sampled frame not yet decoded
        prev: list = [None, -1]                 # the last frame the decoder gave and its native index
        first: list = [None]                    # native index of the first frame the decoder gave, when it was the
        sought = [False]                        # first of the whole stream (no seek before it); ``sought``: a seek

        def settled(j: int) -> bool:            # todo[j] has its frame, or lies before the decoder's first frame
            if todo[j] in out:                  # and a later sampled frame (its stand-in) has one
                return True
            while not strict and first[0] is not None and j < len(todo) and todo[j] < first[0]:
                j += 1
            return j < len(todo) and todo[j] in out and j > 0 and todo[j - 1] < first[0]
        repeated: set[int] = set()

        def fill_gap(upto: int) -> None:        # sampled frames in (prev, upto) the decoder gave nothing for
            if strict or prev[0] is None:
                return
            lo, hi = bisect.bisect_right(todo, prev[1]), bisect.bisect_left(todo, upto)
            gap = [k for k in todo[lo:hi] if k not in out]
            if gap:
                x = _rgb(prev[0])
                for k in gap:
                    out[k] = x
                    repeated.add(k)

        def take(frame) -> None:
            if (frame.height, frame.width) != first_hw and not check_only:
                to_rgb(frame)   # raises FrameSizeChange: the CLI rebuilds its filter graph there
            n = raw.get(frame.pts)
            at = bisect.bisect_left(probe.pts, frame.pts + off) if frame.pts is not None else None
            if frame.is_corrupt and at is not None:   # FFmpeg's AV_FRAME_FLAG_CORRUPT / decode_error_flags:
                tainted.add(_next_key(keyframes, at) if keyframes else 0)   # seen with any decoder threads
                causes.append(f"native frame {at} marked corrupt by the decoder")
            if at is not None:
                if first[0] is None and not sought[0]:
                    first[0] = at
                fill_gap(at)
                if at > prev[1]:
                    prev[:] = [frame, at]
            if n is not None and n not in out:
                out[n] = _rgb(frame)

        tainted: set[int] = set()              # key frames of the GOPs whose decode logged an error
        causes: list[str] = []
        # the decoder's log is read with one decoder thread only: PyAV's Python log callback called from FFmpeg's
        # frame threads can deadlock, so with threads the log stays off; frames FFmpeg marks corrupt
        # (``Frame.is_corrupt``) taint their GOP with any thread count (take)
        watch = num_threads <= 1
        with av.open(str(path)) as container, av.logging.Capture() as logs, ffmpeg_log_unfolded():
            stream = container.streams.video[0]
            cc = stream.codec_context
            if codec_options:
                cc.options = dict(codec_options)
            stream.thread_type = "AUTO"
            stream.thread_count = max(1, num_threads)
            if watch:
                av.logging.set_level(av.logging.WARNING)
            seen = len(logs)

            def check(at: int) -> None:   # decoder errors logged since the last packet: that packet's GOP
                nonlocal seen
                for _, _, msg in logs[seen:]:
                    if _CONCEALED.search(str(msg)):
                        tainted.add(_next_key(keyframes, at) if keyframes else 0)
                        causes.append(" ".join(str(msg).split()))
                seen = len(logs)
            fed = -1                            # highest native index of a packet sent to the decoder
            while t < len(todo):
                kf = _next_key(keyframes, todo[t]) if keyframes else 0
                if seek and kf > fed + 1:       # a whole span no sampled frame needs: seek over it
                    container.seek(probe.pts[kf] - off, stream=stream, backward=True, any_frame=False)
                    sought[0] = True
                    cc.flush_buffers()
                    fed = kf - 1
                ended = True
                for packet in container.demux(stream):
                    if not packet.size:         # the demuxer's final empty packet: drained below
                        continue
                    if packet.pts is not None:
                        fed = max(fed, bisect.bisect_left(probe.pts, packet.pts + off))
                    if skip_nonref:
                        cc.skip_frame = "DEFAULT" if packet.pts in raw else "NONREF"
                    try:
                        for frame in cc.decode(packet):
                            take(frame)
                    except av.error.InvalidDataError as e:   # the CLI skips a packet the decoder refuses
                        if strict:
                            raise
                        tainted.add(_next_key(keyframes, fed) if keyframes else 0)
                        causes.append(f"packet of native frame {fed} refused: {e}")
                    check(fed)
                    while t < len(todo) and settled(t):
                        t += 1
                    if t >= len(todo) or (seek and keyframes and _next_key(keyframes, todo[t]) > fed + 1):
                        ended = False
                        break
                if ended:                       # end of stream: drain the decoder
                    cc.skip_frame = "DEFAULT"
                    for frame in cc.decode(None):
                        take(frame)
                    fill_gap(len(probe.pts))   # past the last frame: the fps filter repeats it
                    while t < len(todo) and settled(t):
                        t += 1
                    break
        av.logging.set_level(None)
        # before the first frame of the stream (a read that decoded from the start; after a seek the CLI would
        # repeat a frame this read did not decode, and the frame stays missing)
        lead = [k for k in todo if first[0] is not None and k < first[0] and k not in out and not strict]
        stand_in = next((k for k in todo if k in out and k >= (first[0] or 0)), None)
        if lead and stand_in is not None:   # the CLI's constant-rate output duplicates its first frame back to 0
            for k in lead:
                out[k] = out[stand_in]
                repeated.add(k)
        missing = [k for k in todo if k not in out]
        if missing:   # not a DecodeError: the caller's retries and replacement rule apply
            raise RuntimeError(f"the decoder gave no frame for native frames {missing[:5]}")
        concealed = [k for k in todo if (keyframes and _next_key(keyframes, k) in tainted)
                     or (not keyframes and tainted) or k in repeated]
        if concealed and not strict:
            read.concealed.update(concealed)
        elif concealed:   # issue 35 item 4: frames decoded from a GOP the decoder reported errors in
            raise RuntimeError(f"the decoder reported errors (concealed) in the GOP of native frames "
                               f"{concealed[:5]}: {'; '.join(dict.fromkeys(causes))[:200]}")
        frames = np.stack([out[k] for k in idx])
        return frames if frames.shape[1:3] == (dh, dw) or check_only else _resize(frames, dh, dw)

    def read(idx: list[int]) -> np.ndarray:
        try:
            return _read(idx)
        finally:
            av.logging.set_level(None)

    read.concealed = set()
    return read


# FFmpeg decoder messages that mean a picture was decoded from damaged data (h264: "concealing N DC, N AC, N MV
# errors in I frame", "error while decoding MB", "Invalid NAL unit size", "corrupted macroblock", ...)
_CONCEALED = re.compile(r"conceal|error while decoding|corrupt|Invalid NAL|decode_slice_header error|"
                        r"no frame!|Invalid data|illegal", re.IGNORECASE)


def _next_key(keyframes: list[int], k: int) -> int:
    """The key frame at or before native frame ``k`` (0, the stream's start, when none is)."""
    j = bisect.bisect_right(keyframes, k) - 1
    return keyframes[j] if j >= 0 else 0


READERS["pyav_skip"] = _pyav_skip_reader


def decord_rgb(dh: int, dw: int):
    """``frame -> (dh, dw, 3)`` uint8 RGB as decord converts it: the frame's 8-bit 4:2:0 planes through decord's
    own libswscale with the parameters of its ``scale`` filter (:class:`Yuv420ToRgb`; one converter per frame
    size, pixel format and colour tags, as ``vf_scale`` configures per frame). Bilinear at a reduced size, the
    plain conversion at native size. Raises :class:`datamodules.decode.errors.NvdecError` for another format."""
    convs: dict = {}

    def rgb(frame) -> np.ndarray:
        key = (frame.width, frame.height, frame.format.name, frame.colorspace, frame.color_range)
        c = convs.get(key)
        if c is None:
            c = convs[key] = Yuv420ToRgb(frame.width, frame.height, frame.format.name, (dh, dw), frame.colorspace,
                                         frame.color_range)
        return c(*(np.frombuffer(p, np.uint8).reshape(p.height, p.line_size) for p in frame.planes[:3]))
    return rgb


def _pyav_sws_reader(path: Path, probe: VideoProbe, dh: int, dw: int, num_threads: int, **kw):
    """``pyav_sws``: :func:`_pyav_skip_reader` (the keywords pass on) with decord's conversion
    (:func:`decord_rgb`) at decode size ``(dh, dw)``: decord's frames byte for byte on H.264/HEVC/VP9 8-bit 4:2:0
    without a display transform (:func:`datamodules.decode.cpu.pyav_sws_reads`; the decoding is bit-exact by
    those standards, and the conversion is decord's own library with its filter's parameters), with
    ``read.concealed`` from the same pass, so no second decode checks it (issue 42 item 1). A frame of another
    size than the first raises :class:`FrameSizeChange` as the ``pyav_skip`` reader does."""
    return _pyav_skip_reader(path, probe, dh, dw, num_threads, convert=decord_rgb(dh, dw), **kw)


READERS["pyav_sws"] = _pyav_sws_reader


def concealed_frames(path: Path, probe: VideoProbe, idx: list[int], num_threads: int = 1) -> set[int]:
    """The native indices of ``idx`` the FFmpeg decoder conceals (decodes from damaged data) or cannot give, for the
    frames another reader decoded: decord, PyAV in decode order and NVDEC report nothing of the kind (issue 42
    item 1: decord returns concealed pictures unflagged).

    How: one pass of :func:`_pyav_skip_reader` with ``check_only`` (seeking over the spans no sampled frame needs;
    ``skip_frame=NONREF`` only for H.264/HEVC; no RGB conversion). With one decoder thread (``num_threads=1``) the
    decoder's log is read as well as ``Frame.is_corrupt`` (FFmpeg's ``AV_FRAME_FLAG_CORRUPT`` /
    ``decode_error_flags``) and refused packets; with more, the log stays off (PyAV's log callback can deadlock
    under frame threads) and only the last two flag. A frame is flagged when its GOP (key frame to key frame)
    reported a decoder error, or the decoder gave nothing for it. The cost: one more decode of the GOPs that hold
    sampled frames, without the colour conversion (measured on 60 s 1280x720 25 fps clips decoded by decord at
    448 px, one thread, 2 shared cores: H.264 5.5 s -> 9.5 s, VP9 3.6-4.2 s -> 8.0 s; the profile is all
    ``CodecContext.decode``). So the files it cost most on are no longer read by decord: ``pyav_sws`` (H.264/HEVC/
    VP9 8-bit 4:2:0 without a display transform, :func:`datamodules.decode.cpu.pyav_sws_reads`) reads the frames
    and sets these very flags in one pass, 2.1-4.4x less CPU than decord + this check (``bench/conceal_check.py``,
    docs/performance.md). Why its flags are this function's: both are :func:`_pyav_skip_reader` with the same
    ``idx``, thread count, ``skip_nonref`` and ``seek``, so the same packets reach the same decoder with the same
    settings in the same order; the conversion (``check_only`` here, decord's swscale there) runs on the decoded
    frame after the decoder is done with it and feeds nothing back, and the flags come only from the decoder (its
    log, ``is_corrupt``, refused packets) and from which pts it gives (checked on every corrupt fixture, 1 and 2
    threads: ``tests/datamodules/test_decode_paths.py::test_one_pass_flags_equal_the_check``). This check remains
    for the rest (other codecs and pixel formats, rotated reduced sizes, PyAV in decode order, NVDEC's CPU
    fallback). Measured and not kept: ``skip_loop_filter=all`` in this pass (the same flags: H.264's errors are
    found while a slice is parsed and reconstructed, before the deblocking filter, which reports nothing) saves
    7-10% of the check on H.264 and nothing on VP9. Exact for the pictures
    FFmpeg's decoder itself conceals; a file whose timestamps are unusable (``probe.timestamps_unusable``, frames
    not matched by pts) is scanned in decode order: all its frames are flagged when any frame is marked corrupt or
    any packet is refused.

    Returns:
        a set of native indices (empty: nothing concealed). A file PyAV cannot open at all gives every index.
    """
    import av

    want = sorted(set(int(k) for k in idx))
    if probe.decoded_timeline:   # the timeline pass decoded every frame: it saw any corrupt frame / refused packet
        return set(want) if probe.damaged else set()
    if probe.timestamps_unusable:
        bad = False
        try:
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                for packet in container.demux(stream):
                    try:
                        bad = bad or any(f.is_corrupt for f in packet.decode())
                    except av.error.InvalidDataError:
                        bad = True
        except Exception:  # noqa: BLE001 - the container itself is unreadable
            return set(want)
        return set(want) if bad else set()
    read = _pyav_skip_reader(path, probe, 1, 1, max(1, int(num_threads)), strict=False, check_only=True)
    try:
        read(want)
    except Exception:  # noqa: BLE001 - no frame at all for some index: FFmpeg gives nothing to repeat there
        return set(want)
    return set(read.concealed)
