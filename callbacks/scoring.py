"""Scoring of prediction records: accuracies per job and parser, benchmark breakdowns, ``scores.json`` and plots.

Records are the jsonl lines written by the prediction writer under ``<out_root>/<job>/<benchmark>/*.jsonl``
(``job`` e.g. ``b1024`` or ``<variant>_b<B>``), one per (question, budget[, variant]) with ``qid, video, budget,
variant, answer, pred, pred_robust, response, meta{benchmark, template, ...}``, or ``error`` instead of the answer
fields when the question failed.

Protocol (every choice is visible in ``scores.json``):

* **Groups**: one per ``(benchmark, job, variant, budget)``; ``benchmark`` is ``meta["benchmark"]`` (else the
  folder name), ``job`` is the record's ``job`` key (else the first folder under ``out_root``).
* **De-duplication**: a qid seen twice in a group (restarts, overlapping shards) counts once; the *first* record
  wins, in sorted-path then line order, except that an answered record replaces an earlier error record (the
  writer retries failed questions on restart and appends the new record after the error, which stays as the
  audit trail). ``n_duplicates`` reports how many were dropped, ``n_retried`` how many errors were replaced.
* **Rules** (:mod:`algorithms.choice`): ``official`` is the benchmark's own released rule
  (:func:`algorithms.choice.official_rule`: ``videomme``, ``mlvu``, ``lvb``, ``worldsense``; its name is the
  parser's ``rule``), ``robust`` the robust parser; ``rules=[...]`` (CLI ``--rules``) adds any rule of
  :data:`algorithms.choice.RULES` under its own name. A record with a ``response`` key is re-parsed from it (so old
  folders re-score with today's rules); ``robust`` needs the record's ``options`` (else the stored
  ``pred_robust``); a record without ``options`` is parsed with the benchmark's usual option count
  (:data:`DEFAULT_NUM_OPTIONS`, counted in ``n_options_assumed``); a record without ``response`` keeps its stored
  ``pred`` / ``pred_robust``.
* **Release aggregations** (``release`` of the benchmark's own rule): Video-MME: ``accuracy_answered`` = correct /
  questions whose extraction is not empty, overall and per duration / domain / task_type, as
  ``eval_your_results.py`` divides (thanku-all/parse_answer@afd52cfe:eval_your_results.py:eval_your_results);
  MLVU: ``m_avg``, the mean of the per-task accuracies (JUNJIE99/MLVU@fd060c10:
  evaluation/multiple_choice_evaluation/choice_bench.py:main, ``final_res['Avg']``); LongVideoBench:
  ``accuracy_fallback`` with the release's ``random.choice`` for an unparsed reply drawn from
  ``random.Random("lvb:<qid>")`` (the same number on every re-score) and ``expected_accuracy`` counting each
  unparsed reply as 1 / number of options (lmms-eval@75571cfe:lmms_eval/tasks/longvideobench/utils.py:
  longvideobench_aggregate_results, whose "Overall" is the pooled accuracy); WorldSense: the mean score over all
  questions, an empty extraction scoring 0 (VLMEvalKit@e8e78f05:vlmeval/dataset/worldsense.py:WorldSense.evaluate
  with ``exact_matching``, vlmeval/dataset/utils/worldsense.py:get_dimension_rating).
* **Accuracy** (fractions in [0, 1]): ``accuracy = correct / n_scored`` with ``n_scored`` the records with an
  answer and no error (an unparseable answer, ``pred`` null, counts as wrong); ``accuracy_all = correct /
  (n_scored + n_errors + n_missing)`` also counts failed and missing questions as wrong.
* **Breakdowns** (over scored records): Video-MME by ``duration`` / ``domain`` / ``task_type``; MLVU by ``task``
  with ``m_avg`` = the mean of the per-task accuracies (MLVU's "M-Avg") and ``pooled`` = accuracy over
  all questions; LongVideoBench by ``duration_group`` / ``question_category``; WorldSense by ``domain`` /
  ``task_type``.
* **Uncertainty** (:mod:`algorithms.bootstrap`, percentile bootstrap, ``n_resamples`` 1000, seed 0, so every
  re-score gives the same numbers): each parser's ``accuracy_ci95`` / ``accuracy_all_ci95`` (``[low, high]``,
  fractions; ``accuracy_all``'s resample counts errors and missing questions as wrong), and ``differences``: for
  every pair of groups of one benchmark that differ only in budget (same variant) or only in variant (same
  budget), the paired difference of accuracy (``a`` minus ``b``, ``a`` the later group in table order) over the
  questions scored in both, with ``ci95`` and ``p_two_sided``. ``bootstrap`` records the settings. The table shows
  the interval's half-width (``±95``) and the official parser's differences below it.
* **Missing**: when the expected qids of a benchmark are known (from the annotation), ``n_missing`` counts those
  with no record (error records are not missing) and ``missing_qids`` lists the first 50.

Command: ``python -m callbacks.scoring <out_root> [--expected videomme=/data/videomme ...] [--rules lvb robust ...]
[--no-plots]`` prints
the table and writes ``<out_root>/scores.json`` and the PNG plots; :class:`ScoreOnPredictEnd` does the same at
the end of ``trainer.predict``.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from lightning.pytorch import Callback

from algorithms.bootstrap import (DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED, bootstrap_interval,
                                  paired_bootstrap_difference)
from algorithms.choice import RULES, official_rule, parse
from datamodules.features import atomic_write_bytes

log = logging.getLogger(__name__)

PARSERS = {"official": "pred", "robust": "pred_robust"}   # parser -> the stored field used without a response
# option count assumed for a record without ``options`` (records written before they carried them)
DEFAULT_NUM_OPTIONS = {"videomme": 4, "worldsense": 4, "lvb": 5, "mlvu": 6}
BREAKDOWNS = {
    "videomme": ("duration", "domain", "task_type"),
    "mlvu": ("task",),
    "lvb": ("duration_group", "question_category"),
    "worldsense": ("domain", "task_type"),
}
DURATION_KEY = {"videomme": "duration", "lvb": "duration_group"}
_DURATION_ORDER = {"short": 0, "medium": 1, "long": 2}
MAX_LISTED_MISSING = 50
SCORES_FILE = "scores.json"
_JOB = re.compile(r"^(?:(.+)_)?b(\d+)$")


# ----------------------------------------------------------------------------------------------------- reading
def read_records(out_root: str | Path) -> tuple[list[dict], dict[str, int]]:
    """All records under ``out_root`` (every ``*.jsonl``, sorted by path, lines in order).

    Each record gets ``job`` (first folder under ``out_root`` unless the record has one) and ``benchmark``
    (``meta["benchmark"]``, else the second folder) keys if missing; a record without a budget takes it (and, if
    it has no ``variant`` key, the variant) from a job name ``b<B>`` / ``<variant>_b<B>``. Unreadable lines (e.g. a line cut by a crash)
    are skipped and counted.

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
        with open(path, encoding="utf-8") as fh:
            for k, line in enumerate(fh):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    n_bad += 1
                    log.warning("scoring: skipping unreadable line %d of %s", k + 1, path)
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
def _acc(correct: int, n: int) -> float | None:
    return correct / n if n else None


