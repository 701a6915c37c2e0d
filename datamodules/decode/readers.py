"""Step 3 of a decode, the registry: the readers a ``data.decoder`` setting may pick (:data:`READERS`) and the
rule that picks one per file (:func:`resolve_decoder`).

A reader returns ``(n, dh, dw, 3)`` uint8 RGB for ascending native (presentation-order) indices. The CPU readers
(``decord``, ``pyav``, ``pyav_skip``) are registered by :mod:`datamodules.decode.cpu`; ``nvdec`` by
:mod:`datamodules.decode.nvdec` when that module is imported (it must be imported before decord: see there).
``info["decoder"]`` names the reader used.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from datamodules.decode.display import mirrored
from datamodules.decode.probe import VideoProbe


# A reader: ``factory(path, probe, dh, dw, num_threads) -> read``, ``read(native indices ascending) -> (n, dh, dw, 3)``
# uint8 RGB, upright. ``datamodules/decode/nvdec.py`` adds ``"nvdec"``; a factory may carry ``supports(probe) -> bool``
# (``auto`` then falls back to ``cpu`` per file for what it cannot decode).
ReaderFactory = Callable[[Path, VideoProbe, int, int, int], Callable[[list[int]], np.ndarray]]
READERS: dict[str, ReaderFactory] = {}
DECODERS = ("cpu", "nvdec", "auto")


def resolve_decoder(decoder: str, probe: VideoProbe | None = None, path: Path | None = None,
                    device_checks: bool = True) -> tuple[str, str | None]:
    """The reader a ``decoder`` setting decodes a video with, and why it is not the one asked for.

    ``cpu``: the CPU reader; ``nvdec``: the NVDEC reader (an error when none is registered); ``auto``: ``nvdec``
    when registered, else ``cpu``. For ``nvdec`` and ``auto`` a video the NVDEC reader cannot decode exactly
    (its ``supports(probe, path)`` gives a reason: codec, 4:4:4 / 10-bit, odd size, rotation, decoder limits, no
    GPU) goes to the CPU, per file, with that reason. ``device_checks=False``: only what the stream alone rules out
    is asked (the reader's ``stream_supports``, where it has one: no query of the GPU), for a file that is read on
    the CPU whatever the device says (the rank's first video, ``decode_video(cpu_below_mpx=...)``), whose record
    needs only the reason.

    Returns:
        ``("cpu" | "nvdec", reason or None)``; the reason is recorded as ``video_info.decoder_fallback``.

    Raises:
        ValueError: an unknown setting, or ``nvdec`` with no NVDEC reader registered.
    """
    if decoder not in DECODERS:
        raise ValueError(f"data.decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    if decoder == "cpu":
        return "cpu", None
    if probe is not None and (probe.decoded_timeline or mirrored(probe.display_matrix)):
        return "cpu", ("the frames are numbered by the decoder's output timestamps (" + probe.decoded_timeline + ")"
                       if probe.decoded_timeline else "a mirrored display matrix (flips applied on the CPU)")
    nv = READERS.get("nvdec")
    if nv is None:
        if decoder == "nvdec":
            raise ValueError("data.decoder=nvdec: no NVDEC reader is registered (datamodules.decode.nvdec not "
                             "available: needs PyNvVideoCodec and an NVIDIA GPU); use cpu or auto")
        return "cpu", None
    supports = getattr(nv, "supports", None)
    if not device_checks:
        supports = getattr(nv, "stream_supports", supports)
    why = supports(probe, path) if (probe is not None and supports is not None) else None
    return ("cpu", why) if why else ("nvdec", None)
