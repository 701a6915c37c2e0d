"""Layout ablations (DESIGN §4): which frames a variant keeps, how it groups them, what a compressed group becomes.

Legend: B budget (LLM vision rows per video), K rows per qbase group (64), T decoded frames, T_b the budget's
frames (``subsample(T, B)``), T_v the frames a variant keeps, D feature dim, G groups.

Every variant is one frozen :class:`LayoutVariant` in :data:`VARIANTS`, the declarative counterpart of seed 000's
``VARIANTS`` dict (``BASE = dict(cap=None, layout="hybrid", tf=4, seg="adaptive", comp="qbase", raw_tokens=None)``)
read by the same few shared functions, each following one function of seed 000 (quoted on it):

* :func:`variant_frames` = ``frame_indices``: a video with more decoded frames than the cap keeps
  ``np.linspace(0, n_decoded - 1, cap, dtype=int)`` of them (*capped*), else the budget's ``subsample``.
* the effective variant (seed ``eff = v if capped or v["cap"] is None else BASE``): a capped variant on an uncapped
  video is the baseline itself (:func:`effective_variant`).
* :func:`plan_variant` = ``plan_variant`` / ``_plan_variant``; :func:`segment` = ``segment``;
  :func:`fill` = ``fill``; :func:`training_change` = ``training_change``.
* :func:`same_llm_input` = the seed's reuse test (same cut, same compressed groups, and qbase groups or none).

Today's earlier rules that are worth keeping are separate named variants (``rho32fv2``, ``rho64fv2``,
``rho128fv2``: :func:`fill_v2`), never a silent default.

Flow for the caller (one video, one budget, one variant)::

    frames, capped = variant_frames(name, T, B)           # indices into the T decoded frames
    layout = layout_video(name, per_frame[frames], hw, B, raw_grid_for, raw_max_tokens, frames=frames,
                          capped=capped)                  # hw: the encode grid of len(frames) frames at B
    same_llm_input(layout, base_layout)                   # the job copies the baseline record when True

Where seed 000 calls a helper it does not define (``bd.subsample``, ``hybrid_raw.raw_frame_grid``): ``bd.subsample``
thins with the seeds' own ``np.linspace(..., dtype=int)`` (:func:`algorithms.budget.subsample`);
``raw_frame_grid`` is :func:`algorithms.budget.raw_frame_grid` (of the encode's merged grid), for the swaps'
substitutes here and for raw frames through the caller's ``raw_grid_for``.

Pure python/torch; no lightning, no transformers, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch

import numpy as np

from .budget import (
    K_ROWS,
    Plan,
    check_budget,
    compress_until_fits,
    compression_order,
    make_plan,
    raw_frame_grid,
    plan_groups,
    subsample,
)
from .segmentation import (
    FORCE_EVERY,
    MAX_GROUP_FRAMES,
    adaptive_segment_count,
    adaptive_segment_lengths,
    frame_changes,
    group_variation,
    uniform_segment_count_lengths,
)

CutRule = Literal["adaptive", "uniform"]
GroupSubstitute = Literal["qbase", "sel_resize", "sel_merge", "mean_merge"]
SUBSTITUTE_MAX_ROWS = 64  # seed 000 SMALL: a swapped compressed group becomes one raw frame of at most this many rows


@dataclass(frozen=True)
class FrameCap:
    """Frame-count cap of a coverage variant.

    * ``kind="ratio"``, ``value=R``: ``B // R`` frames (``rho<R>``, ``low64``).
    * ``kind="groups"``, ``value=k``: ``k * (B // K) - 1`` frames (``k = 1``: ``B // K``): the most frames whose
      ``min(T // k + 1, T)`` groups all fit as K-row groups (``rho16`` = groups of 4, ``qtf<k>``).

    Always at least 1 frame.
    """

    kind: Literal["ratio", "groups"]
    value: int

    def frames(self, budget_tokens: int, k: int = K_ROWS) -> int:
        """The cap in frames for budget B (raises ``ValueError`` when ``B < K``)."""
        check_budget(budget_tokens, k)
        if self.kind == "ratio":
            n = budget_tokens // self.value
        elif self.kind == "groups":
            n = budget_tokens // k if self.value == 1 else self.value * (budget_tokens // k) - 1
        else:
            raise ValueError(f"unknown frame cap kind {self.kind!r}")
        return max(1, n)


@dataclass(frozen=True)
class LayoutVariant:
    """Declarative description of one layout ablation (DESIGN §4).

    Attributes:
        name: registry key, also the ``variant`` record field and output folder prefix.
        cap: frame cap (``None``: the baseline's frames, ``subsample(T, B)``).
        fill: after the hybrid rule, send compressed groups back raw with the leftover budget (seed ``fill=True``,
            :func:`fill`; hybrid plans only).
        fill_rule: ``seed`` (:func:`fill`) or ``v2`` (the project's earlier rule, :func:`fill_v2`).
        compress_group_frames: ``tf`` of seed ``layout="qbase"`` (``qtf<k>``): every frame compressed in
            ``min(T // k + 1, T)`` adaptive groups, mode ``qbase``. ``None``: the hybrid layout (``tf = 4``).
        raw_rows_cap: seed ``raw_tokens``: raw frames at ``<= raw_rows_cap`` rows (``low64``).
        cut: seed ``seg``: ``adaptive`` or ``uniform`` (``np.round(np.linspace(0, T, n + 1))`` bounds).
        most_changing_first: seed ``order="hivar"``: compress the most-changing groups first, change measured as
            :func:`training_change`.
        group_substitute: what a compressed group becomes in the LLM input: ``qbase`` (K learned rows between
            compression tokens) or one raw frame of ``<= 64`` rows in raw-frame text: ``sel_resize`` (middle
            frame re-encoded small), ``sel_merge`` (middle frame's rows area-pooled), ``mean_merge`` (the group's
            mean rows area-pooled).
    """

    name: str
    cap: FrameCap | None = None
    fill: bool = False
    fill_rule: Literal["seed", "v2"] = "seed"
    compress_group_frames: int | None = None
    raw_rows_cap: int | None = None
    cut: CutRule = "adaptive"
    most_changing_first: bool = False
    group_substitute: GroupSubstitute = "qbase"

    def __post_init__(self):
        coverage = [self.fill, self.compress_group_frames is not None, self.raw_rows_cap is not None]
        if sum(coverage) > 1:
            raise ValueError(f"variant {self.name!r}: fill, compress_group_frames and raw_rows_cap are exclusive")
        if any(coverage) and self.cap is None:
            raise ValueError(f"variant {self.name!r}: a coverage rule needs a frame cap")
        if self.compress_group_frames is not None and not 1 <= self.compress_group_frames <= MAX_GROUP_FRAMES:
            raise ValueError(f"variant {self.name!r}: compress_group_frames must be in [1, {MAX_GROUP_FRAMES}]")
        if self.fill and self.group_substitute != "qbase":
            raise ValueError(f"variant {self.name!r}: fill is defined for qbase groups only")


def _rho(r: int, fill: bool, name: str | None = None, fill_rule: str = "seed") -> LayoutVariant:
    return LayoutVariant(name or f"rho{r}", cap=FrameCap("ratio", r), fill=fill, fill_rule=fill_rule)


_RHO16_CAP = FrameCap("groups", 4)  # 4 * (B // 64) - 1: the most frames whose 4-frame groups all fit as qbase

VARIANTS: dict[str, LayoutVariant] = {v.name: v for v in (
    # coverage
    LayoutVariant("rho16", cap=_RHO16_CAP),
    _rho(32, fill=True),
    _rho(32, fill=False, name="rho32nf"),
    _rho(64, fill=True),
    _rho(128, fill=True),
    _rho(256, fill=False),  # seed: rho256 has no fill
    # the project's earlier fill rule (cheap groups first, split groups, raw mode when nothing stays compressed)
    _rho(32, fill=True, name="rho32fv2", fill_rule="v2"),
    _rho(64, fill=True, name="rho64fv2", fill_rule="v2"),
    _rho(128, fill=True, name="rho128fv2", fill_rule="v2"),
    LayoutVariant("qtf1", cap=FrameCap("groups", 1), compress_group_frames=1),
    LayoutVariant("qtf2", cap=FrameCap("groups", 2), compress_group_frames=2),
    LayoutVariant("low64", cap=FrameCap("ratio", 64), raw_rows_cap=64),
    # compressor swaps (baseline plan)
    LayoutVariant("sel_resize", group_substitute="sel_resize"),
    LayoutVariant("sel_merge", group_substitute="sel_merge"),
    LayoutVariant("mean_merge", group_substitute="mean_merge"),
    # grouping: uniform cuts at the baseline's (B/8) and rho16's (B/16) coverage
    LayoutVariant("uni8", cut="uniform"),
    LayoutVariant("uni16", cap=_RHO16_CAP, cut="uniform"),
    # order
    LayoutVariant("hivar", most_changing_first=True),
    # the baseline
    LayoutVariant("base"),
)}


def get_variant(variant: str | LayoutVariant) -> LayoutVariant:
    """The :class:`LayoutVariant` for a name (``ValueError`` listing the known names when unknown)."""
    if isinstance(variant, LayoutVariant):
        return variant
    try:
        return VARIANTS[variant]
    except KeyError:
        raise ValueError(f"unknown layout variant {variant!r}; known: {', '.join(VARIANTS)}") from None


def parse_jobs(spec: str, k: int = K_ROWS) -> list[tuple[str, int]]:
    """Parse ablation jobs ``variant:budget[:budget…]``, comma-separated, into ``(variant, budget)`` pairs.

    ``"rho32:1024:4096,base:256"`` → ``[("rho32", 1024), ("rho32", 4096), ("base", 256)]`` (input order;
    whitespace around tokens is ignored).

    Raises:
        ValueError: naming the bad token: empty spec or token, unknown variant, missing or non-integer budget,
            budget smaller than K, or a repeated ``(variant, budget)`` job.
    """
    if not spec or not spec.strip():
        raise ValueError("empty job list: expected 'variant:budget[:budget...]', comma-separated")
    jobs: list[tuple[str, int]] = []
    seen: set[tuple[str, int]] = set()
    for token in spec.split(","):
        tok = token.strip()
        if not tok:
            raise ValueError(f"empty job token in {spec!r}")
        name, *budgets = [p.strip() for p in tok.split(":")]
        if name not in VARIANTS:
            raise ValueError(f"job {tok!r}: unknown layout variant {name!r}; known: {', '.join(VARIANTS)}")
        if not budgets:
            raise ValueError(f"job {tok!r}: no budget (write {name}:<budget>[:<budget>...])")
        for b in budgets:
            if not b.isdigit():
                raise ValueError(f"job {tok!r}: budget {b!r} is not a positive integer")
            budget = int(b)
            if budget < k:
                raise ValueError(f"job {tok!r}: budget {budget} is smaller than one compressed group ({k} rows)")
            if (name, budget) in seen:
                raise ValueError(f"job {tok!r}: {name}:{budget} is listed twice")
            seen.add((name, budget))
            jobs.append((name, budget))
    return jobs


def frame_cap(variant: str | LayoutVariant, budget_tokens: int, k: int = K_ROWS) -> int | None:
    """Most frames a long video keeps under the variant (seed 000 ``frame_cap``; ``None``: the baseline's B/8).

    ``rho``: ``budget // x``; ``tf``: ``x * m - 1 if x > 1 else m`` with ``m = budget // K``; at least 1 frame (the
    seed's ``budget // 256`` is 0 below B = 256, which it cannot decode).
    """
    v = get_variant(variant)
    return None if v.cap is None else v.cap.frames(budget_tokens, k)


def variant_frames(variant: str | LayoutVariant, num_decoded: int, budget_tokens: int,
                   k: int = K_ROWS) -> tuple[list[int], bool]:
    """(indices into the decoded frames, capped?) for a variant at a budget (seed 000 ``frame_indices``)::

        cap = frame_cap(v, budget)
        if cap is None or n_decoded <= cap:
            return bd.subsample(n_decoded, budget), False
        return np.linspace(0, n_decoded - 1, cap, dtype=int).tolist(), True

    The cap compares with the *decoded* frames (the ablation decodes for 16384 tokens), not the budget's.

    Raises:
        ValueError: ``num_decoded < 1``.
    """
    if num_decoded < 1:
        raise ValueError("cannot select frames of a video with no frames")
    cap = frame_cap(variant, budget_tokens, k)
    if cap is None or num_decoded <= cap:
        return subsample(num_decoded, budget_tokens, k), False
    return [int(i) for i in np.linspace(0, num_decoded - 1, cap, dtype=int)], True


def effective_variant(variant: str | LayoutVariant, capped: bool) -> LayoutVariant:
    """The variant a job plans with: seed 000 ``eff = v if (capped or v["cap"] is None) else BASE`` (a capped
    variant on a video its cap does not reach keeps the baseline layout)."""
    v = get_variant(variant)
    return v if (capped or v.cap is None) else VARIANTS["base"]


def raw_rows_limit(variant: str | LayoutVariant, capped: bool, raw_max_tokens: int) -> int:
    """Most rows a raw frame may have in this variant's LLM input: ``raw_max_tokens``, or ``raw_rows_cap`` for
    ``low64`` on a capped video whatever ``raw_max_tokens`` is (seed 000:1320 ``raw_frame_grid(*grid,
    eff["raw_tokens"] or args.raw_max_tokens)`` with ``low64``'s ``raw_tokens=SMALL`` = 64: the variant's 64 rows
    replace the run's cap, also when the cap is smaller)."""
    v = get_variant(variant)
    if capped and v.raw_rows_cap is not None:
        return v.raw_rows_cap
    return raw_max_tokens


def substitute_frame(start: int, end: int) -> int:
    """Frame a swapped compressed group ``[start, end)`` stands for: its middle frame ``start + (n - 1) // 2``."""
    if end <= start:
        raise ValueError(f"empty group [{start}, {end})")
    return start + (end - start - 1) // 2


def substitute_grid(variant: str | LayoutVariant, encode_grid: tuple[int, int]) -> tuple[int, int] | None:
    """Merged-token grid of the raw frame a swapped compressed group becomes (``None`` for ``qbase``: K rows).

    One grid for the three swaps, seed 000:1161 ``small = llm.hybrid_raw.raw_frame_grid(hh, ww, SMALL)`` with
    ``SMALL = 64`` and ``(hh, ww)`` the encode's merged grid (:func:`algorithms.budget.raw_frame_grid`):
    ``sel_resize`` re-encodes the middle frame at it (``llm.reencode(frames[src], tok, small)``), ``sel_merge`` /
    ``mean_merge`` area-pool the encoder rows to it (``F.adaptive_avg_pool2d(..., small)``).

    Args:
        encode_grid: ``(gh, gw)`` of the group's frames at the encode size.

    Returns:
        ``(gh', gw')`` with ``gh' * gw' <= 64``, never larger than ``(gh, gw)``.
    """
    v = get_variant(variant)
    if v.group_substitute == "qbase":
        return None
    return raw_frame_grid(encode_grid[0], encode_grid[1], SUBSTITUTE_MAX_ROWS)


# ---------------------------------------------------------------------------------------------- planning


def segment(per_frame: torch.Tensor, tf: int, cut: CutRule) -> list[int]:
    """Seed 000 ``segment``::

        n = adaptive_segment_count(T, tf, bd.FORCE_EVERY)
        if seg == "adaptive":
            return adaptive_segment_lengths(per_frame, tf, bd.FORCE_EVERY, 0.0, None, n_segments=n)
        bounds = np.round(np.linspace(0, T, n + 1)).astype(int)

    (the fork's segmenter, :mod:`algorithms.segmentation`).

    Args:
        per_frame: (T, D) per-frame mean features.
    """
    num_frames = int(per_frame.shape[0])
    n = adaptive_segment_count(num_frames, tf, FORCE_EVERY)
    if cut == "adaptive":
        return adaptive_segment_lengths(per_frame, tf, FORCE_EVERY, 0.0, None, n_segments=n)
    if cut == "uniform":
        return uniform_segment_count_lengths(num_frames, n)
    raise ValueError(f"unknown cut rule {cut!r}")


def training_change(changes: torch.Tensor, seg_lens: list[int] | tuple[int, ...]) -> list[float]:
    """Per-group change as Phase-3 training ranks raw segments (seed 000 ``training_change``)::

        change.append(sum(diff[s:s + L - 1]) / (L - 1) if L >= 2 else (diff[s - 1] if s >= 1 else diff[0]))

    A 1-frame group scores its step from the previous frame (the first frame: its step to the next). A video of one
    frame has no step at all: the seed's ``diff[0]`` of an empty list raises ``IndexError`` (``hivar`` of a 1-frame
    video that does not fit raw, e.g. a 256-row frame at B = 64, crashes the seed's run); here it scores 0.0, the
    only group is compressed and the job is answered (docs/deviations.md).
    """
    vals = changes.detach().to(device="cpu", dtype=torch.float64).tolist()
    out, s = [], 0
    for n in seg_lens:
        if n >= 2:
            out.append(sum(vals[s:s + n - 1]) / (n - 1))
        else:
            out.append(vals[s - 1] if s >= 1 else (vals[0] if vals else 0.0))
        s += n
    return out


def fill(plan: Plan, changes: torch.Tensor, budget_tokens: int, raw_hw: int | None = None) -> Plan:
    """Spend what the greedy rule left of the budget on raw frames (seed 000 ``fill``).

    Only a ``hybrid`` plan changes (``if plan.mode != "hybrid": return plan``). One pass over the compressed groups
    in the order ``sorted(plan.compressed, key=lambda j: (-var[j], plan.seg_lens[j], j))`` (``var``: within-group
    variation, +inf for 1 frame, so 1-frame groups first): a group of L frames goes back whole when
    ``cost + L * raw_hw - K <= budget``; else, when ``L > 1`` and ``(budget - cost) // raw_hw >= 1``, its first
    ``k = min(L - 1, (budget - cost) // raw_hw)`` frames go raw (``cost += k * raw_hw``) and the rest stays one
    compressed group. The result is ``Plan("hybrid", lens, comp, cost)``: raw groups keep their length, a group
    returned whole is one raw group, a split group is a raw group of ``k`` frames then a compressed one.

    Args:
        plan: a plan with ``vision_tokens <= B``.
        changes: (T-1,) consecutive-frame changes of the plan's frames.
        raw_hw: rows per raw frame; must equal ``plan.raw_hw`` (default).

    Raises:
        ValueError: ``raw_hw`` differs from the plan's, or ``changes`` has the wrong size.
    """
    raw_hw = plan.raw_hw if raw_hw is None else raw_hw
    if raw_hw != plan.raw_hw:
        raise ValueError(f"fill raw_hw {raw_hw} differs from the plan's raw_hw {plan.raw_hw}")
    if int(changes.numel()) != plan.num_frames - 1:
        raise ValueError(f"{changes.numel()} changes for {plan.num_frames} frames")
    if plan.mode != "hybrid":
        return plan
    seg = list(plan.seg_lens)
    var = group_variation(changes, seg)
    raw_k: dict[int, int] = {}
    cost = plan.vision_tokens
    for j in sorted(plan.compressed, key=lambda j: (-var[j], seg[j], j)):
        n = seg[j]
        if cost + n * raw_hw - plan.k <= budget_tokens:
            raw_k[j] = n
            cost += n * raw_hw - plan.k
        elif n > 1 and (budget_tokens - cost) // raw_hw >= 1:
            raw_k[j] = min(n - 1, (budget_tokens - cost) // raw_hw)
            cost += raw_k[j] * raw_hw
    lens: list[int] = []
    comp: list[int] = []
    compressed = set(plan.compressed)
    for j, n in enumerate(seg):
        kk = raw_k.get(j, 0) if j in compressed else n
        if kk:
            lens.append(kk)
        if n - kk:
            comp.append(len(lens))
            lens.append(n - kk)
    out = make_plan("hybrid", lens, comp, plan.hw, raw_hw, plan.k)
    assert out.vision_tokens == cost <= budget_tokens and sum(lens) == sum(seg), (out, cost, budget_tokens)
    return out


def fill_order(variation: list[float], seg_lens: list[int] | tuple[int, ...]) -> list[int]:
    """Order in which :func:`fill_v2` returns groups: the reverse of the baseline compression order
    (1-frame groups first, then most-changing; ties: shorter group, then later group)."""
    return compression_order(variation, list(seg_lens))[::-1]


def fill_v2(plan: Plan, changes: torch.Tensor, budget_tokens: int, raw_hw: int | None = None) -> Plan:
    """The project's earlier fill rule (variants ``rho<R>fv2``; seed 000's rule is :func:`fill`).

    Groups whose raw frames cost no more than their K rows (``n * raw_hw <= K``) come back whole first (they free
    rows, so they would come back at any point of the pass; crediting their rows first lets the most-changing
    groups use them). Then one greedy pass over the other compressed groups in :func:`fill_order` (the leftover
    only shrinks during it): a group of n frames comes back whole when ``n * raw_hw - K`` fits the leftover, else its first ``k = min(leftover // raw_hw, n - 1)`` frames come back
    raw (skipped when ``k = 0``) and the group is split into a raw group of those k frames and a still-compressed
    group of the remaining ``n - k`` frames (K rows), so ``seg_lens`` still tiles the frames and no group grows.

    Args:
        plan: a plan with ``vision_tokens <= B``.
        changes: (T-1,) consecutive-frame changes of the plan's frames (:func:`frame_changes`).
        budget_tokens: B.
        raw_hw: rows per raw frame; must equal ``plan.raw_hw`` (default).

    Returns:
        A plan with ``vision_tokens <= B`` over the same frames; unchanged (the same object) when nothing came back;
        mode ``hybrid`` (``raw`` when no group stays compressed).

    Raises:
        ValueError: the plan already exceeds B, ``raw_hw`` differs from the plan's, or ``changes`` has the wrong size.
    """
    raw_hw = plan.raw_hw if raw_hw is None else raw_hw
    if raw_hw != plan.raw_hw:
        raise ValueError(f"fill raw_hw {raw_hw} differs from the plan's raw_hw {plan.raw_hw}")
    if plan.vision_tokens > budget_tokens:
        raise ValueError(f"plan needs {plan.vision_tokens} vision tokens > budget {budget_tokens}")
    if int(changes.numel()) != plan.num_frames - 1:
        raise ValueError(f"{changes.numel()} changes for {plan.num_frames} frames")
    seg = list(plan.seg_lens)
    comp = set(plan.compressed)
    variation = group_variation(changes, seg)
    order = [g for g in fill_order(variation, seg) if g in comp]
    leftover = budget_tokens - plan.vision_tokens
    returned: dict[int, int] = {}  # group -> frames sent back raw (n: whole)
    for g in order:  # groups whose raw frames cost no more than their K rows: always back, and first
        if seg[g] * raw_hw <= plan.k:
            returned[g] = seg[g]
            leftover += plan.k - seg[g] * raw_hw
    for g in order:
        n = seg[g]
        whole_cost = n * raw_hw - plan.k
        if g in returned:
            continue
        if whole_cost <= leftover:
            returned[g] = n
            leftover -= whole_cost
            continue
        kk = min(leftover // raw_hw, n - 1) if raw_hw > 0 else n - 1
        if kk >= 1:
            returned[g] = kk
            leftover -= kk * raw_hw
    if not returned:
        return plan
    new_seg: list[int] = []
    new_comp: list[int] = []
    for g, n in enumerate(seg):
        back = returned.get(g, 0)
        if g not in comp or back == n:  # raw group, or compressed group sent back whole
            new_seg.append(n)
        elif back == 0:  # still compressed
            new_comp.append(len(new_seg))
            new_seg.append(n)
        else:  # split: first `back` frames raw, the rest still compressed
            new_seg.append(back)
            new_comp.append(len(new_seg))
            new_seg.append(n - back)
    if not new_comp:
        out = make_plan("raw", [1] * plan.num_frames, [], plan.hw, raw_hw, plan.k)
    else:
        out = make_plan("hybrid", new_seg, new_comp, plan.hw, raw_hw, plan.k)
    assert out.vision_tokens <= budget_tokens, (out, budget_tokens)
    return out



def plan_variant(variant: str | LayoutVariant, per_frame: torch.Tensor, hw: int, budget_tokens: int, raw_hw: int,
                 *, capped: bool, group_rows: int | None = None, k: int = K_ROWS) -> Plan:
    """Plan the frames a (variant, budget) job kept (seed 000 ``plan_variant`` / ``_plan_variant``).

    The effective variant is :func:`effective_variant` (the baseline for a capped variant on an uncapped video).
    Then, as the seed:

    * ``qtf<k>`` (``layout == "qbase"``): ``lens = segment(per_frame, v["tf"], v["seg"])``, every group
      compressed, ``Plan("qbase", lens, set(range(len(lens))), len(lens) * bd.K)``.
    * adaptive cut and no order (baseline, ``rho<R>``, ``low64``, swaps): ``bd.plan_groups(...)``.
    * otherwise (``uni8``, ``uni16``, ``hivar``) the hybrid rule on the variant's cut / order: all raw when
      ``T * raw_hw <= budget``; ``plan_groups`` (forced8) when ``len(lens) * K > budget``; else compress in the order
      ``(-change[j], -lens[j], j)`` (``hivar``, :func:`training_change`) or ``(var[j], -lens[j], j)`` until it fits.
    * then ``fill(plan, ...) if v.get("fill")`` (:func:`fill`, or :func:`fill_v2` for ``fill_rule="v2"``).

    Compressor swaps return the plan with ``k = group_rows`` (the substitute's rows) so ``vision_tokens`` is exact.

    Args:
        per_frame: (T_v, D) per-frame mean features of the kept frames.
        hw: merged tokens per frame at the job's encode grid (recorded).
        raw_hw: rows per raw frame in this job's LLM input.
        capped: whether :func:`variant_frames` capped the video.
        group_rows: rows of a swapped group's substitute (required for swaps, ``None`` for qbase).

    Raises:
        ValueError: ``B < K``; capped for a variant without cap or with more frames than the cap; a swap without
            valid ``group_rows``; a qbase layout whose groups do not fit B; any plan over B.
    """
    v = get_variant(variant)
    check_budget(budget_tokens, k)
    num_frames = int(per_frame.shape[0])
    if capped:
        cap = frame_cap(v, budget_tokens, k)
        if cap is None:
            raise ValueError(f"variant {v.name!r} has no frame cap; capped must be False")
        if num_frames > cap:
            raise ValueError(f"{num_frames} frames exceed {v.name}'s cap of {cap} at budget {budget_tokens}")
    if v.group_substitute == "qbase":
        if group_rows is not None:
            raise ValueError(f"variant {v.name!r} uses qbase groups of {k} rows; group_rows must be None")
    elif group_rows is None or not 1 <= group_rows <= SUBSTITUTE_MAX_ROWS:
        raise ValueError(f"variant {v.name!r} needs group_rows in [1, {SUBSTITUTE_MAX_ROWS}], got {group_rows}")
    eff = effective_variant(v, capped)
    plan = _plan_variant(eff, per_frame, hw, budget_tokens, raw_hw, k)
    if eff.fill:
        fill_rule = fill if eff.fill_rule == "seed" else fill_v2
        plan = fill_rule(plan, frame_changes(per_frame), budget_tokens)
    if group_rows is not None:
        plan = make_plan(plan.mode, list(plan.seg_lens), plan.compressed, hw, raw_hw, group_rows)
    if plan.vision_tokens > budget_tokens:
        raise ValueError(f"{v.name} plan of {num_frames} frames needs {plan.vision_tokens} vision tokens > budget "
                         f"{budget_tokens}")
    return plan


def _plan_variant(v: LayoutVariant, per_frame: torch.Tensor, hw: int, budget_tokens: int, raw_hw: int,
                  k: int) -> Plan:
    num_frames = int(per_frame.shape[0])
    if v.compress_group_frames is not None:
        lens = segment(per_frame, v.compress_group_frames, v.cut)
        if len(lens) * k > budget_tokens:
            raise ValueError(f"{v.name}: {len(lens)} qbase groups of {num_frames} frames exceed budget {budget_tokens}")
        return make_plan("qbase", lens, range(len(lens)), hw, raw_hw, k)
    if v.cut == "adaptive" and not v.most_changing_first:
        return plan_groups(per_frame, hw, budget_tokens, raw_hw, k=k)
    if num_frames * raw_hw <= budget_tokens:
        return make_plan("raw", [1] * num_frames, [], hw, raw_hw, k)
    changes = frame_changes(per_frame)
    lens = segment(per_frame, 4, v.cut)
    if len(lens) * k > budget_tokens:
        return plan_groups(per_frame, hw, budget_tokens, raw_hw, k=k)   # forced8: already uniform
    if v.most_changing_first:
        change = training_change(changes, lens)
        order = sorted(range(len(lens)), key=lambda j: (-change[j], -lens[j], j))
    else:
        var = group_variation(changes, lens)
        order = sorted(range(len(lens)), key=lambda j: (var[j], -lens[j], j))
    return make_plan("hybrid", lens, compress_until_fits(lens, order, budget_tokens, raw_hw, k), hw, raw_hw, k)


# ---------------------------------------------------------------------------------------------- whole layout


@dataclass(frozen=True)
class VariantLayout:
    """Everything that decides a (video, budget, variant)'s LLM vision input.

    Attributes:
        variant: variant name.
        budget_tokens: B.
        frames: ascending indices into the decoded frames that are kept (T_v of them, :func:`variant_frames`).
        capped: whether the variant's cap applied (record field ``capped``).
        plan: the plan over the kept frames.
        raw_grid: ``(gh, gw)`` rows grid of each raw frame (``gh * gw == plan.raw_hw``).
        group_substitute: ``qbase`` or the swap kind.
        group_grid: ``(gh, gw)`` of the swapped group's raw frame, ``None`` for qbase.
    """

    variant: str
    budget_tokens: int
    frames: tuple[int, ...]
    capped: bool
    plan: Plan
    raw_grid: tuple[int, int]
    group_substitute: GroupSubstitute = "qbase"
    group_grid: tuple[int, int] | None = None

    def stats(self) -> dict:
        """Record fields: the plan's stats plus ``variant``, ``capped`` and ``n_frames_kept``."""
        return {**self.plan.stats(), "variant": self.variant, "capped": self.capped, "n_frames_kept": len(self.frames)}


def layout_video(variant: str | LayoutVariant, per_frame: torch.Tensor, hw: int, budget_tokens: int,
                 raw_grid_for: Callable[[int], tuple[int, int]], raw_max_tokens: int, *,
                 frames: list[int] | tuple[int, ...], capped: bool,
                 encode_grid: tuple[int, int] | None = None, k: int = K_ROWS) -> VariantLayout:
    """:func:`raw_rows_limit` + :func:`substitute_grid` + :func:`plan_variant` for the frames a job kept.

    Args:
        per_frame: (T_v, D) per-frame mean features of the kept frames (``frames`` from :func:`variant_frames`).
        hw: merged tokens per frame at the job's encode grid.
        budget_tokens: B.
        raw_grid_for: maps a raw-row limit to the raw frames' grid ``(gh, gw)`` (the caller's raw mode).
        raw_max_tokens: the run's raw-frame row cap.
        frames / capped: :func:`variant_frames`' result.
        encode_grid: needed by the compressor swaps (see :func:`substitute_grid`).
    """
    v = get_variant(variant)
    if int(per_frame.shape[0]) != len(frames):
        raise ValueError(f"{per_frame.shape[0]} feature rows for {len(frames)} kept frames")
    eff = effective_variant(v, capped)
    raw_grid = tuple(raw_grid_for(raw_rows_limit(eff, capped, raw_max_tokens)))
    group_grid = None
    if v.group_substitute != "qbase":
        if encode_grid is None:
            raise ValueError(f"variant {v.name!r} needs encode_grid")
        group_grid = substitute_grid(v, encode_grid)
    plan = plan_variant(v, per_frame, hw, budget_tokens, raw_grid[0] * raw_grid[1], capped=capped,
                        group_rows=None if group_grid is None else group_grid[0] * group_grid[1], k=k)
    return VariantLayout(v.name, budget_tokens, tuple(frames), capped, plan, raw_grid, v.group_substitute,
                         group_grid)


def same_llm_input(a: VariantLayout, base: VariantLayout) -> bool:
    """Whether a job's LLM input is the baseline's, so its records are copied (seed 000's reuse test)::

        reuse = eff is BASE
        if not capped and raw_grid == base_grid:
            reuse = (plan.seg_lens == bplan.seg_lens and plan.compressed == bplan.compressed
                     and (eff["comp"] == "qbase" or not plan.compressed))

    Both layouts must be of the same budget; an uncapped job keeps the baseline's frames (the budget's
    ``subsample``), so frames and encode grid agree whenever ``a`` is not capped. A swap (``sel_*``, ``mean_merge``)
    on a video whose plan has no compressed group is the baseline's input.
    """
    if a.budget_tokens != base.budget_tokens or a.capped or a.frames != base.frames:
        return False
    if a.raw_grid != base.raw_grid:
        return False
    return (a.plan.seg_lens == base.plan.seg_lens and a.plan.compressed == base.plan.compressed
            and (a.group_substitute == "qbase" or not a.plan.compressed))


__all__ = [
    "FrameCap", "LayoutVariant", "VARIANTS", "VariantLayout", "SUBSTITUTE_MAX_ROWS", "effective_variant", "fill",
    "fill_order", "fill_v2", "frame_cap", "get_variant", "layout_video", "parse_jobs", "plan_variant",
    "raw_rows_limit", "same_llm_input", "segment", "substitute_frame", "substitute_grid",
    "training_change", "variant_frames",
]
