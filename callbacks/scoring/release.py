"""Each benchmark's released aggregation (``release`` of the benchmark's own rule), the name its release gives the
headline figure, and the small helpers the scores share with it.

Every function follows the release code named in its docstring (read in full at that commit): the same questions
in each cell, the same denominator, every breakdown the release prints. Fractions in [0, 1] here where the
releases print percentages.
"""
from __future__ import annotations

import ast
import random
from collections import defaultdict
from typing import Any

# option count assumed for a record without ``options`` (records written before they carried them)
DEFAULT_NUM_OPTIONS = {"videomme": 4, "worldsense": 4, "lvb": 5, "mlvu": 6}
# the breakdowns of every parser (over scored questions); the release blocks add their own
BREAKDOWNS = {
    "videomme": ("duration", "domain", "task_type"),
    "mlvu": ("task",),
    "lvb": ("duration_group", "question_category"),
    "worldsense": ("domain", "task_type"),
}
# Video-MME eval_your_results prints, per duration and over the whole set: "Video Categories" (domain), "Video Sub
# Categories", "Task Categories", "Overall"
VIDEOMME_RELEASE_FIELDS = ("domain", "sub_category", "task_type")
# VLMEvalKit get_dimension_rating: per duration and 'overall': domain, sub_category, task_domain, task_type,
# audio_class (a question counts in each of its audio classes)
WORLDSENSE_RELEASE_FIELDS = ("domain", "sub_category", "task_domain", "task_type", "audio_class")

# the release's own name for its headline figure, the release block's key holding it, and the task breakdown
# (release key path) shown beside it
HEADLINES = {
    "videomme": ("Video-MME Overall (eval_your_results.py: correct / answered)", "accuracy_answered",
                 ("by", "task_type")),
    "mlvu": ("MLVU M-Avg (choice_bench.py: mean of task accuracies)", "m_avg", ("by_task",)),
    "lvb": ("LongVideoBench Overall (lmms-eval: random option when unparsed)", "accuracy_fallback",
            ("by", "question_category")),
    "worldsense": ("WorldSense overall (VLMEvalKit exact_matching: unparsed = 0)", "accuracy", ("by", "task_type")),
}


def acc(correct: int, n: int) -> float | None:
    """``correct / n``, ``None`` when ``n`` is 0."""
    return correct / n if n else None


def num_options(rec: dict, benchmark: str) -> tuple[list[str], bool]:
    """The record's option texts, or placeholders for the benchmark's usual count (second item: assumed)."""
    opts = rec.get("options")
    if isinstance(opts, list) and opts:
        return [str(o) for o in opts], False
    return [""] * DEFAULT_NUM_OPTIONS.get(benchmark, 4), True


def _values(rec: dict, field: str) -> list[str]:
    """The breakdown cells a record counts in for ``field``: one, except a list-valued field (WorldSense's
    ``audio_class``, released as the text of a Python list that VLMEvalKit ``eval``s), which gives one per item."""
    value = (rec.get("meta") or {}).get(field)
    if isinstance(value, str) and value.startswith("["):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return ["unknown" if value is None else str(value)]


def cells(rows: list[tuple[dict, Any]], field: str, n_key: str = "n") -> dict[str, dict]:
    """Per value of ``meta[field]``: ``{n_key: questions, correct, accuracy}`` over ``rows`` = ``(record, 0/1)``."""
    out: dict[str, list] = defaultdict(lambda: [0, 0])
    for rec, ok in rows:
        for v in _values(rec, field):
            cell = out[v]
            cell[0] += 1
            cell[1] += ok
    return {k: {n_key: n, "correct": c, "accuracy": acc(c, n)} for k, (n, c) in sorted(out.items())}


def _videomme_release(scored: list[dict], preds: list, p: dict) -> dict:
    """Video-MME's ``eval_your_results`` (thanku-all/parse_answer@afd52cfe3dde5b3685e0d4f760c10c756860c758:
    eval_your_results.py:eval_your_results): a question counts only when its extraction is not empty
    (``if extration != "": ... ["answered"] += 1``); accuracy = correct / answered, printed per duration ("Evaluation
    on video Type") for Video Categories (domain), Video Sub Categories and Task Categories, then over the entire
    dataset for the same three and "Overall".

    Returns:
        ``{answered, correct, accuracy_answered, by: {duration|domain|sub_category|task_type: {value: {answered,
        correct, accuracy}}}, by_duration: {duration: {answered, correct, accuracy_answered, by: {domain|
        sub_category|task_type: ...}}}}``.
    """
    rows = [(r, int(str(pr) == str(r["answer"]))) for r, pr in zip(scored, preds) if pr is not None]
    correct = sum(ok for _, ok in rows)
    by_duration = {}
    for dur in sorted({v for r, _ in rows for v in _values(r, "duration")}):
        sub = [(r, ok) for r, ok in rows if dur in _values(r, "duration")]
        c = sum(ok for _, ok in sub)
        by_duration[dur] = {"answered": len(sub), "correct": c, "accuracy_answered": acc(c, len(sub)),
                            "by": {f: cells(sub, f, "answered") for f in VIDEOMME_RELEASE_FIELDS}}
    return {"answered": len(rows), "correct": correct, "accuracy_answered": acc(correct, len(rows)),
            "by": {f: cells(rows, f, "answered") for f in ("duration", *VIDEOMME_RELEASE_FIELDS)},
            "by_duration": by_duration}