def _breakdown(rows: list[tuple[dict, bool]], field: str) -> dict[str, dict]:
    cells: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for rec, ok in rows:
        value = (rec.get("meta") or {}).get(field)
        cell = cells["unknown" if value is None else str(value)]
        cell[0] += 1
        cell[1] += int(ok)
    return {k: {"n": n, "correct": c, "accuracy": _acc(c, n)} for k, (n, c) in sorted(cells.items())}


def _group_key(rec: dict) -> tuple:
    meta = rec.get("meta") or {}
    return (rec.get("benchmark") or meta.get("benchmark") or "unknown", str(rec.get("job") or "default"),
            rec.get("variant"), rec.get("budget"))


def _sort_key(g: dict) -> tuple:
    b = g["budget"]
    return (g["benchmark"], g["variant"] or "", b if isinstance(b, (int, float)) else math.inf, g["job"])


def _num_options(rec: dict, benchmark: str) -> tuple[list[str], bool]:
    """The record's option texts, or placeholders for the benchmark's usual count (second item: assumed)."""
    opts = rec.get("options")
    if isinstance(opts, list) and opts:
        return [str(o) for o in opts], False
    return [""] * DEFAULT_NUM_OPTIONS.get(benchmark, 4), True


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


def _cells(rows: list[tuple[dict, Any]], field: str, n_key: str = "n") -> dict[str, dict]:
    cells: dict[str, list] = defaultdict(lambda: [0, 0])
    for rec, ok in rows:
        value = (rec.get("meta") or {}).get(field)
        cell = cells["unknown" if value is None else str(value)]
        cell[0] += 1
        cell[1] += ok
    return {k: {n_key: n, "correct": c, "accuracy": _acc(c, n)} for k, (n, c) in sorted(cells.items())}


