"""One self-contained ``report.html`` per output folder: the answer first (each benchmark's released figure by its
release's name with the task breakdown; the layout ablation's variant x budget matrix against ``base``; the
pruning table against ``full``), then every group's scores with intervals, the differences, plots, errors,
unparsed answers, stage timing and settings; a banner when the model is a tiny random test model.

Written beside ``scores.json`` at the end of a run and by ``python -m callbacks.scoring <out_dir>``
(:func:`callbacks.scoring.save_scores`). Everything is inline (CSS, PNGs as base64 data URIs), so the file can be
mailed or opened from any folder. Dataset and model text (questions, responses, error messages) is HTML-escaped.
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from callbacks.scoring.console import data_notes
from callbacks.scoring.plots import plot_caption
from callbacks.scoring.release import HEADLINES
from callbacks.scoring.summary import (by_benchmark, flops_label, format_p, headline_rows, is_matrix, is_pruning,
                                       matrix, pruning_rows, variant_name)

from datamodules.features import atomic_write_bytes

REPORT_FILE = "report.html"
MAX_LISTED = 200          # error / unparsed rows shown (the counts are always complete)
MAX_RESPONSE_CHARS = 300

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}img{max-width:100%;margin:.5em 0}
code,pre{background:#f7f7f7;padding:1px 4px}h2{margin-top:1.6em;border-bottom:1px solid #ddd}
.banner{background:#fff3cd;border:2px solid #c9a100;padding:.8em 1em;font-size:16px;margin:1em 0}
td.up{background:#e3f4e3}td.down{background:#fbe3e3}td.ref{background:#eef}details{margin:.5em 0 1.5em}
.wide{overflow-x:auto}"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _pct(x) -> str:
    return "" if x is None else f"{100 * float(x):.1f}"


def _table(header: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="num">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(c) -> str:
    """A cell: plain text, ``(text, css class)`` (a number) or ``(text, css class, second line, tooltip)``."""
    if isinstance(c, tuple):
        sub = f"<br><small>{_e(c[2])}</small>" if len(c) > 2 and c[2] else ""
        tip = f' title="{_e(c[3])}"' if len(c) > 3 and c[3] else ""
        return f'<td class="num {c[1]}"{tip}>{_e(c[0])}{sub}</td>'
    return f"<td>{_e(c)}</td>"


def _ctable(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in rows)
    return f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>'


def _ci(ci) -> str:
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]" if ci else ""


def _signed(x) -> str:
    return "" if x is None else f"{100 * float(x):+.1f}"


def _sign_class(d, ci) -> str:
    if d is None or not ci:
        return ""
    return "up" if ci[0] > 0 else "down" if ci[1] < 0 else ""


def _answer(scores: dict) -> str:
    """The top of the page: per benchmark, the matrix / pruning table / released figures (module docstring)."""
    n_res = (scores.get("bootstrap") or {}).get("n_resamples")
    parts = []
    for bench, groups in by_benchmark(scores).items():
        name = HEADLINES.get(bench, ("accuracy",))[0]
        if is_matrix(groups):
            m = matrix(scores, groups)
            ref = variant_name(m["reference"])
            rows = []
            for r in m["rows"]:
                row = [variant_name(r["variant"])]
                for b in m["budgets"]:
                    c = r["cells"].get(b)
                    if c is None:
                        row.append("")
                        continue
                    txt = f"{_pct(c['accuracy'])} {_ci(c['ci'])}"
                    if r["variant"] == m["reference"]:
                        row.append((txt, "ref"))
                    else:
                        sub = f"Δ {_signed(c['difference'])} [{_signed((c['diff_ci'] or [None])[0])}, " \
                              f"{_signed((c['diff_ci'] or [None, None])[1])}]" if c["difference"] is not None else ""
                        row.append((txt, _sign_class(c["difference"], c["diff_ci"]), sub,
                                    f"p {format_p(c['p'], n_res)} (paired bootstrap, two-sided)"))
                row.append(("ref" if r["variant"] == m["reference"] else _signed(r["mean_difference"]), ""))
                row.append((sum(c["n_reused"] for c in r["cells"].values()), ""))
                rows.append(row)
            reused = sum(g.get("n_reused", 0) for g in groups)
            n_rec = sum(g["n_records"] for g in groups)
            parts.append(
                f"<h3>{_e(bench)}: layout ablation, accuracy % [95 % CI] and Δ vs {_e(ref)} at the same budget</h3>"
                f"<p>Official rule, unparsed answers count as wrong. Δ = paired difference from {_e(ref)} at the same "
                f"budget over the questions both answered (points, 95 % paired-bootstrap CI; green / red: the CI "
                f"excludes 0; hover a cell for its p-value). Rows sorted by the mean Δ over budgets. Records reused from {_e(ref)} (the same LLM "
                f"input, copied, not recomputed): <b>{reused} of {n_rec}</b>.</p>"
                + _ctable(["variant", *[f"b{b}" for b in m["budgets"]], "mean Δ", "reused"], rows))
            groups = [g for g in groups if g["variant"] == m["reference"]]
        elif is_pruning(groups):
            t = pruning_rows(scores, groups)
            ref = "-" if t["reference"] is None else t["reference"]
            rows = [[r["variant"], (r["n"], ""), (_pct(r["accuracy"]), "ref" if r["is_reference"] else ""),
                     (_ci(r["ci"]), ""),
                     ("ref" if r["is_reference"] else f"{_signed(r['difference'])} {_ci(r['diff_ci'])}",
                      _sign_class(r["difference"], r["diff_ci"])),
                     ("" if r["is_reference"] else format_p(r["p"], n_res), ""),
                     (_pct(r["video_retention"]), ""), (_pct(r["audio_retention"]), ""),
                     ("" if r["kept_tokens"] is None else f"{r['kept_tokens']:.0f}", ""),
                     ("" if r["tflops"] is None else f"{r['tflops']:.4g}", ""),
                     ("" if r["tflops_pct_of_full"] is None else f"{r['tflops_pct_of_full']:.1f}", "")]
                    for r in t["rows"]]
            parts.append(
                f"<h3>{_e(bench)}: token pruning, one row per variant</h3><p>Accuracy = {_e(name)}. Δ vs {_e(ref)}: "
                "paired difference over the questions both answered (points, 95 % CI). Retention reached = kept / "
                "unpruned tokens of the modality (%); kept tokens = video + audio per question (mean); prefill "
                f"TFLOPs per question (mean; {_e(flops_label(t['flops_key']))}).</p>"
                + _ctable(["variant", "n", "accuracy %", "95 % CI", f"Δ vs {ref} (pts)", "p", "video retention %",
                           "audio retention %", "kept tokens", "prefill TFLOPs", f"% of {ref}"], rows))
            continue
        heads = headline_rows(groups)
        rows = [[h["job"], (_pct(h["value"]), "ref"),
                 (f"{h['answered']} of {h['questions']}" if h.get("answered") is not None else h["n"], ""),
                 (f"{_pct(h['accuracy'])} {_ci(h['ci'])}", ""), (h["n_errors"], ""), (h["n_missing"], "")]
                for h in heads]
        parts.append(f"<h3>{_e(bench)}: {_e(name)}</h3>" + _ctable(
            ["job", "released figure %", "answered of questions" if bench == "videomme" else "n",
             "accuracy % [95 % CI] (unparsed = wrong)", "errors", "missing"], rows))
        tasks = sorted({t for h in heads for t in h["tasks"]})
        if tasks:
            parts.append("<p>By task (released figure %):</p>" + _ctable(
                ["task", *[h["job"] for h in heads]], [[t, *[(_pct(h["tasks"].get(t)), "") for h in heads]]
                                                       for t in tasks]))
    return "".join(parts)


def tiny_model_banner(out_dir: Path) -> str:
    """A banner when ``run.json``'s ``model_path`` is a tiny random test model (its ``TINY_RANDOM_MODEL.json``
    marker, written by ``models.videollama3.tiny``, or a config whose largest ``hidden_size`` is below 256, as
    the tiny omni model's); empty otherwise."""
    try:
        run = json.loads((out_dir / "run.json").read_text())
    except (OSError, ValueError):
        return ""
    path = run.get("model_path") or (run.get("model") or {}).get("model_path") if isinstance(run, dict) else None
    if not path:
        return ""
    root = Path(path)
    tiny = (root / "TINY_RANDOM_MODEL.json").is_file()
    if not tiny:
        try:
            cfg = json.loads((root / "config.json").read_text())
        except (OSError, ValueError):
            return ""
        sizes = []

        def walk(x):
            if isinstance(x, dict):
                for k, v in x.items():
                    if k == "hidden_size" and isinstance(v, int):
                        sizes.append(v)
                    walk(v)
        walk(cfg)
        tiny = bool(sizes) and max(sizes) < 256
    if not tiny:
        return ""
    return (f'<div class="banner"><b>Tiny random model.</b> {_e(path)} is a test model with random weights: its '
            "answers are noise, and these accuracies say nothing about the method.</div>")


