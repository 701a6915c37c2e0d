"""One self-contained ``report.html`` per output folder: settings, score tables with intervals, plots, errors,
unparsed answers and stage timing.

Written beside ``scores.json`` at the end of a run and by ``python -m callbacks.scoring <out_dir>``
(:func:`callbacks.scoring.save_scores`). Everything is inline (CSS, PNGs as base64 data URIs), so the file can be
mailed or opened from any folder. Dataset and model text (questions, responses, error messages) is HTML-escaped.
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from datamodules.features import atomic_write_bytes

REPORT_FILE = "report.html"
MAX_LISTED = 200          # error / unparsed rows shown (the counts are always complete)
MAX_RESPONSE_CHARS = 300

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}img{max-width:100%;margin:.5em 0}
code,pre{background:#f7f7f7;padding:1px 4px}h2{margin-top:1.6em;border-bottom:1px solid #ddd}"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _pct(x) -> str:
    return "" if x is None else f"{100 * float(x):.1f}"


def _table(header: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="num">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def score_rows(scores: dict) -> list[list]:
    """One row per (group, parser): benchmark, job, variant, budget, parser, rule, n scored, acc %, 95 % interval,
    acc_all %, errors, unparsed, missing."""
    rows = []
    for g in scores.get("groups", []):
        for name, p in g.get("parsers", {}).items():
            ci = p.get("accuracy_ci95")
            rows.append([g.get("benchmark"), g.get("job"), g.get("variant") or "-", g.get("budget"), name,
                         p.get("rule", name), g.get("n_scored"), _pct(p.get("accuracy")),
                         f"[{_pct(ci[0])}, {_pct(ci[1])}]" if ci else "", _pct(p.get("accuracy_all")),
                         g.get("n_errors"), p.get("unparseable"), g.get("n_missing")])
    return rows


def _differences(scores: dict) -> str:
    rows = []
    for d in scores.get("differences", []) or []:
        ci = d.get("ci95")
        a, b = ((x.get("job") if isinstance(x, dict) else x) for x in (d.get("a"), d.get("b")))
        rows.append([d.get("benchmark"), d.get("parser"), a, b, d.get("n_common"),
                     _pct(d.get("difference")), f"[{_pct(ci[0])}, {_pct(ci[1])}]" if ci else "",
                     d.get("p_two_sided")])
    if not rows:
        return "<p>No pairs of groups that differ only in budget or variant.</p>"
    return _table(["benchmark", "parser", "a", "b", "n common", "a - b (pts)", "95 % interval", "p (two-sided)"],
                  rows, {4, 5, 7})


def _costs(scores: dict) -> str:
    groups = [g for g in scores.get("groups", []) if g.get("cost")]
    if not groups:
        return ""
    keys = sorted({k for g in groups for k in g["cost"]})
    rows = [[g.get("benchmark"), g.get("job"), g.get("variant") or "-"] + [f"{g['cost'][k]:.4g}" if k in g["cost"]
                                                                             else "" for k in keys] for g in groups]
    return ("<h2>Kept tokens, retention reached and prefill cost (means per group)</h2>"
            + _table(["benchmark", "job", "variant", *keys], rows, set(range(3, 3 + len(keys)))))


def _images(scores: dict, out_dir: Path) -> str:
    parts = []
    for name in scores.get("plots", []) or []:
        p = out_dir / name
        if p.is_file():
            data = base64.b64encode(p.read_bytes()).decode("ascii")
            parts.append(f'<figure><img alt="{_e(name)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{_e(name)}</figcaption></figure>")
    return "".join(parts) or "<p>No plots.</p>"


def _record_lists(records: list[dict]) -> tuple[str, str]:
    errors = [r for r in records if r.get("error")]
    unparsed = [r for r in records if not r.get("error") and r.get("pred") is None]
    err_rows = [[r.get("qid"), r.get("job"), r.get("video"), r.get("error")] for r in errors[:MAX_LISTED]]
    un_rows = [[r.get("qid"), r.get("job"), r.get("pred_rule"), r.get("answer"),
                str(r.get("response") or "")[:MAX_RESPONSE_CHARS]] for r in unparsed[:MAX_LISTED]]
    err = (f"<p>{len(errors)} error records" + (f" (first {MAX_LISTED} listed)" if len(errors) > MAX_LISTED else "")
           + "</p>" + (_table(["qid", "job", "video", "error"], err_rows) if err_rows else ""))
    un = (f"<p>{len(unparsed)} answers with no option letter under the benchmark's rule"
          + (f" (first {MAX_LISTED} listed)" if len(unparsed) > MAX_LISTED else "") + "</p>"
          + (_table(["qid", "job", "rule", "answer", "response"], un_rows) if un_rows else ""))
    return err, un


def _timing(out_dir: Path) -> str:
    rows = []
    for f in sorted(out_dir.glob("timing_rank*.json")):
        try:
            t = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        stages = t.get("stages_s") or {k: v for k, v in t.items() if isinstance(v, (int, float))}
        rows.append([f.name, ", ".join(f"{k} {float(v):.2f} s" for k, v in stages.items())])
    return _table(["file", "stages"], rows) if rows else "<p>No timing files.</p>"


def render_report(scores: dict, out_dir: str | Path, records: list[dict]) -> str:
    """The report page's HTML for ``out_dir`` (reads ``run.json``, ``timing_rank*.json`` and the plots there)."""
    out_dir = Path(out_dir)
    run = out_dir / "run.json"
    settings = run.read_text() if run.is_file() else "(no run.json)"
    err, un = _record_lists(records)
    header = ["benchmark", "job", "variant", "budget", "parser", "rule", "n", "acc %", "95 % interval", "acc_all %",
              "err", "unparse", "miss"]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(out_dir.name)} report</title>"
            f"<style>{_CSS}</style></head><body><h1>Run report: {_e(out_dir)}</h1>"
            "<p>acc % = correct / scored questions (unparsed answers count as wrong); acc_all % also counts error "
            "records and missing questions as wrong; intervals are percentile-bootstrap 95 % intervals "
            "(scores.json: bootstrap).</p>"
            f"<h2>Scores</h2>{_table(header, score_rows(scores), {3, 6, 7, 9, 10, 11, 12})}"
            f"{_costs(scores)}<h2>Differences between budgets and variants</h2>{_differences(scores)}"
            f"<h2>Plots</h2>{_images(scores, out_dir)}"
            f"<h2>Errors</h2>{err}<h2>Unparsed answers</h2>{un}"
            f"<h2>Stage timing</h2>{_timing(out_dir)}"
            f"<h2>Settings (run.json)</h2><pre>{_e(settings)}</pre></body></html>")


def write_report(scores: dict, out_dir: str | Path, records: list[dict]) -> Path:
    """Write ``<out_dir>/report.html`` atomically; returns its path."""
    path = Path(out_dir) / REPORT_FILE
    atomic_write_bytes(path, render_report(scores, out_dir, records).encode("utf-8"))
    return path
