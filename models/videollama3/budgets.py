"""Every budget of one decoded video: encoder rows cached per frame size, per-budget geometry and plan, the prefixes.

Legend: T decoded frames, T_b a budget's frames (``subsample(T, B)``), hw merged tokens per frame, C vision hidden
size, D LLM hidden size, K rows per compressed group, G_c compressed groups.

:func:`prepare_budgets` is DESIGN §3 steps 2-6: it drives a :class:`~models.videollama3.model.BudgetedVideoLlama3`
(encode, project, compress, build_prompt) through one :class:`EncodeCache` per video.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from algorithms.budget import Plan, frame_grid, frame_token_cap, plan_groups, raw_frame_grid, subsample
from algorithms.errors import SettingError
from ..kernels import host_to_device
from .layout import VideoPrompt
from .model import BudgetedVideoLlama3


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work so stage timings are real (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class BudgetInput:
    """Everything the LLM needs for one (video, budget): the frames used, the plan and the shared prefix.

    Attributes:
        budget: B.
        frame_idx: indices into the decoded frames used by this budget (``subsample(T, B)``).
        plan: the layout.
        prompt: the shared prefix (ids + vision rows).
        grid, raw_grid: merged-token grids of the encode and of raw frames.
    """

    budget: int
    frame_idx: list[int]
    plan: Plan
    prompt: VideoPrompt
    grid: tuple[int, int]
    raw_grid: tuple[int, int]


class EncodeCache:
    """Encoder rows per grid, each grid encoded at most once per video over the union of requested frames.

    ``encode_calls`` lists ``(grid, n_frames)`` of every encode, for instrumentation (tests assert one per size).
    """

    def __init__(self, vlm: "BudgetedVideoLlama3", frames: torch.Tensor, chunk_frames: int = 64):
        self.vlm, self.frames, self.chunk_frames = vlm, frames, chunk_frames
        self.rows: dict[tuple[int, int], dict[int, torch.Tensor]] = {}
        self.encode_calls: list[tuple[tuple[int, int], int]] = []
        # rows re-encoded at an explicit grid from another grid's pixels: (source grid, grid) -> frame -> rows
        self.reencoded: dict[tuple[tuple[int, int], tuple[int, int]], dict[int, torch.Tensor]] = {}
        self.reencode_calls: list[tuple[tuple[int, int], tuple[int, int], int]] = []
        self.encode_seconds = 0.0

    def grid_for(self, max_tokens: int) -> tuple[int, int]:
        return frame_grid(self.frames.shape[1], self.frames.shape[2], max_tokens)

    def encode(self, requests: list[tuple[list[int], int]]) -> None:
        """Encode, per grid, the union of frames requested for it that are not cached yet (one call per grid).

        Args:
            requests: ``(frame indices, max_tokens)`` pairs.
        """
        want: dict[tuple[int, int], tuple[set[int], int]] = {}
        for idx, cap in requests:
            grid = self.grid_for(cap)
            have = self.rows.get(grid, {})
            missing = {i for i in idx if i not in have}
            if missing:
                s, _ = want.setdefault(grid, (set(), cap))
                s.update(missing)
        for grid, (idx_set, cap) in want.items():
            idx = sorted(idx_set)
            t0 = time.perf_counter()
            held = getattr(self.frames, "at_grid", None)   # frames held at the encoder's sizes
            rows, got = (self.vlm.encode(held(idx, grid), cap, self.chunk_frames, grid) if held
                         else self.vlm.encode(self.frames[idx], cap, self.chunk_frames))
            _sync(rows.device)
            self.encode_seconds += time.perf_counter() - t0
            assert got == grid
            self.encode_calls.append((grid, len(idx)))
            store = self.rows.setdefault(grid, {})
            for j, i in enumerate(idx):
                store[i] = rows[j]

    def get(self, idx: list[int], max_tokens: int) -> torch.Tensor:
        """(len(idx), gh * gw, C) rows (encoding what is missing)."""
        self.encode([(idx, max_tokens)])
        store = self.rows[self.grid_for(max_tokens)]
        return torch.stack([store[i] for i in idx])

    def reencode(self, requests: list[tuple[list[int], int, tuple[int, int]]]) -> None:
        """Rows at an explicit merged grid, seed 001:1200 ``reencode(frames, tok, grid)`` ("processed at the groups'
        size ``tok``, then the pixel rows resized and passed through the encoder again",
        :meth:`~models.videollama3.encoding.VisionEncoding.reencode`): one call per (source grid, grid) over the
        union of the frames requested for it that are not cached yet.

        A request whose grid is the source grid needs no call: its rows are :meth:`encode`'s (seed 000:1197 uses
        the encode's rows when ``raw_grid == (hh, ww)``).

        Args:
            requests: ``(frame indices, groups' max_tokens, (gh', gw'))``.
        """
        want: dict[tuple[tuple[int, int], tuple[int, int]], tuple[set[int], int]] = {}
        for idx, cap, grid in requests:
            src, grid = self.grid_for(cap), tuple(int(g) for g in grid)
            if grid == src:
                self.encode([(idx, cap)])
                continue
            have = self.reencoded.get((src, grid), {})
            missing = {i for i in idx if i not in have}
            if missing:
                want.setdefault((src, grid), (set(), cap))[0].update(missing)
        for (src, grid), (idx_set, cap) in want.items():
            idx = sorted(idx_set)
            t0 = time.perf_counter()
            held = getattr(self.frames, "at_grid", None)   # frames held at the encoder's sizes
            rows = (self.vlm.reencode(held(idx, src), cap, grid, self.chunk_frames, src_grid=src) if held
                    else self.vlm.reencode(self.frames[idx], cap, grid, self.chunk_frames))
            _sync(rows.device)
            self.encode_seconds += time.perf_counter() - t0
            self.reencode_calls.append((src, grid, len(idx)))
            store = self.reencoded.setdefault((src, grid), {})
            for j, i in enumerate(idx):
                store[i] = rows[j]

    def get_reencoded(self, idx: list[int], max_tokens: int, grid: tuple[int, int]) -> torch.Tensor:
        """(len(idx), gh' * gw', C) rows of :meth:`reencode` (re-encoding what is missing)."""
        src, grid = self.grid_for(max_tokens), tuple(int(g) for g in grid)
        if grid == src:
            return self.get(idx, max_tokens)
        self.reencode([(idx, max_tokens, grid)])
        store = self.reencoded[(src, grid)]
        return torch.stack([store[i] for i in idx])


def _budget_geometry(height: int, width: int, budget: int, num_frames: int, max_tokens_per_frame: int,
                     raw_mode: str, raw_max_tokens: int) -> tuple[list[int], int, tuple[int, int], tuple[int, int]]:
    """``(frames, encode cap, encode grid, raw grid)`` of one budget. The raw grid is seed 001:1146-1148's
    "merged grid of a raw frame: the groups' own grid, or Phase 3's capped one": ``(hh, ww) if raw_mode == "orig"
    else hybrid_raw.raw_frame_grid(hh, ww, raw_max_tokens)`` (:func:`algorithms.budget.raw_frame_grid`)."""
    idx = subsample(num_frames, budget)
    cap = frame_token_cap(budget, len(idx), max_tokens_per_frame)
    grid = frame_grid(height, width, cap)
    if raw_mode == "phase3":
        raw_grid = raw_frame_grid(grid[0], grid[1], raw_max_tokens)
    elif raw_mode == "orig":
        raw_grid = grid
    else:
        raise SettingError(f"raw_mode must be 'phase3' or 'orig', got {raw_mode!r}")
    return idx, cap, grid, raw_grid


@torch.no_grad()
def prepare_budgets(vlm: BudgetedVideoLlama3, frames: torch.Tensor, times_s: list[float], budgets: list[int],
                    raw_mode: str = "phase3", raw_max_tokens: int = 256, max_tokens_per_frame: int = 256,
                    chunk_frames: int = 64, cache: EncodeCache | None = None,
                    subtitle_slots=None) -> list[BudgetInput]:
    """DESIGN §3 steps 2-6 for every budget of one decoded video.

    Per budget: frames ``subsample(T, B)``; grid from ``frame_token_cap``; one encode per grid over the union of
    the budgets' frames; plan from per-frame mean rows; raw frames at ``raw_frame_grid(gh, gw, raw_max_tokens)``
    (``raw_mode="phase3"``; re-encoded from the encode's pixel rows when smaller, :meth:`EncodeCache.reencode`,
    once per grid pair) or kept at the group grid through the original projector (``raw_mode="orig"``); qbase over
    the compressed groups; the shared prefix.

    Args:
        frames: (T, H, W, 3) uint8 decoded frames (for the largest budget).
        times_s: T frame times in seconds.
        subtitle_slots: ``None``, or ``f(frame_times_s) -> T_b + 1`` lists of subtitle texts interleaved before
            each frame of a budget (LongVideoBench; see :meth:`BudgetedVideoLlama3.build_prompt`).

    Returns:
        One :class:`BudgetInput` per budget, in the order given.
    """
    t, h, w = frames.shape[0], frames.shape[1], frames.shape[2]
    cache = cache or EncodeCache(vlm, frames, chunk_frames)
    geo = [_budget_geometry(h, w, b, t, max_tokens_per_frame, raw_mode, raw_max_tokens) for b in budgets]
    cache.encode([(idx, cap) for idx, cap, *_ in geo])
    plans = []
    for b, (idx, cap, grid, raw_grid) in zip(budgets, geo):
        rows = cache.get(idx, cap)                                     # (T_b, hw, C)
        plans.append((rows, plan_groups(rows.float().mean(1), grid[0] * grid[1], b, raw_grid[0] * raw_grid[1])))
    # raw frames at a smaller grid (seed 001:1173 ``sel = self.reencode(frames[src], tok, raw_grid)``): one
    # re-encode per (encode grid, raw grid) over all budgets' raw frames
    raw_requests = []
    for (idx, cap, grid, raw_grid), (_, plan) in zip(geo, plans):
        if raw_grid != grid:
            raw_requests.append(([idx[a] for kind, a, _ in plan.blocks() if kind == "raw"], cap, raw_grid))
    cache.reencode(raw_requests)
    out = []
    for b, (idx, cap, grid, raw_grid), (rows, plan) in zip(budgets, geo, plans):
        raw_pos = [a for kind, a, _ in plan.blocks() if kind == "raw"]
        if raw_grid != grid:
            raw_rows = cache.get_reencoded([idx[a] for a in raw_pos], cap, raw_grid) if raw_pos else rows[:0]
        else:
            raw_rows = rows[host_to_device(torch.tensor(raw_pos, dtype=torch.long), rows.device)]
        raw_llm = vlm.project(raw_rows, original=raw_mode == "orig")   # (n_raw, raw_hw, D)
        group_llm = vlm.project(vlm.compress(rows, plan, grid))          # (G_c, K, D)
        times = [times_s[i] for i in idx]
        prompt = vlm.build_prompt(plan, times, raw_llm, group_llm,
                                  subtitle_slots=subtitle_slots(times) if subtitle_slots else None)
        out.append(BudgetInput(budget=b, frame_idx=idx, plan=plan, prompt=prompt, grid=grid, raw_grid=raw_grid))
    return out
