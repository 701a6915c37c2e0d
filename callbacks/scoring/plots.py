"""The PNG plots of a scores dict (matplotlib ``Figure`` objects, Agg, no pyplot state)."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from datamodules.features import atomic_write_bytes

from .release import headline
from .scores import DURATION_KEY, _sort_key, reference_variant
from .summary import duration_sort as _duration_sort

def _save_figure(fig, path: Path) -> None:
    atomic_write_bytes(path, figure_png(fig))


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
_ACC_TITLE = "accuracy = correct / scored questions (unparsed = wrong)"


def _series_style(k: int, cmap) -> dict:
    """A distinct colour and marker for series ``k`` (colour cycle of ``cmap``, markers cycling at another
    period, so two series never share both)."""
    return {"color": cmap(k % cmap.N), "marker": MARKERS[k % len(MARKERS)]}


FONT = {"axes.titlesize": 11, "axes.labelsize": 11, "xtick.labelsize": 10, "ytick.labelsize": 10,
        "legend.fontsize": 10, "figure.titlesize": 12}
MAX_LINES = 10          # more variants than this: the ablation's difference plot instead of one line each
MAX_BAR_JOBS = 12       # more jobs than this: no duration bars (report.html's tables carry the numbers)


def _figure(**kw):
    """A bare ``Figure`` with the constrained layout (titles, labels and an outside legend never overlap)."""
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **kw)


def _cost_figure(bench: str, groups: list[dict], rule_of: dict[str, str]):
    """Pruning jobs (groups with ``cost``): official accuracy against kept tokens (video + audio) and against
    prefill TFLOPs (:func:`.summary.flops_key`: the ``accurate`` convention at the model's own shape when recorded),
    one point per variant with its interval (legend, no point labels to collide), the reference variant
    (``full``) drawn as a dashed horizontal line at its accuracy; ``None`` when no group has costs."""
    import matplotlib

    from .summary import flops_key, flops_label

    fk = next((flops_key(g["cost"]) for g in groups if g.get("cost") and flops_key(g["cost"])), None)
    ref = reference_variant(g["variant"] for g in groups)
    pts = []
    for g in groups:
        c, p = g.get("cost") or {}, (g.get("parsers") or {}).get("official")
        if not c or not p or p.get("accuracy") is None:
            continue
        tokens = c.get("num_video_tokens", 0.0) + c.get("num_audio_tokens", 0.0)
        ci = p.get("accuracy_ci95") or [p["accuracy"], p["accuracy"]]
        pts.append((g["job"], tokens, c.get(fk) if fk else None, 100 * p["accuracy"], 100 * ci[0], 100 * ci[1],
                    g["variant"] == ref))
    if not pts:
        return None
    # FLOPs in the unit that makes the largest value >= 1 (a tiny test model's prefill is MFLOPs, a 7B one TFLOPs)
    top = max((pt[2] for pt in pts if pt[2] is not None), default=1.0) or 1.0
    scale, unit = next(((f, u) for f, u in ((1.0, "TFLOPs"), (1e3, "GFLOPs"), (1e6, "MFLOPs"))
                        if top * f >= 1), (1e9, "kFLOPs"))
    pts = [(job, tok, None if fl is None else fl * scale, *rest) for job, tok, fl, *rest in pts]
    cmap = matplotlib.colormaps["tab20" if len(pts) > 10 else "tab10"]
    with matplotlib.rc_context(FONT):
        fig = _figure(figsize=(13, 4.8))
        axes = fig.subplots(1, 2, sharey=True, squeeze=False).flatten()
        for ax, xi, xlabel in ((axes[0], 1, "kept tokens per question (video + audio, mean)"),
                               (axes[1], 2, f"prefill {unit} per question\n({flops_label(fk)}, mean)")):
            for k, (job, *vals) in enumerate(pts):
                x = vals[xi - 1]
                if x is None:
                    continue
                acc, lo, hi, is_ref = vals[2], vals[3], vals[4], vals[5]
                ax.errorbar([x], [acc], yerr=[[acc - lo], [hi - acc]], capsize=3, markersize=8, linestyle="none",
                            label=job, **_series_style(k, cmap))
                if is_ref:
                    ax.axhline(acc, color="black", linestyle="--", linewidth=1, label=f"{job} (reference)")
            ax.set_xlabel(xlabel)
            ax.set_ylim(-2, 102)
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("accuracy (%)")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, title="variant", loc="outside right upper")
        fig.suptitle(f"{bench}: accuracy (official rule {rule_of.get('official', 'official')}, unparsed = wrong) "
                     "against cost, 95 % bootstrap intervals")
    return fig


def _difference_figure(scores: dict, bench: str, groups: list[dict]):
    """The layout ablation at a glance: one panel per budget (shared x axis), one row per variant in the matrix's
    order (:func:`.summary.matrix`), its paired difference from the reference variant at that budget with the
    95 % interval, a line at 0; filled markers where the interval excludes 0."""
    import matplotlib

    from .summary import matrix

    m = matrix(scores, groups)
    rows = [r for r in m["rows"] if r["variant"] != m["reference"]]
    if not rows:
        return None
    with matplotlib.rc_context(FONT):
        fig = _figure(figsize=(3.6 * len(m["budgets"]) + 1.6, 0.34 * len(rows) + 1.8))
        axes = fig.subplots(1, len(m["budgets"]), sharex=True, sharey=True, squeeze=False).flatten()
        ys = list(range(len(rows)))
        for ax, b in zip(axes, m["budgets"]):
            for y, r in zip(ys, rows):
                c = r["cells"].get(b)
                if not c or c["difference"] is None:
                    continue
                d, (lo, hi) = 100 * c["difference"], (100 * v for v in c["diff_ci"])
                sig = lo > 0 or hi < 0
                colour = "tab:green" if lo > 0 else "tab:red" if hi < 0 else "tab:gray"
                ax.errorbar([d], [y], xerr=[[d - lo], [hi - d]], fmt="o", color=colour, capsize=2,
                            markerfacecolor=colour if sig else "white")
            ax.axvline(0, color="black", linewidth=1)
            ax.set_title(f"budget {b:g}")
            ax.set_xlabel(f"Δ accuracy vs {m['reference']} (points)")
            ax.grid(True, axis="x", alpha=0.3)
        axes[0].set_yticks(ys)
        axes[0].set_yticklabels([str(r["variant"]) for r in rows])
        axes[0].invert_yaxis()
        fig.suptitle(f"{bench}: each variant minus {m['reference']} at the same budget (official rule, paired "
                     "bootstrap 95 % CI; filled = excludes 0)")
    return fig


def build_figures(scores: dict) -> dict[str, Any]:
    """The matplotlib ``Figure`` of every plot of ``scores`` (not saved; :func:`plot_scores` saves them), by file name.

    * ``acc_vs_budget_<benchmark>.png``: small multiples, one panel per parser (its rule in the panel title):
      accuracy (%) vs budget (vision tokens, log2 axis), one line per variant, each with its own colour and marker
      and its 95 % bootstrap interval as error bars; legend outside the axes. Groups without a numeric budget
      are left out. In the official panel the release's headline figure (the console's and report's first table:
      Video-MME correct / answered, MLVU M-Avg, LongVideoBench with its random fallback) is drawn dashed with
      hollow markers where it differs from the accuracy.
    * ``duration_<benchmark>.png`` (Video-MME, LongVideoBench): grouped bars, one panel per parser, one group per
      job and one bar (colour) per duration group, its value printed on it (so 0 % shows): as many colours as
      duration groups whatever the number of jobs.

    * ``acc_vs_cost_<benchmark>.png`` (pruning jobs, groups with ``cost``): :func:`_cost_figure`.
    * ``diff_vs_<reference>_<benchmark>.png`` (layout ablations, several variants at budgets):
      :func:`_difference_figure`; with more than ``MAX_LINES`` variants the accuracy-vs-budget panels show the
      reference variant only, and no duration bars are drawn above ``MAX_BAR_JOBS`` jobs.

    Every title names the accuracy (over scored questions, unparsed counted wrong) and the rule. Panels of one
    figure share their y range (accuracy 0-100 %); the layout is matplotlib's constrained layout (no overlap of
    titles, labels and the legend outside the axes); text at 10-12 pt.
    """
    import matplotlib

    with matplotlib.rc_context(FONT):   # text sizes are fixed when the artists are made
        return _build_figures(scores)


def _build_figures(scores: dict) -> dict[str, Any]:
    import matplotlib

    from .summary import is_matrix

    figures: dict[str, Any] = {}
    by_bench: dict[str, list[dict]] = defaultdict(list)
    for g in scores.get("groups", []):
        by_bench[g["benchmark"]].append(g)
    for bench, groups in sorted(by_bench.items()):
        parsers = sorted({pa for g in groups for pa in g["parsers"]}, key=lambda x: (x != "official", x))
        rule_of = {pa: g["parsers"][pa].get("rule", pa) for g in groups for pa in g["parsers"]}
        # ---- accuracy vs budget, one panel per parser
        lines: dict[str, dict[str, list[tuple]]] = {pa: defaultdict(list) for pa in parsers}
        released: dict[str, list[tuple]] = defaultdict(list)   # variant -> (budget, the release's headline %)
        released_name = None
        for g in groups:
            if not isinstance(g["budget"], (int, float)):
                continue
            head = headline(bench, g["parsers"].get("official") or {})
            if head and head[1] is not None:
                released_name = head[0]
                released[g["variant"] or "base"].append((g["budget"], 100 * head[1]))
            for parser, p in g["parsers"].items():
                if p["accuracy"] is not None:
                    ci = p.get("accuracy_ci95") or [p["accuracy"], p["accuracy"]]
                    lines[parser][g["variant"] or "base"].append(
                        (g["budget"], 100 * p["accuracy"], 100 * ci[0], 100 * ci[1]))
        panels = [pa for pa in parsers if lines[pa]]
        if is_matrix(groups):
            ref = reference_variant(g["variant"] for g in groups)
            diff_fig = _difference_figure(scores, bench, groups)
            if diff_fig is not None:
                figures[f"diff_vs_{ref or 'base'}_{bench}.png"] = diff_fig
            if len({g["variant"] for g in groups}) > MAX_LINES:    # one line per variant would be unreadable
                ref_name = ref or "base"
                lines = {pa: {v: pts for v, pts in lines[pa].items() if v == ref_name} for pa in parsers}
        if panels:
            variants = sorted({v for pa in panels for v in lines[pa]})
            cmap = matplotlib.colormaps["tab20" if len(variants) > 10 else "tab10"]
            ncol = min(len(panels), 2)
            nrow = math.ceil(len(panels) / ncol)
            fig = _figure(figsize=(5.6 * ncol + 2.4, 4.2 * nrow))
            axes = fig.subplots(nrow, ncol, sharey=True, squeeze=False).flatten()
            budgets = sorted({pt[0] for pa in panels for pts in lines[pa].values() for pt in pts})
            for ax, parser in zip(axes, panels):
                for k, variant in enumerate(variants):
                    pts = sorted(lines[parser].get(variant, []))
                    if not pts:
                        continue
                    ys = [a for _, a, _, _ in pts]
                    err = [[a - lo for _, a, lo, _ in pts], [hi - a for _, a, _, hi in pts]]
                    ax.errorbar([b for b, *_ in pts], ys, yerr=err, capsize=3, linewidth=1.4, markersize=6,
                                label=variant, **_series_style(k, cmap))
                    rel = sorted(released.get(variant, [])) if parser == "official" else []
                    if rel and [round(a, 9) for _, a in rel] != [round(a, 9) for a in ys]:
                        ax.plot([b for b, _ in rel], [a for _, a in rel], linestyle="--", linewidth=1.2,
                                markersize=7, markerfacecolor="white", label=f"{variant}: released figure",
                                **_series_style(k, cmap))
                ax.set_xscale("log", base=2)
                ax.set_xticks(budgets)
                ax.set_xticklabels([f"{b:g}" for b in budgets])
                ax.minorticks_off()
                ax.set_xlabel("budget (vision tokens, log2 scale)")
                ax.set_ylabel("accuracy (%)")
                ax.set_ylim(-2, 102)
                ax.set_title(f"{parser} parser, rule {rule_of[parser]}")
                ax.grid(True, alpha=0.3)
            for ax in axes[len(panels):]:
                ax.set_visible(False)
            handles, labels = axes[0].get_legend_handles_labels()
            for ax in axes[1:len(panels)]:
                for h, lab in zip(*ax.get_legend_handles_labels()):
                    if lab not in labels:
                        handles.append(h)
                        labels.append(lab)
            # each variant's released-figure line right after the variant
            order = sorted(range(len(labels)), key=lambda i: (labels[i].removesuffix(": released figure"),
                                                              labels[i].endswith(": released figure")))
            handles, labels = [handles[i] for i in order], [labels[i] for i in order]
            fig.legend(handles, labels, title="variant", loc="outside lower center", ncols=min(len(labels), 6))
            title = f"{bench}: {_ACC_TITLE}, 95 % bootstrap intervals"
            if any(h.get_label().endswith(": released figure") for h in handles):
                title += f"\ndashed, official panel: the released figure, {released_name}"
            fig.suptitle(title)
            figures[f"acc_vs_budget_{bench}.png"] = fig

        cost_fig = _cost_figure(bench, groups, rule_of)
        if cost_fig is not None:
            figures[f"acc_vs_cost_{bench}.png"] = cost_fig

        dk = DURATION_KEY.get(bench)
        if not dk:
            continue
        bars: dict[str, list[tuple[str, dict]]] = defaultdict(list)
        cats: set[str] = set()
        for g in groups:
            for parser, p in g["parsers"].items():
                cells = p["by"].get(dk) or {}
                if cells:
                    bars[parser].append((g["job"], cells))
                    cats.update(cells)
        panels = [pa for pa in parsers if bars[pa]]
        if not panels:
            continue
        cats_sorted = sorted(cats, key=_duration_sort)
        # one group of bars per job, one bar (colour) per duration group: few colours whatever the job count
        jobs = sorted({job for pa in panels for job, _ in bars[pa]},
                      key=lambda jb: next(_sort_key(g) for g in groups if g["job"] == jb))
        if len(jobs) > MAX_BAR_JOBS:
            continue
        cmap = matplotlib.colormaps["viridis"]
        colours = [cmap(0.15 + 0.7 * k / max(1, len(cats_sorted) - 1)) for k in range(len(cats_sorted))]
        width_in = max(6.4, len(jobs) * (0.28 * len(cats_sorted) + 0.25))
        fig = _figure(figsize=(width_in + 2.0, 4.2 * len(panels)))
        axes = fig.subplots(len(panels), 1, sharey=True, squeeze=False).flatten()
        width = 0.8 / len(cats_sorted)
        for ax, parser in zip(axes, panels):
            cells_of = dict(bars[parser])
            for k, cat in enumerate(cats_sorted):
                xs = [x + (k - (len(cats_sorted) - 1) / 2) * width for x in range(len(jobs))]
                vals = [100 * (cells_of[jb][cat]["accuracy"] or 0.0) if cat in cells_of.get(jb, {}) else float("nan")
                        for jb in jobs]
                n = max((cells_of[jb][cat]["n"] for jb in jobs if cat in cells_of.get(jb, {})), default=0)
                rect = ax.bar(xs, vals, width=width, label=f"{cat} (n {n})", color=colours[k], edgecolor="black",
                              linewidth=0.4)
                ax.bar_label(rect, labels=["" if v != v else f"{v:.0f}" for v in vals], fontsize=8, padding=1)
            ax.set_xticks(range(len(jobs)))
            ax.set_xticklabels(jobs, rotation=45 if len(jobs) > 6 else 0, ha="right" if len(jobs) > 6 else "center")
            ax.set_xlim(-0.6, len(jobs) - 0.4)
            ax.set_xlabel("job (variant, budget)")
            ax.set_ylabel("accuracy (%)")
            ax.set_ylim(0, 109)
            ax.set_title(f"{parser} parser, rule {rule_of[parser]}")
            ax.grid(True, axis="y", alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, title=dk, loc="outside lower center", ncols=min(len(labels), 6))
        fig.suptitle(f"{bench}: {_ACC_TITLE}, per {dk}")
        figures[f"duration_{bench}.png"] = fig
    return figures


# what each plot shows, by file-name prefix (the report's captions)
_CAPTIONS = (
    ("acc_vs_budget_", "Accuracy (correct / scored, %) against the vision-token budget (log2 axis), one panel per "
                       "parser, one line per variant, 95 % bootstrap intervals."),
    ("diff_vs_", "Each variant minus the reference variant at the same budget (accuracy points, paired bootstrap "
                 "95 % intervals; filled: the interval excludes 0)."),
    ("acc_vs_cost_", "Accuracy against kept tokens and prefill FLOPs per question, one point per variant; dashed: "
                     "the reference variant."),
    ("duration_", "Accuracy per duration group, one group of bars per job, one panel per parser."),
)


MAX_TIMELINE_ROWS = 400   # videos drawn one per row; a longer run shows its first ones (the tables have the rest)


def timeline_figure(per_rank: dict[str, dict]):
    """Where a run's time went, per video: for each rank's latest ``timing_rank<r>.json`` run (``{file name:
    run}``), one row per video in the order its step took them, with its decode window in its worker (grey), the
    step's wait for it (red) and the step itself (blue), in seconds after the process start, with the model's load
    end and the first answer marked. ``None`` when no run has ``per_video`` rows with decode windows (a run without
    workers, or a file written before they existed)."""
    panels = []
    for name, run in sorted(per_rank.items()):
        rows = [r for r in (run.get("per_video") or []) if "decode_start" in r and "step_start" in r]
        if rows:
            panels.append((name, run, rows[:MAX_TIMELINE_ROWS], len(rows)))
    if not panels:
        return None
    tallest = max(len(rows) for _, _, rows, _ in panels)
    fig = _figure(figsize=(9, min(2.0 + 0.22 * tallest, 14.0) * len(panels)))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (name, run, rows, total) in zip(axes, panels):
        draw_timeline(ax, run, rows, f"{name}: {total} videos"
                      + (f" (the first {len(rows)} drawn)" if total > len(rows) else ""))
    return fig


def draw_timeline(ax, run: dict, rows: list[dict], title: str) -> None:
    """One run's per-video ``rows`` (in step order) on ``ax``: decode window (grey), the step's wait (red), the
    step (blue), the run's ``timeline_s`` marks ``model_loaded`` / ``first_answer``; the panel of
    :func:`timeline_figure`, also drawn by ``bench/plot_cli_run.py`` under the run's busy shares."""
    for k, r in enumerate(rows):
        ax.barh(k, r["decode_end"] - r["decode_start"], left=r["decode_start"], height=0.7, color="0.7",
                label="decoded in a worker" if k == 0 else None)
        if r.get("wait_s", 0.0) > 0:
            ax.barh(k, r["wait_s"], left=r["step_start"] - r["wait_s"], height=0.7, color="tab:red",
                    label="step waiting for it" if k == 0 else None)
        if "step_s" in r:
            ax.barh(k, r["step_s"], left=r["step_start"], height=0.7, color="tab:blue",
                    label="its step (encode, plan, answer)" if k == 0 else None)
    for mark, style in (("model_loaded", ":"), ("first_answer", "--")):
        t = (run.get("timeline_s") or {}).get(mark)
        if t is not None:
            ax.axvline(t, color="k", linestyle=style, linewidth=1, label=mark.replace("_", " "))
    labels = [str(r.get("video_id")) + (f" ({r['decode_parts']} parts)" if r.get("decode_parts") else "")
              + (" (decoded again whole)" if r.get("parts_fallback") else "") for r in rows]
    ax.set_yticks(range(len(rows)), labels if len(rows) <= 40 else [""] * len(rows))
    ax.invert_yaxis()
    ax.set_xlabel("seconds after the process start")
    ax.set_title(title)
    if len(rows) > 40:   # many rows: no blank band above and below them
        ax.margins(y=0.01)
    if ax.get_legend_handles_labels()[0]:   # (no rows and no marks: no legend)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))


def figure_png(fig) -> bytes:
    """``fig`` as PNG bytes (100 dpi, tight)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def plot_caption(name: str) -> str:
    """What the plot file ``name`` (from :func:`build_figures`, optionally ``_<rules>``-suffixed) shows: one sentence
    for a figure caption (the benchmark is in the figure's title); the name itself for another file."""
    return next((text for prefix, text in _CAPTIONS if name.startswith(prefix)), name)


def plot_scores(scores: dict, out_dir: str | Path, suffix: str = "") -> list[Path]:
    """Render the PNG plots of :func:`build_figures` into ``out_dir`` (matplotlib Agg, no display; files replaced
    atomically); ``suffix`` goes before ``.png`` (a re-score with other rules: ``acc_vs_budget_videomme_robust.png``).

    Returns:
        The written paths.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in build_figures(scores).items():
        name = f"{name[:-4]}{suffix}.png" if suffix else name
        _save_figure(fig, out_dir / name)
        written.append(out_dir / name)
    return written

