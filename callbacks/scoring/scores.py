"""Scores of prediction records: reading the jsonl records, groups, parsers, breakdowns, intervals, differences
and pruning costs (the protocol is the package docstring, :mod:`callbacks.scoring`)."""
from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from algorithms.bootstrap import (DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED, bootstrap_interval,
                                  paired_bootstrap_difference)
from algorithms.choice import RULES, official_rule, parse

from ..record_lines import jsonl_lines
from .release import BENCHMARK_AGGREGATIONS, BREAKDOWNS, acc as _acc, cells, num_options as _num_options

log = logging.getLogger(__name__)

PARSERS = {"official": "pred", "robust": "pred_robust"}   # parser -> the stored field used without a response
DURATION_KEY = {"videomme": "duration", "lvb": "duration_group"}
MAX_LISTED_MISSING = 50
_JOB = re.compile(r"^(?:(.+)_)?b(\d+)$")
# the variant every other one is compared with at the same budget, in this order of preference (``None``: a plain
# budgeted run's groups, which have no variant)
REFERENCE_VARIANTS = ("base", "full", None)


# ----------------------------------------------------------------------------------------------------- reading
def read_records(out_root: str | Path, warn: bool = True) -> tuple[list[dict], dict[str, int]]:
    """All records under ``out_root`` (every ``*.jsonl``, sorted by path, lines in order).

    Each record gets ``job`` (first folder under ``out_root`` unless the record has one) and ``benchmark``
    (``meta["benchmark"]``, else the second folder) keys if missing; a record without a budget takes it (and, if
    it has no ``variant`` key, the variant) from a job name ``b<B>`` / ``<variant>_b<B>``. Unreadable lines (e.g. a line cut by a crash)
    are skipped and counted, each named in a console line when ``warn`` (``False`` for a second read of a folder
    whose lines were already named).

    Returns:
        ``(records, stats)`` with ``stats = {"n_files", "n_bad_lines"}``.
    """
    root = Path(out_root)
    records: list[dict] = []
    n_files = n_bad = 0
    for path in sorted(root.rglob("*.jsonl")):
        parts = path.relative_to(root).parts
        job_dir = parts[0] if len(parts) >= 2 else None
        bench_dir = parts[1] if len(parts) >= 3 else None
        n_files += 1
        for n, rec, err in jsonl_lines(path):
            if err is not None:   # not JSON, or not UTF-8 (a damaged disk block): skipped as a cut line is
                n_bad += 1
                if warn:
                    log.warning("scoring: skipping unreadable line %d of %s", n, path)
                continue
            if not isinstance(rec, dict) or "qid" not in rec:
                n_bad += 1
                continue
            rec.setdefault("job", job_dir or "default")
            m = _JOB.match(str(rec["job"]))
            if m and rec.get("budget") is None:  # budget/variant from a job name such as rho32_b1024
                rec["budget"] = int(m.group(2))
                if "variant" not in rec:
                    rec["variant"] = m.group(1)
            meta = rec.get("meta") or {}
            rec.setdefault("benchmark", meta.get("benchmark") or bench_dir or "unknown")
            records.append(rec)
    return records, {"n_files": n_files, "n_bad_lines": n_bad}


# ----------------------------------------------------------------------------------------------------- scoring
def _group_key(rec: dict) -> tuple:
    meta = rec.get("meta") or {}
    return (rec.get("benchmark") or meta.get("benchmark") or "unknown", str(rec.get("job") or "default"),
            rec.get("variant"), rec.get("budget"))


def _sort_key(g: dict) -> tuple:
    b = g["budget"]
    return (g["benchmark"], g["variant"] or "", b if isinstance(b, (int, float)) else math.inf, g["job"])


def _predictions(scored: list[dict], parser: str, rule: str, benchmark: str) -> tuple[list | None, int]:
    """Per scored record the letter under ``rule`` (re-parsed from ``response`` when the record has it, see the
    module docstring), and how many records had no ``options``. ``(None, 0)`` when nothing can give this parser
    (no response and no stored field)."""
    field = PARSERS.get(parser)
    if not scored:
        return [], 0
    if not any("response" in r or (field and field in r) for r in scored):
        return None, 0
    preds, assumed = [], 0
    for r in scored:
        if "response" in r and not (rule == "robust" and not r.get("options")):
            opts, guessed = _num_options(r, benchmark)
            assumed += guessed
            preds.append(parse(r.get("response"), opts, rule))
        else:
            preds.append(r.get(field) if field else None)
    return preds, assumed


