"""What a report shows first, as plain rows shared by the console (:mod:`.console`) and ``report.html``
(:mod:`callbacks.report`): each benchmark's released figure, the layout ablation's variant x budget matrix and
the pruning table. Accuracies are fractions; nothing here is computed that :func:`.scores.score_records` did not
already put in the scores dict, except sums and ratios of its numbers.
"""
from __future__ import annotations

import math
from collections import defaultdict

from algorithms.choice import official_rule

from .release import HEADLINES, headline
from .scores import reference_variant

_DURATION_ORDER = {"short": 0, "medium": 1, "long": 2}


def duration_sort(v: str) -> tuple:
    """Sort key of a duration group: numbers by value, Video-MME's short / medium / long in that order."""
    try:
        return (1, float(v), v)
    except ValueError:
        return (0, _DURATION_ORDER.get(v, 99), v)


def variant_name(v) -> str:
    """A variant as shown: ``None`` (the groups of a plain budgeted run, jobs ``b<B>``) is the base layout,
    ``base``."""
    return "base" if v is None else str(v)


def format_p(p: float | None, n_resamples: int | None) -> str:
    """A bootstrap p-value as text: never ``0.000``; a p of 0 (no resample crossed zero) reads ``< 1/n_resamples``
    (``< 0.001`` with 1000 resamples), the test's resolution."""
    if p is None:
        return "-"
    if p <= 0:
        return f"< {1 / n_resamples:.2g}" if n_resamples else "< 1e-4"
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.1e}"


def by_benchmark(scores: dict) -> dict[str, list[dict]]:
    """The groups per benchmark, in table order."""
    out: dict[str, list[dict]] = defaultdict(list)
    for g in scores.get("groups", []):
        out[g["benchmark"]].append(g)
    return dict(sorted(out.items()))


def _official(g: dict) -> dict | None:
    return (g.get("parsers") or {}).get("official")


def _diff_index(scores: dict, parser: str = "official") -> dict[tuple, dict]:
    """``(benchmark, job a, job b) -> difference`` for the scores' differences of ``parser``."""
    return {(d["benchmark"], d["a"]["job"], d["b"]["job"]): d for d in scores.get("differences", [])
            if d["parser"] == parser}


def is_matrix(groups: list[dict]) -> bool:
    """A layout ablation: several variants, each at numeric budgets."""
    return (len({g["variant"] for g in groups}) > 1 and all(isinstance(g["budget"], (int, float)) for g in groups)
            and not any(g.get("cost") for g in groups))


def is_pruning(groups: list[dict]) -> bool:
    """A pruning run: groups carry kept-token / FLOPs costs."""
    return any(g.get("cost") for g in groups)


def headline_rows(groups: list[dict]) -> list[dict]:
    """Per group: ``{job, variant, budget, name, value, n, tasks, answered, questions, ...}`` of the release's headline
    figure (official parser; ``value`` None when the benchmark has no release block). ``n``: questions scored;
    ``answered``: those the release counts (Video-MME: a letter was extracted; else ``None``); ``questions``: every
    question of the job, scored + error records + missing."""
    rows = []
    for g in groups:
        p = _official(g) or {}
        h = headline(g["benchmark"], p)
        name, value, tasks = h if h else (HEADLINES.get(g["benchmark"], ("accuracy",))[0], p.get("accuracy"), {})
        if not h and p.get("rule") and p["rule"] != official_rule(g["benchmark"]):   # the job's own rule (omni)
            name = f"accuracy under the job's {p['rule']} rule"
        rows.append({"job": g["job"], "variant": g["variant"], "budget": g["budget"], "name": name, "value": value,
                     "n": g.get("n_scored"), "accuracy": p.get("accuracy"), "ci": p.get("accuracy_ci95"),
                     "n_errors": g.get("n_errors"), "n_missing": g.get("n_missing"), "n_reused": g.get("n_reused", 0),
                     "unparseable": p.get("unparseable"), "tasks": tasks,
                     "answered": (p.get("release") or {}).get("answered"),
                     # every question of the job: scored + error records + questions without a record
                     "questions": sum(g.get(k) or 0 for k in ("n_scored", "n_errors", "n_missing"))})
    return rows


