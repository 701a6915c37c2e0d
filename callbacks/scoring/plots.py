"""The PNG plots of a scores dict (matplotlib ``Figure`` objects, Agg, no pyplot state)."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from datamodules.features import atomic_write_bytes

from .scores import DURATION_KEY, _sort_key
from .summary import duration_sort as _duration_sort

def _save_figure(fig, path: Path) -> None:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
_ACC_TITLE = "accuracy = correct / scored questions (answered; unparsed = wrong)"


def _series_style(k: int, cmap) -> dict:
    """A distinct colour and marker for series ``k`` (colour cycle of ``cmap``, markers cycling at another
    period, so two series never share both)."""
    return {"color": cmap(k % cmap.N), "marker": MARKERS[k % len(MARKERS)]}


def _cost_figure(bench: str, groups: list[dict], rule_of: dict[str, str]):
    """Pruning jobs (groups with ``cost``): official accuracy against kept tokens (video + audio) and against
    prefill TFLOPs (the ``accurate`` convention, first shape), one labelled point per job with its interval, so the
    better trade-offs (up and left) can be read off; ``None`` when no group has costs."""
    import matplotlib
    from matplotlib.figure import Figure

    pts = []
    for g in groups:
        c, p = g.get("cost") or {}, (g.get("parsers") or {}).get("official")
        if not c or not p or p.get("accuracy") is None:
            continue
        tokens = c.get("num_video_tokens", 0.0) + c.get("num_audio_tokens", 0.0)
        flops_keys = sorted(k for k in c if k.startswith("prefill_tflops.accurate."))
        ci = p.get("accuracy_ci95") or [p["accuracy"], p["accuracy"]]
        pts.append((g["job"], tokens, c[flops_keys[0]] if flops_keys else None, 100 * p["accuracy"],
                    100 * ci[0], 100 * ci[1], flops_keys[0][len("prefill_tflops.accurate."):] if flops_keys else ""))
    if not pts:
        return None
    cmap = matplotlib.colormaps["tab20" if len(pts) > 10 else "tab10"]
    fig = Figure(figsize=(12.4, 4.2))
    axes = fig.subplots(1, 2, squeeze=False).flatten()
    for ax, xi, xlabel in ((axes[0], 1, "kept tokens per question (video + audio, mean)"),
                           (axes[1], 2, f"prefill TFLOPs per question (accurate, {pts[0][6] or '-'}, mean)")):
        for k, (job, *vals) in enumerate(pts):
            x = vals[xi - 1]
            if x is None:
                continue
            acc, lo, hi = vals[2], vals[3], vals[4]
            ax.errorbar([x], [acc], yerr=[[acc - lo], [hi - acc]], capsize=3, markersize=7, linestyle="none",
                        label=job, **_series_style(k, cmap))
            ax.annotate(job, (x, acc), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"official parser, rule {rule_of.get('official', 'official')}", fontsize=9)
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, title="job", fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 0.95))
    fig.suptitle(f"{bench}: {_ACC_TITLE}, against cost (95 % bootstrap intervals)", fontsize=10)
    fig.tight_layout()
    return fig


def build_figures(scores: dict) -> dict[str, Any]:
    """The matplotlib ``Figure`` of every plot of ``scores`` (not saved; :func:`plot_scores` saves them), by file name.

    * ``acc_vs_budget_<benchmark>.png``: small multiples, one panel per parser (its rule in the panel title):
      accuracy (%) vs budget (vision tokens, log2 axis), one line per variant, each with its own colour and marker
      and its 95 % bootstrap interval as error bars; legend outside the axes. Groups without a numeric budget
      are left out.
    * ``duration_<benchmark>.png`` (Video-MME, LongVideoBench): grouped bars, one panel per parser, one group per
      job and one bar (colour) per duration group, its value printed on it (so 0 % shows): as many colours as
      duration groups whatever the number of jobs.

    * ``acc_vs_cost_<benchmark>.png`` (pruning jobs, groups with ``cost``): :func:`_cost_figure`.

    Every title names the accuracy (over scored questions, unparsed counted wrong) and the rule.
    """
    import matplotlib
    from matplotlib.figure import Figure  # a bare Figure renders with Agg; pyplot's global state is never touched

    figures: dict[str, Any] = {}
    by_bench: dict[str, list[dict]] = defaultdict(list)
    for g in scores.get("groups", []):
        by_bench[g["benchmark"]].append(g)
    for bench, groups in sorted(by_bench.items()):
        parsers = sorted({pa for g in groups for pa in g["parsers"]}, key=lambda x: (x != "official", x))
        rule_of = {pa: g["parsers"][pa].get("rule", pa) for g in groups for pa in g["parsers"]}
        # ---- accuracy vs budget, one panel per parser
        lines: dict[str, dict[str, list[tuple]]] = {pa: defaultdict(list) for pa in parsers}
        for g in groups:
            if not isinstance(g["budget"], (int, float)):
                continue
            for parser, p in g["parsers"].items():
                if p["accuracy"] is not None:
                    ci = p.get("accuracy_ci95") or [p["accuracy"], p["accuracy"]]
                    lines[parser][g["variant"] or "base"].append(
                        (g["budget"], 100 * p["accuracy"], 100 * ci[0], 100 * ci[1]))
        panels = [pa for pa in parsers if lines[pa]]
        if panels:
            variants = sorted({v for pa in panels for v in lines[pa]})
            cmap = matplotlib.colormaps["tab20" if len(variants) > 10 else "tab10"]
            ncol = min(len(panels), 2)
            nrow = math.ceil(len(panels) / ncol)
            fig = Figure(figsize=(5.2 * ncol + 2.4, 3.8 * nrow))
            axes = fig.subplots(nrow, ncol, squeeze=False).flatten()
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
                ax.set_xscale("log", base=2)
                ax.set_xticks(budgets)
                ax.set_xticklabels([f"{b:g}" for b in budgets])
                ax.minorticks_off()
                ax.set_xlabel("budget (vision tokens)")
                ax.set_ylabel("accuracy (%)")
                ax.set_title(f"{parser} parser, rule {rule_of[parser]}", fontsize=9)
                ax.grid(True, alpha=0.3)
            for ax in axes[len(panels):]:
                ax.set_visible(False)
            handles, labels = axes[0].get_legend_handles_labels()
            for ax in axes[1:len(panels)]:
                for h, lab in zip(*ax.get_legend_handles_labels()):
                    if lab not in labels:
                        handles.append(h)
                        labels.append(lab)
            fig.legend(handles, labels, title="variant", fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 0.95))
            fig.suptitle(f"{bench}: {_ACC_TITLE}, 95 % bootstrap intervals", fontsize=10)
            fig.tight_layout()
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
        cmap = matplotlib.colormaps["viridis"]
        colours = [cmap(0.15 + 0.7 * k / max(1, len(cats_sorted) - 1)) for k in range(len(cats_sorted))]
        width_in = max(6.4, len(jobs) * (0.28 * len(cats_sorted) + 0.25))
        fig = Figure(figsize=(width_in + 1.6, 4.0 * len(panels)))
        axes = fig.subplots(len(panels), 1, squeeze=False).flatten()
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
                ax.bar_label(rect, labels=["" if v != v else f"{v:.0f}" for v in vals], fontsize=6, padding=1)
            ax.set_xticks(range(len(jobs)))
            ax.set_xticklabels(jobs, rotation=45 if len(jobs) > 6 else 0, ha="right" if len(jobs) > 6 else "center",
                               fontsize=8)
            ax.set_xlim(-0.6, len(jobs) - 0.4)
            ax.set_xlabel("job (variant, budget)")
            ax.set_ylabel("accuracy (%)")
            ax.set_ylim(0, 109)
            ax.set_title(f"{parser} parser, rule {rule_of[parser]}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, title=dk, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 0.95))
        fig.suptitle(f"{bench}: {_ACC_TITLE}, per {dk}", fontsize=10)
        fig.tight_layout()
        figures[f"duration_{bench}.png"] = fig
    return figures


def plot_scores(scores: dict, out_dir: str | Path) -> list[Path]:
    """Render the PNG plots of :func:`build_figures` into ``out_dir`` (matplotlib Agg, no display; files replaced
    atomically).

    Returns:
        The written paths.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in build_figures(scores).items():
        _save_figure(fig, out_dir / name)
        written.append(out_dir / name)
    return written

