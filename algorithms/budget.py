"""Vision-token budgets: frame caps, decode sampling, per-frame token counts and the layout plan (DESIGN §3.1-3.4).

Legend: B budget (LLM vision rows per video), K rows per compressed group (64), T frames, D feature dim,
G groups, hw merged tokens per frame at the encode size, raw_hw rows per raw frame in the LLM input.

A *merged token* (or cell) is one 28×28 pixel area: a 2×2 block of 14-pixel ViT patches that VideoLLaMA3 merges
into one LLM row. Pure python/torch; no lightning, no transformers, no I/O (numpy where a seed's numpy call is reproduced).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
import torch

from .segmentation import (
    FORCE_EVERY,
    MAX_GROUP_FRAMES,
    TARGET_FRAMES,
    adaptive_segment_count,
    adaptive_segment_lengths,
    frame_changes,
    group_variation,
    uniform_segment_lengths,
)

K_ROWS = 64                    # rows a compressed group becomes (qbase queries)
PATCH_SIZE = 14                # ViT patch side, pixels
MERGE_SIZE = 2                 # patches merged per side into one LLM row
CELL_PIXELS = PATCH_SIZE * MERGE_SIZE  # 28: side of one merged token, pixels
MAX_TOKENS_PER_FRAME = 256
MIN_TOKENS_PER_FRAME = 16
BASE_FPS = 1.0
# seed 001/000 record ``fps_ok=fps >= bd.MIN_FPS - 1e-6``; ``bd.MIN_FPS`` is not in the seeds. 0.5: the lowest rate a
# video decoded at the full 1 fps reaches (``floor(d) / d >= 1/2`` for d >= 1 s), so ``fps_ok`` is False exactly when
# a budget's frames are thinned below one per 2 s (docs/deviations.md)
MIN_FPS = 0.5

PlanMode = Literal["raw", "hybrid", "forced8", "all_compressed", "qbase"]


def max_frames(budget_tokens: int, k: int = K_ROWS) -> int:
    """Most frames a budget can carry: ``(B // K) * 8`` (every group compressed, 8 frames each).

    Raises:
        ValueError: ``B < K`` (not even one compressed group fits).
    """
    check_budget(budget_tokens, k)
    return (budget_tokens // k) * MAX_GROUP_FRAMES


def check_budget(budget_tokens: int, k: int = K_ROWS) -> None:
    """Raise ``ValueError`` when the budget cannot hold even one compressed group of K rows."""
    if budget_tokens < k:
        raise ValueError(f"budget of {budget_tokens} vision tokens is smaller than one compressed group ({k} rows)")


def sample_rate(duration_s: float, budget_tokens: int, base_fps: float = BASE_FPS, k: int = K_ROWS) -> float:
    """Decode sampling rate for the largest budget (seed 001, ``decode_video``).

    Follows ``fps = bd.FPS if int(duration * bd.FPS) + 1 <= max_frames else (max_frames + 1) / duration``
    with ``max_frames = (B // K) * 8`` (:func:`max_frames`) and ``duration = float(probe["format"]["duration"])``
    (the container's duration, which is what ffprobe prints as ``format.duration``; not the video stream's end).

    Args:
        duration_s: the container's duration in seconds (``format.duration``).
        budget_tokens: the largest budget of the run.

    Returns:
        Frames per second (``base_fps``, or ``(M + 1) / duration`` when ``base_fps`` would give more than M frames):
        the Python float the seed passes to ``ffmpeg.filter(stream, "fps", fps=fps, round="down")``.
    """
    cap = max_frames(budget_tokens, k)
    if int(duration_s * base_fps) + 1 <= cap:
        return base_fps
    return (cap + 1) / float(duration_s)


INT_MAX = 2**31 - 1


def _int64(v: int) -> int:
    """``v`` wrapped to a signed 64-bit integer (C's ``int64_t`` overflow)."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def av_reduce(num: int, den: int, max_value: int) -> tuple[int, int]:
    """FFmpeg's ``av_reduce`` (libavutil/rational.c): ``num / den`` as the best rational approximation with
    numerator and denominator at most ``max_value`` (continued fractions; the last convergent or, when it passes
    ``max_value``, the semiconvergent that is closer than the previous convergent).

    Returns:
        ``(num, den)``, reduced; the sign on the numerator.
    """
    sign = (num < 0) != (den < 0)
    num, den = abs(num), abs(den)
    g = math.gcd(num, den)
    if g:
        num, den = num // g, den // g
    a0n, a0d, a1n, a1d = 0, 1, 1, 0
    if num <= max_value and den <= max_value:
        a1n, a1d, den = num, den, 0
    while den:
        x = num // den
        next_den = num - den * x
        # C's int64 arithmetic (x is uint64_t there): the products wrap as in libavutil
        a2n, a2d = _int64(x * a1n + a0n), _int64(x * a1d + a0d)
        if a2n > max_value or a2d > max_value:
            if a1n:
                x = (max_value - a0n) // a1n
            if a1d:
                x = min(x, (max_value - a0d) // a1d)
            if (den * (2 * x * a1d + a0d)) % 2**64 > (num * a1d) % 2**64:   # uint64_t comparison
                a1n, a1d = x * a1n + a0n, x * a1d + a0d
            break
        a0n, a0d, a1n, a1d = a1n, a1d, a2n, a2d
        num, den = den, next_den
    return (-a1n if sign else a1n), a1d


def av_d2q(d: float, max_value: int = INT_MAX) -> Fraction:
    """FFmpeg's ``av_d2q`` (libavutil/rational.c): a double as a rational, ``av_reduce(floor(d * 2^(62 - e) + 0.5),
    2^(62 - e), max)`` with ``e = max(exponent(d) - 1, 0)`` (``frexp``); the fps filter's rate is
    ``av_d2q(fps, INT_MAX)`` (vf_fps.c ``config_props``: ``outlink->frame_rate = av_d2q(res, INT_MAX)``).

    Raises:
        ValueError: ``d`` is not a positive finite number (no frame rate).
    """
    if not (math.isfinite(d) and d > 0) or d > INT_MAX + 3:
        raise ValueError(f"a frame rate must be a positive finite number, got {d!r}")
    exponent = max(math.frexp(d)[1] - 1, 0)
    den = 1 << (62 - exponent)
    scaled = int(math.floor(d * den + 0.5))
    num, den_out = av_reduce(scaled, den, max_value)
    if (not num or not den_out) and 0 < max_value < INT_MAX:
        num, den_out = av_reduce(scaled, den, INT_MAX)
    return Fraction(num, den_out)


def rescale_down(ts: int, time_base: Fraction, rate: Fraction) -> int:
    """``av_rescale_q_rnd(ts, time_base, 1 / rate, AV_ROUND_DOWN)``: a timestamp in ``time_base`` units as the
    number of whole ``1 / rate`` steps at or before it (floor, exact integer arithmetic, also for negative ``ts``)."""
    return (ts * time_base.numerator * rate.numerator) // (time_base.denominator * rate.denominator)


def fps_filter_frames(pts: list[int], time_base: Fraction, end_pts: int, rate: Fraction, flush: bool = True
                      ) -> list[int]:
    """Source frame shown by each output frame of FFmpeg's ``fps=fps:round=down`` filter, from integer timestamps.

    Follows FFmpeg libavfilter/vf_fps.c (FFmpeg/FFmpeg@01440e258827f77990d918bfeb77cb613bc3733a, the filter of the
    n9 binary imageio-ffmpeg bundles; ``tests/datamodules/test_frame_identity.py`` checks the binary itself):

    * ``read_frame``: ``frame->pts = av_rescale_q_rnd(in_pts, inlink->time_base, outlink->time_base, rounding)``,
      the output time base being ``1 / rate`` and the rounding ``AV_ROUND_DOWN`` (:func:`rescale_down`);
    * ``write_frame``: the first output pts is the first frame's (``s->next_pts = s->frames[0]->pts``); the first of
      two buffered frames is dropped when ``s->frames[1]->pts <= s->next_pts``, else it is output at
      ``s->next_pts++`` (so output ``n`` is the last frame whose rescaled pts is ``<= n``);
    * ``update_eof_pts``: at end of stream the status pts is rescaled the same way (``eof_action=round``), and the
      last frame is repeated while ``s->status_pts > s->next_pts``.

    Args:
        pts: the frames' presentation timestamps in ``time_base`` units, in the order the decoder outputs them
            (presentation order), already offset as the ffmpeg CLI offsets them (minus the file's start time).
        time_base: the stream's time base (the filter's input time base in the ffmpeg CLI).
        end_pts: the end-of-stream timestamp the CLI signals (``last pts + last frame duration``, same units).
        rate: the filter's rate, ``av_d2q(fps, INT_MAX)`` (:func:`av_d2q`).
        flush: ``False``: the stream does not end here; the filter is dropped with its last frame still buffered
            (the CLI rebuilding its filter graph on a new frame size: no end of stream, no output for that frame).

    Returns:
        N positions into ``pts`` (non-decreasing), one per output frame; empty when the rescaled end is not past
        the rescaled first pts (``floor(end * fps) <= floor(t_0 * fps)``: the clip ends before one output step).
    """
    return [i for _, i in _fps_outputs(pts, time_base, end_pts, rate, flush)]


def _fps_outputs(pts: list[int], time_base: Fraction, end_pts: int, rate: Fraction, flush: bool = True
                 ) -> list[tuple[int, int]]:
    """:func:`fps_filter_frames` as ``(output pts in 1 / rate units, position into pts)`` pairs."""
    if not pts:
        return []
    q = [rescale_down(p, time_base, rate) for p in pts]
    eof = rescale_down(end_pts, time_base, rate)
    out: list[tuple[int, int]] = []
    i, n, last = 0, q[0], len(q) - 1
    while True:
        if i < last:
            if q[i + 1] <= n:
                i += 1
                continue
        elif not flush or eof <= n:
            break
        out.append((n, i))
        n += 1
    return out


def cfr_sync(outputs: list[tuple[int, int]]) -> list[int]:
    """The frames the ffmpeg CLI writes for filter outputs ``(pts, frame)`` (pts in the output time base, one unit
    per frame) to a ``-f rawvideo`` output: its constant-frame-rate sync (fftools/ffmpeg_enc.c
    ``video_sync_process``, ``VSYNC_CFR``, the default for a muxer without ``AVFMT_VARIABLE_FPS``), from the first
    output on.

    For each output after the first, ``delta0 = pts - next_pts`` and ``delta = delta0 + 1``: ``delta < -1.1``
    drops it; ``delta > 1.1`` writes it ``llrint(delta)`` times, the first ``llrint(delta0 - 0.6)`` of them (when
    ``delta0 > 1.1``) being the previous frame again; ``next_pts`` advances by the frames written. A gap of one
    output (the CLI rebuilding its filter graph drops the buffered frame) writes the next frame twice.
    """
    if not outputs:
        return []
    written = [outputs[0][1]]
    nxt = outputs[0][0] + 1
    prev = outputs[0][1]
    for pts, k in outputs[1:]:
        delta0 = pts - nxt
        delta = delta0 + 1
        if delta < -1.1:
            continue
        if delta > 1.1:
            nb = math.floor(delta + 0.5)
            nb_prev = math.floor(delta0 - 0.6 + 0.5) if delta0 > 1.1 else 0
        else:
            nb, nb_prev = 1, 0
        written += [prev] * nb_prev + [k] * (nb - nb_prev)
        nxt += nb
        prev = k
    return written


def thin_linspace(num_frames: int, num_keep: int) -> list[int]:
    """``num_keep`` of ``num_frames`` indices as seed 001 and 000 thin: ``np.linspace(0, N - 1, M, dtype=int)``
    (truncation toward zero, first and last included; all indices when ``N <= M``)."""
    if num_frames <= num_keep:
        return list(range(num_frames))
    return [int(i) for i in np.linspace(0, num_frames - 1, num_keep, dtype=int)]


def sample_frames(pts: list[int], time_base: Fraction, end_pts: int, duration_s: float, budget_tokens: int,
                  start_s: float = 0.0, base_fps: float = BASE_FPS, k: int = K_ROWS, segments: tuple[int, ...] = ()
                  ) -> tuple[float, list[int], list[float]]:
    """Which source frames the decode keeps and the time each is labelled with (seed 001, ``decode_video``).

    The rate of :func:`sample_rate` (``duration = format.duration``); the frames FFmpeg's ``fps`` filter with
    ``round=down`` emits at ``av_d2q(fps, INT_MAX)`` (:func:`fps_filter_frames`); their labels
    ``ts = (start + np.arange(len(frames)) / fps)`` (the sampling grid, not the source frames' own times); then,
    when more than M frames came out, ``idx = np.linspace(0, len(frames) - 1, max_frames, dtype=int)``
    (:func:`thin_linspace`).

    Args:
        pts, time_base, end_pts: the source frames' timestamps as :func:`fps_filter_frames` takes them.
        duration_s: the container's duration (s, ``format.duration``), which picks the rate.
        budget_tokens: the largest budget of the run.
        start_s: the video stream's ``start_time`` (s; added to the labels, ``start`` in the seed).
        segments: positions into ``pts`` where the ffmpeg CLI rebuilds its filter graph (a new frame size
            mid-stream: ``Reconfiguring filter graph because video parameters changed``): each part gets a new
            ``fps`` filter (it starts at that part's first frame), and the old one is dropped unflushed
            (``flush=False``); the outputs then pass the CLI's constant-rate output sync (:func:`cfr_sync`: the
            output lost to the rebuild is filled), as the CLI does (checked against the binary on an MPEG-TS whose
            size changes).

    Returns:
        ``(fps, positions into pts, times_s)``; the lists are empty when the clip is too short for one output frame.

    Raises:
        ValueError: ``duration_s`` is not positive (no rate).
    """
    if not duration_s > 0:
        raise ValueError(f"the duration must be positive, got {duration_s!r}")
    fps = sample_rate(duration_s, budget_tokens, base_fps, k)
    rate = av_d2q(fps)
    bounds = [0, *[b for b in segments if 0 < b < len(pts)], len(pts)]
    if len(bounds) == 2:
        src = fps_filter_frames(pts, time_base, end_pts, rate)
    else:
        outs = []
        for a, b in zip(bounds, bounds[1:]):
            last = b == len(pts)
            outs += [(n, a + i) for n, i in _fps_outputs(pts[a:b], time_base, end_pts if last else 0, rate,
                                                         flush=last)]
        src = cfr_sync(outs)
    times = (start_s + np.arange(len(src)) / fps).tolist()
    keep = thin_linspace(len(src), max_frames(budget_tokens, k))
    return fps, [src[i] for i in keep], [float(times[i]) for i in keep]


def subsample(num_frames: int, budget_tokens: int, k: int = K_ROWS) -> list[int]:
    """Frames a budget uses out of the T decoded ones (seed 001 ``idx = bd.subsample(len(ts), b)``).

    The helper is not in the seeds; both seeds thin with ``np.linspace(0, N - 1, M, dtype=int)`` wherever they show
    code (001 ``decode_video``: ``idx = np.linspace(0, len(frames) - 1, max_frames, dtype=int)``; 000
    ``frame_indices``: ``np.linspace(0, n_decoded - 1, cap, dtype=int)``), so the same rule is used here
    (:func:`thin_linspace`): all T when ``T <= max_frames(B)``, else ``max_frames(B)`` indices, truncated toward zero,
    first and last included.

    Returns:
        ``min(T, max_frames(B))`` increasing, distinct indices into ``range(T)``.

    Raises:
        ValueError: ``B < K``.
    """
    return thin_linspace(num_frames, max_frames(budget_tokens, k))


def budget_fps(num_frames: int, duration_s: float, base_fps: float = BASE_FPS, min_fps: float = MIN_FPS,
               ) -> tuple[float, bool]:
    """A budget's frame rate and its ``fps_ok`` flag, as seed 001 records them per budget::

        fps = min(bd.FPS, len(idx) / max(info["duration"], 1e-6))
        binfo = dict(info, n_frames=len(idx), fps=round(fps, 4), fps_ok=fps >= bd.MIN_FPS - 1e-6)

    Args:
        num_frames: the budget's frames (``len(idx)``); duration_s: the video's duration (s).

    Returns:
        ``(round(fps, 4), fps >= min_fps - 1e-6)`` (the flag from the unrounded rate, as the seed).
    """
    fps = min(base_fps, num_frames / max(duration_s, 1e-6))
    return round(fps, 4), fps >= min_fps - 1e-6


def frame_grid(height: int, width: int, max_tokens: int, min_tokens: int = MIN_TOKENS_PER_FRAME) -> tuple[int, int]:
    """Merged-token grid ``(gh, gw)`` a ``height × width`` frame is resized to, keeping its aspect ratio.

    Follows VideoLLaMA3's ``smart_resize`` (transformers 5.23, ``transformers/models/video_llama_3/
    video_processing_video_llama_3.py:smart_resize``, the rule ``VideoLlama3VideoProcessor.resize`` applies) with
    ``factor = 28``, ``max_pixels = max_tokens * 28²`` and ``min_pixels = min(min_tokens, max_tokens) * 28²``:

    * ``h_bar = round(height / 28) * 28``, ``w_bar = round(width / 28) * 28`` (a side under 14 px rounds to 0);
    * above ``max_pixels``: ``beta = sqrt(h w / max_pixels)``, each side ``max(28, floor(side / beta / 28) * 28)``;
    * else below ``min_pixels`` (a side rounded to 0 always is): ``beta = sqrt(min_pixels / (h w))``, each side
      ``ceil(side * beta / 28) * 28``. This path does not look at ``max_pixels``: a thin frame (2000x10 at 23
      tokens: ``(1, 57)``) may get more cells than ``max_tokens``, as in the processor (issue 44 item 4).

    An aspect ratio above 200, which ``smart_resize`` refuses (``ValueError``, the video's error record), keeps
    each rounded side at least 28 here (a grid for the callers that plan before the processor refuses).

    Returns:
        ``(gh, gw)``; the pixel size is ``28 gh × 28 gw``. ``gh * gw <= max_tokens`` except on the minimum path
        above.

    Raises:
        ValueError: a side below 1 pixel.
    """
    if height < 1 or width < 1:
        raise ValueError(f"frame size must be positive, got {height}x{width}")
    f = CELL_PIXELS
    max_px = max_tokens * f * f
    min_px = min(min_tokens, max_tokens) * f * f
    floor = f if max(height, width) / min(height, width) > 200 else 0   # smart_resize: no clamp (issue 44 item 4)
    h_bar = max(floor, round(height / f) * f)
    w_bar = max(floor, round(width / f) * f)
    if h_bar * w_bar > max_px:
        beta = math.sqrt(height * width / max_px)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < min_px:
        beta = math.sqrt(min_px / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return h_bar // f, w_bar // f


def raw_frame_grid(gh: int, gw: int, max_tokens: int) -> tuple[int, int]:
    """Merged grid of a frame whose encode grid is ``(gh, gw)`` when it may have at most ``max_tokens`` rows.

    Seed 000:1161 ``small = llm.hybrid_raw.raw_frame_grid(hh, ww, SMALL)`` and 000:1320 ``raw_grid =
    llm.hybrid_raw.raw_frame_grid(*grid, eff["raw_tokens"] or args.raw_max_tokens)`` (also seed 001:1148): a grid
    of the *merged* grid ``(hh, ww)`` of the encode, not of the native frame. ``hybrid_raw`` is the Phase-3 model
    code the seeds import (``OnlineLong_ft``); it is not in the seeds nor in the public fork
    (chicheng567/OnlineLong, every branch), so its body is the rule it is named after: VideoLLaMA3's
    ``smart_resize`` (factor 28, ``max_pixels = max_tokens * 28²``, no minimum) applied to the frame as the encoder
    saw it, ``28 gh x 28 gw`` pixels, i.e. :func:`frame_grid` ``(28 gh, 28 gw, max_tokens, min_tokens=1)``:

    * ``gh * gw <= max_tokens``: ``(gh, gw)`` itself (seed 000:1197 ``if raw_grid == (hh, ww)``: no re-encode);
    * else ``beta = sqrt(gh * gw / max_tokens)`` and ``(max(1, floor(gh / beta)), max(1, floor(gw / beta)))``.

    Raises:
        ValueError: a grid side or ``max_tokens`` below 1.
    """
    if gh < 1 or gw < 1 or max_tokens < 1:
        raise ValueError(f"raw_frame_grid needs a grid and a cap of at least 1, got ({gh}, {gw}) and {max_tokens}")
    return frame_grid(gh * CELL_PIXELS, gw * CELL_PIXELS, max_tokens, min_tokens=1)


def frame_token_cap(budget_tokens: int, num_frames: int, max_tokens_per_frame: int = MAX_TOKENS_PER_FRAME,
                    min_tokens: int = MIN_TOKENS_PER_FRAME) -> int:
    """Largest per-frame token count ``<= max_tokens_per_frame`` with ``T * tokens <= 8 * B``, at least ``min_tokens``."""
    return max(min_tokens, min(max_tokens_per_frame, (MAX_GROUP_FRAMES * budget_tokens) // max(num_frames, 1)))


def encoder_grids(height: int, width: int, num_frames: int, budgets: list[int], max_tokens_per_frame: int,
                  raw_mode: str, raw_max_tokens: int) -> dict[tuple[int, int], tuple[list[int], int]]:
    """Every (frame, grid) pair the vision encoder can be asked for on one decoded video, per grid.

    The geometry of ``models.videollama3.prepare_budgets`` for each budget: frames ``subsample(T, B)`` at
    ``frame_grid(H, W, frame_token_cap(B, T_b, max_tokens_per_frame))``. Raw frames re-encoded smaller
    (``raw_mode="phase3"``, seed 001 ``reencode``) are made from the pixel rows of that same grid, so they need no
    grid of their own (``raw_mode`` and ``raw_max_tokens`` are only checked).

    Args:
        height, width: decoded frame size in pixels; num_frames: T decoded frames.

    Returns:
        ``{(gh, gw): (sorted frame positions, the token cap of the first budget asking for that grid)}``.

    Raises:
        ValueError: ``raw_mode`` is neither ``phase3`` nor ``orig``.
    """
    if raw_mode not in ("phase3", "orig"):
        raise ValueError(f"raw_mode must be 'phase3' or 'orig', got {raw_mode!r}")
    out: dict[tuple[int, int], tuple[set[int], int]] = {}
    for b in budgets:
        idx = subsample(num_frames, b)
        cap = frame_token_cap(b, len(idx), max_tokens_per_frame)
        grid = frame_grid(height, width, cap)
        out.setdefault(grid, (set(), cap))[0].update(idx)
    return {g: (sorted(s), c) for g, (s, c) in out.items()}


def frame_tokens(height: int, width: int, budget_tokens: int, num_frames: int,
                 max_tokens_per_frame: int = MAX_TOKENS_PER_FRAME, min_tokens: int = MIN_TOKENS_PER_FRAME) -> int:
    """Merged tokens per frame (``hw``) the vision encoder produces for a budget (DESIGN §3.3).

    The cap of :func:`frame_token_cap` turned into the aspect-preserving grid of :func:`frame_grid`;
    ``hw = gh * gw`` (at most the cap, fewer when the frame is small or the aspect ratio leaves cells unused).
    """
    gh, gw = frame_grid(height, width, frame_token_cap(budget_tokens, num_frames, max_tokens_per_frame, min_tokens),
                        min_tokens)
    return gh * gw


@dataclass(frozen=True)
class Plan:
    """Layout of one video's frames in the LLM input.

    Attributes:
        mode: ``raw`` | ``hybrid`` | ``forced8`` | ``all_compressed`` | ``qbase`` (layout ablations' ``qtf<k>``).
        seg_lens: group lengths in frames, in time order; they tile T exactly (raw mode: one group per frame).
        compressed: indices of the compressed groups (ascending).
        vision_tokens: exact LLM vision rows, ``n_raw_frames * raw_hw + len(compressed) * k`` (``<= B``).
        n_raw_frames: frames entering as raw rows.
        hw: merged tokens per frame at the encode size.
        raw_hw: rows per raw frame in the LLM input.
        k: rows per compressed group.
    """

    mode: PlanMode
    seg_lens: tuple[int, ...]
    compressed: tuple[int, ...]
    vision_tokens: int
    n_raw_frames: int
    hw: int
    raw_hw: int
    k: int = K_ROWS

    @property
    def num_frames(self) -> int:
        return sum(self.seg_lens)

    @property
    def n_groups(self) -> int:
        return len(self.seg_lens)

    @property
    def n_compressed(self) -> int:
        return len(self.compressed)

    def group_bounds(self) -> list[tuple[int, int]]:
        """``[start, end)`` frame range of each group."""
        out, s = [], 0
        for n in self.seg_lens:
            out.append((s, s + n))
            s += n
        return out

    def blocks(self) -> list[tuple[str, int, int]]:
        """LLM input blocks in time order: ``("raw", t, t + 1)`` per raw frame, ``("group", a, b)`` per compressed group."""
        comp = set(self.compressed)
        out: list[tuple[str, int, int]] = []
        for g, (a, b) in enumerate(self.group_bounds()):
            if g in comp:
                out.append(("group", a, b))
            else:
                out.extend(("raw", t, t + 1) for t in range(a, b))
        return out

    def stats(self) -> dict:
        """Record fields (DESIGN §3.8)."""
        return {"mode": self.mode, "hw": self.hw, "raw_hw": self.raw_hw, "n_groups": self.n_groups,
                "n_compressed": self.n_compressed, "n_raw_frames": self.n_raw_frames,
                "vision_tokens": self.vision_tokens, "seg_lens": list(self.seg_lens)}


def make_plan(mode: PlanMode, seg_lens: list[int], compressed: list[int] | set[int], hw: int, raw_hw: int,
              k: int = K_ROWS) -> Plan:
    """A :class:`Plan` with its derived counts computed from ``seg_lens`` and ``compressed``."""
    comp = tuple(sorted(compressed))
    n_raw = sum(n for g, n in enumerate(seg_lens) if g not in set(comp))
    return Plan(mode=mode, seg_lens=tuple(seg_lens), compressed=comp, vision_tokens=n_raw * raw_hw + len(comp) * k,
                n_raw_frames=n_raw, hw=hw, raw_hw=raw_hw, k=k)


def compression_order(variation: list[float], seg_lens: list[int], most_changing_first: bool = False) -> list[int]:
    """Order in which groups are compressed: least-varying first (1-frame groups, +inf, last);
    ties: longer group first, then earlier. ``most_changing_first`` reverses the variation order (``hivar``)."""
    sign = -1.0 if most_changing_first else 1.0

    def key(g: int):
        v = variation[g]
        return (sign * v if math.isfinite(v) else math.inf, -seg_lens[g], g)

    return sorted(range(len(seg_lens)), key=key)


def compress_until_fits(seg_lens: list[int], order: list[int], budget_tokens: int, raw_hw: int,
                        k: int = K_ROWS) -> set[int]:
    """Start from all frames raw and compress groups in ``order`` until ``raw rows + K * compressed <= B``.

    Returns:
        The compressed group indices (may still not fit if every group is compressed and ``G * K > B``).
    """
    cost = sum(seg_lens) * raw_hw
    compressed: set[int] = set()
    for g in order:
        if cost <= budget_tokens:
            break
        compressed.add(g)
        cost += k - seg_lens[g] * raw_hw
    return compressed


def plan_groups(per_frame: torch.Tensor, hw: int, budget_tokens: int, raw_hw: int,
                force_mode: PlanMode | None = None, k: int = K_ROWS) -> Plan:
    """Plan a video's layout under a vision-token budget (DESIGN §3.4).

    * ``raw``: ``T * raw_hw <= B``: every frame raw.
    * ``hybrid``: otherwise cut into ``n = min(T // 4 + 1, T)`` adaptive groups (cuts at the largest
      consecutive-frame changes, groups of at most 8 frames); if ``n * K <= B``, compress groups least-varying
      first (see :func:`compression_order`) until the cost fits.
    * ``forced8``: otherwise uniform groups of 8 frames (the last shorter), all compressed.
    * ``all_compressed`` (only as ``force_mode``): the adaptive groups, every one compressed.

    Args:
        per_frame: (T, D) per-frame mean features (any float dtype).
        hw: merged tokens per frame at the encode size (recorded).
        budget_tokens: B.
        raw_hw: LLM rows one raw frame costs.
        force_mode: force ``raw``, ``hybrid``, ``forced8`` or ``all_compressed`` instead of the rule.
        k: rows per compressed group.

    Returns:
        A :class:`Plan` with ``vision_tokens <= B``.

    Raises:
        ValueError: ``B < K``; ``T > max_frames(B)`` (subsample first); or a forced mode that cannot fit B.
    """
    check_budget(budget_tokens, k)
    num_frames = int(per_frame.shape[0])
    if num_frames < 1:
        raise ValueError("cannot plan a video with no frames")
    if num_frames > max_frames(budget_tokens, k):
        raise ValueError(f"{num_frames} frames exceed max_frames({budget_tokens}) = {max_frames(budget_tokens, k)}; "
                         "subsample() the frames for this budget first")
    changes = frame_changes(per_frame)
    n = adaptive_segment_count(num_frames, TARGET_FRAMES, FORCE_EVERY)
    fits_raw = num_frames * raw_hw <= budget_tokens
    fits_hybrid = n * k <= budget_tokens
    mode = force_mode or ("raw" if fits_raw else "hybrid" if fits_hybrid else "forced8")
    if mode == "raw":
        plan = make_plan("raw", [1] * num_frames, [], hw, raw_hw, k)
    elif mode in ("hybrid", "all_compressed"):
        seg = adaptive_segment_lengths(per_frame, TARGET_FRAMES, FORCE_EVERY, n_segments=n)
        if mode == "all_compressed":
            comp = set(range(len(seg)))
        else:
            comp = compress_until_fits(seg, compression_order(group_variation(changes, seg), seg), budget_tokens,
                                       raw_hw, k)
        plan = make_plan(mode, seg, comp, hw, raw_hw, k)
    elif mode == "forced8":
        seg = uniform_segment_lengths(num_frames, MAX_GROUP_FRAMES)
        plan = make_plan("forced8", seg, range(len(seg)), hw, raw_hw, k)
    else:
        raise ValueError(f"unknown plan mode {mode!r}")
    if plan.vision_tokens > budget_tokens:
        raise ValueError(f"{mode} plan of {num_frames} frames needs {plan.vision_tokens} vision tokens > budget "
                         f"{budget_tokens}")
    return plan
