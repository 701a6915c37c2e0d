"""The baseline records of a layout ablation read from a finished run folder (seed 000 ``--baseline_run``).

Seed 000:1014 ``p.add_argument("--baseline_run", required=True, help="results/<run> prefix of the baseline
(<run>_b<B>/<benchmark>/*.jsonl), for reuse")`` and 000:1342 ``rec = dict(base_recs[b][s["qid"]], variant=vname,
reused=True)``: a job whose LLM input equals the baseline's copies the baseline run's record of the question. Here
the baseline run is an output folder of this project: a plain predict (``evaluate.py predict`` with
:class:`~lightning_modules.budgeted_qa.BudgetedQA`: records in ``<folder>/b<B>/<benchmark>/*.jsonl``) or an
ablation that ran ``base`` (``<folder>/base_b<B>/<benchmark>/*.jsonl``), with its ``run.json``.

:func:`load_baseline_run` refuses a folder that cannot stand for this run's baseline, naming the folder and the
field, before the ablation writes anything (the seed finds a missing record only when it reaches the video:
``assert not reuse, f"baseline records missing for {item['video']} at {b}"``):

* no folder, or no readable ``run.json`` in it;
* a setting of ``run.json`` that differs from this run's (model, raw mode and caps, answer length, template,
  dtype and kernels, benchmark, root, decoding...: every setting the output folder itself keeps, except
  ``baseline_run``, ``decode_budget`` (checked below) and ``no_reuse``), or is absent there;
* another decode budget: the baseline's frames of budget B are ``subsample`` of *its* decode, which equals this
  run's only when both decode for the same budget (an ablation's ``decode_budget``; a plain predict's largest
  budget, read off its ``b<B>`` folders);
* a question of this run with no record at one of the jobs' budgets (the first video lacking one is named).

Pure file reading: nothing is written.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from algorithms.errors import SettingError

from .jsonl_writer import RUN_FILE
from .record_lines import jsonl_lines

# settings of the ablation's own folder that do not determine the baseline's records
NOT_COMPARED = ("baseline_run", "decode_budget", "no_reuse")
_JOB_DIR = re.compile(r"^(?:base_)?b(\d+)$")


class BaselineRunError(SettingError):
    """The baseline run folder cannot give this run's baseline records (folder and field named)."""


def baseline_job_dirs(folder: Path) -> dict[int, list[Path]]:
    """``budget -> [<folder>/b<B>, <folder>/base_b<B>]`` (those that exist)."""
    out: dict[int, list[Path]] = {}
    for d in sorted(p for p in folder.iterdir() if p.is_dir()):
        m = _JOB_DIR.match(d.name)
        if m:
            out.setdefault(int(m.group(1)), []).append(d)
    return out


def _read_records(dirs: list[Path], benchmark: str) -> dict[str, dict]:
    """``qid -> record`` of the budget's folders: the last answered record of a qid, else its last error record
    (a retried question's new record is appended after its error record)."""
    answered: dict[str, dict] = {}
    failed: dict[str, dict] = {}
    for d in dirs:
        for f in sorted((d / benchmark).glob("*.jsonl")):
            for n, rec, err in jsonl_lines(f):
                try:   # not JSON or not UTF-8: named here, not a decoder's traceback
                    if err is not None:
                        raise err
                    qid = str(rec["qid"])
                except (ValueError, KeyError, TypeError) as e:
                    raise BaselineRunError(f"baseline_run {f} line {n}: unreadable record ({type(e).__name__})"
                                           ) from e
                (failed if rec.get("error") else answered)[qid] = rec
    return {**failed, **answered}


