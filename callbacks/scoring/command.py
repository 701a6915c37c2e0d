"""``python -m callbacks.scoring <out_root>``: re-score an output folder."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from algorithms.choice import RULES

from .console import format_table
from .output import compute_scores, output_files, rules_tag, save_scores

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
    ``scores.json``, the plots and ``report.html``, print the table. With ``--rules`` the re-score's files are
    ``scores_<rules>.json``, ``report_<rules>.html`` and ``<plot>_<rules>.png`` (rules joined by ``-``): the
    run's own scores, report and plots are never replaced by a re-score with other rules."""
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
    tag = rules_tag(args.rules)
    scores_file, report_file, _ = output_files(tag)
    try:
        save_scores(scores, root, plots=not args.no_plots, tag=tag)
    except OSError as e:   # a read-only (archived, shared) folder can still be scored: table only
        scores["plots"] = []
        print(format_table(scores))
        print(f"warning: {root}: scores.json and plots not written ({type(e).__name__}: {e})", file=sys.stderr)
        return scores
    print(format_table(scores))
    print(f"scores: {Path(args.out_root) / scores_file}", file=sys.stderr)
    print(f"report: {Path(args.out_root) / report_file}", file=sys.stderr)
    return scores


if __name__ == "__main__":
    main()