def recorded_rule(scored: list[dict]) -> str | None:
    """The rule the job that wrote ``scored`` answered with, when every record names the same one of
    :data:`~algorithms.choice.RULES` in ``pred_rule`` (the omni pruning job's ``answer_rule``: OmniZip's by
    default); else ``None`` (the benchmark's own rule, :func:`~algorithms.choice.official_rule`, is the official
    parser)."""
    rules = {r.get("pred_rule") for r in scored}
    if len(rules) == 1:
        (rule,) = rules
        if rule in RULES and rule != "robust":
            return rule
    return None


def _interval(scores: list[float], n_resamples: int, seed: int) -> list[float] | None:
    ci = bootstrap_interval(scores, n_resamples, DEFAULT_LEVEL, seed) if n_resamples else None
    return list(ci) if ci else None


def reference_variant(variants: Iterable) -> Any:
    """The variant the others are compared with: the first of :data:`REFERENCE_VARIANTS` (``base``, the layout
    ablation's; ``full``, the unpruned omni run's; ``None``, a plain budgeted run's) among ``variants``, else the
    first in sorted order."""
    present = list(dict.fromkeys(variants))
    for v in REFERENCE_VARIANTS:
        if v in present:
            return v
    return sorted(present, key=lambda v: (v is None, str(v)))[0] if present else None


def _pair_differences(out: list[dict], correct_by: dict[int, dict[str, dict[str, int]]], n_resamples: int,
                      seed: int) -> list[dict]:
    """Paired bootstrap differences (package docstring): per benchmark, every variant against the reference
    variant (:func:`reference_variant`) at the same budget, and the reference variant's budgets against each
    other; per parser present in both, over the qids scored in both."""
    diffs = []
    if not n_resamples:
        return diffs
    refs = {b: reference_variant(g["variant"] for g in out if g["benchmark"] == b) for b in {g["benchmark"] for g in out}}
    for i, gb in enumerate(out):
        for j in range(len(out)):
            ga = out[j]
            if i == j or ga["benchmark"] != gb["benchmark"]:
                continue
            ref = refs[ga["benchmark"]]
            same_variant, same_budget = ga["variant"] == gb["variant"], ga["budget"] == gb["budget"]
            if same_variant == same_budget:      # identical settings (other jobs) or both differ: not a pair
                continue
            if same_variant and not (ga["variant"] == ref and j > i):   # budgets: the reference's, a the later
                continue
            if same_budget and not (gb["variant"] == ref):              # variants: a against the reference
                continue
            for parser in ga["parsers"]:
                ca, cb = correct_by[id(ga)].get(parser), correct_by[id(gb)].get(parser)
                if ca is None or cb is None:
                    continue
                common = sorted(set(ca) & set(cb))
                res = paired_bootstrap_difference([ca[q] for q in common], [cb[q] for q in common], n_resamples,
                                                  DEFAULT_LEVEL, seed)
                if res is None:
                    continue
                diffs.append({
                    "benchmark": ga["benchmark"], "parser": parser, "compared": "budget" if same_variant else "variant",
                    "a": {k: ga[k] for k in ("job", "variant", "budget")},
                    "b": {k: gb[k] for k in ("job", "variant", "budget")},
                    "n_common": len(common), "difference": res["difference"], "ci95": [res["low"], res["high"]],
                    "p_two_sided": res["p_two_sided"]})
    return diffs


COST_FIELDS = ("num_video_tokens", "num_audio_tokens", "video_retention_reached", "audio_retention_reached",
               "prefill_time_s")


