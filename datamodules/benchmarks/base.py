"""The record every benchmark loader yields and the row checks every loader runs (the registry is ``__init__``).

A loader reads a benchmark's public release files and returns a list of :class:`Question`. Videos are grouped
by the datamodule (one item per video, carrying all its questions), so a loader never decodes media.

Validation (issue 8). Every loader checks its rows before a run starts and raises :class:`AnnotationError`
naming the file and the row (and the row's id when it has one) on the first bad row; nothing is silently dropped,
so a malformed release costs seconds, not a GPU run. Per case (tests in ``tests/datamodules/test_bad_annotations.py``):

======================================  ==========================================================================
case                                    behaviour
======================================  ==========================================================================
missing field / column                  error (file and row, or the missing column)
mistyped field (question not text,      error ``<field> must be text, got <type>`` (numbers are accepted as option
options not a list, answer not a        text, e.g. MLVU's counting candidates; booleans, null, lists, objects are
letter / index)                         not)
empty or blank question, empty option   error
duplicate qid                           error naming both rows
answer not among the options            error
zero or one option                      error (a multiple-choice question needs at least 2); WorldSense: that
                                        question's error (``Question.error``, its records are error records)
many options                            error above 10 (letters A-J) or above the benchmark's own count
                                        (LongVideoBench 5); WorldSense above 10: that question's error
no answer (test splits), an empty or    accepted: ``answer = None``; one warning with the count and the first
blank one                               row; records are left out of ``n_scored`` and counted (``n_no_answer``)
a NaN or infinite number as text        error (a NaN option would become the text ``'nan'``)
a duration NaN, negative or not a       error (LongVideoBench, MLVU ``duration``)
number
a subtitle offset NaN, infinite or     error (LongVideoBench ``starting_timestamp_for_subtitles``; absent: 0 s)
not a number
more options than the released rule     accepted; one warning with the count (Video-MME, WorldSense: the regex
reads (> 4)                             reads ``[ABCD]``, E-J never credited under the official parser)
non-Latin / right-to-left text          accepted verbatim (no normalisation); the prompt carries it unchanged
model special tokens in a question,     accepted verbatim: the model tokenizes dataset text with
option or subtitle                      ``split_special_tokens=True``, so it can neither add a vision placeholder
                                        nor end the user turn (``models.videollama3.layout``)
malformed subtitles                     error naming the subtitle file and cue / item (``subtitles.py``); an
                                        ``.srt`` with no timed cue at all gives no lines (Video-MME still
                                        prints the header over nothing: the file exists)
media path no file can have             error for the annotation text: a NUL byte, a name over 255 bytes (a
                                        300-character videoID)
annotation file not a regular file      error saying what it is: a FIFO (never read: it would wait), a
                                        symbolic link loop, a broken link, a folder, a device
JSON nested beyond the recursion limit  error ``invalid JSON: nested too deeply`` (no ``RecursionError``)
media path escaping the root            error for the annotation text: an absolute path or a ``..`` component.
                                        Symbolic links under the root are followed, also out of it (the user's
                                        own layout, e.g. ``videos/`` linked to other storage)
invalid UTF-8 text                      error naming the file, row and field (a Video-MME parquet ``string``
                                        cell); a JSON annotation file that is not UTF-8: error naming the file
                                        and the byte offset; a JSON ``\\ud800``-style escape of half a
                                        surrogate pair: error naming the file and the JSON path (row, field)
media file missing or unreadable        not an annotation error: one error record per question at decode time;
                                        but when more than half of the videos are missing or empty (a wrong
                                        root or video folder, an unfinished copy) the run stops before it writes
                                        anything
                                        (:func:`check_media_present`, called by the datamodule's setup)
======================================  ==========================================================================
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LETTERS = "ABCDEFGHIJ"
log = logging.getLogger(__name__)
MIN_OPTIONS = 2


class AnnotationError(ValueError):
    """A benchmark annotation file or row is malformed; the message names the file and the row."""


@dataclass
class Question:
    """One multiple-choice question.

    Attributes:
        qid: the benchmark's own question id (stable across runs; records are keyed by it).
        video_id: the benchmark's id of the video (questions sharing it share one decode).
        video_path: absolute path of the video file.
        question: question text, exactly as released.
        options: option texts *without* their letters, in release order (option i has letter ``LETTERS[i]``).
        answer: the correct letter (``"A"``...), or ``None`` when the release has no answer.
        meta: breakdown fields (duration group, domain, task type...), JSON-serialisable.
        subtitles: subtitle text to show with the question, or ``None``.
        subtitle_lines: the same subtitles as timed lines ``[(start_s, end_s, text), ...]`` on the video's
            timeline, sorted by time (for interleaving with frames), or ``None``.
        option_lines: the options exactly as the release writes them (Video-MME's ``"A. text"`` strings of the
            parquet), for the prompts that print them verbatim; ``None`` when the release has only the texts.
        error: why this one question cannot be asked (a WorldSense row with 1 or more than 10 options), naming the
            file and row; the runs write its error records instead of answering it, the rest of the file goes on.
            ``None`` for a good question.
    """

    qid: str
    video_id: str
    video_path: str
    question: str
    options: list[str]
    answer: str | None
    meta: dict[str, Any] = field(default_factory=dict)
    subtitles: str | None = None
    subtitle_lines: list[tuple[float, float, str]] | None = None
    option_lines: list[str] | None = None
    error: str | None = None


def question_sha1(text: str) -> str:
    """The first 16 hex digits of the SHA-1 of a question's text (UTF-8), kept in each answered record
    (``question_sha1``) so that a resumed run can tell a reworded question from the one its record answered
    (:func:`datamodules.videoqa.annotation_changes`) without the records carrying the text."""
    import hashlib

    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


class MediaMissingError(AnnotationError):
    """Most of a benchmark's video files are not where the annotation and the settings put them."""


