"""The console summary of a scores dict (:func:`format_table`): the released figures, the ablation matrix or the
pruning table first, then the per-group table, the rules and the differences."""
from __future__ import annotations

from algorithms.choice import official_rule

from .release import HEADLINES
from .scores import DURATION_KEY
from .summary import (by_benchmark, duration_sort, flops_label, format_p, headline_rows, is_matrix, is_pruning,
                      matrix, pruning_rows, variant_name)

MAX_DETAIL_GROUPS = 12      # more groups than this: the per-group table is left to report.html / scores.json
MAX_TASKS_SHOWN = 14


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _pts(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}"


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
        parts.append("  ".join(f"{k} {_pct(cells[k]['accuracy'])}" for k in sorted(cells, key=duration_sort)))
    return "  ".join(parts)


def _grid(rows: list[tuple], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, indent + "  ".join("-" * w for w in widths))
    return lines


def _name(v) -> str:
    return variant_name(v)


def _summary(scores: dict) -> list[str]:
    """The sections above the per-group table, per benchmark."""
    n_res = (scores.get("bootstrap") or {}).get("n_resamples")
    out: list[str] = []
    for bench, groups in by_benchmark(scores).items():
        name = HEADLINES.get(bench, ("accuracy",))[0]
        rules = {((g.get("parsers") or {}).get("official") or {}).get("rule") for g in groups}
        if len(rules) == 1 and None not in rules and rules != {official_rule(bench)}:
            # the job answered with its own rule (the omni job's OmniZip rule), not the release's: say which
            (rule,) = rules
            name = f"correct / scored under the job's {rule} rule ({RULE_DESCRIPTIONS.get(rule, rule)})"
        if is_matrix(groups):
            m = matrix(scores, groups)
            ref = _name(m["reference"])
            out.append(f"{bench}: accuracy % (official rule, unparsed = wrong) ±95 % CI half-width, and the paired "
                       f"difference from {ref} at the same budget (pts; * = its 95 % CI excludes 0); "
                       f"rows by mean difference")
            rows = [("variant", *[f"b{b}" for b in m["budgets"]], "mean Δ")]
            for r in m["rows"]:
                cells = []
                for b in m["budgets"]:
                    c = r["cells"].get(b)
                    if c is None:
                        cells.append("")
                        continue
                    txt = f"{_pct(c['accuracy'])} {_half(c['ci'])}"
                    if c["difference"] is not None:
                        lo, hi = c["diff_ci"]
                        txt += f" ({_pts(c['difference'])}{'*' if lo > 0 or hi < 0 else ''})"
                    cells.append(txt)
                rows.append((_name(r["variant"]), *cells,
                             "ref" if r["variant"] == m["reference"] else _pts(r["mean_difference"])))
            out += _grid(rows)
            reused = sum(g.get("n_reused", 0) for g in groups)
            n_rec = sum(g["n_records"] for g in groups)
            out.append(f"  records reused from {ref} (same LLM input as {ref}, not recomputed): {reused} of {n_rec}")
            groups = [g for g in groups if g["variant"] == m["reference"]]
        elif is_pruning(groups):
            t = pruning_rows(scores, groups)
            ref = _name(t["reference"])
            out.append(f"{bench}: pruning, one row per variant; accuracy = {name}; prefill TFLOPs per question "
                       f"({flops_label(t['flops_key'])})")
            rows = [("variant", "n", "acc%", "±95", f"Δ vs {ref}", "p", "video ret.", "audio ret.", "kept tokens",
                     "TFLOPs", f"% of {ref}")]
            for r in t["rows"]:
                rows.append((r["variant"], str(r["n"]), _pct(r["accuracy"]), _half(r["ci"]),
                             "ref" if r["is_reference"] else _pts(r["difference"]),
                             "" if r["is_reference"] else format_p(r["p"], n_res),
                             _pct(r["video_retention"]), _pct(r["audio_retention"]),
                             "-" if r["kept_tokens"] is None else f"{r['kept_tokens']:.0f}",
                             "-" if r["tflops"] is None else f"{r['tflops']:.4g}",
                             "-" if r["tflops_pct_of_full"] is None else f"{r['tflops_pct_of_full']:.1f}"))
            out += _grid(rows)
            continue
        heads = headline_rows(groups)
        out.append(f"{bench}: {name}" + (f" ({m['reference']} rows)" if is_matrix(by_benchmark(scores)[bench])
                                          else ""))
        rows = [("job", "released %", "n", "acc% ±95 (unparsed = wrong)", "err", "miss")]
        for h in heads:
            n = f"{h['answered']} answered of {h['questions']}" if h.get("answered") is not None else str(h["n"])
            rows.append((h["job"], _pct(h["value"]), n, f"{_pct(h['accuracy'])} {_half(h['ci'])}",
                         str(h["n_errors"]), str(h["n_missing"])))
        out += _grid(rows)
        tasks = sorted({t for h in heads for t in h["tasks"]})
        if tasks:
            shown = tasks[:MAX_TASKS_SHOWN]
            out.append(f"  by task (released %){'' if len(tasks) <= MAX_TASKS_SHOWN else f', first {MAX_TASKS_SHOWN} of {len(tasks)} (report.html has all)'}:")
            rows = [("task", *[h["job"] for h in heads])]
            rows += [(t, *[_pct(h["tasks"].get(t)) for h in heads]) for t in shown]
            out += _grid(rows, "    ")
    return out


