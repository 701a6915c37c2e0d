"""Subtitle files of the benchmarks: Video-MME ``.srt`` and LongVideoBench's two JSON forms.

Every parser returns timed lines ``[(start_s, end_s, text), ...]`` in seconds of the *video file's* timeline,
sorted by ``(start_s, end_s)``; :func:`subtitles_text` joins them into the text shown with a question.
Interleaving subtitles with frames by time is done by the model input builder from these timed lines.
"""
from __future__ import annotations

import logging
import math
import re
from pathlib import Path

from .base import AnnotationError, load_json_annotation

TimedLine = tuple[float, float, str]
log = logging.getLogger(__name__)

_SRT_TIME = re.compile(
    r"(\d+):(\d{1,2}):(\d{1,2})(?:[,.](\d{1,3}))?\s*-->\s*(\d+):(\d{1,2}):(\d{1,2})(?:[,.](\d{1,3}))?"
)
_TAG = re.compile(r"<[^>]*>")            # <font color="#fff">, <i>, </b> ...
_ASS = re.compile(r"\{\\[^}]*\}")          # {\an8}, {\i1} (SSA override codes found in many .srt files)


def strip_markup(text: str) -> str:
    """Remove HTML-like tags (``<font ...>``, ``<i>``) and SSA override codes (``{\\an8}``); collapse spaces."""
    text = _ASS.sub("", _TAG.sub("", text))
    text = text.replace("&nbsp;", " ").replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    return " ".join(text.split())


def _hms(h: str, m: str, s: str, frac: str | None) -> float:
    ms = int((frac or "0").ljust(3, "0")[:3])
    return int(h) * 3600 + int(m) * 60 + int(s) + ms / 1000.0


def parse_srt(text: str, where: str = "<srt>") -> list[TimedLine]:
    """Parse SubRip text into timed lines (seconds), markup stripped, multi-line cues joined by a space.

    Cues whose text is empty after stripping are dropped. A cue without a ``-->`` timing line is skipped
    (common in hand-edited files); a timing line with end < start raises.

    Raises:
        AnnotationError: a cue whose end time precedes its start (``where`` and the cue number are named).
    """
    lines: list[TimedLine] = []
    blocks = re.split(r"\n\s*\n", text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff"))
    for b, block in enumerate(blocks):
        rows = [r for r in block.strip().split("\n") if r.strip()]
        for k, row in enumerate(rows):
            m = _SRT_TIME.search(row)
            if m:
                start = _hms(*m.group(1, 2, 3, 4))
                end = _hms(*m.group(5, 6, 7, 8))
                if end < start:
                    raise AnnotationError(f"{where}: cue {b + 1} ends ({end}s) before it starts ({start}s)")
                body = strip_markup(" ".join(rows[k + 1:]))
                if body:
                    lines.append((start, end, body))
                break
    return sorted(lines, key=lambda x: (x[0], x[1]))


def load_srt(path: str | Path) -> list[TimedLine]:
    """Read and parse an ``.srt`` file (UTF-8, BOM tolerated). Raises ``AnnotationError`` as :func:`parse_srt`."""
    path = Path(path)
    return parse_srt(path.read_text(encoding="utf-8-sig", errors="replace"), where=str(path))


def load_srt_as_videollama3(path: str | Path) -> list[TimedLine]:
    """A Video-MME ``.srt`` as VideoLLaMA3's evaluation reads it: ``pysubs2.load(subtitle_path, encoding="utf-8")``
    and, per cue, ``subtitle.text.replace("\\N", " ")`` (DAMO-NLP-SG/VideoLLaMA3@05cee23d:
    evaluation/benchmarks/videomme.py:VideoMMEDataset.load_data / generate_instruction).

    pysubs2 does the markup handling (``<i>`` -> ``{\\i1}``, other HTML tags removed, newlines -> ``\\N``); times are
    its integer milliseconds; cues stay in pysubs2's order (file order) and blank ones are kept, since the release
    takes the *first* cue covering a frame and only then skips a blank text (:func:`lines_at_frames`).

    Where the release would stop the whole evaluation, one file does not: bytes that are not UTF-8 are replaced
    (``errors="replace"``, the retry after the strict read, with a warning naming the file), and a file with no cue pysubs2 recognises
    (``FormatAutodetectionError``) has no lines. A cue ending before it starts is kept, as pysubs2 keeps it (it
    covers no frame).

    Raises:
        AnnotationError: the file cannot be read (file named).
    """
    import pysubs2

    try:
        try:
            subs = pysubs2.load(str(path), encoding="utf-8")
        except UnicodeDecodeError as e:
            log.warning("%s: not UTF-8 (byte 0x%02x at offset %d); read with U+FFFD in place of the bad bytes, where "
                        "VideoLLaMA3's evaluation (pysubs2.load(encoding='utf-8')) would stop; re-encode it as UTF-8 "
                        "for the released text", path, e.object[e.start], e.start)
            subs = pysubs2.load(str(path), encoding="utf-8", errors="replace")
    except pysubs2.exceptions.FormatAutodetectionError:
        return []
    except (OSError, ValueError, pysubs2.Pysubs2Error) as e:
        raise AnnotationError(f"{path}: unreadable subtitle file ({type(e).__name__}: {e})") from e
    return [(ev.start / 1000.0, ev.end / 1000.0, ev.text.replace("\\N", " ")) for ev in subs]


def hms_to_seconds(stamp: str) -> float:
    """``"HH:MM:SS.mmm"`` (or ``"MM:SS.mmm"``, or ``"SS.mmm"``; ``,`` accepted for ``.``) to seconds.

    Raises:
        ValueError: not a timestamp.
    """
    parts = str(stamp).strip().replace(",", ".").split(":")
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"not a timestamp: {stamp!r}")
    total = 0.0
    for p in parts:
        total = total * 60 + float(p)
    return total