MAX_MISSING_MEDIA_FRAC = 0.5


def _exists(path: str) -> bool:
    """Whether ``path`` names something (``Path.exists``, but ``False`` instead of an ``OSError`` for a name too
    long, or a ``ValueError`` for a NUL byte)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def _is_empty_file(path: str) -> bool:
    """Whether ``path`` is a regular file of 0 bytes (``False`` for anything :func:`os.stat` cannot read)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def check_media_present(questions: list["Question"], where: str, max_missing_frac: float = MAX_MISSING_MEDIA_FRAC
                        ) -> list[str]:
    """Check that the questions' video files exist before a run writes anything.

    A few missing files are the run's business (one error record per question, the run goes on); none or most
    present is a wrong root or video folder (e.g. a new ``root`` that kept another layout's ``video_dir``), which
    would otherwise "succeed" with nothing but error records. Empty files (0 bytes: a copy or download that did not
    finish) count with the missing ones here, as no video can be read from them.

    Args:
        questions: a loader's questions.
        where: what to name in the error (the benchmark and its settings).
        max_missing_frac: the share of distinct videos that may be missing.

    Returns:
        The missing video paths (at most ``max_missing_frac`` of them).

    Raises:
        MediaMissingError: more than ``max_missing_frac`` of the distinct videos are missing or empty; one line
            naming the folder(s) they were looked for in, how many are missing (and empty) and one example.
    """
    videos = list(dict.fromkeys(q.video_path for q in questions))
    missing = [v for v in videos if not _exists(v)]
    empty = [v for v in videos if v not in missing and _is_empty_file(v)]   # 0 bytes: no video can be read
    bad = missing + empty
    if videos and len(bad) > max_missing_frac * len(videos):
        folders = sorted({str(Path(v).parent) for v in bad})
        folder = folders[0] if len(folders) == 1 else f"{folders[0]} (and {len(folders) - 1} other folders)"
        if not empty:
            raise MediaMissingError(
                f"{where}: {len(missing)} of {len(videos)} videos are missing from {folder} (e.g. "
                f"{Path(missing[0]).name}); check data.init_args.root and data.init_args.loader_kwargs (video_dir)")
        raise MediaMissingError(
            f"{where}: {len(bad)} of {len(videos)} videos in {folder} cannot be read: {len(empty)} empty file{'s' * (len(empty) != 1)} "
            f"(0 bytes, e.g. {Path(empty[0]).name}; a copy or download that did not finish?)"
            + (f" and {len(missing)} missing (e.g. {Path(missing[0]).name})" if missing else "")
            + "; check the files, data.init_args.root and data.init_args.loader_kwargs (video_dir)")
    return missing