def matrix(scores: dict, groups: list[dict]) -> dict:
    """The variant x budget matrix of one benchmark's layout ablation (official parser).

    Returns:
        ``{reference, budgets, rows: [{variant, mean_difference, cells: {budget: {accuracy, ci, difference,
        diff_ci, p, n_reused, n}}}]}``; rows sorted by the mean over budgets of the difference from the reference
        variant at the same budget (best first), the reference first; ``difference`` is the paired difference
        (this variant minus the reference, same budget, common questions) from the scores' ``differences``.
    """
    ref = reference_variant(g["variant"] for g in groups)
    diffs = _diff_index(scores)
    budgets = sorted({g["budget"] for g in groups})
    ref_job = {g["budget"]: g["job"] for g in groups if g["variant"] == ref}
    rows: dict = {}
    for g in groups:
        p = _official(g) or {}
        d = diffs.get((g["benchmark"], g["job"], ref_job.get(g["budget"])))
        row = rows.setdefault(g["variant"], {"variant": g["variant"], "cells": {}})
        row["cells"][g["budget"]] = {"accuracy": p.get("accuracy"), "ci": p.get("accuracy_ci95"), "n": g.get("n_scored"),
                                     "n_reused": g.get("n_reused", 0),
                                     "difference": d["difference"] if d else None,
                                     "diff_ci": d["ci95"] if d else None, "p": d["p_two_sided"] if d else None}
    for row in rows.values():
        ds = [c["difference"] for c in row["cells"].values() if c["difference"] is not None]
        row["mean_difference"] = sum(ds) / len(ds) if ds else None
    ordered = sorted(rows.values(), key=lambda r: (r["variant"] != ref, -(r["mean_difference"] if r["mean_difference"]
                                                                          is not None else -math.inf),
                                                   str(r["variant"])))
    return {"reference": ref, "budgets": budgets, "rows": ordered}


def flops_key(cost: dict) -> str | None:
    """The prefill FLOPs entry at the model's own shape (``prefill_tflops.accurate.model``), else the first
    ``accurate`` shape, else the first of any convention."""
    keys = sorted(k for k in cost if k.startswith("prefill_tflops."))
    for k in ("prefill_tflops.accurate.model",):
        if k in keys:
            return k
    acc = [k for k in keys if k.startswith("prefill_tflops.accurate.")]
    return (acc or keys or [None])[0]


def pruning_rows(scores: dict, groups: list[dict]) -> dict:
    """One row per pruning variant (official parser), the reference (``full``) first, then by accuracy.

    Returns:
        ``{reference, flops_key, rows: [{variant, job, n, accuracy, ci, difference, diff_ci, p, video_retention,
        audio_retention, kept_tokens, tflops, tflops_pct_of_full}]}``; ``kept_tokens`` = mean video + audio tokens
        per question, ``tflops`` the mean prefill TFLOPs per question under ``flops_key``, ``tflops_pct_of_full``
        that as % of the reference's.
    """
    ref = reference_variant(g["variant"] for g in groups)
    diffs = _diff_index(scores)
    ref_g = next((g for g in groups if g["variant"] == ref), None)
    fk = next((flops_key(g["cost"]) for g in groups if g.get("cost") and flops_key(g["cost"])), None)
    ref_flops = (ref_g or {}).get("cost", {}).get(fk) if fk else None
    rows = []
    for g in groups:
        p, c = _official(g) or {}, g.get("cost") or {}
        d = diffs.get((g["benchmark"], g["job"], ref_g["job"])) if ref_g is not None and g is not ref_g else None
        tf = c.get(fk) if fk else None
        kept = (c.get("num_video_tokens") or 0.0) + (c.get("num_audio_tokens") or 0.0) if c else None
        rows.append({"variant": g["variant"] or g["job"], "job": g["job"], "n": g.get("n_scored"),
                     "accuracy": p.get("accuracy"), "ci": p.get("accuracy_ci95"),
                     "difference": d["difference"] if d else None, "diff_ci": d["ci95"] if d else None,
                     "p": d["p_two_sided"] if d else None, "video_retention": c.get("video_retention_reached"),
                     "audio_retention": c.get("audio_retention_reached"), "kept_tokens": kept, "tflops": tf,
                     "tflops_pct_of_full": 100 * tf / ref_flops if tf is not None and ref_flops else None,
                     "is_reference": g is ref_g})
    rows.sort(key=lambda r: (not r["is_reference"], -(r["accuracy"] if r["accuracy"] is not None else -1),
                             r["variant"]))
    return {"reference": ref, "flops_key": fk, "rows": rows}


def flops_label(key: str | None) -> str:
    """``prefill_tflops.accurate.model`` -> ``accurate convention, the model's own shape``."""
    if not key:
        return "-"
    _, conv, shape = key.split(".", 2)
    return f"{conv} convention, {'the model' + chr(39) + 's own shape' if shape == 'model' else shape}"
