"""Video-MME: the public parquet (``videomme/test-*.parquet``) and ``<root>/videos/<videoID>.mp4``.

Columns: ``video_id, duration, domain, sub_category, url, videoID, question_id, task_type, question, options,
answer``; ``options`` holds strings ``"A. text"``; ``answer`` is a letter.

Optional subtitles: ``<root>/subtitles/<videoID>.srt``, read as VideoLLaMA3's evaluation reads them (pysubs2,
:func:`~datamodules.benchmarks.subtitles.load_srt_as_videollama3`). Whether they were used is recorded in each
question's ``meta["subtitles"]`` (``True``: the video has an ``.srt``, even one whose cues are all blank;
``False``: the setting is on but the video has no file), since published Video-MME
numbers come in both settings. The option strings are also kept verbatim (``Question.option_lines``).
"""
from __future__ import annotations

import re
from pathlib import Path

from .base import (LETTERS, AnnotationError, Question, check_questions, options_field, resolve_media_path,
                   strip_option_letters, text_field, check_annotation_file, warn_options_beyond_rule)
from .base import log
from .subtitles import load_srt_as_videollama3, subtitles_text

BREAKDOWN_FIELDS = ("duration", "domain", "task_type")   # the score table's Video-MME breakdowns

COLUMNS = ("video_id", "duration", "domain", "sub_category", "videoID", "question_id", "task_type", "question",
           "options", "answer")
_LETTER_PREFIX = re.compile(r"^\s*([A-J])[.)]\s*")


def find_parquets(root: Path) -> list[Path]:
    """The annotation parquet files under ``root`` (``root`` itself may be a parquet file)."""
    if root.is_file():
        return [root]
    files = sorted(root.glob("*.parquet")) + sorted(root.glob("videomme/*.parquet"))
    if not files:
        raise AnnotationError(f"Video-MME: no *.parquet under {root} or {root / 'videomme'}")
    return files


def _rows(table, f: Path) -> list[dict]:
    """``table.to_pylist()``, with an invalid UTF-8 ``string`` cell (pyarrow's ``UnicodeDecodeError``, which names
    neither row nor column) reported as an :class:`AnnotationError` naming the file, row and field."""
    try:
        return table.to_pylist()
    except UnicodeDecodeError as e:
        for name in table.column_names:   # find the first bad cell: only on this error path, cell by cell
            start = 0
            for chunk in table.column(name).chunks:
                for j in range(len(chunk)):
                    try:
                        chunk[j].as_py()
                    except UnicodeDecodeError as cell:
                        i = start + j
                        try:
                            qid = table.column("question_id")[i].as_py()
                        except UnicodeDecodeError:
                            qid = "<not UTF-8>"
                        raise AnnotationError(f"{f} row {i} (question_id={qid!r}): {name} is not valid UTF-8 text "
                                              f"({cell.reason} at byte {cell.start})") from e
                start += len(chunk)
        raise AnnotationError(f"{f}: a text cell is not valid UTF-8 ({e})") from e