def _videomme_release(scored: list[dict], preds: list, p: dict) -> dict:
    """Video-MME's ``eval_your_results``: a question counts in "answered" only when its extraction is not empty;
    accuracy = correct / answered, overall and per duration, domain and task type."""
    rows = [(r, int(str(pr) == str(r["answer"]))) for r, pr in zip(scored, preds) if pr is not None]
    correct = sum(ok for _, ok in rows)
    return {"answered": len(rows), "correct": correct, "accuracy_answered": _acc(correct, len(rows)),
            "by": {f: _cells(rows, f, "answered") for f in BREAKDOWNS["videomme"]}}


def lvb_fallback_choice(qid: str, num_options: int) -> str:
    """The letter LongVideoBench's release draws (``random.choice(all_choices)``) for an unparsed reply, from a
    generator seeded by the qid (``random.Random("lvb:<qid>")``: string seeds are hashed with SHA-512, so the
    draw is the same in every process and on every re-score)."""
    return random.Random(f"lvb:{qid}").choice([chr(ord("A") + i) for i in range(num_options)])


def _lvb_release(scored: list[dict], preds: list, p: dict) -> dict:
    """lmms-eval's LongVideoBench: an unparsed reply gets a random option (seeded per qid here); "Overall" is the
    instance-weighted mean over duration groups and question categories, i.e. the pooled accuracy. Also the
    expected accuracy over that draw (each unparsed reply counts 1 / number of options)."""
    rows, expected = [], 0.0
    for r, pr in zip(scored, preds):
        n = len(_num_options(r, "lvb")[0])
        if pr is None:
            expected += 1.0 / n
            pr = lvb_fallback_choice(str(r["qid"]), n)
        else:
            expected += float(str(pr) == str(r["answer"]))
        rows.append((r, int(str(pr) == str(r["answer"]))))
    correct = sum(ok for _, ok in rows)
    return {"correct_fallback": correct, "accuracy_fallback": _acc(correct, len(rows)),
            "expected_accuracy": expected / len(rows) if rows else None,
            "by": {f: _cells(rows, f) for f in BREAKDOWNS["lvb"]}}


def _mlvu_release(scored: list[dict], preds: list, p: dict) -> dict:
    """MLVU's ``choice_bench.main``: per task ``correct / total * 100``, ``Avg`` their mean over the tasks present
    (fractions here)."""
    return {"m_avg": p.get("m_avg"), "by_task": {k: c["accuracy"] for k, c in p["by"]["task"].items()}}


def _worldsense_release(scored: list[dict], preds: list, p: dict) -> dict:
    """VLMEvalKit's WorldSense with ``exact_matching``: score 1 when the regex letter equals the answer, else 0
    (an empty extraction scores 0); each rating is the mean score of its questions."""
    return {"accuracy": p["accuracy"], "by": {f: {k: c["accuracy"] for k, c in cells.items()}
                                               for f, cells in p["by"].items()}}


