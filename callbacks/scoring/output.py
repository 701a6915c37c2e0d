"""Writing ``scores.json``, the plots and ``report.html`` of an output folder."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

from datamodules.features import atomic_write_bytes

from .plots import plot_scores
from .scores import read_records, score_records

SCORES_FILE = "scores.json"


def rules_tag(rules: Iterable[str] | None) -> str | None:
    """The file-name tag of a re-score with extra ``rules`` (``--rules``): the rules joined by ``-`` in the order
    given, repeats dropped (``["mlvu", "robust"]`` -> ``"mlvu-robust"``); ``None`` without rules."""
    rules = list(dict.fromkeys(rules or []))
    return "-".join(rules) if rules else None


def output_files(tag: str | None = None) -> tuple[str, str, str]:
    """``(scores file, report file, plot suffix)`` of a scoring: ``scores.json``, ``report.html`` and no suffix for
    the run's own; ``scores_<tag>.json``, ``report_<tag>.html`` and ``_<tag>`` before each plot's ``.png`` for a
    re-score with extra rules (:func:`rules_tag`), so it never replaces the run's own files."""
    from callbacks.report import REPORT_FILE   # here: callbacks.report imports this package

    if not tag:
        return SCORES_FILE, REPORT_FILE, ""
    return f"scores_{tag}.json", f"report_{tag}.html", f"_{tag}"


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


def save_scores(scores: dict, out_dir: Path, plots: bool = True, records: list[dict] | None = None,
                tag: str | None = None) -> dict:
    """Render the plots (when ``plots``), write ``scores.json`` atomically into ``out_dir`` and the folder's
    ``report.html`` (:mod:`callbacks.report`; its error and unparsed lists come from ``records``, read from
    ``out_dir`` when not given); ``scores`` with ``plots`` filled in. With ``tag`` (a re-score with extra rules,
    :func:`rules_tag`) the files are ``scores_<tag>.json``, ``report_<tag>.html`` and ``<plot>_<tag>.png``
    (:func:`output_files`): the run's own are left as they are. Raises ``OSError`` when the folder cannot take the
    files."""
    from callbacks.report import write_report

    out_dir = Path(out_dir)
    scores_file, report_file, suffix = output_files(tag)
    earlier = _listed_plots(out_dir / scores_file)
    scores["plots"] = [p.name for p in plot_scores(scores, out_dir, suffix)] if plots else []
    data = json.dumps(scores, indent=1, sort_keys=False, default=str).encode("utf-8")
    with _naming(out_dir / scores_file):
        atomic_write_bytes(out_dir / scores_file, data)
    rules = tag.split("-") if tag else None
    with _naming(out_dir / report_file):
        # the records of the folder just scored: their unreadable lines were named then (compute_scores)
        write_report(scores, out_dir, records if records is not None else read_records(out_dir, warn=False)[0],
                     report_file, rules=rules)
    _remove_stale_plots(out_dir, earlier - set(scores["plots"]), suffix)
    return scores


@contextmanager
def _naming(path: Path):
    """An ``OSError`` raised inside without a file name (a ``write`` that met a full disk) gets ``path`` as its
    ``filename``, so the one-line message names the file that was being written."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:   # (an OSError of a message only keeps its str())
            e.filename = str(path)
        raise


def _listed_plots(scores_path: Path) -> set[str]:
    """The plot file names an earlier scoring listed in ``scores_path`` (empty when there is none or it is
    unreadable)."""
    try:
        plots = json.loads(scores_path.read_text(encoding="utf-8")).get("plots") or []
    except (OSError, ValueError, AttributeError):
        return set()
    return {p for p in plots if isinstance(p, str)}


def _remove_stale_plots(out_dir: Path, names: set[str], suffix: str) -> None:
    """Delete the PNGs an earlier scoring of the same files wrote and this one did not (``--no-plots``, a
    benchmark or a variant no longer there), so the folder holds the plots its report shows. ``names`` come from
    the same scores file (a re-score's own list for ``_<rules>`` files), and only plain ``<name><suffix>.png`` files
    directly in ``out_dir`` are touched."""
    for name in names:
        path = out_dir / name
        if Path(name).name == name and name.endswith(f"{suffix}.png") and path.is_file():
            path.unlink(missing_ok=True)