def path_problem(path: str | Path, want: str = "file") -> str | None:
    """Why ``path`` is not a readable regular file (``want="file"``) or folder (``want="folder"``), in words, or
    ``None`` when it is one (or a symbolic link to one).

    Told apart: not found, a broken symbolic link (its target named), a symbolic link loop, a name the file
    system cannot hold (too long), a named pipe (FIFO: reading it would wait for a writer), a socket, a device, a
    folder where a file is wanted and the other way round, a file whose permissions refuse reading."""
    try:
        st = os.stat(path)
    except ValueError:
        return "not a usable path (it holds a NUL byte)"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"a symbolic link loop (its links lead back to themselves); point it at the real {want}"
        if e.errno == errno.ENAMETOOLONG:
            return "a name longer than the file system allows"
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            if os.path.islink(path):
                return f"a broken symbolic link (to {os.readlink(path)}, which does not exist)"
            return "not found"
        return f"not readable ({e.strerror})"
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return None if want == "file" else "a file, not a folder"
    if stat.S_ISDIR(mode):
        return None if want == "folder" else "a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO), not a regular file: reading it would wait for a writer; give the file itself"
    if stat.S_ISSOCK(mode):
        return "a socket, not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a regular file"
    return "not a regular file"


def check_annotation_file(path: Path, what: str = "annotation file") -> None:
    """Refuse an annotation ``path`` that is not a readable regular file, naming what it is (:func:`path_problem`)
    instead of a hang on a FIFO or "not found" for a symbolic link loop.

    Raises:
        AnnotationError: ``<path>: <what> is <problem>`` (a relative path also shown as the absolute one looked at).
    """
    problem = path_problem(path)
    if problem is not None:
        shown = path if Path(path).is_absolute() else f"{path} (looked for at {Path(path).absolute()})"
        raise AnnotationError(f"{shown}: {what} is {problem}" if not problem.startswith("not ")
                              else f"{shown}: {what} {problem}")


def _unpaired_surrogate(obj) -> str | None:
    """Where in ``obj`` (a loaded JSON value) the first text holding an unpaired UTF-16 surrogate is, as its JSON
    path (``[3].candidates[1]``; an object key: ``[3] key 2``), else ``None``. Walked without recursion."""
    def shown(key: str) -> str:   # printable even when the key itself is the bad text
        return key.encode("utf-8", "backslashreplace").decode("utf-8")

    stack = [("", obj)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return where or "the top-level text"
        elif isinstance(x, dict):
            for j, (k, v) in reversed(list(enumerate(x.items()))):
                stack.append((f"{where}.{shown(k)}" if where else shown(k), v))
                stack.append((f"{where} key {j}", k))
        elif isinstance(x, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(x))))
    return None


def load_json_annotation(path: Path, what: str = "annotation file"):
    """``json.loads`` of a UTF-8 annotation file, every failure one :class:`AnnotationError` naming the file:
    not a regular file (:func:`check_annotation_file`), not UTF-8 (byte offset), invalid JSON, nested deeper than
    the parser's recursion limit (a ``RecursionError`` otherwise), a ``\\ud800``-style escape of half a UTF-16
    surrogate pair (valid JSON syntax, but no text: the tokenizer refused it with a ``TypeError`` when the question
    was asked, which stopped the run as a bug), named by its JSON path."""
    check_annotation_file(path, what)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AnnotationError(f"{path}: invalid JSON: {e}") from e
    except RecursionError as e:
        raise AnnotationError(f"{path}: invalid JSON: nested too deeply (arrays or objects inside each other "
                              f"beyond Python's recursion limit, {sys.getrecursionlimit()}); no "
                              "benchmark annotation nests more than a few levels") from e
    except OSError as e:
        raise AnnotationError(f"{path}: {what} not readable ({e.strerror or e})") from e
    bad = _unpaired_surrogate(data)
    if bad is not None:
        raise AnnotationError(f"{path}: invalid JSON text: {bad} holds an escape of half a UTF-16 surrogate pair "
                              "(\\ud800-\\udfff without its other half), which is no character; fix that string")
    return data