def load_videomme(root: Path, parquet: str | None = None, video_dir: str = "videos",
                  subtitles: bool = False, subtitle_dir: str = "subtitles") -> list[Question]:
    """Read Video-MME questions.

    Args:
        root: benchmark root (holds ``videos/`` and the parquet, or ``videomme/*.parquet``).
        parquet: explicit annotation file (default: discovered under ``root``).
        video_dir: folder of ``<videoID>.mp4`` relative to ``root``.
        subtitles: attach ``<root>/<subtitle_dir>/<videoID>.srt`` when it exists (``Question.subtitles`` text and
            ``Question.subtitle_lines`` timed lines in seconds); a video without a file gets none (``None``); a file with
            no non-blank cue gives ``""`` (and its lines), so its prompt still has the subtitle header.
        subtitle_dir: folder of the ``.srt`` files relative to ``root``.

    Raises:
        AnnotationError: an unreadable parquet, a missing column, a row with a mistyped or empty question,
            options or answer, fewer than 2 or more than 10 options, an answer outside the options, a duplicate
            question_id, a text cell that is not valid UTF-8, or a videoID whose path escapes ``root`` (file and row
            named; the field too for UTF-8); a malformed ``.srt`` (file and cue named). See :mod:`datamodules.benchmarks.base` for the per-case table.
    """
    import pyarrow.parquet as pq   # here, not at the top: off predict's import path until the annotation is read

    root = Path(root)
    files = [Path(parquet)] if parquet else find_parquets(root)
    questions: list[Question] = []
    wheres: list[str] = []
    subs_cache: dict[str, list | None] = {}
    for f in files:
        check_annotation_file(f, "Video-MME annotation file")
        try:
            # ParquetFile(...).read(), not pq.read_table: the same table from one file, without importing
            # pyarrow.dataset (which pulled pandas in on the GPU machine: ~0.3 s before the first decode)
            table = pq.ParquetFile(f).read()
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for unreadable files
            raise AnnotationError(f"{f}: not a readable parquet file ({type(e).__name__}: {e})") from e
        missing = [c for c in COLUMNS if c not in table.column_names]
        if missing:
            raise AnnotationError(f"{f}: missing column(s) {missing}")
        for i, row in enumerate(_rows(table, f)):
            where = f"{f} row {i} (question_id={row.get('question_id')!r})"
            qid = text_field(row["question_id"], "question_id", where, numbers_ok=True)
            question = text_field(row["question"], "question", where)
            released_options = options_field(row["options"], "options", where)
            options = strip_option_letters(released_options, where, _LETTER_PREFIX)
            raw_answer = row["answer"]
            if raw_answer is not None and not isinstance(raw_answer, str):
                raise AnnotationError(f"{where}: answer must be a letter, got {type(raw_answer).__name__} "
                                      f"{raw_answer!r}")
            answer = (raw_answer or "").strip() or None
            if answer is not None and answer not in LETTERS[: len(options)]:
                raise AnnotationError(f"{where}: answer {answer!r} is not one of {len(options)} option letters")
            vid = text_field(row["videoID"], "videoID", where, numbers_ok=True)
            video_path = resolve_media_path(root, Path(video_dir) / f"{vid}.mp4", where)
            lines = None
            if subtitles:
                if vid not in subs_cache:
                    srt = resolve_media_path(root, Path(subtitle_dir) / f"{vid}.srt", where)
                    subs_cache[vid] = load_srt_as_videollama3(srt) if srt.is_file() else None
                lines = subs_cache[vid]
            questions.append(Question(
                qid=qid,
                video_id=vid,
                video_path=str(video_path),
                question=question,
                options=options,
                answer=answer,
                meta={"benchmark": "videomme", "duration": row["duration"], "domain": row["domain"],
                      "sub_category": row["sub_category"], "task_type": row["task_type"],
                      **({"subtitles": lines is not None} if subtitles else {})},
                # a file whose cues are all blank (or that has none) still has subtitles: VideoLLaMA3@05cee23d
                # videomme.py prints its header whenever the .srt exists (``subtitles is not None``)
                subtitles=subtitles_text(lines) if lines is not None else None,
                subtitle_lines=list(lines) if lines is not None else None,
                option_lines=list(released_options),
            ))
            wheres.append(where)
    check_questions(questions, wheres)
    # thanku-all/parse_answer@afd52cfe eval_your_results.py extract_characters_regex: ``re.search(r"[ABCD]", s)``
    warn_options_beyond_rule(questions, wheres, 4, "Video-MME eval_your_results.py")
    for field in BREAKDOWN_FIELDS:   # said once per field, as the missing answers are
        blank = [w for q, w in zip(questions, wheres) if not str(q.meta.get(field) or "").strip()]
        if blank:
            log.warning("%d of %d questions have no %s (first: %s): their breakdown cell is 'unknown'",
                        len(blank), len(questions), field, blank[0])
    return questions