def parse_lvb_subtitles(items: list, starting_timestamp_s: float = 0.0, duration_s: float | None = None,
                        where: str = "<lvb subtitles>") -> list[TimedLine]:
    """LongVideoBench subtitles (both public forms) as timed lines on the clip's own timeline.

    Forms (LongVideoBench's ``LongVideoBenchDataset`` reads the same two):

    * ``{"timestamp": [start_s, end_s], "text": "..."}`` (Whisper style; ``end_s`` may be ``null``: the line then
      lasts to ``duration_s``, or is a point at ``start_s`` when the duration is unknown);
    * ``{"start": "HH:MM:SS.mmm", "end": "HH:MM:SS.mmm", "line": "..."}``.

    Times are shifted by ``-starting_timestamp_s`` (the clip's offset inside the subtitled source video). Lines
    that end before 0 after the shift are dropped, starts are clamped to 0, times are rounded to 1 ms. The text is
    kept as released (markup, whitespace and empty lines included, as ``insert_subtitles_into_frames`` appends
    ``subtitle["text"]`` / ``subtitle["line"]``).

    Raises:
        AnnotationError: an item in neither form, or with unreadable times (``where`` and the item index named).
    """
    if not isinstance(items, list):
        raise AnnotationError(f"{where}: expected a JSON list of subtitle items, got {type(items).__name__}")
    out: list[TimedLine] = []
    for i, it in enumerate(items):
        try:
            if isinstance(it, dict) and "timestamp" in it:
                start, end = it["timestamp"]
                start = float(start)
                end = float(end) if end is not None else (float(duration_s) + starting_timestamp_s
                                                          if duration_s is not None else start)
                text = it.get("text", "")
            elif isinstance(it, dict) and "start" in it and "end" in it:
                start, end = hms_to_seconds(it["start"]), hms_to_seconds(it["end"])
                text = it.get("line", it.get("text", ""))
            else:
                raise AnnotationError(f"{where}: item {i} is neither {{timestamp, text}} nor {{start, end, line}}")
            if not (math.isfinite(start) and math.isfinite(end)):   # NaN / Infinity: no place among the frames
                raise ValueError(f"start {start}, end {end} (not finite)")
        except (TypeError, ValueError) as e:
            raise AnnotationError(f"{where}: item {i} has unreadable times: {e}") from e
        start -= starting_timestamp_s
        end -= starting_timestamp_s
        if end < 0:
            continue
        # the text as released: VideoLLaMA3@05cee23d longvideobench.py insert_subtitles_into_frames appends
        # ``subtitle["text"]`` / ``subtitle["line"]`` unchanged (no markup or whitespace normalisation)
        body = "" if text is None else str(text)
        out.append((round(max(start, 0.0), 3), round(end, 3), body))
    return sorted(out, key=lambda x: (x[0], x[1]))