def score_rows(scores: dict) -> list[list]:
    """One row per (group, parser): benchmark, job, variant, budget, parser, rule, n scored, acc %, 95 % interval,
    acc_all %, errors, unparsed, missing, duplicates ignored."""
    rows = []
    for g in scores.get("groups", []):
        for name, p in g.get("parsers", {}).items():
            ci = p.get("accuracy_ci95")
            rows.append([g.get("benchmark"), g.get("job"), g.get("variant") or "-", g.get("budget"), name,
                         p.get("rule", name), g.get("n_scored"), _pct(p.get("accuracy")),
                         f"[{_pct(ci[0])}, {_pct(ci[1])}]" if ci else "", _pct(p.get("accuracy_all")),
                         g.get("n_errors"), p.get("unparseable"), g.get("n_missing"), g.get("n_duplicates")])
    return rows


def _differences(scores: dict) -> str:
    rows = []
    for d in scores.get("differences", []) or []:
        ci = d.get("ci95")
        a, b = ((x.get("job") if isinstance(x, dict) else x) for x in (d.get("a"), d.get("b")))
        rows.append([d.get("benchmark"), d.get("parser"), a, b, d.get("n_common"),
                     _pct(d.get("difference")), f"[{_pct(ci[0])}, {_pct(ci[1])}]" if ci else "",
                     format_p(d.get("p_two_sided"), (scores.get("bootstrap") or {}).get("n_resamples"))])
    if not rows:
        return "<p>No pairs of groups that differ only in budget or variant.</p>"
    return ("<p>Each variant against the reference variant at the same budget, and the reference's budgets "
            "against each other.</p><details><summary>" + f"{len(rows)} differences" + "</summary>"
            + _table(["benchmark", "parser", "a", "b", "n common", "a - b (pts)", "95 % interval", "p (two-sided)"],
                     rows, {4, 5, 7}) + "</details>")


