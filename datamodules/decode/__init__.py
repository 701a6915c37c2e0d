"""Video decoding, once per video, of the frames the largest budget needs: the decode room.

The pipeline, one file per step:

====================  ==========================================================================================
``probe.py``          :func:`probe_video` -> :class:`VideoProbe`: the container's integer pts and time base, packet
                      durations, ``format.duration``, ``start_time``, key frames, codec, display matrix (PyAV; one
                      frame decoded), or the decoder's timeline where the packets' pts are not the CLI's (AVI with
                      B-frames, pts = dts with B-frames, a frame size change: a full decode)
``display.py``        the display matrix as the ffmpeg CLI's autorotation applies it (transposes and flips)
``plan.py``           :func:`plan_decode` -> :class:`DecodePlan`: seed 001's frames and the decode size;
                      :func:`auto_decode_threads`, :func:`auto_num_workers`
``readers.py``        :data:`READERS`, the registry, and :func:`resolve_decoder` (``data.decoder``: cpu, nvdec, auto)
``cpu.py``            the CPU readers ``decord``, ``pyav`` and :func:`cpu_reader_for`
``pyav_skip.py``      the CPU readers ``pyav_skip``, ``pyav_sws`` (decord's frames and the concealment flags in
                      one pass) and :func:`concealed_frames` (the flags for the other readers)
``nvdec.py``          the ``nvdec`` reader (registered when imported; import it before decord), fed by
                      ``packet_filter.py`` (the packets the sampled frames need) and converted by ``swscale.py``
                      (decord's own libswscale, so its frames are the CPU path's) on ``convert.py``'s threads;
                      ``nvdec_plan.py``: which files it decodes exactly and how their frames are cut over sessions
``retry.py``          the retries with one thread and the replacement rule, on any reader
``held.py``           :class:`EncoderSizing`, :class:`EncoderFrames`: frames held at the encoder's sizes only
``parts.py``          a long video's planned frames cut into parts (decoded by several workers) and joined back
``video.py``          :func:`decode_video`, :func:`decode_at_indices`, :func:`decord_frame_count`: the steps above
                      end to end, -> :class:`DecodedVideo`
``errors.py``         :class:`DecodeError`, :class:`NvdecError`, the file checks, and what each broken file gives
``isolated.py``       :func:`decode_isolated`: :func:`decode_video` in a child process, for a file that killed a
                      decode worker in an earlier run of the output folder
====================  ==========================================================================================

Three parts (:func:`decode_video`): (a) the plan: :func:`probe_video` demuxes the video stream with PyAV (integer
pts and time base, packet durations, ``format.duration``, ``start_time``; no decode beyond one frame) and
:func:`plan_decode` makes seed 001's frame choice from them exactly as FFmpeg's ``fps=fps:round=down`` does
(:func:`algorithms.budget.fps_filter_frames`, checked index by index against imageio-ffmpeg's binary in
``tests/datamodules/test_frame_identity.py``) and the decode size; (b) a reader from :data:`READERS` returns
``(n, dh, dw, 3)`` uint8 RGB for ascending native (presentation-order) indices. ``decoder=cpu`` picks one per file
(:func:`cpu_reader_for`: ``pyav_skip``, ``pyav_sws``, ``decord`` or ``pyav``, :mod:`datamodules.decode.cpu` says
when). ``nvdec``
is registered by :mod:`datamodules.decode.nvdec`; ``decoder=auto`` takes it per file where its ``supports(probe)``
allows; (c) retries, the replacement rule and the encoder-size holding work on any reader; ``info["decoder"]``
names the reader used (``decord``, ``pyav_skip``, ``pyav_sws``, ``pyav``, ``nvdec``).

Importing this package imports neither decord nor PyNvVideoCodec: the readers import decord when they first read,
and ``from datamodules.decode import nvdec`` imports PyNvVideoCodec (it must come before decord in a process:
:func:`datamodules.decode.nvdec_plan._import_nvc`).
"""
from datamodules.decode.errors import DecodeError, NvdecError, short_error
from datamodules.decode.probe import VideoProbe, is_variable_frame_rate, probe_video
from datamodules.decode.plan import (NATIVE_DECODE_BYTES, DecodePlan, auto_decode_threads, auto_num_workers,
                                     decode_frame_size,
                                     decode_size, plan_decode)
from datamodules.decode.readers import DECODERS, READERS, ReaderFactory, resolve_decoder
from datamodules.decode.cpu import PYAV_SKIP_CODECS, PYAV_SKIP_PIX_FMTS, PYAV_SWS_CODECS, cpu_reader_for
from datamodules.decode.pyav_skip import concealed_frames
from datamodules.decode.retry import MAX_REPLACED_FRAC, replace_unreadable
from datamodules.decode.held import HOLD_CHUNK_BYTES, EncoderFrames, EncoderSizing, held_bytes, hold_chunk_frames
from datamodules.decode.parts import PartMismatch, join_frames, join_info, part_bounds
from datamodules.decode.video import (STRICT_FRAMES, DecodedVideo, decode_at_indices, decode_video,
                                      decord_frame_count)

__all__ = ["DECODERS", "DecodeError", "DecodePlan", "DecodedVideo", "EncoderFrames", "EncoderSizing",
           "HOLD_CHUNK_BYTES", "MAX_REPLACED_FRAC", "NATIVE_DECODE_BYTES", "NvdecError", "PYAV_SKIP_CODECS",
           "PartMismatch", "join_frames", "join_info", "part_bounds",
           "PYAV_SKIP_PIX_FMTS", "PYAV_SWS_CODECS", "READERS", "ReaderFactory", "STRICT_FRAMES", "VideoProbe",
           "auto_decode_threads", "auto_num_workers",
           "concealed_frames", "cpu_reader_for", "decode_at_indices", "decode_frame_size", "decode_size",
           "decode_video", "decord_frame_count", "held_bytes", "hold_chunk_frames", "is_variable_frame_rate",
           "plan_decode", "probe_video", "replace_unreadable", "resolve_decoder", "short_error"]