RULE_DESCRIPTIONS = {
    "videomme": "Video-MME eval_your_results.py: prefixes removed, first capital of [ABCD] anywhere (even in a word)",
    "lvb": "lmms-eval LongVideoBench: prefixes removed, first capital of [ABCDE] anywhere, random option if none",
    "worldsense": "VLMEvalKit WorldSense: prefixes removed, first capital of [ABCD] anywhere, else 0",
    "mlvu": "MLVU check_ans: the character before the first ')' (else the whole reply) equals the letter",
    "omnizip": "OmniZip eval.py: reply stripped, the first of A-F it starts with, else its first character",
    "robust": "a standalone option letter ('B', '(B)', 'Answer: c') or one option's text",
}


def _budget(budget) -> str:
    return "-" if budget is None else str(budget)   # pruning jobs have a retention, no vision-token budget


def nothing_answered(groups: list[dict]) -> int:
    """The number of error records when every record of ``groups`` is one (nothing answered), else 0."""
    n_errors = sum(g.get("n_errors", 0) for g in groups)
    if n_errors and not sum(g.get("n_scored", 0) + g.get("n_no_answer", 0) for g in groups):
        return n_errors
    return 0


def data_notes(groups: list[dict]) -> list[str]:
    """The lines under the score table on what the counts leave out: a run where every record is an error record,
    questions without a gold answer, videos answered on concealed frames, videos NVDEC decoded unchecked (the
    console table and ``report.html``)."""
    lines: list[str] = []
    n_errors = nothing_answered(groups)
    if n_errors:   # every record an error (every video unreadable, a wrong model...): empty cells say too little
        lines.append(f"NOTHING WAS ANSWERED: all {n_errors} records are error records (the Errors section of "
                     "report.html names each file and cause)")
    stale = [g for g in groups if g.get("n_not_in_annotation")]
    if stale:   # a question removed from the annotation after its records were written
        lines.append("left out, their questions no longer in the annotation: "
                     + "; ".join(f"{g['benchmark']} {_group_name(g)} {g['n_not_in_annotation']}" for g in stale))
    no_answer = [g for g in groups if g.get("n_no_answer")]
    if no_answer:   # issue 44 item 8: questions without a gold answer leave n without a word otherwise
        lines.append("not scored, no gold answer in the annotation (empty, blank or missing): "
                     + "; ".join(f"{g['benchmark']} {_group_name(g)} {g['n_no_answer']}" for g in no_answer))
    concealed = [g for g in groups if g.get("n_concealed_videos")]
    if concealed:   # issue 42 item 1: answered on frames the decoder concealed (damaged packets), as FFmpeg
        lines.append("concealed frames (damaged packets decoded as FFmpeg does; data.strict_frames makes them "
                     "errors): " + "; ".join(
                         f"{_group_name(g)} {_videos(g['n_concealed_videos'], g.get('concealed_videos'))}, "
                         f"{g['n_concealed_frames']} frames" for g in concealed))
    unchecked = [g for g in groups if g.get("n_unchecked_videos")]
    if unchecked:   # NVDEC reports no decode status: those videos' frames were not checked (docs/deviations.md)
        lines.append("not checked for concealment (decoded by NVDEC, which reports no decode status; data.decoder: cpu "
                     "checks them): "
                     + "; ".join(f"{_group_name(g)} {g['n_unchecked_videos']} videos" for g in unchecked))
    return lines