BENCHMARK_AGGREGATIONS = {"videomme": _videomme_release, "lvb": _lvb_release, "mlvu": _mlvu_release,
                          "worldsense": _worldsense_release}


def _interval(scores: list[float], n_resamples: int, seed: int) -> list[float] | None:
    ci = bootstrap_interval(scores, n_resamples, DEFAULT_LEVEL, seed) if n_resamples else None
    return list(ci) if ci else None


def _pair_differences(out: list[dict], correct_by: dict[int, dict[str, dict[str, int]]], n_resamples: int,
                      seed: int) -> list[dict]:
    """Paired bootstrap differences between groups of one benchmark differing only in budget or only in variant
    (module docstring), per parser present in both, over the qids scored in both."""
    diffs = []
    if not n_resamples:
        return diffs
    for i, gb in enumerate(out):
        for j in range(i + 1, len(out)):
            ga = out[j]
            if ga["benchmark"] != gb["benchmark"]:
                continue
            same_variant, same_budget = ga["variant"] == gb["variant"], ga["budget"] == gb["budget"]
            if same_variant == same_budget:      # identical settings (other jobs) or both differ: not a pair
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


def score_records(records: list[dict], expected_qids: dict[str, Iterable[str]] | None = None,
                  rules: Iterable[str] | None = None, n_resamples: int = DEFAULT_RESAMPLES,
                  seed: int = DEFAULT_SEED) -> dict:
    """Score records (see the module docstring for the protocol).

    Args:
        records: record dicts; each needs ``qid`` and ``benchmark`` (or ``meta["benchmark"]``) and ``job``
            (default ``"default"``); ``answer``, ``pred``, ``pred_robust``, ``error``, ``variant``, ``budget``,
            ``meta`` are read when present.
        expected_qids: per benchmark name, the qids of the annotation (for ``n_missing``); optional.
        rules: extra rules of :data:`algorithms.choice.RULES` scored under their own names.
        n_resamples / seed: bootstrap resamples (0: no intervals, no differences) and seed.

    Raises:
        ValueError: an unknown rule.

    Returns:
        ``{"groups": [group, ...]}`` sorted by (benchmark, variant, budget, job), each group
        ``{benchmark, job, variant, budget, n_records, n_duplicates, n_errors, n_scored, n_expected, n_missing,
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
            else:
                dups[key] += 1
            continue
        groups[key][qid] = rec
    expected = {b: {str(q) for q in qs} for b, qs in (expected_qids or {}).items()}

    out = []
    correct_by: dict[int, dict[str, dict[str, int]]] = {}
    for key, by_qid in groups.items():
        benchmark, job, variant, budget = key
        recs = list(by_qid.values())
        errors = [r for r in recs if r.get("error")]
        scored = [r for r in recs if not r.get("error") and r.get("answer") is not None]
        missing = sorted(expected[benchmark] - set(by_qid)) if benchmark in expected else []
        templates = sorted({str((r.get("meta") or {}).get("template")) for r in recs
                            if (r.get("meta") or {}).get("template") is not None})
        g: dict[str, Any] = {
            "benchmark": benchmark, "job": job, "variant": variant, "budget": budget,
            "n_records": len(recs), "n_duplicates": dups[key], "n_retried": retried[key], "n_errors": len(errors),
            "n_scored": len(scored),
            "n_expected": len(expected[benchmark]) if benchmark in expected else None,
            "n_missing": len(missing), "missing_qids": missing[:MAX_LISTED_MISSING], "templates": templates,
            "parsers": {},
        }
        cost = cost_means([r for r in recs if not r.get("error")])
        if cost:
            g["cost"] = cost
        names = list(PARSERS) + [r for r in (rules or ()) if r not in PARSERS]
        own = official_rule(benchmark)
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
                "by": {f: _breakdown(rows, f) for f in BREAKDOWNS.get(benchmark, ())},
            }
            oks = [int(ok) for _, ok in rows]
            p["accuracy_ci95"] = _interval(oks, n_resamples, seed)
            p["accuracy_all_ci95"] = _interval(oks + [0] * (len(errors) + len(missing)), n_resamples, seed)
            correct_by.setdefault(id(g), {})[parser] = {str(r["qid"]): int(ok) for r, ok in rows}
            if benchmark == "mlvu":
                tasks = [c["accuracy"] for c in p["by"]["task"].values() if c["accuracy"] is not None]
                p["m_avg"] = sum(tasks) / len(tasks) if tasks else None
                p["pooled"] = p["accuracy"]
            if rule == own and benchmark in BENCHMARK_AGGREGATIONS:
                p["release"] = BENCHMARK_AGGREGATIONS[benchmark](scored, preds, p)
            g["parsers"][parser] = p
        correct_by.setdefault(id(g), {})
        out.append(g)
    out.sort(key=_sort_key)
    return {"groups": out, "differences": _pair_differences(out, correct_by, n_resamples, seed),
            "bootstrap": {"method": "percentile, paired for differences (algorithms.bootstrap)",
                          "n_resamples": n_resamples, "level": DEFAULT_LEVEL, "seed": seed}}


# ----------------------------------------------------------------------------------------------------- table
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _duration_sort(v: str) -> tuple:
    try:
        return (1, float(v), v)
    except ValueError:
        return (0, _DURATION_ORDER.get(v, 99), v)


def _extra(benchmark: str, p: dict) -> str:
    rel = p.get("release") or {}
    if benchmark == "mlvu":
        return f"M-Avg {_pct(p.get('m_avg'))}  pooled {_pct(p.get('pooled'))}"
    parts = []
    if benchmark == "videomme" and rel:
        parts.append(f"answered-only {_pct(rel.get('accuracy_answered'))} (n {rel.get('answered')})")
    if benchmark == "lvb" and rel:
        parts.append(f"random-fallback {_pct(rel.get('accuracy_fallback'))}  expected {_pct(rel.get('expected_accuracy'))}")
    dk = DURATION_KEY.get(benchmark)
    if dk and dk in p["by"]:
        cells = p["by"][dk]
        parts.append("  ".join(f"{k} {_pct(cells[k]['accuracy'])}" for k in sorted(cells, key=_duration_sort)))
    return "  ".join(parts)


RULE_DESCRIPTIONS = {
    "videomme": "Video-MME eval_your_results.py: prefixes removed, first capital of [ABCD] anywhere (even in a word)",
    "lvb": "lmms-eval LongVideoBench: prefixes removed, first capital of [ABCDE] anywhere, random option if none",
    "worldsense": "VLMEvalKit WorldSense: prefixes removed, first capital of [ABCD] anywhere, else 0",
    "mlvu": "MLVU check_ans: the character before the first ')' (else the whole reply) equals the letter",
    "robust": "a standalone option letter ('B', '(B)', 'Answer: c') or one option's text",
}


def _budget(budget) -> str:
    return "-" if budget is None else str(budget)   # pruning jobs have a retention, no vision-token budget


def format_table(scores: dict) -> str:
    """A readable fixed-width table of ``scores`` (from :func:`score_records`): one row per group and parser with
    n, accuracy (%), errors, unparseable, missing, duplicates and the benchmark's headline numbers (Video-MME
    answered-only accuracy, LongVideoBench random-fallback and expected accuracy, per duration; MLVU M-Avg and
    pooled). The footer describes each rule that appears."""
    header = ("benchmark", "job", "variant", "budget", "parser", "rule", "n", "acc%", "acc_all%", "err", "unparse",
              "miss", "dup", "±95", "breakdown")
    rows = [header]
    used: list[str] = []
    for g in scores.get("groups", []):
        for parser, p in g["parsers"].items():
            rule = p.get("rule", parser)
            if rule not in used:
                used.append(rule)
            rows.append((g["benchmark"], g["job"], g["variant"] or "-", _budget(g["budget"]), parser, rule,
                         str(g["n_scored"]), _pct(p["accuracy"]), _pct(p["accuracy_all"]), str(g["n_errors"]),
                         str(p["unparseable"]), str(g["n_missing"]), str(g["n_duplicates"]),
                         _half_width(p.get("accuracy_ci95")), _extra(g["benchmark"], p)))
        if not g["parsers"]:
            rows.append((g["benchmark"], g["job"], g["variant"] or "-", _budget(g["budget"]), "-", "-", str(g["n_scored"]),
                         "-", "-", str(g["n_errors"]), "-", str(g["n_missing"]), str(g["n_duplicates"]), "-", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("acc% = correct / scored (unparsed = wrong); acc_all% also counts errors and missing questions as "
                 "wrong; official = the benchmark's own released rule; unparse = no letter under the rule")
    lines.append("±95 = half-width of the 95 % bootstrap interval of acc% (scores.json: accuracy_ci95)")
    for rule in used:
        lines.append(f"  {rule}: {RULE_DESCRIPTIONS.get(rule, rule)}")
    diffs = [d for d in scores.get("differences", []) if d["parser"] == "official"]
    if diffs:
        lines.append("differences (official parser, a - b over the questions scored in both, 95 % paired bootstrap):")
        for d in diffs:
            lo, hi = d["ci95"]
            lines.append(f"  {d['benchmark']} {_group_name(d['a'])} - {_group_name(d['b'])}: "
                         f"{100 * d['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]  n {d['n_common']}  "
                         f"p {d['p_two_sided']:.3f}")
    return "\n".join(lines)


def _half_width(ci: list[float] | None) -> str:
    return "-" if not ci else f"±{100 * (ci[1] - ci[0]) / 2:.1f}"


def _group_name(g: dict) -> str:
    return f"{g['variant'] + ' ' if g.get('variant') else ''}b{g['budget']}" if g.get("budget") is not None \
        else str(g.get("job"))


# ----------------------------------------------------------------------------------------------------- writing
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


def write_scores(out_dir: str | Path, expected_qids: dict[str, Iterable[str]] | None = None,
                 plots: bool = True, rules: Iterable[str] | None = None) -> dict:
    """Read every record under ``out_dir``, score it and write ``<out_dir>/scores.json`` (+ PNG plots beside it).

    ``scores.json`` is written atomically (temp file in the same folder + ``os.replace``), so a reader never sees a
    partial file. It holds :func:`score_records`'s result plus ``n_files``, ``n_bad_lines`` and ``plots`` (file
    names).

    Args:
        out_dir: the prediction output root (``<out_dir>/<job>/<benchmark>/*.jsonl``).
        expected_qids: per benchmark, the annotation's qids (for missing counts); optional.
        plots: also render :func:`plot_scores`.
        rules: extra rules (:func:`score_records`).

    Returns:
        The scores dict that was written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records, stats = read_records(out_dir)
    scores = {**score_records(records, expected_qids, rules), **stats, "plots": []}
    return save_scores(scores, out_dir, plots, records)


def compute_scores(out_dir: str | Path, expected_qids: dict[str, Iterable[str]] | None = None,
                   rules: Iterable[str] | None = None) -> dict:
    """:func:`score_records` of every record under ``out_dir`` plus the reading stats (``n_files``,
    ``n_bad_lines``); ``plots`` empty until :func:`save_scores`. Reads only."""
    records, stats = read_records(out_dir)
    return {**score_records(records, expected_qids, rules), **stats, "plots": []}


def save_scores(scores: dict, out_dir: Path, plots: bool = True, records: list[dict] | None = None) -> dict:
    """Render the plots (when ``plots``), write ``scores.json`` atomically into ``out_dir`` and the folder's
    ``report.html`` (:mod:`callbacks.report`; its error and unparsed lists come from ``records``, read from
    ``out_dir`` when not given); ``scores`` with ``plots`` filled in. Raises ``OSError`` when the folder cannot take
    the files."""
    from .report import write_report

    out_dir = Path(out_dir)
    scores["plots"] = [p.name for p in plot_scores(scores, out_dir)] if plots else []
    data = json.dumps(scores, indent=1, sort_keys=False, default=str).encode("utf-8")
    atomic_write_bytes(out_dir / SCORES_FILE, data)
    write_report(scores, out_dir, records if records is not None else read_records(out_dir)[0])
    return scores


# ----------------------------------------------------------------------------------------------------- lightning
def _expected_from_datamodule(dm) -> dict[str, list[str]] | None:
    """Duck-typed: ``dm.expected_qids()`` -> {benchmark: qids}, or ``dm.questions`` (Question objects)."""
    if dm is None:
        return None
    fn = getattr(dm, "expected_qids", None)
    if callable(fn):
        return fn()
    questions = getattr(dm, "questions", None)
    if isinstance(questions, (list, tuple)) and questions and hasattr(questions[0], "qid"):
        out: dict[str, list[str]] = defaultdict(list)
        for q in questions:
            out[(getattr(q, "meta", None) or {}).get("benchmark", "unknown")].append(q.qid)
        return dict(out)
    return None


class ScoreOnPredictEnd(Callback):
    """Score the whole output root at the end of ``trainer.predict`` and print the table (global rank 0 only).

    All ranks wait at a barrier first, so every shard's records are on disk. List this callback after the
    prediction writer. Expected qids (for missing counts) come from ``expected_qids`` or, duck-typed, from the
    datamodule's ``expected_qids()`` or ``questions``. When a ``WandbLogger`` is attached, the per-group table is
    also logged to it (offline unless a key is configured).

    Args:
        out_root: the writer's output root; ``None``: taken from the first callback with an ``out_root`` or
            ``output_dir`` attribute.
        plots: render the PNG plots.
        expected_qids: per benchmark, the annotation's qids.
    """

    def __init__(self, out_root: str | None = None, plots: bool = True,
                 expected_qids: dict[str, list[str]] | None = None):
        super().__init__()
        self.out_root = out_root
        self.plots = plots
        self.expected_qids = expected_qids
        self.last_scores: dict | None = None

    def _root(self, trainer) -> Path | None:
        if self.out_root:
            return Path(self.out_root)
        for cb in trainer.callbacks:
            for attr in ("out_root", "output_dir"):
                value = getattr(cb, attr, None)
                if cb is not self and value:
                    return Path(value)
        return None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._scored = False

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # a resumed run with nothing left to do skips the predict loop (and on_predict_end): still print the table
        if stage == "predict" and not getattr(self, "_scored", True):
            self.on_predict_end(trainer, pl_module)

    def on_predict_end(self, trainer, pl_module) -> None:
        self._scored = True
        trainer.strategy.barrier("score_on_predict_end")
        if not trainer.is_global_zero:
            return
        root = self._root(trainer)
        if root is None:
            log.warning("ScoreOnPredictEnd: no out_root given and no writer callback exposes one; not scoring")
            return
        expected = self.expected_qids or _expected_from_datamodule(getattr(trainer, "datamodule", None))
        scores = write_scores(root, expected, plots=self.plots)
        self.last_scores = scores
        print(format_table(scores))
        print(f"scores: {root / SCORES_FILE}")
        log_to_wandb(trainer, scores, root)


def log_to_wandb(trainer, scores: dict, root: Path) -> bool:
    """Log the per-group accuracies as a W&B table (key ``scores``) and each PNG plot as an image (key
    ``scores/<plot name>``), when a ``WandbLogger`` is attached to ``trainer`` (offline unless a key is set).
    Returns whether anything was logged."""
    try:
        from lightning.pytorch.loggers import WandbLogger
    except ImportError:  # pragma: no cover
        return False
    loggers = [lg for lg in getattr(trainer, "loggers", []) if isinstance(lg, WandbLogger)]
    if not loggers:
        return False
    columns = ["benchmark", "job", "variant", "budget", "parser", "n_scored", "accuracy", "n_errors",
               "unparseable", "n_missing"]
    data = [[g["benchmark"], g["job"], g["variant"] or "base", g["budget"], parser, g["n_scored"], p["accuracy"],
             g["n_errors"], p["unparseable"], g["n_missing"]]
            for g in scores.get("groups", []) for parser, p in g["parsers"].items()]
    for lg in loggers:
        lg.log_table(key="scores", columns=columns, data=data)
        for name in scores.get("plots", []):
            lg.log_image(key=f"scores/{Path(name).stem}", images=[str(root / name)])
    return True


# ----------------------------------------------------------------------------------------------------- CLI
def _parse_expected(items: list[str]) -> dict[str, list[str]]:
    from datamodules.benchmarks import load_benchmark  # lazy: only the CLI reads annotations

    out = {}
    for item in items:
        name, _, root = item.partition("=")
        if not root:
            raise SystemExit(f"--expected wants NAME=ROOT, got {item!r}")
        out[name] = [q.qid for q in load_benchmark(name, root)]
    return out


def _expected_from_run_file(out_root: Path) -> dict[str, list[str]] | None:
    """The qids of the benchmark named in ``<out_root>/run.json`` (its ``benchmark``, ``root`` and
    ``loader_kwargs``), so a re-score counts missing questions as the run's own scoring did; ``None`` (with a
    message) when the file or the annotation is not there."""
    from datamodules.benchmarks import load_benchmark

    from callbacks.jsonl_writer import RUN_FILE

    path = out_root / RUN_FILE
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
        name, bench_root = run["benchmark"], run["root"]
    except (OSError, ValueError, KeyError, TypeError):
        print(f"{path}: no benchmark and root recorded: missing questions are not counted (use --expected)",
              file=sys.stderr)
        return None
    try:
        qids = [q.qid for q in load_benchmark(name, bench_root, **(run.get("loader_kwargs") or {}))]
    except Exception as e:  # noqa: BLE001 - the annotation may have moved; scoring still works without it
        print(f"{name} at {bench_root} (from {path}) cannot be read ({type(e).__name__}: {e}): missing questions "
              "are not counted (use --expected)", file=sys.stderr)
        return None
    print(f"missing questions counted against {name} at {bench_root} ({len(qids)} qids, from {path})",
          file=sys.stderr)
    return {name: qids}


def main(argv: list[str] | None = None) -> dict:
    """``python -m callbacks.scoring <out_root> [--expected NAME=ROOT ...] [--rules RULE ...] [--no-plots]``: score, write
    ``scores.json`` and plots, print the table."""
    ap = argparse.ArgumentParser(prog="python -m callbacks.scoring", description=main.__doc__)
    ap.add_argument("out_root")
    ap.add_argument("--expected", action="append", default=[], metavar="NAME=ROOT",
                    help="benchmark annotation to count missing qids against (repeatable)")
    ap.add_argument("--rules", nargs="+", default=[], choices=RULES, metavar="RULE",
                    help=f"also score these rules of algorithms.choice ({', '.join(RULES)}), re-parsed from each "
                         "record's response")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    root = Path(args.out_root)
    if not root.is_dir():
        ap.error(f"{root}: no such output folder")
    if not any(root.glob("*/*/*.jsonl")):
        ap.error(f"{root}: no records (expected <job>/<benchmark>/rank<r>.jsonl files)")
    expected = _parse_expected(args.expected) or _expected_from_run_file(root)
    scores = compute_scores(root, expected, args.rules)
    try:
        save_scores(scores, root, plots=not args.no_plots)
    except OSError as e:   # a read-only (archived, shared) folder can still be scored: table only
        scores["plots"] = []
        print(format_table(scores))
        print(f"warning: {root}: scores.json and plots not written ({type(e).__name__}: {e})", file=sys.stderr)
        return scores
    print(format_table(scores))
    print(f"scores: {Path(args.out_root) / SCORES_FILE}", file=sys.stderr)
    return scores


if __name__ == "__main__":
    main()
