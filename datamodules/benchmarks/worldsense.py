"""WorldSense: ``<root>/worldsense_qa.json`` and videos ``<root>/videos/<video_id>.mp4`` (audio from the video).

Accepted annotation shapes:

1. The public release (``worldsense_qa.json``): an object keyed by video id, each value
   ``{"video_id"?, "domain", "sub_category"?, "duration"?, "audio_class"?, ..., "task0": Q, "task1": Q, ...}``
   where ``Q = {"question", "candidates": ["A. text", "B. text", "C. text", "D. text"], "answer": "B",
   "task_domain"?, "task_type"}``. qid = ``<video_id>_<taskK>``.
2. A flat JSON list of ``{"video_id", "question", "candidates" | "options", "answer", "domain", "task_type",
   "qid"? | "question_id"?, "task_domain"?, "sub_category"?, "duration"?}``; qid defaults to
   ``<video_id>_<index>``.

Options may carry ``"A. "`` letters (checked against their position) or not; the release has 4, and any count
of 2..10 is accepted (as lmms-eval's scorer takes 3-option rows), the answer being one of the row's letters. A row
with 1 option or more than 10 is that question's error (``Question.error``: its records are error records naming
the file and row), not the file's: the other questions are asked.
"""
from __future__ import annotations

import re
from pathlib import Path

from .base import (LETTERS, MIN_OPTIONS, AnnotationError, Question, check_questions, options_field,
                   resolve_media_path, strip_option_letters, text_field, load_json_annotation, warn_options_beyond_rule)

_LETTER_PREFIX = re.compile(r"^\s*\(?([A-J])[.):]\s*")
NUM_OPTIONS = 4   # the release's count; others are accepted (lmms-eval's scorer takes 3-option rows too)


def _options(raw, where: str) -> tuple[list[str], list[str]]:
    """(option texts without letters, the release's strings). Any count of 2..10 is accepted: lmms-eval@75571cfe
    worldsense/utils.py:worldsense_process_results scores a row by its own candidates (``if len(options) == 3``),
    so one odd row does not refuse the file."""
    released = options_field(raw, "options", where)
    return strip_option_letters(released, where, _LETTER_PREFIX), released


def _answer(raw, where: str, n_options: int) -> str:
    letters = LETTERS[:n_options]
    if not isinstance(raw, str):
        raise AnnotationError(f"{where}: answer must be a letter A-{letters[-1]}, got {type(raw).__name__} "
                              f"{raw!r:.80}")
    a = raw.strip().strip("().").upper()
    if a not in letters:
        raise AnnotationError(f"{where}: answer {raw!r} is not a letter A-{letters[-1]}")
    return a


def load_worldsense(root: Path, annotation: str = "worldsense_qa.json", video_dir: str = "videos") -> list[Question]:
    """Read WorldSense questions (either shape of the module docstring).

    Returns:
        Questions (videos in file order, tasks in ``task0, task1...`` order); ``meta = {benchmark, domain,
        sub_category, task_domain, task_type, duration[, audio_class]}`` (``audio_class`` from the question, else
        the video, when the annotation has it).

    Raises:
        AnnotationError: invalid JSON, an unknown shape, a question with an answer outside its letters, a
            missing, mistyped or empty question/task_type/option, a duplicate qid, or a video path escaping ``root``
            (file and row named). A row with 1 or more than 10 options is no file error: that question carries
            ``error`` (its records are error records).
    """
    root = Path(root)
    f = root / annotation
    data = load_json_annotation(f, "WorldSense annotation file")

    items: list[tuple[str, str, dict, dict]] = []  # (qid, where, video-level fields, question fields)
    if isinstance(data, dict):
        for key, video in data.items():
            if not isinstance(video, dict):
                raise AnnotationError(f"{f} video {key!r}: expected an object")
            vid = str(video.get("video_id") or key)
            tasks = sorted((k for k in video if re.fullmatch(r"task\d+", k)), key=lambda k: int(k[4:]))
            if not tasks:
                raise AnnotationError(f"{f} video {key!r}: no task<k> entries")
            for k in tasks:
                items.append((f"{vid}_{k}", f"{f} video {key!r} {k}", {**video, "video_id": vid}, video[k]))
    elif isinstance(data, list):
        for i, row in enumerate(data):
            if not isinstance(row, dict) or "video_id" not in row:
                raise AnnotationError(f"{f} row {i}: expected an object with a video_id")
            qid = str(row.get("qid") or row.get("question_id") or f"{row['video_id']}_{i}")
            items.append((qid, f"{f} row {i}", row, row))
    else:
        raise AnnotationError(f"{f}: expected an object keyed by video id or a list of questions")

    questions: list[Question] = []
    for qid, where, video, q in items:
        if not isinstance(q, dict) or not q.get("question"):
            raise AnnotationError(f"{where}: missing question")
        if not q.get("task_type"):
            raise AnnotationError(f"{where}: missing task_type")
        question = text_field(q["question"], "question", where)
        vid = text_field(video["video_id"], "video_id", where, numbers_ok=True)
        video_path = resolve_media_path(root, Path(video_dir) / f"{vid}.mp4", where)
        raw = q.get("candidates", q.get("options"))
        error = None
        if isinstance(raw, (list, tuple)) and not MIN_OPTIONS <= len(raw) <= len(LETTERS):
            # one odd row is this question's error, not the file's (the run writes its error records)
            error = (f"{where}: {len(raw)} option{'s' if len(raw) != 1 else ''}; a multiple-choice question needs "
                     f"{MIN_OPTIONS}..{len(LETTERS)} (letters A-{LETTERS[-1]})")
            released = [text_field(v, f"option {j}", where, numbers_ok=True, empty_ok=True)
                        for j, v in enumerate(raw)]
            options, answer = released, (q.get("answer").strip() or None) if isinstance(q.get("answer"), str) else None
        else:
            options, released = _options(raw, where)
            answer = _answer(q.get("answer"), where, len(options))
        questions.append(Question(
            qid=qid,
            video_id=vid,
            video_path=str(video_path),
            question=question,
            options=options,
            answer=answer,
            error=error,
            meta={"benchmark": "worldsense", "domain": video.get("domain"),
                  "sub_category": video.get("sub_category"), "task_domain": q.get("task_domain"),
                  "task_type": q["task_type"], "duration": video.get("duration"),
                  # VLMEvalKit's get_dimension_rating rates by audio class (a list per question), when released
                  **({"audio_class": q.get("audio_class", video.get("audio_class"))}
                     if q.get("audio_class", video.get("audio_class")) is not None else {})},
            option_lines=list(released),
        ))
    wheres = [w for _, w, _, _ in items]
    check_questions(questions, wheres)
    # VLMEvalKit@e8e78f05 worldsense.py extract_characters_regex: ``re.search(r"[ABCD]", s)``
    warn_options_beyond_rule(questions, wheres, 4, "VLMEvalKit WorldSense")
    return questions
