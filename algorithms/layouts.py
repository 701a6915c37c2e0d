"""Layout ablations (DESIGN §4): which frames a variant keeps, how it groups them, what a compressed group becomes.

Legend: B budget (LLM vision rows per video), K rows per qbase group (64), T decoded frames, T_b the budget's
frames (``subsample(T, B)``), T_v the frames a variant keeps, D feature dim, G groups.

Every variant is one frozen :class:`LayoutVariant` in :data:`VARIANTS`: a declarative description read by the
same few shared functions (frame cap :func:`frame_cap`, cut and order inside :func:`plan_variant`, :func:`fill`,
the compressor swap :func:`substitute_grid`). There is no per-variant code path.

Fields of a variant fall in two kinds:

* **coverage** fields (``fill``, ``compress_group_frames``, ``raw_rows_cap``) describe what the variant does with
  the budget it frees by keeping fewer frames. They apply only when the cap actually dropped frames
  (``capped``). A video with ``T_b <= cap`` keeps all its frames and the baseline layout (DESIGN §4: "short
  videos keep the baseline layout").
* **layout** fields (``cut``, ``most_changing_first``, ``group_substitute``) apply to every video.

Flow for the caller (one video, one budget, one variant)::

    v = VARIANTS[name]
    keep = select_frames(v, T_b, B)                    # indices into the budget's frames
    capped = len(keep) < T_b
    max_rows = raw_rows_limit(v, capped, raw_max_tokens)   # encode raw frames at <= max_rows rows
    plan = plan_variant(v, per_frame_b[keep], hw, B, raw_hw, capped=capped, group_rows=...)

or :func:`layout_video`, which does all of it and returns a :class:`VariantLayout` that
:func:`same_llm_input` compares with the baseline's (the job copies the baseline record when they are equal).

Choices made where DESIGN §4 is silent (also stated on the functions):

1. ``B/64`` in the caps is ``B // 64`` (whole compressed groups). ``qtf<k>`` / ``rho16`` caps are
   ``k * (B // 64) - 1`` (``qtf1``: ``B // 64``): the most frames whose ``min(T // k + 1, T)`` groups fit as pure
   qbase, the same group-count form as the hybrid rule (``T // 4 + 1``); this is what makes the ``- 1`` (and
   ``qtf1``'s missing ``- 1``) exact. Every cap is at least 1 frame (``rho128`` / ``rho256`` at small B); a capped video keeps
   ``evenly_spaced(T_b, cap)`` of the budget's frames (first and last; the first alone when the cap is 1).
2. ``qtf<k>`` cuts ``min(T // k + 1, T)`` adaptive groups (never fewer than ``ceil(T / 8)``) with the usual
   8-frame limit, all compressed (mode ``all_compressed``).
3. ``uni8`` / ``uni16``: the number names the coverage as for ``rho<R>`` (B/8 frames is the baseline's
   ``max_frames``; B/16 is ``rho16``'s cap). ``uni8`` = baseline frames, ``uni16`` = ``rho16``'s frames, both with
   uniform cuts of the same group count as the adaptive cut (:func:`uniform_segment_count_lengths`). Uniform
   cuts replace adaptive cuts only in ``hybrid`` mode (``raw`` has no groups, ``forced8`` is already uniform).
4. ``hivar`` reverses the variation order only; 1-frame groups (+inf variation) are still compressed last, as in
   the baseline, because compressing one frame into K rows saves the least.
5. ``rho256`` does not fill (DESIGN lists fill for ``rho32…rho128``); with ``raw_hw <= 256`` its ``B // 256``
   frames are always all raw, so fill would be a no-op anyway. ``rho16`` does not fill.
6. Fill order is the reverse of the baseline compression order (fill undoes compression, last compressed first):
   1-frame groups first, then higher variation, ties shorter group then later group. Groups that are cheaper raw
   than as K rows (``n * raw_hw <= K``) come back first, whatever their rank. Then one greedy pass; a group
   that cannot take even one frame is skipped and later groups are still tried. A partly returned group of n
   frames is **split** into a raw group of its first k frames and a still-compressed group of its last
   ``n - k`` frames (K rows), so ``seg_lens`` still tiles the frames; the plan's mode becomes ``hybrid`` (``raw``
   if nothing stays compressed).
7. Compressor swaps: the plan is the baseline's (planned with K = 64 rows per group); the returned plan's ``k``
   is the substitute's row count (``<= 64``), so ``vision_tokens`` is the exact LLM cost. The substitute stands
   for the group's middle frame ``a + (n - 1) // 2`` (its timestamp in the raw-frame text). ``sel_resize``
   re-encodes that frame at ``frame_grid(h, w, 64)``; ``sel_merge`` / ``mean_merge`` area-pool the encode grid
   ``(gh, gw)`` to ``frame_grid(28 gh, 28 gw, 64, min_tokens=1)`` (unchanged when it already has <= 64 cells).
8. ``low64`` (when capped) plans every frame raw and refuses ``raw_hw > 64``; the caller encodes its raw frames at
   ``raw_rows_limit(...) = min(raw_max_tokens, 64)`` rows.

Pure python/torch; no lightning, no transformers, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch

from .budget import (
    K_ROWS,
    Plan,
    check_budget,
    compress_until_fits,
    compression_order,
    evenly_spaced,
    frame_grid,
    make_plan,
    max_frames,
    plan_groups,
    subsample,
)
from .segmentation import (
    FORCE_EVERY,
    MAX_GROUP_FRAMES,
    TARGET_FRAMES,
    adaptive_segment_lengths,
    frame_changes,
    group_variation,
    uniform_segment_count_lengths,
)

CutRule = Literal["adaptive", "uniform"]
GroupSubstitute = Literal["qbase", "sel_resize", "sel_merge", "mean_merge"]
SUBSTITUTE_MAX_ROWS = 64  # a swapped compressed group becomes one raw frame of at most this many rows


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
        fill: (coverage) after the hybrid rule, send compressed groups back raw with the leftover budget
            (:func:`fill`).
        compress_group_frames: (coverage) ``k`` of ``qtf<k>``: every frame compressed, ``min(T // k + 1, T)``
            groups. ``None``: the hybrid rule.
        raw_rows_cap: (coverage) every frame raw at ``<= raw_rows_cap`` rows (``low64``). ``None``: hybrid rule.
        cut: ``adaptive`` (cuts at the largest changes) or ``uniform`` (same group count, near-equal groups).
        most_changing_first: compress the most-changing groups first (``hivar``).
        group_substitute: what a compressed group becomes in the LLM input: ``qbase`` (K learned rows between
            compression tokens) or one raw frame of ``<= 64`` rows in raw-frame text: ``sel_resize`` (middle
            frame re-encoded small), ``sel_merge`` (middle frame's rows area-pooled), ``mean_merge`` (the group's
            mean rows area-pooled).
    """

    name: str
    cap: FrameCap | None = None
    fill: bool = False
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