def cost_means(records: list[dict]) -> dict[str, float]:
    """Per-group means of the pruning records' cost fields (``COST_FIELDS``, and ``prefill_flops`` as TFLOPs per
    convention and model shape, ``prefill_tflops.<paper|accurate>.<shape>``) over the records that have them; empty
    for records without any (budgeted QA)."""
    sums: dict[str, list[float]] = {}
    for r in records:
        for k in COST_FIELDS:
            v = r.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                sums.setdefault(k, []).append(float(v))
        for conv, shapes in (r.get("prefill_flops") or {}).items():
            for shape, v in (shapes or {}).items() if isinstance(shapes, dict) else ():
                if isinstance(v, (int, float)):
                    sums.setdefault(f"prefill_tflops.{conv}.{shape}", []).append(float(v) / 1e12)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def _concealed_counts(scored: list[dict]) -> dict:
    """``{n_concealed_videos, n_concealed_frames, concealed_videos, n_unchecked_videos}``: the distinct videos among
    answered records
    whose decode had concealed or repeated frames (``video_info.frames_concealed``, issue 42 item 1: damaged packets
    are answered as the seed's FFmpeg decodes them), the sum of their concealed sampled-frame counts (each video
    once), those videos' ids (sorted, so the console can name the damaged files), and the distinct videos whose
    frames were not checked for concealment at all (``video_info.concealment_checked`` false: decoded by NVDEC,
    which reports no decode status)."""
    per_video, unchecked = {}, set()
    for r in scored:
        vi = r.get("video_info") or {}
        fc = vi.get("frames_concealed")
        if fc:
            per_video[str(r.get("video"))] = len(fc)
        if vi.get("concealment_checked") is False:
            unchecked.add(str(r.get("video")))
    return {"n_concealed_videos": len(per_video), "n_concealed_frames": sum(per_video.values()),
            "concealed_videos": sorted(per_video), "n_unchecked_videos": len(unchecked)}


