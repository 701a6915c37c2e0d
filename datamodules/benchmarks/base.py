"""The record every benchmark loader yields, and the loader registry.

A loader reads a benchmark's public release files and returns a list of :class:`Question`. Videos are grouped
by the datamodule (one item per video, carrying all its questions), so a loader never decodes media.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

LETTERS = "ABCDEFGHIJ"


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


def resolve_media_path(root: str | Path, relative: str | Path, where: str) -> Path:
    """Absolute ``root / relative`` (not symlink-resolved), refusing paths that escape ``root``.

    Escapes are ``..`` components, absolute paths and symlinks pointing out of ``root``.

    Raises:
        AnnotationError: the path leaves ``root`` (``where`` names the annotation file and row).
    """
    root_r = Path(root).resolve()
    rel = str(relative)
    if not rel or Path(rel).is_absolute():
        raise AnnotationError(f"{where}: media path {rel!r} must be a non-empty path relative to {root}")
    path = (root_r / rel).resolve()
    if path != root_r and root_r not in path.parents:
        raise AnnotationError(f"{where}: media path {rel!r} escapes the benchmark root {root}")
    return Path(root).absolute() / rel


LOADERS: dict[str, Callable[..., list[Question]]] = {}


def register(name: str):
    """Decorator registering a loader ``fn(root: Path, **kwargs) -> list[Question]`` under ``name``."""

    def deco(fn):
        LOADERS[name] = fn
        return fn

    return deco


def load_benchmark(name: str, root: str | Path, **kwargs) -> list[Question]:
    """Load benchmark ``name`` from its release directory ``root``.

    Raises:
        KeyError: unknown benchmark name (the message lists the known ones).
        AnnotationError: a malformed annotation file or row (named in the message).
    """
    from . import videomme  # noqa: F401  (registration side effect)

    try:
        from . import lvb, mlvu, worldsense  # noqa: F401
    except ImportError:  # loaders not present yet
        pass
    if name not in LOADERS:
        raise KeyError(f"unknown benchmark {name!r}; known: {sorted(LOADERS)}")
    return LOADERS[name](Path(root), **kwargs)
