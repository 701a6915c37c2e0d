"""Layout ablations from one decode and at most one encode per frame size (DESIGN §4, issue 4).

Legend: T decoded frames, T_b a budget's frames (``subsample(T, B)``), T_v the frames a job keeps, hw merged
tokens per frame at a budget's encode grid, C vision hidden size, D LLM hidden size, K rows per qbase group, K' rows
of a swapped group's substitute (``<= 64``), G_c compressed groups.

Every ``(variant, budget)`` job of a video is built from the single decode (the frames of the largest budget) and
one shared :class:`models.videollama3.budgets.EncodeCache`. Per video::

    lj = plan_layout_jobs(cache, times_s, [("rho32", 1024), ("sel_merge", 256)], ...)   # also base at each budget
    encode_layout_inputs(cache, [lj[k] for k in keys_to_run])                             # phase 2 (see below)
    prompt = build_layout_prompt(vlm, cache, lj[k], times_s, raw_mode)                    # per job that runs

Encodes (``cache.encode_calls`` / ``cache.reencode_calls`` record each one; at most one per grid, and one per
(encode grid, smaller grid) pair, per video):

1. **Phase 1** (inside :func:`plan_layout_jobs`): each job's frames (:func:`algorithms.layouts.variant_frames`, seed
   000 ``frame_indices``) at the encode grid of that many frames at its budget (seed ``features``:
   ``frame_tokens(h, w, b, len(idx))``; for an uncapped job the budget's frames and plain predict's grid), one call
   per grid over the union of the jobs sharing it.
2. **Layouts**: :func:`algorithms.layouts.layout_video` per job from the per-frame mean rows, and ``base`` at every
   budget (the reuse reference, cheap: no LLM work is implied).
3. **Phase 2** (:func:`encode_layout_inputs`): seed 000 ``build``'s two re-encodes, both ``llm.reencode(frames[src],
   tok, grid)`` (:meth:`models.videollama3.budgets.EncodeCache.reencode`: the job's encode-size pixel rows resized
   and encoded again): raw frames when ``raw_grid != (hh, ww)`` (``phase3`` ``raw_max_tokens``, ``low64``'s 64
   rows; seed 000:1197-1199) and ``sel_resize`` middle frames at ``small`` (seed 000:1176-1178); the union over the
   jobs that run, one call per (encode grid, grid) pair.

Rows of a frame at a grid do not depend on which call produced them (the encoder attends within a frame), so all
jobs see the same rows for the same (frame, grid) and, for re-encoded rows, the same (frame, encode grid, grid).

Choices (DESIGN §4 is silent):

* The qbase video context of a variant is its own kept frames (as in plain predict, where it is the budget's
  frames: the whole video the LLM input covers).
* Substitutes of compressor swaps take the raw-frame path: one grid ``small = raw_frame_grid(hh, ww, 64)`` of the
  encode's merged grid for all three (seed 000:1161); ``sel_merge`` / ``mean_merge`` area-pool the encoder rows
  (before the projector, ``adaptive_avg_pool2d`` to ``small``), ``sel_resize`` re-encodes the middle frame at
  ``small``; every substitute goes through the raw-frame projector (seed ``llm.proj_orig``: the original one in
  ``raw_mode="orig"``), then enters as a raw frame at its middle frame's time.
* ``raw_mode="orig"`` keeps raw frames at the encode grid (no ``raw_max_tokens`` cap) except ``low64`` on a capped
  video, whose raw frames are re-encoded at ``raw_frame_grid(hh, ww, 64)`` and still go through the original
  projector.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.budget import K_ROWS, frame_grid, frame_token_cap, raw_frame_grid, subsample
from algorithms.layouts import (
    VariantLayout, effective_variant, layout_video, raw_rows_limit, substitute_frame, variant_frames,
)

from .budgets import EncodeCache
from .layout import VideoPrompt
from .model import BudgetedVideoLlama3

BASELINE = "base"
_NO_RAW_CAP = 1 << 30  # raw_mode="orig": raw frames keep the encode grid unless a variant caps their rows


@dataclass(frozen=True)
class BudgetGeometry:
    """Frames and encode grid of one job (plain predict's for an uncapped job).

    Attributes:
        budget: B.
        frame_idx: T_b indices into the decoded frames (``subsample(T, B)``).
        cap: per-frame token cap given to the encoder (``frame_token_cap(B, T_b)``).
        grid: ``(gh, gw)`` encode grid, ``hw = gh * gw``.
    """

    budget: int
    frame_idx: tuple[int, ...]
    cap: int
    grid: tuple[int, int]

    @property
    def hw(self) -> int:
        return self.grid[0] * self.grid[1]


@dataclass(frozen=True)
class LayoutJob:
    """One (variant, budget) of a video: its layout and where its rows come from.

    Attributes:
        variant: variant name.
        geometry: the budget's frames and encode grid.
        layout: the :class:`~algorithms.layouts.VariantLayout` (frames index the decoded frames).
        frame_idx: T_v indices into the decoded frames of the kept frames.
        raw_cap: kept for records and callers: the encode cap (raw frames at a smaller grid are re-encoded from
            the encode's pixel rows, seed ``llm.reencode(frames[src], tok, raw_grid)``).
    """

    variant: str
    geometry: BudgetGeometry
    layout: VariantLayout
    frame_idx: tuple[int, ...]
    raw_cap: int

    @property
    def budget(self) -> int:
        return self.geometry.budget

    @property
    def key(self) -> tuple[str, int]:
        return self.variant, self.geometry.budget

    def raw_positions(self) -> list[int]:
        """Positions (into the kept frames) of the raw frames, in time order."""
        return [a for kind, a, _ in self.layout.plan.blocks() if kind == "raw"]

    def substitute_positions(self) -> list[int]:
        """Positions (into the kept frames) of the middle frame of each compressed group, in time order."""
        bounds = self.layout.plan.group_bounds()
        return [substitute_frame(*bounds[g]) for g in self.layout.plan.compressed]

    def encode_requests(self) -> list[tuple[list[int], int, tuple[int, int]]]:
        """Phase-2 re-encodes ``(decoded frame indices, encode cap, grid)`` this job needs beyond its budget's
        encode (:meth:`~models.videollama3.budgets.EncodeCache.reencode`): its raw frames when the raw grid is not
        the encode grid (seed 000:1197-1199), and ``sel_resize``'s middle frames at ``small`` (000:1176-1178)."""
        out = []
        g = self.geometry
        if self.layout.raw_grid != g.grid:
            raw = [self.frame_idx[a] for a in self.raw_positions()]
            if raw:
                out.append((raw, g.cap, self.layout.raw_grid))
        if self.layout.group_substitute == "sel_resize" and self.layout.plan.compressed:
            out.append(([self.frame_idx[a] for a in self.substitute_positions()], g.cap, self.layout.group_grid))
        return out


def budget_geometry(num_frames: int, height: int, width: int, budget: int,
                    max_tokens_per_frame: int = 256, frame_idx: list[int] | None = None) -> BudgetGeometry:
    """The frames and encode grid of a job at budget B (DESIGN §3.2-3.3; seed 000 ``features``:
    ``tok = bd.frame_tokens(*info["native_hw"], b, len(idx))``).

    Args:
        frame_idx: the job's frames (default: plain predict's ``subsample(T, B)``); the encode cap is
            ``frame_token_cap(B, len(frame_idx))``, so a capped variant's fewer frames are encoded larger.
    """
    idx = subsample(num_frames, budget) if frame_idx is None else list(frame_idx)
    cap = frame_token_cap(budget, len(idx), max_tokens_per_frame)
    return BudgetGeometry(budget, tuple(idx), cap, frame_grid(height, width, cap))


def _raw_grid_rule(grid: tuple[int, int]):
    """``max rows -> raw grid``: seed 000:1320 ``raw_grid = llm.hybrid_raw.raw_frame_grid(*grid, eff["raw_tokens"] or
    args.raw_max_tokens)`` (:func:`algorithms.budget.raw_frame_grid` of the encode's merged grid: the encode grid
    itself when it has at most that many cells)."""
    def rule(max_rows: int) -> tuple[int, int]:
        return raw_frame_grid(grid[0], grid[1], max_rows)
    return rule


def plan_layout_jobs(cache: EncodeCache, jobs: list[tuple[str, int]], *, raw_mode: str = "phase3",
                     raw_max_tokens: int = 256, max_tokens_per_frame: int = 256,
                     with_baseline: bool = True, k: int = K_ROWS) -> dict[tuple[str, int], LayoutJob]:
    """Phase-1 encode and the layout of every job (and of ``base`` at every budget when ``with_baseline``).

    Each job's frames are :func:`algorithms.layouts.variant_frames` of the decoded frames (seed 000
    ``frame_indices``) and its encode grid the one of that many frames at its budget (seed ``features``).

    Args:
        cache: the video's encode cache (its ``frames``: (T, H, W, 3) uint8, decoded for the ablation's budget).
        jobs: ``(variant, budget)`` pairs (:func:`algorithms.layouts.parse_jobs`).
        raw_mode: ``phase3`` or ``orig`` (see the module docstring).

    Returns:
        ``(variant, budget) -> LayoutJob``, the requested jobs plus ``("base", B)`` for each budget.

    Raises:
        ValueError: unknown variant or raw mode, budget smaller than K.
    """
    if raw_mode not in ("phase3", "orig"):
        raise ValueError(f"raw_mode must be 'phase3' or 'orig', got {raw_mode!r}")
    num_frames, height, width = (int(x) for x in cache.frames.shape[:3])
    keys = list(dict.fromkeys(jobs))
    if with_baseline:
        keys += [(BASELINE, b) for b in dict.fromkeys(b for _, b in jobs) if (BASELINE, b) not in keys]
    eff_raw_max = raw_max_tokens if raw_mode == "phase3" else _NO_RAW_CAP
    geo: dict[tuple[str, int], BudgetGeometry] = {}
    capped: dict[tuple[str, int], bool] = {}
    for variant, b in keys:
        idx, capped[(variant, b)] = variant_frames(variant, num_frames, b, k)
        geo[(variant, b)] = budget_geometry(num_frames, height, width, b, max_tokens_per_frame, idx)

    # phase 1: every job's frames at its encode grid, one call per grid
    requests: dict[tuple[int, int], tuple[set[int], int]] = {}
    for g in geo.values():
        requests.setdefault(g.grid, (set(), g.cap))[0].update(g.frame_idx)
    cache.encode([(sorted(idx), cap) for idx, cap in requests.values()])

    out: dict[tuple[str, int], LayoutJob] = {}
    for key in keys:
        variant, b = key
        g = geo[key]
        per_frame = cache.get(list(g.frame_idx), g.cap).float().mean(1)  # (T_v, C)
        layout = layout_video(variant, per_frame, g.hw, b, _raw_grid_rule(g.grid), eff_raw_max,
                              frames=g.frame_idx, capped=capped[key], encode_grid=g.grid, k=k)
        out[key] = LayoutJob(variant, g, layout, tuple(g.frame_idx), g.cap)
    return out


def encode_layout_inputs(cache: EncodeCache, jobs: list[LayoutJob]) -> None:
    """Phase 2: raw frames at smaller grids and ``sel_resize`` middle frames of ``jobs``, re-encoded (seed
    ``llm.reencode``) once per (encode grid, grid) pair."""
    cache.reencode([r for job in jobs for r in job.encode_requests()])


def area_pool_rows(rows: torch.Tensor, grid: tuple[int, int], out_grid: tuple[int, int]) -> torch.Tensor:
    """Area-pool a frame's row-major rows from ``grid`` to ``out_grid`` (``adaptive_avg_pool2d``, fp32 inside).

    Args:
        rows: (gh * gw, C).

    Returns:
        (gh' * gw', C) in ``rows.dtype``; the input itself when the grids are equal.
    """
    if tuple(grid) == tuple(out_grid):
        return rows
    gh, gw = grid
    x = rows.float().reshape(gh, gw, -1).permute(2, 0, 1)                    # (C, gh, gw)
    y = F.adaptive_avg_pool2d(x, tuple(out_grid))                              # (C, gh', gw')
    return y.permute(1, 2, 0).reshape(out_grid[0] * out_grid[1], -1).to(rows.dtype)


def mean_merge_rows(rows: torch.Tensor, grid: tuple[int, int], out_grid: tuple[int, int]) -> torch.Tensor:
    """One ``mean_merge`` substitute: a group's frames averaged and area-pooled in fp32, cast once (seed 000
    ``build``: ``x = torch.stack([grid[s:s + L].float().mean(0) ...])``, ``F.adaptive_avg_pool2d(...)``,
    ``x.reshape(-1, C).to(feats.dtype)``).

    Args:
        rows: (L, gh * gw, C), the group's frames at the encode grid.

    Returns:
        (gh' * gw', C) in ``rows.dtype``.
    """
    return area_pool_rows(rows.float().mean(0), grid, out_grid).to(rows.dtype)


@torch.no_grad()
def build_layout_prompt(vlm: BudgetedVideoLlama3, cache: EncodeCache, job: LayoutJob, times_s: list[float],
                        raw_mode: str = "phase3", subtitle_slots=None) -> VideoPrompt:
    """The shared LLM prefix of one (video, budget, variant) from cached rows (no encode when phase 2 ran).

    ``base`` builds exactly what :func:`models.videollama3.budgets.prepare_budgets` builds for the budget.

    Args:
        times_s: T decoded frame times (s).
        subtitle_slots: as :func:`models.videollama3.budgets.prepare_budgets`'s (interleaved subtitles).

    Returns:
        A :class:`~models.videollama3.layout.VideoPrompt` whose placeholder count is ``job.layout.plan.vision_tokens``.
    """
    g, lay = job.geometry, job.layout
    plan = lay.plan
    rows = cache.get(list(job.frame_idx), g.cap)                               # (T_v, hw, C)
    raw_pos = job.raw_positions()
    if lay.raw_grid != g.grid:   # seed 000:1199 ``sel = llm.reencode(frames[src], tok, raw_grid)``
        raw_rows = (cache.get_reencoded([job.frame_idx[a] for a in raw_pos], g.cap, lay.raw_grid) if raw_pos
                    else rows.new_zeros(0, lay.raw_grid[0] * lay.raw_grid[1], rows.shape[-1]))
    else:
        raw_rows = rows[raw_pos]                                               # (n_raw, raw_hw, C)
    orig = raw_mode == "orig"
    raw_llm = vlm.project(raw_rows, original=orig)                             # (n_raw, raw_hw, D)
    if lay.group_substitute == "qbase":
        group_llm = vlm.project(vlm.compress(rows, plan, g.grid))              # (G_c, K, D)
    else:
        bounds = plan.group_bounds()
        mids = job.substitute_positions()
        if not mids:
            sub = rows.new_zeros(0, plan.k, rows.shape[-1])
        elif lay.group_substitute == "sel_resize":   # seed 000:1178 ``llm.reencode(frames[src], tok, small)``
            sub = cache.get_reencoded([job.frame_idx[a] for a in mids], g.cap, lay.group_grid)  # (G_c, K', C)
        elif lay.group_substitute == "sel_merge":
            sub = torch.stack([area_pool_rows(rows[a], g.grid, lay.group_grid) for a in mids])
        elif lay.group_substitute == "mean_merge":
            sub = torch.stack([mean_merge_rows(rows[bounds[c][0]:bounds[c][1]], g.grid, lay.group_grid)
                               for c in plan.compressed])
        else:
            raise ValueError(f"unknown group substitute {lay.group_substitute!r}")
        group_llm = vlm.project(sub, original=orig)                            # (G_c, K', D)
    times = [times_s[i] for i in job.frame_idx]
    return vlm.build_prompt(plan, times, raw_llm, group_llm, groups_as_raw=lay.group_substitute != "qbase",
                            subtitle_slots=subtitle_slots(times) if subtitle_slots else None)


def duplicate_encodes(cache: EncodeCache) -> list[tuple[int, int]]:
    """Grids the cache encoded more than once (empty when the one-encode-per-size rule held)."""
    seen: set[tuple[int, int]] = set()
    dup = []
    for grid, _ in cache.encode_calls:
        if grid in seen:
            dup.append(grid)
        seen.add(grid)
    return dup


__all__ = ["BASELINE", "BudgetGeometry", "LayoutJob", "area_pool_rows", "budget_geometry", "build_layout_prompt",
           "duplicate_encodes", "encode_layout_inputs", "plan_layout_jobs"]