def lvb_fallback_choice(qid: str, num_options: int) -> str:
    """The letter LongVideoBench's release draws (``random.choice(all_choices)``) for an unparsed reply, from a
    generator seeded by the qid (``random.Random("lvb:<qid>")``: string seeds are hashed with SHA-512, so the
    draw is the same in every process and on every re-score)."""
    return random.Random(f"lvb:{qid}").choice([chr(ord("A") + i) for i in range(num_options)])


def _lvb_release(scored: list[dict], preds: list, p: dict) -> dict:
    """lmms-eval's LongVideoBench (lmms-eval@75571cfe:lmms_eval/tasks/longvideobench/utils.py:
    longvideobench_aggregate_results): an unparsed reply gets a random option (seeded per qid here); "Overall" is
    the instance-weighted mean over duration groups and question categories, i.e. the pooled accuracy. Also the
    expected accuracy over that draw (each unparsed reply counts 1 / number of options)."""
    rows, expected = [], 0.0
    for r, pr in zip(scored, preds):
        n = len(num_options(r, "lvb")[0])
        if pr is None:
            expected += 1.0 / n
            pr = lvb_fallback_choice(str(r["qid"]), n)
        else:
            expected += float(str(pr) == str(r["answer"]))
        rows.append((r, int(str(pr) == str(r["answer"]))))
    correct = sum(ok for _, ok in rows)
    return {"correct_fallback": correct, "accuracy_fallback": acc(correct, len(rows)),
            "expected_accuracy": expected / len(rows) if rows else None,
            "by": {f: cells(rows, f) for f in BREAKDOWNS["lvb"]}}


def _mlvu_release(scored: list[dict], preds: list, p: dict) -> dict:
    """MLVU's ``choice_bench.main`` (JUNJIE99/MLVU@fd060c10:evaluation/multiple_choice_evaluation/choice_bench.py:
    main): per task ``correct / total * 100``, ``Avg`` their mean over the tasks present (fractions here)."""
    return {"m_avg": p.get("m_avg"), "by_task": {k: c["accuracy"] for k, c in p["by"]["task"].items()}}


def _worldsense_release(scored: list[dict], preds: list, p: dict) -> dict:
    """VLMEvalKit's WorldSense with ``exact_matching``: score 1 when the regex letter equals the answer, else 0 (an
    empty extraction scores 0); ratings as ``get_dimension_rating`` (open-compass/VLMEvalKit@23757c4385ec3433b83
    54e6c75b7717e612b8f52:vlmeval/dataset/utils/worldsense.py:get_dimension_rating): for ``'overall'`` and each
    ``duration``, the mean score per ``domain``, ``sub_category``, ``task_domain``, ``task_type`` and
    ``audio_class`` (``for _audio_ctg in audio_ctg: ...append(score)``: a question counts once in each of its audio
    classes), and ``overall`` the mean over all questions (the union of the domain lists).

    Returns:
        ``{accuracy, by: {field: {value: mean}}, by_duration: {duration: {accuracy, n, by: {field: {value:
        mean}}}}}`` with ``field`` in domain, sub_category, task_domain, task_type, audio_class (``by`` also has
        ``duration``).
    """
    rows = [(r, int(pr is not None and str(pr) == str(r["answer"]))) for r, pr in zip(scored, preds)]

    def means(sub: list) -> dict:
        return {f: {k: c["accuracy"] for k, c in cells(sub, f).items()} for f in WORLDSENSE_RELEASE_FIELDS}

    by_duration = {}
    for dur in sorted({v for r, _ in rows for v in _values(r, "duration")}):
        sub = [(r, ok) for r, ok in rows if dur in _values(r, "duration")]
        by_duration[dur] = {"accuracy": acc(sum(ok for _, ok in sub), len(sub)), "n": len(sub), "by": means(sub)}
    return {"accuracy": acc(sum(ok for _, ok in rows), len(rows)),
            "by": {**means(rows), "duration": {k: c["accuracy"] for k, c in cells(rows, "duration").items()}},
            "by_duration": by_duration}


BENCHMARK_AGGREGATIONS = {"videomme": _videomme_release, "lvb": _lvb_release, "mlvu": _mlvu_release,
                          "worldsense": _worldsense_release}


def headline(benchmark: str, parser_scores: dict) -> tuple[str, float | None, dict[str, float | None]] | None:
    """The release's headline of one group's ``official`` parser: ``(name, value, task breakdown {task: value})``,
    or ``None`` for a benchmark without a release block."""
    if benchmark not in HEADLINES or not parser_scores.get("release"):
        return None
    name, key, path = HEADLINES[benchmark]
    rel = parser_scores["release"]
    node: Any = rel
    for k in path:
        node = (node or {}).get(k) or {}
    tasks = {k: (v.get("accuracy") if isinstance(v, dict) else v) for k, v in node.items()}
    return name, rel.get(key), tasks