def _costs(scores: dict) -> str:
    groups = [g for g in scores.get("groups", []) if g.get("cost")]
    if not groups:
        return ""
    keys = sorted({k for g in groups for k in g["cost"]})
    rows = [[g.get("benchmark"), g.get("job"), g.get("variant") or "-"] + [f"{g['cost'][k]:.4g}" if k in g["cost"]
                                                                             else "" for k in keys] for g in groups]
    return ("<h2>Kept tokens, retention reached and prefill cost (means per group)</h2><details><summary>every "
            "cost field</summary><div class='wide'>"
            + _table(["benchmark", "job", "variant", *keys], rows, set(range(3, 3 + len(keys)))) + "</div></details>")


def _images(scores: dict, out_dir: Path) -> str:
    parts = []
    for name in scores.get("plots", []) or []:
        p = out_dir / name
        if p.is_file():
            data = base64.b64encode(p.read_bytes()).decode("ascii")
            parts.append(f'<figure><img alt="{_e(name)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{_e(plot_caption(name))} <code>{_e(name)}</code></figcaption></figure>")
    return "".join(parts) or "<p>No plots.</p>"


# the unparsed-answers table: the record's ``answer`` is the benchmark's correct option, ``response`` the model's reply
UNPARSED_HEADER = ["qid", "job", "rule", "correct answer", "model reply (raw, no option letter parsed)"]


MAX_QIDS_LISTED = 6   # question ids named per (video, cause) row of the errors table


def _record_lists(records: list[dict]) -> tuple[str, str]:
    errors = [r for r in records if r.get("error")]
    unparsed = [r for r in records if not r.get("error") and r.get("pred") is None]
    # one row per (video, cause): a video that failed gives the same line for each question and budget
    causes: dict[tuple, tuple[list, list, list]] = {}   # (video, cause) -> (qids, jobs, [records])
    for r in errors:
        qids, jobs, n = causes.setdefault((str(r.get("video")), str(r.get("error"))), ([], [], [0]))
        n[0] += 1
        for seq, v in ((qids, str(r.get("qid"))), (jobs, str(r.get("job")))):
            if v not in seq:
                seq.append(v)
    err_rows = [[video, n[0], ", ".join(jobs),
                 ", ".join(qids[:MAX_QIDS_LISTED]) + (", ..." if len(qids) > MAX_QIDS_LISTED else ""), cause]
                for (video, cause), (qids, jobs, n) in list(causes.items())[:MAX_LISTED]]
    un_rows = [[r.get("qid"), r.get("job"), r.get("pred_rule"), r.get("answer"),
                str(r.get("response") or "")[:MAX_RESPONSE_CHARS]] for r in unparsed[:MAX_LISTED]]
    err = (f"<p>{len(errors)} error records" + (f", {len(causes)} (video, cause)" if causes else "")
           + (f" (first {MAX_LISTED} listed)" if len(causes) > MAX_LISTED else "") + "</p>"
           + (_table(["video", "records", "jobs", "questions", "error"], err_rows, {1}) if err_rows else ""))
    un = (f"<p>{len(unparsed)} answers with no option letter under the benchmark's rule"
          + (f" (first {MAX_LISTED} listed)" if len(unparsed) > MAX_LISTED else "") + "</p>"
          + (_table(UNPARSED_HEADER, un_rows) if un_rows else ""))
    return err, un


def _timing(out_dir: Path) -> str:
    """The latest run's stages per ``timing_rank*.json``, and the earlier runs of the folder (resumed runs) below
    them, folded (``callbacks.timing.timing_runs``: a file of the old single-run format is its latest run)."""
    from .timing import timing_runs

    def stages(t: dict) -> str:   # (a run stopped by Ctrl-C says so: its figures are those of the videos it did)
        st = t.get("stages_s") or {k: v for k, v in t.items() if isinstance(v, (int, float))}
        return ("interrupted: " if t.get("interrupted") else "") + ", ".join(f"{k} {float(v):.2f} s"
                                                                           for k, v in st.items())

    def first_answer(t: dict) -> str:
        v = (t.get("timeline_s") or {}).get("first_answer")
        return "-" if v is None else f"{float(v):.1f} s"

    def mps(t: dict) -> str:   # (files written before session 17 do not say; a CPU run has no GPU to share)
        if t.get("device_type") == "cpu":
            return "no GPU"
        return "-" if "cuda_mps_pipe" not in t else ("on" if t["cuda_mps_pipe"] else "off")

    rows, earlier, latest = [], [], {}
    for f in sorted(out_dir.glob("timing_rank*.json")):
        try:
            runs = timing_runs(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
        if not runs:
            continue
        latest[f.name] = runs[-1]
        rows.append([f.name, runs[-1].get("videos"), first_answer(runs[-1]), mps(runs[-1]), stages(runs[-1])])
        earlier += [[f.name, f"{i + 1} of {len(runs)}", r.get("videos"), first_answer(r), mps(r), stages(r)]
                    for i, r in enumerate(runs[:-1])]
    if not rows:
        return "<p>No timing files.</p>"
    out = ("<p>The latest run of this folder (first answer: seconds from the process's start to the end of its first "
           "step; CUDA MPS: whether the run's processes shared the GPU through an MPS daemon, "
           "<code>TOKENBUDGET_MPS</code>).</p>"
           + _table(["file", "videos", "first answer", "CUDA MPS", "stages"], rows, {1, 2}))
    out += _timeline(latest)
    if earlier:
        out += (f"<details><summary>{len(earlier)} earlier run(s) into this folder (resumed)</summary>"
                + _table(["file", "run", "videos", "first answer", "CUDA MPS", "stages"], earlier, {2, 3})
                + "</details>")
    return out


def _timeline(latest: dict[str, dict]) -> str:
    """The latest runs' per-video timeline (:func:`callbacks.scoring.plots.timeline_figure`) as an embedded PNG;
    empty when there is none, or when it cannot be drawn (a report is never lost for a plot)."""
    from callbacks.scoring.plots import figure_png, timeline_figure

    try:
        fig = timeline_figure(latest)
        if fig is None:
            return ""
        data = base64.b64encode(figure_png(fig)).decode("ascii")
    except Exception as e:  # noqa: BLE001 - matplotlib's errors: the page says why, the rest of it stays
        return f"<p>(no timeline plot: {_e(type(e).__name__)}: {_e(e)})</p>"
    return (f'<figure><img alt="timeline" src="data:image/png;base64,{data}"><figcaption>Per video, in the order '
            "the step took them: decoded in its worker (grey), the step waiting for it (red), its step (blue); "
            "seconds after the process start.</figcaption></figure>")


def render_report(scores: dict, out_dir: str | Path, records: list[dict], rules: list[str] | None = None) -> str:
    """The report page's HTML for ``out_dir`` (reads ``run.json``, ``timing_rank*.json`` and the plots there).
    ``rules``: a re-score with these extra rules (``python -m callbacks.scoring --rules``), named in the page's
    title and heading, which then point to the run's own ``report.html``."""
    out_dir = Path(out_dir)
    if rules:
        title = f"{out_dir.name}: re-score with rules {', '.join(rules)}"
        heading = (f"<h1>Re-score with rules {_e(', '.join(rules))}: {_e(out_dir)}</h1><p>The records of this run "
                   f"scored again, each rule as a parser of its own beside <code>official</code> and "
                   f"<code>robust</code>. The run's own report is <a href='{REPORT_FILE}'>{REPORT_FILE}</a>.</p>")
    else:
        title, heading = f"{out_dir.name} report", f"<h1>Run report: {_e(out_dir)}</h1>"
    run = out_dir / "run.json"
    settings = run.read_text() if run.is_file() else "(no run.json)"
    err, un = _record_lists(records)
    header = ["benchmark", "job", "variant", "budget", "parser", "rule", "n", "acc %", "95 % interval", "acc_all %",
              "err", "unparse", "miss", "dup"]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{_CSS}</style></head><body>{heading}{tiny_model_banner(out_dir)}"
            f"<h2>Result</h2>{_answer(scores)}"
            "<p>acc % = correct / scored questions (unparsed answers count as wrong); acc_all % also counts error "
            "records and missing questions as wrong; intervals are percentile-bootstrap 95 % intervals "
            "(scores.json: bootstrap).</p>"
            + "".join(f"<p><b>{_e(note)}</b></p>" for note in data_notes(scores.get("groups", [])))
            + f"<h2>Scores</h2><details{' open' if len(scores.get('groups', [])) <= 12 else ''}><summary>every group "
            f"and parser</summary>{_table(header, score_rows(scores), {3, 6, 7, 9, 10, 11, 12, 13})}</details>"
            f"{_costs(scores)}<h2>Differences between budgets and variants</h2>{_differences(scores)}"
            f"<h2>Plots</h2>{_images(scores, out_dir)}"
            f"<h2>Errors</h2>{err}<h2>Unparsed answers</h2>{un}"
            f"<h2>Stage timing</h2>{_timing(out_dir)}"
            f"<h2>Settings (run.json)</h2><pre>{_e(settings)}</pre></body></html>")


def write_report(scores: dict, out_dir: str | Path, records: list[dict], name: str = REPORT_FILE,
                 rules: list[str] | None = None) -> Path:
    """Write ``<out_dir>/<name>`` (``report.html``; ``report_<rules>.html`` for a re-score with extra ``rules``,
    see :func:`render_report`) atomically; returns its path."""
    path = Path(out_dir) / name
    atomic_write_bytes(path, render_report(scores, out_dir, records, rules).encode("utf-8"))
    return path
