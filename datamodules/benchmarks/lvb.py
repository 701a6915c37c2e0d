"""LongVideoBench val: ``<root>/lvb_val.json``, videos under ``<root>/videos/``, subtitles under ``<root>/subtitles/``.

``lvb_val.json`` is a JSON list of ``{"id", "video_id", "video_path", "question", "candidates" (<= 5),
"correct_choice" (index), "duration_group", "question_category", "level", "subtitle_path",
"starting_timestamp_for_subtitles", "duration"}``. Subtitle files come in two public JSON forms, see
:func:`datamodules.benchmarks.subtitles.parse_lvb_subtitles`.
"""
from __future__ import annotations

import math
from pathlib import Path

from .base import (LETTERS, AnnotationError, Question, check_questions, options_field, resolve_media_path,
                   text_field, duration_field, load_json_annotation)
from .subtitles import load_lvb_subtitles, subtitles_text

_FIELDS = ("id", "video_id", "video_path", "question", "candidates")
MAX_CANDIDATES = 5


def _subtitle_offset(value, where: str) -> float:
    """A row's ``starting_timestamp_for_subtitles`` in seconds: 0 when absent (``null``), else a finite number.

    Raises:
        AnnotationError: text, a boolean, a list or object, NaN or infinite (``where`` named): ``float()`` of it
            was a ``ValueError`` naming neither file nor row, and a NaN shifted every subtitle line to NaN.
    """
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AnnotationError(f"{where}: starting_timestamp_for_subtitles must be a number of seconds, got "
                              f"{type(value).__name__} {value!r:.80}")
    return float(value)


def load_lvb(root: Path, annotation: str = "lvb_val.json", video_dir: str = "videos",
             subtitle_dir: str = "subtitles", subtitles: bool = True) -> list[Question]:
    """Read LongVideoBench questions.

    Args:
        root: benchmark root.
        annotation: the annotation file relative to ``root`` (``lvb_val.json``; the test split without
            ``correct_choice`` gives ``answer=None``).
        video_dir: folder the rows' ``video_path`` is relative to.
        subtitle_dir: folder the rows' ``subtitle_path`` is relative to.
        subtitles: attach subtitles (shifted by ``starting_timestamp_for_subtitles``, seconds) as
            ``Question.subtitles`` (text ordered by time) and ``Question.subtitle_lines`` (timed lines); a row whose
            subtitle file is absent gets none. On by default: VideoLLaMA3's evaluation
            (``DAMO-NLP-SG/VideoLLaMA3@05cee23d:evaluation/benchmarks/longvideobench.py``) always interleaves them.

    Returns:
        Questions in file order; ``meta = {benchmark, duration_group, question_category, level, duration (s),
        [subtitles]}``.

    Raises:
        AnnotationError: invalid JSON, a row missing a field or with a mistyped or empty one, fewer than 2 or
            more than 5 candidates, ``correct_choice`` not an index into them, a duplicate id, a media path escaping
            ``root`` (file and row named), a malformed subtitle file (file and item named).
    """
    root = Path(root)
    f = root / annotation
    rows = load_json_annotation(f, "LongVideoBench annotation file")
    if not isinstance(rows, list):
        raise AnnotationError(f"{f}: expected a JSON list of questions")
    questions: list[Question] = []
    wheres: list[str] = []
    cache: dict[tuple, list] = {}
    for i, row in enumerate(rows):
        where = f"{f} row {i}"
        if not isinstance(row, dict) or any(k not in row for k in _FIELDS):
            raise AnnotationError(f"{where}: expected an object with fields {_FIELDS}")
        where = f"{f} row {i} (id={row['id']!r})"
        qid = text_field(row["id"], "id", where, numbers_ok=True)
        question = text_field(row["question"], "question", where)
        cands = options_field(row["candidates"], "candidates", where, max_n=MAX_CANDIDATES)
        answer = None
        if row.get("correct_choice") is not None:
            c = row["correct_choice"]
            if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < len(cands):
                raise AnnotationError(f"{where}: correct_choice {c!r} is not an index into {len(cands)} candidates")
            answer = LETTERS[c]
        video_path = resolve_media_path(root, Path(video_dir) / text_field(row["video_path"], "video_path", where),
                                        where)
        duration = duration_field(row.get("duration"), "duration", where)
        lines = None
        if subtitles and row.get("subtitle_path"):
            sub = resolve_media_path(root, Path(subtitle_dir) / text_field(row["subtitle_path"], "subtitle_path", where),
                                     where)
            start = _subtitle_offset(row.get("starting_timestamp_for_subtitles"), where)
            dur = duration
            key = (str(sub), start, dur)
            if key not in cache:
                cache[key] = load_lvb_subtitles(sub, start, dur) if sub.is_file() else None
            lines = cache[key]
        meta = {"benchmark": "lvb", "duration_group": row.get("duration_group"),
                "question_category": row.get("question_category"), "level": row.get("level"),
                "duration": duration}
        if subtitles:
            meta["subtitles"] = bool(lines)
        questions.append(Question(
            qid=qid,
            video_id=text_field(row["video_id"], "video_id", where, numbers_ok=True),
            video_path=str(video_path),
            question=question,
            options=cands,
            answer=answer,
            meta=meta,
            subtitles=(subtitles_text(lines) or None) if lines else None,   # no header for blank lines (interleaved)
            subtitle_lines=list(lines) if lines else None,
        ))
        wheres.append(where)
    return check_questions(questions, wheres)