def _decode_budget_of(old: dict, job_dirs: dict[int, list[Path]]) -> int | None:
    """The budget the baseline decoded its videos for: an ablation's recorded ``decode_budget``; a plain predict's
    largest budget (its ``b<B>`` folders: ``datamodules.videoqa`` decodes for the largest job budget); else
    ``None`` (not known)."""
    if old.get("decode_budget") is not None:
        return int(old["decode_budget"])
    plain = [b for b, dirs in job_dirs.items() if any(d.name == f"b{b}" for d in dirs)]
    ablation = any(d.name.startswith("base_") for dirs in job_dirs.values() for d in dirs)
    return max(plain) if plain and not ablation else None


def load_baseline_run(folder: str | Path, settings: dict, defaults: dict, benchmark: str, budgets: list[int],
                      questions: list[tuple[str, str]], decode_budget: int,
                      canonical=None) -> dict[int, dict[str, dict]]:
    """The baseline records of every question at every budget, from a finished run folder.

    Args:
        folder: the baseline run's output folder (``run.json`` and ``<job>/<benchmark>/*.jsonl``).
        settings / defaults: this run's ``run.json`` settings and their recorded-only-when-not-default defaults
            (:func:`callbacks.jsonl_writer.run_settings`).
        budgets: the ablation's budgets.
        questions: ``(video id, qid)`` of every question this run may answer.
        decode_budget: the budget this run decodes every video for.
        canonical: ``recorded settings -> settings as this run records them`` applied to the folder's ``run.json``
            first (the datamodule's ``canonical_settings``: its ``loader_kwargs`` resolved), or ``None``.

    Returns:
        ``budget -> qid -> record``.

    Raises:
        BaselineRunError: naming the folder and the setting, budget or video that does not match.
    """
    folder = Path(folder)
    where = f"baseline_run {folder}"
    if not folder.is_dir():
        raise BaselineRunError(f"{where}: no such folder")
    path = folder / RUN_FILE
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BaselineRunError(f"{where}: no readable {RUN_FILE} ({type(e).__name__}); a baseline is an output "
                               "folder of `evaluate.py predict`") from e
    if canonical is not None and isinstance(old, dict):
        old = canonical(old)
    diffs = []
    for k, v in settings.items():
        if k in NOT_COMPARED or k in defaults:
            continue
        if k not in old:
            diffs.append(f"{k}: absent there, {v!r} here")
        elif old[k] != v:
            diffs.append(f"{k}: {old[k]!r} there, {v!r} here")
    diffs += [f"{k}: {old.get(k, d)!r} there, {settings.get(k, d)!r} here" for k, d in defaults.items()
              if k not in NOT_COMPARED and old.get(k, d) != settings.get(k, d)]
    if diffs:
        raise BaselineRunError(f"{where}: {path} was made with other settings ({'; '.join(diffs)})")
    job_dirs = baseline_job_dirs(folder)
    theirs = _decode_budget_of(old, job_dirs)
    if theirs is None:
        raise BaselineRunError(f"{where}: decode_budget: not recorded in {path} (an ablation folder written before "
                               "it was recorded); its frames cannot be shown to equal this run's")
    if theirs != decode_budget:
        raise BaselineRunError(f"{where}: decode_budget: {theirs} there (the budget its videos were decoded for), "
                               f"{decode_budget} here; the baseline's frames would not be this run's")
    out: dict[int, dict[str, dict]] = {}
    for b in budgets:
        if b not in job_dirs:
            raise BaselineRunError(f"{where}: budget {b}: no b{b}/ or base_b{b}/ folder of records")
        recs = _read_records(job_dirs[b], benchmark)
        missing = [(v, q) for v, q in questions if q not in recs]
        if missing:
            v, q = missing[0]
            n_videos = len({m[0] for m in missing})
            raise BaselineRunError(f"{where}: budget {b}: no record for {len(missing)} question(s) of {n_videos} "
                                   f"video(s), e.g. video {v} (qid {q}) in {', '.join(d.name for d in job_dirs[b])}/"
                                   f"{benchmark}/")
        out[b] = recs
    return out


__all__ = ["BaselineRunError", "NOT_COMPARED", "baseline_job_dirs", "load_baseline_run"]