# the longest name of one path component most file systems hold (ext4, xfs, btrfs, tmpfs: NAME_MAX = 255 bytes)
NAME_MAX = 255


def resolve_media_path(root: str | Path, relative: str | Path, where: str) -> Path:
    """``root / relative`` for a media path taken from annotation text, refusing paths that leave ``root``.

    Refused: an empty or absolute path, and any ``..`` component (checked on the text, so annotation text alone
    can never name a file outside the benchmark root). Symbolic links are the user's own layout and are followed:
    a ``videos/`` folder linked to other storage works.

    Raises:
        AnnotationError: the path is empty, absolute or has a ``..`` component (``where`` names the annotation
            file and row).
    """
    rel = str(relative)
    if not rel or Path(rel).is_absolute():
        raise AnnotationError(f"{where}: media path {rel!r} must be a non-empty path relative to {root}")
    if ".." in Path(rel).parts:
        raise AnnotationError(f"{where}: media path {rel!r} escapes the benchmark root {root} (a '..' component)")
    if "\0" in rel:
        raise AnnotationError(f"{where}: media path {rel!r:.120} holds a NUL byte, which no file name can; fix the "
                              "row's video id")
    for part in Path(rel).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise AnnotationError(f"{where}: media path component {part[:40]!r}... is {len(os.fsencode(part))} bytes; "
                                  f"a file name holds at most {NAME_MAX}, so no video can be there; fix the row's "
                                  "video id")
    return Path(root).absolute() / rel


def text_field(value: Any, name: str, where: str, numbers_ok: bool = False, empty_ok: bool = False) -> str:
    """``value`` as text, refusing mistyped values.

    Args:
        numbers_ok: accept ``int``/``float`` (not ``bool``) and turn them into text.
        empty_ok: accept an empty or blank string.

    Raises:
        AnnotationError: ``value`` is not a string (nor an accepted number), is NaN or infinite, or is blank
            (``where`` named).
    """
    if isinstance(value, str):
        text = value
    elif numbers_ok and isinstance(value, float) and not math.isfinite(value):
        # a NaN cell (a list<double> options column, a JSON NaN candidate) would become the option text 'nan'
        raise AnnotationError(f"{where}: {name} is {value} (not a number), not a text; fix the row")
    elif numbers_ok and isinstance(value, (int, float)) and not isinstance(value, bool):
        text = str(value)
    elif value is None:
        raise AnnotationError(f"{where}: {name} is missing (null); fix the row")
    else:
        raise AnnotationError(f"{where}: {name} must be text, got {type(value).__name__} {value!r:.80}")
    if not empty_ok and not text.strip():
        raise AnnotationError(f"{where}: {name} is empty")
    return text


def strip_option_letters(options: list[str], where: str, prefix: "re.Pattern[str]") -> list[str]:
    """Option texts without their ``A.``-style letters (``prefix`` captures the letter); a letter out of order or an
    option with no text after its letter is an :class:`AnnotationError` naming ``where``."""
    out = []
    for j, opt in enumerate(options):
        m = prefix.match(opt)
        if m and m.group(1) != LETTERS[j]:
            raise AnnotationError(f"{where}: option {j} is lettered {m.group(1)!r}, expected {LETTERS[j]!r}")
        body = opt[m.end():] if m else opt
        if not body.strip():
            raise AnnotationError(f"{where}: option {j} is empty")
        out.append(body)
    return out