def _rho(r: int, fill: bool, name: str | None = None) -> LayoutVariant:
    return LayoutVariant(name or f"rho{r}", cap=FrameCap("ratio", r), fill=fill)


_RHO16_CAP = FrameCap("groups", 4)  # 4 * (B // 64) - 1: the most frames whose 4-frame groups all fit as qbase

VARIANTS: dict[str, LayoutVariant] = {v.name: v for v in (
    # coverage
    LayoutVariant("rho16", cap=_RHO16_CAP),
    _rho(32, fill=True),
    _rho(32, fill=False, name="rho32nf"),
    _rho(64, fill=True),
    _rho(128, fill=True),
    _rho(256, fill=False),  # DESIGN: fill for rho32…rho128; always all-raw anyway when raw_hw <= 256
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
    """The variant's frame cap for budget B, or ``None`` when it keeps the baseline's frames."""
    v = get_variant(variant)
    return None if v.cap is None else v.cap.frames(budget_tokens, k)


def select_frames(variant: str | LayoutVariant, num_frames: int, budget_tokens: int, k: int = K_ROWS) -> list[int]:
    """Which of the budget's frames the variant keeps.

    Args:
        num_frames: T_b, the budget's frame count (``len(subsample(T, B))``).

    Returns:
        Ascending indices into the budget's frames: all of them when ``T_b <= cap`` (or no cap), else ``cap``
        evenly spaced ones (first and last included). The video is *capped* iff fewer than T_b are returned.

    Raises:
        ValueError: ``T_b < 1`` or ``T_b > max_frames(B)`` (subsample first).
    """
    if num_frames < 1:
        raise ValueError("cannot select frames of a video with no frames")
    if num_frames > max_frames(budget_tokens, k):
        raise ValueError(f"{num_frames} frames exceed max_frames({budget_tokens}) = {max_frames(budget_tokens, k)}; "
                         "subsample() the frames for this budget first")
    cap = frame_cap(variant, budget_tokens, k)
    if cap is None or num_frames <= cap:
        return list(range(num_frames))
    return evenly_spaced(num_frames, cap)


def variant_frames(variant: str | LayoutVariant, num_decoded: int, budget_tokens: int, k: int = K_ROWS) -> list[int]:
    """Indices into the T decoded frames that a (variant, budget) uses: ``subsample`` then :func:`select_frames`."""
    sub = subsample(num_decoded, budget_tokens, k)
    return [sub[i] for i in select_frames(variant, len(sub), budget_tokens, k)]


def raw_rows_limit(variant: str | LayoutVariant, capped: bool, raw_max_tokens: int) -> int:
    """Most rows a raw frame may have in this variant's LLM input: ``raw_max_tokens``, or
    ``min(raw_max_tokens, raw_rows_cap)`` for ``low64`` on a capped video."""
    v = get_variant(variant)
    if capped and v.raw_rows_cap is not None:
        return min(raw_max_tokens, v.raw_rows_cap)
    return raw_max_tokens


def substitute_frame(start: int, end: int) -> int:
    """Frame a swapped compressed group ``[start, end)`` stands for: its middle frame ``start + (n - 1) // 2``."""
    if end <= start:
        raise ValueError(f"empty group [{start}, {end})")
    return start + (end - start - 1) // 2


def substitute_grid(variant: str | LayoutVariant, encode_grid: tuple[int, int],
                    native_hw: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """Merged-token grid of the raw frame a swapped compressed group becomes (``None`` for ``qbase``: K rows).

    Args:
        encode_grid: ``(gh, gw)`` of the group's frames at the encode size.
        native_hw: ``(height, width)`` in pixels of the decoded frame (needed by ``sel_resize``).

    Returns:
        ``(gh', gw')`` with ``gh' * gw' <= 64``: ``sel_resize`` re-encodes the middle frame at
        ``frame_grid(h, w, 64)``; ``sel_merge`` / ``mean_merge`` area-pool ``(gh, gw)`` to
        ``frame_grid(28 gh, 28 gw, 64, min_tokens=1)`` (never larger than ``(gh, gw)``).
    """
    v = get_variant(variant)
    if v.group_substitute == "qbase":
        return None
    if v.group_substitute == "sel_resize":
        if native_hw is None:
            raise ValueError("sel_resize needs the frame's native (height, width)")
        return frame_grid(native_hw[0], native_hw[1], SUBSTITUTE_MAX_ROWS)
    gh, gw = encode_grid
    return frame_grid(gh * 28, gw * 28, SUBSTITUTE_MAX_ROWS, min_tokens=1)


# ---------------------------------------------------------------------------------------------- planning


def _cut(rule: CutRule, per_frame: torch.Tensor, num_groups: int, target_frames: int = TARGET_FRAMES) -> list[int]:
    num_frames = int(per_frame.shape[0])
    if rule == "adaptive":
        return adaptive_segment_lengths(per_frame, target_frames, FORCE_EVERY, n_segments=num_groups)
    if rule == "uniform":
        return uniform_segment_count_lengths(num_frames, num_groups)
    raise ValueError(f"unknown cut rule {rule!r}")


def fill_order(variation: list[float], seg_lens: list[int] | tuple[int, ...]) -> list[int]:
    """Order in which :func:`fill` returns groups: the reverse of the baseline compression order
    (1-frame groups first, then most-changing; ties: shorter group, then later group)."""
    return compression_order(variation, list(seg_lens))[::-1]


def fill(plan: Plan, changes: torch.Tensor, budget_tokens: int, raw_hw: int | None = None) -> Plan:
    """Spend the plan's leftover budget by sending compressed groups back raw, most-changing first (DESIGN §4).

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
    """Plan the frames a variant kept (DESIGN §4).

    * not capped (or no cap): the baseline rule :func:`plan_groups`, with the variant's cut (uniform cuts of the
      same group count in ``hybrid`` mode) and order (``hivar``); ``base`` is exactly ``plan_groups``.
    * capped, ``compress_group_frames = k`` (``qtf<k>``): ``min(T // k + 1, T)`` groups (at least
      ``ceil(T / 8)``) cut by the variant's rule, every group compressed (mode ``all_compressed``).
    * capped, ``raw_rows_cap`` (``low64``): every frame raw (mode ``raw``); ``raw_hw`` must be ``<= raw_rows_cap``.
    * capped otherwise (``rho<R>``, ``uni16``): the baseline rule as above, then :func:`fill` when ``fill``.
    * compressor swaps: the baseline plan, returned with ``k = group_rows`` (the substitute's rows) so that
      ``vision_tokens`` is exact; ``seg_lens`` / ``compressed`` are the baseline's.

    Args:
        per_frame: (T_v, D) per-frame mean features of the kept frames (rows ``select_frames(...)``).
        hw: merged tokens per frame at the encode size (recorded).
        budget_tokens: B.
        raw_hw: rows per raw frame in this variant's LLM input (see :func:`raw_rows_limit`).
        capped: whether :func:`select_frames` dropped frames (``len(keep) < T_b``); coverage rules apply only then.
        group_rows: rows of the swapped group substitute (``prod(substitute_grid(...))``); required for swaps,
            ignored (must be ``None``) for ``qbase``.
        k: rows per qbase group.

    Returns:
        A :class:`~algorithms.budget.Plan` with ``vision_tokens <= B``, ``seg_lens`` tiling T_v, groups of at most
        8 frames.

    Raises:
        ValueError: ``B < K``; ``capped`` with more frames than the cap; ``low64`` with ``raw_hw`` over its cap;
            a swap without ``group_rows`` or with ``group_rows > 64``; or any plan over B.
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

    if capped and v.compress_group_frames is not None:
        n = min(num_frames // v.compress_group_frames + 1, num_frames)
        n = max(n, math.ceil(num_frames / MAX_GROUP_FRAMES))
        seg = _cut(v.cut, per_frame, n, v.compress_group_frames)
        plan = make_plan("all_compressed", seg, range(len(seg)), hw, raw_hw, k)
    elif capped and v.raw_rows_cap is not None:
        if raw_hw > v.raw_rows_cap:
            raise ValueError(f"{v.name} encodes raw frames at <= {v.raw_rows_cap} rows, got raw_hw={raw_hw}")
        plan = make_plan("raw", [1] * num_frames, [], hw, raw_hw, k)
    else:
        plan = plan_groups(per_frame, hw, budget_tokens, raw_hw, k=k)
        if plan.mode == "hybrid" and (v.cut != "adaptive" or v.most_changing_first):
            changes = frame_changes(per_frame)
            seg = _cut(v.cut, per_frame, plan.n_groups)
            order = compression_order(group_variation(changes, seg), seg, most_changing_first=v.most_changing_first)
            plan = make_plan("hybrid", seg, compress_until_fits(seg, order, budget_tokens, raw_hw, k), hw, raw_hw, k)
        if capped and v.fill:
            plan = fill(plan, frame_changes(per_frame), budget_tokens)
    if group_rows is not None:
        plan = make_plan(plan.mode, list(plan.seg_lens), plan.compressed, hw, raw_hw, group_rows)
    if plan.vision_tokens > budget_tokens:
        raise ValueError(f"{v.name} plan of {num_frames} frames needs {plan.vision_tokens} vision tokens > budget "
                         f"{budget_tokens}")
    return plan


# ---------------------------------------------------------------------------------------------- whole layout


@dataclass(frozen=True)
class VariantLayout:
    """Everything that decides a (video, budget, variant)'s LLM vision input.

    Attributes:
        variant: variant name.
        budget_tokens: B.
        frames: ascending indices into the budget's frames (``subsample(T, B)``) that are kept (T_v of them).
        capped: whether the variant's cap dropped frames (record field ``video_info.capped`` of the job).
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
                 encode_grid: tuple[int, int] | None = None, native_hw: tuple[int, int] | None = None,
                 k: int = K_ROWS) -> VariantLayout:
    """:func:`select_frames` + :func:`raw_rows_limit` + :func:`substitute_grid` + :func:`plan_variant` in one call.

    Args:
        per_frame: (T_b, D) per-frame mean features of the budget's frames.
        hw: merged tokens per frame at the encode size.
        budget_tokens: B.
        raw_grid_for: maps a raw-row limit to the raw frames' grid ``(gh, gw)`` (the caller's raw mode: e.g.
            ``lambda m: frame_grid(h, w, m)`` for ``phase3``); called with :func:`raw_rows_limit`.
        raw_max_tokens: the run's raw-frame row cap.
        encode_grid / native_hw: needed by the compressor swaps (see :func:`substitute_grid`).

    Returns:
        A :class:`VariantLayout`.
    """
    v = get_variant(variant)
    num_budget_frames = int(per_frame.shape[0])
    keep = select_frames(v, num_budget_frames, budget_tokens, k)
    capped = len(keep) < num_budget_frames
    raw_grid = tuple(raw_grid_for(raw_rows_limit(v, capped, raw_max_tokens)))
    group_grid = None
    if v.group_substitute != "qbase":
        if encode_grid is None:
            raise ValueError(f"variant {v.name!r} needs encode_grid")
        group_grid = substitute_grid(v, encode_grid, native_hw)
    kept = per_frame if not capped else per_frame[torch.as_tensor(keep, dtype=torch.long)]
    plan = plan_variant(v, kept, hw, budget_tokens, raw_grid[0] * raw_grid[1], capped=capped,
                        group_rows=None if group_grid is None else group_grid[0] * group_grid[1], k=k)
    return VariantLayout(v.name, budget_tokens, tuple(keep), capped, plan, raw_grid, v.group_substitute, group_grid)


def same_llm_input(a: VariantLayout, b: VariantLayout) -> bool:
    """Whether two layouts of the same video give the same LLM vision input (the job then copies the record).

    Equal iff budget, kept frames, plan (all fields, so the recorded stats agree too), raw grid, group substitute
    kind and its grid are equal. The variant name is not compared.
    """
    return (a.budget_tokens == b.budget_tokens and a.frames == b.frames and a.plan == b.plan
            and a.raw_grid == b.raw_grid and a.group_substitute == b.group_substitute
            and a.group_grid == b.group_grid)


__all__ = [
    "FrameCap", "LayoutVariant", "VARIANTS", "VariantLayout", "SUBSTITUTE_MAX_ROWS", "fill", "fill_order",
    "frame_cap", "get_variant", "layout_video", "parse_jobs", "plan_variant", "raw_rows_limit", "same_llm_input",
    "select_frames", "substitute_frame", "substitute_grid", "variant_frames",
]