def score_records(records: list[dict], expected_qids: dict[str, Iterable[str]] | None = None,
                  rules: Iterable[str] | None = None, n_resamples: int = DEFAULT_RESAMPLES,
                  seed: int = DEFAULT_SEED) -> dict:
    """Score records (see the module docstring for the protocol).

    Args:
        records: record dicts; each needs ``qid`` and ``benchmark`` (or ``meta["benchmark"]``) and ``job``
            (default ``"default"``); ``answer``, ``pred``, ``pred_robust``, ``error``, ``variant``, ``budget``,
            ``meta`` are read when present.
        expected_qids: per benchmark name, the qids of the annotation (for ``n_missing``); optional. Where given, a
            record of a qid not in it (a question removed from the annotation since) is left out of the group
            (``n_not_in_annotation``).
        rules: extra rules of :data:`algorithms.choice.RULES` scored under their own names.
        n_resamples / seed: bootstrap resamples (0: no intervals, no differences) and seed.

    Raises:
        ValueError: an unknown rule.

    Returns:
        ``{"groups": [group, ...]}`` sorted by (benchmark, variant, budget, job), each group
        ``{benchmark, job, variant, budget, n_records, n_duplicates, n_errors, n_scored, n_no_answer (answered
        records without a gold answer, left out of n_scored), n_concealed_videos,
        n_concealed_frames, concealed_videos, n_unchecked_videos (:func:`_concealed_counts`), n_expected, n_missing,
        missing_qids, templates, parsers: {name: {correct, unparseable, accuracy, accuracy_all, by: {field:
        {value: {n, correct, accuracy}}}, accuracy_ci95, accuracy_all_ci95, [m_avg, pooled]}}}``, plus
        ``differences`` and ``bootstrap`` (module docstring); accuracies are fractions (``None`` when nothing was
        scored).
    """
    for r in rules or ():
        if r not in RULES:
            raise ValueError(f"unknown rule {r!r}; known: {', '.join(RULES)}")
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    dups: dict[tuple, int] = defaultdict(int)
    retried: dict[tuple, int] = defaultdict(int)
    for rec in records:
        key = _group_key(rec)
        qid = str(rec["qid"])
        if qid in groups[key]:
            if groups[key][qid].get("error") and not rec.get("error"):
                groups[key][qid] = rec  # a successful retry of a failed question
                retried[key] += 1
            elif rec.get("error") and not groups[key][qid].get("error"):
                # the same retry read the other way round: the error in a later-sorted file (rank1.jsonl of a
                # two-process run, answered on resume by rank 0); the writer never appends an error after an answer
                retried[key] += 1
            else:
                dups[key] += 1
            continue
        groups[key][qid] = rec
    expected = {b: {str(q) for q in qs} for b, qs in (expected_qids or {}).items()}

    out = []
    correct_by: dict[int, dict[str, dict[str, int]]] = {}
    for key, by_qid in groups.items():
        benchmark, job, variant, budget = key
        # records of questions the annotation no longer has (a row removed since they were written): not scored
        stale = [q for q in by_qid if q not in expected[benchmark]] if benchmark in expected else []
        if stale:
            by_qid = {q: r for q, r in by_qid.items() if q in expected[benchmark]}
        recs = [by_qid[q] for q in sorted(by_qid, key=str)]   # qid order: the intervals never see the file order
        errors = [r for r in recs if r.get("error")]
        scored = [r for r in recs if not r.get("error") and r.get("answer") is not None]
        missing = sorted(expected[benchmark] - set(by_qid)) if benchmark in expected else []
        templates = sorted({str((r.get("meta") or {}).get("template")) for r in recs
                            if (r.get("meta") or {}).get("template") is not None})
        g: dict[str, Any] = {
            "benchmark": benchmark, "job": job, "variant": variant, "budget": budget,
            "n_records": len(recs), "n_duplicates": dups[key], "n_retried": retried[key],
            "n_reused": sum(bool(r.get("reused")) for r in recs), "n_errors": len(errors),
            "n_scored": len(scored),
            # answered records whose question has no gold answer (an empty, blank or missing one): not in n_scored
            "n_no_answer": sum(1 for r in recs if not r.get("error") and r.get("answer") is None),
            **_concealed_counts(scored),
            "n_expected": len(expected[benchmark]) if benchmark in expected else None,
            "n_missing": len(missing), "missing_qids": missing[:MAX_LISTED_MISSING], "templates": templates,
            # records left out because their qid is not in the annotation given (expected_qids)
            "n_not_in_annotation": len(stale),
            "parsers": {},
        }
        cost = cost_means([r for r in recs if not r.get("error")])
        if cost:
            g["cost"] = cost
        own = recorded_rule(scored) or official_rule(benchmark)
        # an extra rule that is this benchmark's own is the official parser already: no second, identical row
        names = list(PARSERS) + [r for r in (rules or ()) if r not in PARSERS and r != own]
        for parser in names:
            rule = own if parser == "official" else parser
            preds, n_assumed = _predictions(scored, parser, rule, benchmark)
            if preds is None:
                continue
            rows = [(r, pr is not None and str(pr) == str(r["answer"])) for r, pr in zip(scored, preds)]
            correct = sum(ok for _, ok in rows)
            p: dict[str, Any] = {
                "rule": rule,
                "correct": correct,
                "unparseable": sum(pr is None for pr in preds),
                "accuracy": _acc(correct, len(scored)),
                "accuracy_all": _acc(correct, len(scored) + len(errors) + len(missing)),
                "n_options_assumed": n_assumed,
                "by": {f: cells(rows, f) for f in BREAKDOWNS.get(benchmark, ())},
            }
            oks = [int(ok) for _, ok in rows]
            p["accuracy_ci95"] = _interval(oks, n_resamples, seed)
            p["accuracy_all_ci95"] = _interval(oks + [0] * (len(errors) + len(missing)), n_resamples, seed)
            correct_by.setdefault(id(g), {})[parser] = {str(r["qid"]): int(ok) for r, ok in rows}
            if benchmark == "mlvu":
                tasks = [c["accuracy"] for c in p["by"]["task"].values() if c["accuracy"] is not None]
                p["m_avg"] = sum(tasks) / len(tasks) if tasks else None
                p["pooled"] = p["accuracy"]
            # the release's aggregation goes with the benchmark's own rule: on the official parser, or on the extra
            # parser of that rule when the job answered with another (the omni job's OmniZip rule)
            if (rule == official_rule(benchmark) and (parser == "official" or own != rule)
                    and benchmark in BENCHMARK_AGGREGATIONS):
                p["release"] = BENCHMARK_AGGREGATIONS[benchmark](scored, preds, p)
            g["parsers"][parser] = p
        correct_by.setdefault(id(g), {})
        out.append(g)
    out.sort(key=_sort_key)
    return {"groups": out, "differences": _pair_differences(out, correct_by, n_resamples, seed),
            "bootstrap": {"method": "percentile, paired for differences (algorithms.bootstrap)",
                          "n_resamples": n_resamples, "level": DEFAULT_LEVEL, "seed": seed}}

