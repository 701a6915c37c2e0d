"""Step 4 of a decode, on any reader: one batch read, retried with one thread, then (``max_replaced_frac > 0``,
a deviation) frame by frame with each unreadable frame replaced by the nearest readable one (:func:`_decode_unique`,
:func:`replace_unreadable`). A frame is unreadable when no reader gives it, or, under ``strict_frames``, when the
decoder concealed it; by default (seed 001) concealed frames are kept (:func:`datamodules.decode.decode_video`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from datamodules.decode.cpu import _read_frames
from datamodules.decode.errors import DecodeError, _check_shape, short_error


MAX_REPLACED_FRAC = 0.0    # an unreadable sampled frame is an error record (above 0: the replacement rule)


_PACKET_RETRIES = 3


def _read_each(path: Path, idx: list[int], h: int, w: int, dh: int, dw: int, attempts: int = _PACKET_RETRIES,
               opener=None) -> list[np.ndarray | None]:
    """Each frame of ``idx`` read alone (one thread, a fresh reader each time); ``None`` where the decoder fails on
    it ``attempts`` times (decord's decoder thread sometimes reports an earlier packet's error on a later read)."""
    out: list[np.ndarray | None] = []
    for i in idx:
        frame = None
        for _ in range(attempts):
            try:
                frame = (opener(1)([i]) if opener is not None else _read_frames(path, [i], h, w, dh, dw, 1))[0]
                break
            except Exception:  # noqa: BLE001 - a corrupt packet: this frame only
                continue
        out.append(frame)
    return out


def replace_unreadable(frames: list[np.ndarray | None], idx: list[int]) -> tuple[list[np.ndarray], list[int]]:
    """Fill each ``None`` with the readable frame nearest in native index (the earlier one on a tie).

    Returns:
        ``(frames, replaced)``: the filled list and the positions that were replaced.

    Raises:
        ValueError: no frame is readable.
    """
    ok = [k for k, f in enumerate(frames) if f is not None]
    if not ok:
        raise ValueError("no readable frame")
    replaced = [k for k, f in enumerate(frames) if f is None]
    filled = list(frames)
    for k in replaced:
        src = min(ok, key=lambda j: (abs(idx[j] - idx[k]), idx[j]))
        filled[k] = frames[src]
    return filled, replaced


def _decode_unique(path: Path, unique: list[int], h: int, w: int, dh: int, dw: int, num_threads: int,
                   max_replaced_frac: float, read=None, opener=None) -> tuple[np.ndarray, list[int]]:
    """``(frames (len(unique), dh, dw, 3), replaced positions)``: one batch read (``read(threads)`` gives the
    frames, default ``opener(threads)(unique)``, one reader call; without ``opener`` one decord call), retried
    with one thread, then (``max_replaced_frac > 0``) frame by frame with replacement."""
    if read is None:
        read = (lambda threads: opener(threads)(unique)) if opener is not None else \
            (lambda threads: _read_frames(path, unique, h, w, dh, dw, threads))
    replaced: list[int] = []
    try:
        try:
            frames = read(num_threads)
        except DecodeError:
            raise
        except Exception:
            if num_threads <= 1:
                raise
            frames = read(1)   # decord's threaded decoder failed: one thread
    except DecodeError:
        raise
    except Exception as e:
        each = _read_each(path, unique, h, w, dh, dw, opener=opener) if max_replaced_frac > 0 else []
        bad = sum(f is None for f in each)
        if not each or bad == len(each) or bad > max_replaced_frac * len(each):
            detail = f"; {bad} of {len(each)} frames unreadable alone, more than data.max_replaced_frac=" \
                     f"{max_replaced_frac:g}" if each else ""
            raise DecodeError(f"{path}: decoding {len(unique)} frames failed (corrupted or truncated stream; "
                              f"{short_error(e)}{detail})") from e
        filled, replaced = replace_unreadable(each, unique)
        frames = np.stack(filled)
    return _check_shape(path, np.ascontiguousarray(frames), len(unique)), replaced
