"""Step 5 of a decode (optional): the frames held only at the encoder's sizes.

Held at the encoder's sizes (issue 25; ``sizing``, ``data.hold_encoder_sizes``, on for plain predict): the frames are
decoded as without it but ``hold_chunk_bytes`` (64 MB of decode-size frames) at a time, and each chunk is resized right
away, by the checkpoint processor's own ``resize`` with the arguments ``BudgetedVideoLlama3.encode`` gives it, to
every grid some budget reads it at (:func:`algorithms.budget.encoder_grids`; smaller raw frames are re-encoded from
those grids' pixels, seed 001 ``reencode``); only those
pixels are kept (:class:`EncoderFrames`), and the encoder does not resize them again. The encoder's
``pixel_values`` are bit-identical to the decode-size path on the CPU (``tests/datamodules/test_hold_sizes.py``; the resize runs
in the worker on the CPU, where seed 001's processor runs too, rather than on the model's device). An hour of
1080p at B = 16384 (and 4096 + 16384): 2048 frames at one grid of 6 x 10 cells, 168 x 280 pixels, 0.29 GB instead
of 2.8 GB per item (``bench/hour_video_rss.py`` measures the peak RSS). A video whose encoder sizes would take no
fewer bytes than its decode (short videos the encoder upsamples) keeps the decode-size tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from algorithms.budget import CELL_PIXELS, encoder_grids
from datamodules.decode.cpu import _frame_reader
from datamodules.decode.errors import _check_shape
from datamodules.decode.retry import _decode_unique
from models.kernels import host_to_device


HOLD_CHUNK_BYTES = 64e6    # decode-size bytes per chunk when frames are held at the encoder's sizes


@dataclass(frozen=True)
class EncoderSizing:
    """The sizes the vision encoder reads a run's frames at, and the processor that resizes them (a decode holds
    only those, :func:`decode_video` ``sizing``).

    Attributes:
        budgets: the run's budgets (vision tokens); ``max_tokens_per_frame``, ``raw_mode``, ``raw_max_tokens``: as
            in ``models.videollama3.prepare_budgets`` (:func:`algorithms.budget.encoder_grids`).
        processor: the checkpoint's ``VideoLlama3VideoProcessor``; its own ``resize`` makes the held frames.
    """

    budgets: tuple[int, ...]
    max_tokens_per_frame: int
    raw_mode: str
    raw_max_tokens: int
    processor: object

    def grids(self, num_frames: int, height: int, width: int) -> dict[tuple[int, int], tuple[list[int], int]]:
        """``{grid: (frame positions, token cap)}`` (:func:`algorithms.budget.encoder_grids`)."""
        return encoder_grids(height, width, num_frames, list(self.budgets), self.max_tokens_per_frame,
                             self.raw_mode, self.raw_max_tokens)

    def resize(self, frames: torch.Tensor, max_tokens: int) -> torch.Tensor:
        """``(n, H, W, 3)`` uint8 -> ``(n, 28 gh, 28 gw, 3)`` uint8: the processor's resize with the size arguments
        ``BudgetedVideoLlama3.encode`` gives it (so its later rescale/normalize sees the very same pixels;
        :func:`models.videollama3.frame_sizes.processor_resize`)."""
        from models.videollama3.frame_sizes import processor_resize

        return processor_resize(self.processor, frames, max_tokens)


class EncoderFrames:
    """A decoded video held only at the sizes its vision encodes read (:class:`EncoderSizing`), in place of the
    ``(T, H, W, 3)`` decode-size frames; ``models.videollama3.EncodeCache`` reads it through :meth:`at_grid`.

    Attributes:
        shape: ``(T, H, W, 3)``, the decode size (the geometry of every budget is computed from it).
        held: ``{(gh, gw): (frames (n, 28 gh, 28 gw, 3) uint8, their positions in 0..T-1, ascending)}``.
    """

    def __init__(self, shape, held: dict[tuple[int, int], tuple[torch.Tensor, list[int]]]):
        self.shape = torch.Size(shape)
        self.held = held

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the held frames, all grids (not the decode size of :attr:`shape`)."""
        return sum(t.numel() * t.element_size() for t, _ in self.held.values())

    def to(self, *args, **kwargs) -> "EncoderFrames":
        """The held frames moved / cast by ``torch.Tensor.to(*args, **kwargs)`` (positions unchanged)."""
        return EncoderFrames(self.shape, {g: (t.to(*args, **kwargs), pos) for g, (t, pos) in self.held.items()})

    def pin_memory(self) -> "EncoderFrames":
        """The frames in page-locked host memory (called by the DataLoader's pin-memory thread when the loader pins):
        the copy to the GPU can then run without blocking the host (``to(device, non_blocking=True)``)."""
        return EncoderFrames(self.shape, {g: (t.pin_memory(), pos) for g, (t, pos) in self.held.items()})

    def at_grid(self, idx: list[int], grid: tuple[int, int]) -> torch.Tensor:
        """``(len(idx), 28 gh, 28 gw, 3)`` frames at positions ``idx`` resized for ``grid``.

        Raises:
            KeyError: the grid or a frame was not held (the sizing did not list it).
        """
        if grid not in self.held:
            raise KeyError(f"frames are held at grids {sorted(self.held)} only, not {grid}")
        t, pos = self.held[grid]
        where = {p: k for k, p in enumerate(pos)}
        missing = [i for i in idx if i not in where]
        if missing:
            raise KeyError(f"frames {missing[:5]} are not held at grid {grid}")
        # the index goes to the GPU from pinned memory: indexing with a host list copies it with a wait for the GPU
        return t[host_to_device(torch.tensor([where[i] for i in idx], dtype=torch.long), t.device)]

    def __getitem__(self, key):
        raise TypeError("EncoderFrames holds the frames at the encoder's sizes only: read them with at_grid")