def load_lvb_subtitles(path: str | Path, starting_timestamp_s: float = 0.0,
                       duration_s: float | None = None) -> list[TimedLine]:
    """Read a LongVideoBench subtitle JSON file; see :func:`parse_lvb_subtitles`.

    Raises:
        AnnotationError: invalid JSON or items (the file is named).
    """
    path = Path(path)
    items = load_json_annotation(path, "subtitle file")
    return parse_lvb_subtitles(items, starting_timestamp_s, duration_s, where=str(path))


def subtitles_text(lines: list[TimedLine]) -> str:
    """Subtitle lines as one text ordered by time, one line per cue, blank cues and consecutive duplicates removed."""
    out: list[str] = []
    for _, _, text in sorted(lines, key=lambda x: (x[0], x[1])):
        if text.strip() and (not out or out[-1] != text):
            out.append(text)
    return "\n".join(out)


def lines_at_frames(lines: list[TimedLine], frame_times_s: list[float]) -> str:
    """The subtitle text of the sampled frames, as VideoLLaMA3's Video-MME evaluation builds it.

    DAMO-NLP-SG/VideoLLaMA3@05cee23deb854fd6ff82dcff1243a4f682e4d617 evaluation/benchmarks/videomme.py
    ``VideoMMEDataset.generate_instruction``: per frame time ``t`` (in order), the first cue with
    ``subtitle.start < t * 1000 < subtitle.end`` (pysubs2 times, integer ms; strict on both sides), its text with
    ``\\N`` as a space; a frame without one adds nothing; texts joined by ``"\\n"``, with no de-duplication (a cue
    covering three frames appears three times).

    Args:
        lines: timed lines (:func:`load_srt_as_videollama3`; seconds of integer ms, in the file's order).
        frame_times_s: the times (s) of the frames the model sees.

    Returns:
        The text (``""`` when no frame falls inside a cue).
    """
    ms = [(round(a * 1000), round(b * 1000), text) for a, b, text in lines]
    out = []
    for t in frame_times_s:
        for a, b, text in ms:
            if a < t * 1000 < b:
                if text.strip():
                    out.append(text)
                break
    return "\n".join(out)


def interleave_slots(lines: list[TimedLine], frame_times_s: list[float]) -> list[list[str]]:
    """Where LongVideoBench places each subtitle line among the frames: ``slots[k]`` are the texts that go right
    before frame ``k`` (``slots[T]``: after the last frame), in subtitle order.

    Follows ``insert_subtitles_into_frames`` of DAMO-NLP-SG/VideoLLaMA3@05cee23deb854fd6ff82dcff1243a4f682e4d617
    evaluation/benchmarks/longvideobench.py (the same function as LongVideoBench's own dataset and lmms-eval@75571cfe
    lmms_eval/tasks/longvideobench/utils.py): per line, with ``mid = (start + end) / 2``, every not yet placed frame
    with ``t <= mid`` goes first; a line shorter than 1 s is widened to ``mid ± 0.5`` for the next test only; the
    line is kept iff some frame has ``start < t < end`` (strict), else left out.

    The lines are :func:`parse_lvb_subtitles`'s (already shifted by ``starting_timestamp_for_subtitles``); where
    that parser departs from the release's inline reading (a ``null`` end, lines before 0, time order) the
    placement follows the parsed lines.
    """
    slots: list[list[str]] = [[] for _ in range(len(frame_times_s) + 1)]
    cur = 0
    for start, end, text in lines:
        mid = (start + end) / 2
        while cur < len(frame_times_s) and frame_times_s[cur] <= mid:
            cur += 1
        if end - start < 1:
            start, end = mid - 0.5, mid + 0.5
        if any(start < t < end for t in frame_times_s):
            slots[cur].append(text)
    return slots
