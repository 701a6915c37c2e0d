"""MLVU dev: ``<root>/json/<n>_<task>.json`` and videos under ``<root>/video/<n>_<task>/<video>``.

Each annotation file is a JSON list of ``{"video", "duration", "question", "candidates", "answer",
"question_type"}``; ``answer`` is the *text* of the correct candidate (its letter is its index). Only the seven
multiple-choice tasks are loaded; the open-ended ones (``subPlot``, ``summary``) are skipped and counted in the log.
Question ids are synthesised stably as ``<task>_<index>`` (index = position in the task's file).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from .base import (LETTERS, AnnotationError, Question, check_questions, options_field, resolve_media_path,
                   text_field, duration_field, load_json_annotation)

log = logging.getLogger(__name__)

MC_TASKS = ("plotQA", "needle", "ego", "count", "order", "anomaly_reco", "topic_reasoning")
OPEN_ENDED_TASKS = ("subPlot", "summary")
_FILE = re.compile(r"^(\d+)_(.+)\.json$")
_FIELDS = ("video", "question", "candidates", "answer")


def load_mlvu(root: Path, json_dir: str = "json", video_dir: str = "video",
              tasks: tuple[str, ...] | list[str] | None = None) -> list[Question]:
    """Read MLVU dev multiple-choice questions.

    Args:
        root: benchmark root holding ``json/`` and ``video/``.
        json_dir: folder of the ``<n>_<task>.json`` files, relative to ``root``.
        video_dir: folder of the ``<n>_<task>/`` video folders, relative to ``root``.
        tasks: multiple-choice tasks to keep (default: all seven of :data:`MC_TASKS`).

    Returns:
        Questions in file order (files sorted by their number), ``meta = {benchmark, task, duration (s),
        question_type}``.

    Raises:
        AnnotationError: no annotation files, invalid JSON, a row missing a field or with a mistyped or empty
            one (a ``duration`` NaN, infinite, negative or not a number), an answer that is not one of its
            candidates, fewer than 2 or more than 10 candidates, a qid used twice (two files of one task), or a
            video path escaping ``root`` (file and row named).
    """
    root = Path(root)
    keep = tuple(tasks) if tasks is not None else MC_TASKS
    unknown = [t for t in keep if t not in MC_TASKS]
    if unknown:
        raise ValueError(f"MLVU: {unknown} are not multiple-choice tasks; choose from {MC_TASKS}")
    files = []
    for f in (root / json_dir).glob("*.json"):
        m = _FILE.match(f.name)
        if m:
            files.append((int(m.group(1)), m.group(2), f))
    if not files:
        raise AnnotationError(f"MLVU: no <n>_<task>.json under {root / json_dir}")
    questions: list[Question] = []
    wheres: list[str] = []
    skipped: dict[str, int] = {}
    for _, task, f in sorted(files):
        rows = load_json_annotation(f, "MLVU annotation file")
        if not isinstance(rows, list):
            raise AnnotationError(f"{f}: expected a JSON list of questions")
        if task not in MC_TASKS:
            skipped[task] = skipped.get(task, 0) + len(rows)
            continue
        if task not in keep:
            continue
        for i, row in enumerate(rows):
            where = f"{f} row {i}"
            if not isinstance(row, dict) or any(k not in row for k in _FIELDS):
                raise AnnotationError(f"{where}: expected an object with fields {_FIELDS}")
            question = text_field(row["question"], "question", where)
            options = options_field(row["candidates"], "candidates", where)
            answer_text = text_field(row["answer"], "answer", where, numbers_ok=True)
            if answer_text not in options:
                raise AnnotationError(f"{where}: answer {answer_text!r} is not one of the candidates {options}")
            # MLVU@fd060c10 choice_bench.py MLVU.qa_template: ``for idx, c in enumerate(data['candidates']): ...
            # if c == answer: answer_idx = idx``, so a repeated candidate gives the gold letter of its LAST match
            gold = max(j for j, c in enumerate(options) if c == answer_text)
            if options.count(answer_text) > 1:
                log.warning("%s: answer %r appears more than once among the candidates; using the last (%s), as "
                            "MLVU's evaluation does", where, answer_text, LETTERS[gold])
            # a NaN or infinite duration would be the video's cost (its run order) and a bare NaN in every record
            duration = duration_field(row.get("duration"), "duration", where)
            video = text_field(row["video"], "video", where, numbers_ok=True)
            video_path = resolve_media_path(root, Path(video_dir) / f.stem / video, where)
            questions.append(Question(
                qid=f"{task}_{i}",
                video_id=f"{f.stem}/{video}",
                video_path=str(video_path),
                question=question,
                options=options,
                answer=LETTERS[gold],
                meta={"benchmark": "mlvu", "task": task, "duration": duration,
                      "question_type": row.get("question_type", task)},
            ))
            wheres.append(where)
    check_questions(questions, wheres)
    if skipped:
        log.info("MLVU: skipped %d open-ended questions (%s)", sum(skipped.values()),
                 ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items())))
    return questions