def held_bytes(grids: dict[tuple[int, int], tuple[list[int], int]]) -> int:
    """Bytes of uint8 RGB frames held at the grids of :meth:`EncoderSizing.grids`: ``sum n * 28 gh * 28 gw * 3``."""
    return sum(len(pos) * (CELL_PIXELS * gh) * (CELL_PIXELS * gw) * 3 for (gh, gw), (pos, _) in grids.items())


def hold_chunk_frames(height: int, width: int, hold_chunk_bytes: float) -> int:
    """Frames per decode chunk when frames are held at the encoder's sizes: ``max(1, bytes // (h * w * 3))``."""
    return max(1, int(hold_chunk_bytes // (height * width * 3)))


def _decode_held(path: Path, unique: list[int], idx: list[int], h: int, w: int, dh: int, dw: int, num_threads: int,
                 max_replaced_frac: float, sizing: EncoderSizing, grids: dict, hold_chunk_bytes: float,
                 opener=None, chunk_opener=None) -> tuple[EncoderFrames, list[int]]:
    """The frames of :func:`_decode_unique`, decoded ``hold_chunk_frames`` at a time and each chunk resized to the
    grids that need its frames at once. A failing chunk falls back to :func:`_decode_unique` on the whole video
    (the same retries and replacements as without ``sizing``; the decode size is then held for all frames)."""
    where = {k: i for i, k in enumerate(unique)}
    src = [where[k] for k in idx]          # position j -> index in ``unique`` (non-decreasing)
    step = hold_chunk_frames(dh, dw, hold_chunk_bytes)
    parts: dict[tuple[int, int], list[torch.Tensor]] = {}

    def take(chunk: np.ndarray, lo: int) -> None:   # chunk = frames of unique[lo:lo + len(chunk)]
        x = torch.from_numpy(chunk)
        for g, (js, cap) in grids.items():
            sel = [src[j] - lo for j in js if lo <= src[j] < lo + len(chunk)]
            if sel:
                parts.setdefault(g, []).append(sizing.resize(x[sel], cap))

    def chunked(threads: int) -> np.ndarray:
        parts.clear()
        read = chunk_opener(threads) if chunk_opener is not None else _frame_reader(path, h, w, dh, dw, threads)
        for lo in range(0, len(unique), step):
            take(_check_shape(path, read(unique[lo:lo + step]), len(unique[lo:lo + step])), lo)
        return np.empty((len(unique), 0, 0, 3), np.uint8)   # done: nothing left to resize

    frames, replaced = _decode_unique(path, unique, h, w, dh, dw, num_threads, max_replaced_frac, read=chunked,
                                      opener=opener)
    if frames.shape[1] != 0:   # the frame-by-frame fallback returned the whole decode: resize it in chunks
        parts.clear()
        for lo in range(0, len(unique), step):
            take(frames[lo:lo + step], lo)
    held = {g: (torch.cat(parts[g]), js) for g, (js, _) in grids.items()}
    return EncoderFrames((len(idx), dh, dw, 3), held), replaced