def duration_field(value: Any, name: str, where: str) -> float | None:
    """An annotation's duration in seconds: ``None`` when absent, else a finite number >= 0.

    Raises:
        AnnotationError: NaN, infinite, negative, or not a number (``where`` named): it would order the videos by
            a NaN cost and be written into every record's ``meta``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise AnnotationError(f"{where}: {name} must be a number of seconds >= 0, got {type(value).__name__} "
                              f"{value!r:.80}")
    return value


def options_field(value: Any, name: str, where: str, min_n: int = MIN_OPTIONS, max_n: int = len(LETTERS)) -> list:
    """``value`` checked to be a list of ``min_n..max_n`` option texts (numbers accepted); returns it as strings.

    Raises:
        AnnotationError: not a list, too few or too many options, or a mistyped or empty option (``where`` named).
    """
    if not isinstance(value, (list, tuple)):
        raise AnnotationError(f"{where}: {name} must be a list of {min_n}..{max_n} option texts, "
                              f"got {type(value).__name__} {value!r:.80}")
    if not min_n <= len(value) <= max_n:
        raise AnnotationError(f"{where}: {name} has {len(value)} options; expected {min_n}..{max_n}"
                              + (" (a multiple-choice question needs at least 2)" if len(value) < 2 else ""))
    return [text_field(v, f"option {j}", where, numbers_ok=True) for j, v in enumerate(value)]


def warn_options_beyond_rule(questions: list[Question], wheres: list[str], n_letters: int, rule: str) -> int:
    """Warn once when questions have more options than the benchmark's released rule can ever credit (Video-MME's
    and WorldSense's regexes read only ``[ABCD]``: ``algorithms.choice``), with their count and the first row;
    returns that count. Such rows are asked as released (the robust parser reads every letter)."""
    beyond = [w for q, w in zip(questions, wheres) if q.error is None and len(q.options) > n_letters]
    if beyond:
        log.warning("%d questions have more than %d options (first: %s): the official rule (%s) reads only %s, so an "
                    "answer %s is never credited under it; the robust parser reads every letter", len(beyond),
                    n_letters, beyond[0], rule, LETTERS[:n_letters], "-".join((LETTERS[n_letters], LETTERS[-1])))
    return len(beyond)


def check_questions(questions: list[Question], wheres: list[str]) -> list[Question]:
    """Checks every loader's output: qid, question and option texts, answer letter, unique qids.

    Args:
        questions: a loader's questions.
        wheres: for each question, its file and row (for messages).

    Raises:
        AnnotationError: a blank qid or question, fewer than 2 or more than 10 options, an answer that is not one
            of the option letters, or a qid used twice (both rows named).
    """
    seen: dict[str, str] = {}
    unanswered = [w for q, w in zip(questions, wheres) if q.answer is None and q.error is None]
    if unanswered:   # asked and written, but scoring leaves them out of n: said once, not per question
        log.warning("%d of %d questions have no answer (empty, blank or missing; first: %s): they are asked, but "
                    "the scores leave them out (scores.json: n_no_answer)", len(unanswered), len(questions),
                    unanswered[0])
    for q, where in zip(questions, wheres):
        text_field(q.qid, "qid", where)
        text_field(q.question, "question", where)
        if q.error is not None:      # a question the loader turned into its own error (it is never asked)
            pass
        elif not MIN_OPTIONS <= len(q.options) <= len(LETTERS):
            raise AnnotationError(f"{where}: {len(q.options)} options; expected {MIN_OPTIONS}..{len(LETTERS)}")
        if q.error is None and q.answer is not None and q.answer not in LETTERS[: len(q.options)]:
            raise AnnotationError(f"{where}: answer {q.answer!r} is not one of {len(q.options)} option letters")
        if q.qid in seen:
            raise AnnotationError(f"{where}: duplicate qid {q.qid!r} (first at {seen[q.qid]})")
        seen[q.qid] = where
    return questions