def format_table(scores: dict) -> str:
    """The console summary of ``scores`` (from :func:`score_records`).

    First, per benchmark: the release's headline figure by its release's name with its task breakdown (one column
    per group), or for a layout ablation the variant x budget matrix of accuracy ± CI with the difference from the
    reference variant (``base``) at the same budget, sorted by that difference, and the number of reused records;
    for a pruning run one row per variant (accuracy, Δ vs ``full``, retention reached, kept tokens, prefill TFLOPs
    and % of ``full``). Then the per-group table (one row per group and parser: n, accuracy (%), errors,
    unparseable, missing, duplicates, the benchmark's other release numbers), left out above
    ``MAX_DETAIL_GROUPS`` groups; the rules that appear; the differences not already in a matrix or pruning
    table (the reference variant's budgets against each other)."""
    lines = _summary(scores)
    if lines:
        lines.append("")
    groups = scores.get("groups", [])
    header = ("benchmark", "job", "variant", "budget", "parser", "rule", "n", "acc%", "acc_all%", "err", "unparse",
              "miss", "dup", "±95", "breakdown")
    rows = [header]
    used: list[str] = []
    for g in groups:
        for parser, p in g["parsers"].items():
            rule = p.get("rule", parser)
            if rule not in used:
                used.append(rule)
            rows.append((g["benchmark"], g["job"], g["variant"] or "-", _budget(g["budget"]), parser, rule,
                         str(g["n_scored"]), _pct(p["accuracy"]), _pct(p["accuracy_all"]), str(g["n_errors"]),
                         str(p["unparseable"]), str(g["n_missing"]), str(g["n_duplicates"]),
                         _half(p.get("accuracy_ci95")), _extra(g["benchmark"], p)))
        if not g["parsers"]:
            rows.append((g["benchmark"], g["job"], g["variant"] or "-", _budget(g["budget"]), "-", "-",
                         str(g["n_scored"]), "-", "-", str(g["n_errors"]), "-", str(g["n_missing"]),
                         str(g["n_duplicates"]), "-", ""))
    if len(groups) <= MAX_DETAIL_GROUPS:
        lines += [ln[2:] for ln in _grid(rows)]
    else:
        lines.append(f"per-group table ({len(groups)} groups x parsers): report.html and scores.json")
    lines.append("n = questions scored (error records are not); acc% = correct / scored (unparsed = wrong); acc_all% "
                 "also counts errors and missing questions as wrong; official = the benchmark's own released rule; "
                 "unparse = no letter under the rule")
    lines.append("±95 = half-width of the 95 % bootstrap interval of acc% (scores.json: accuracy_ci95)")
    lines += data_notes(groups)
    for rule in used:
        lines.append(f"  {rule}: {RULE_DESCRIPTIONS.get(rule, rule)}")
    n_res = (scores.get("bootstrap") or {}).get("n_resamples")
    # variants against the reference are in the matrix / pruning table above: listed here, the budget pairs
    in_tables = {b for b, gs in by_benchmark(scores).items() if is_matrix(gs) or is_pruning(gs)}
    diffs = [d for d in scores.get("differences", []) if d["parser"] == "official"
             and not (d["benchmark"] in in_tables and d["compared"] == "variant")]
    if diffs:
        lines.append("differences (official parser, a - b over the questions scored in both, 95 % paired bootstrap):")
        for d in diffs:
            lo, hi = d["ci95"]
            lines.append(f"  {d['benchmark']} {_group_name(d['a'])} - {_group_name(d['b'])}: "
                         f"{100 * d['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]  n {d['n_common']}  "
                         f"p {format_p(d['p_two_sided'], n_res)}")
    return "\n".join(lines)


def _half(ci: list[float] | None) -> str:
    return "-" if not ci else f"±{100 * (ci[1] - ci[0]) / 2:.1f}"


def _videos(n: int, names: list[str] | None, most: int = 3) -> str:
    """``"1 video (cockatoo)"``, ``"5 videos (a, b, c, ...)"``: the count and the first ``most`` ids (a scores.json
    written before the ids were kept gives the count alone)."""
    text = f"{n} video{'s' if n != 1 else ''}"
    if names:
        text += f" ({', '.join(names[:most])}{', ...' if len(names) > most else ''})"
    return text


def _group_name(g: dict) -> str:
    return f"{g['variant'] + ' ' if g.get('variant') else ''}b{g['budget']}" if g.get("budget") is not None \
        else str(g.get("job"))


