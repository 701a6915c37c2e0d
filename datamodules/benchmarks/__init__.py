"""Benchmark formats (Video-MME, MLVU dev, LongVideoBench val, WorldSense), their prompts, and the loader registry.

The registry is the explicit table :data:`LOADERS` (name -> loader ``fn(root: Path, **kwargs) -> list[Question]``);
each format module imports only ``base`` (and the ``subtitles`` helpers), so there is no import circle. A new
format is a module with its loader and one row here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from algorithms.errors import SettingError

from .base import LETTERS, AnnotationError, Question, question_sha1
from .lvb import load_lvb
from .mlvu import load_mlvu
from .videomme import load_videomme
from .worldsense import load_worldsense

LOADERS: dict[str, Callable[..., list[Question]]] = {
    "videomme": load_videomme,      # Video-MME (parquet release)
    "mlvu": load_mlvu,              # MLVU dev (json/ per task)
    "lvb": load_lvb,                # LongVideoBench val (lvb_val.json)
    "worldsense": load_worldsense,  # WorldSense (worldsense_qa.json)
}


def load_benchmark(name: str, root: str | Path, **kwargs) -> list[Question]:
    """Load benchmark ``name`` from its release directory ``root``.

    Raises:
        SettingError: unknown benchmark name (the message lists the known ones).
        AnnotationError: a malformed annotation file or row (named in the message).
    """
    if name not in LOADERS:
        raise SettingError(f"unknown benchmark {name!r}; known: {sorted(LOADERS)}")
    return LOADERS[name](Path(root), **kwargs)


# loader arguments that name a path relative to the benchmark root, and ones relative to the working directory
ROOT_RELATIVE = ("video_dir", "subtitle_dir", "json_dir", "annotation")
CWD_RELATIVE = ("parquet",)


def canonical_loader_kwargs(name: str, kwargs: dict | None) -> dict:
    """The loader arguments ``kwargs`` of benchmark ``name`` as the values the loader will use, so two spellings of
    one benchmark compare equal: every argument of the loader's signature with its default filled in, the
    root-relative folders and files (``ROOT_RELATIVE``) normalised (``videos``, ``./videos`` and ``videos/`` are one
    folder), a working-directory-relative ``parquet`` made absolute, tuples as lists (as JSON stores them).

    ``{}`` and ``{"video_dir": "videos"}`` of ``videomme`` both give ``{"parquet": None, "video_dir": "videos",
    "subtitles": False, "subtitle_dir": "subtitles"}``. An unknown benchmark, or arguments its loader does not take,
    are returned as given (the loader's own call reports them).

    The result is still a valid ``**kwargs`` of the loader (relative folders stay relative: the loaders refuse
    media paths outside the root).
    """
    import inspect
    import os

    kwargs = dict(kwargs or {})
    if name not in LOADERS:
        return kwargs
    params = list(inspect.signature(LOADERS[name]).parameters.values())[1:]   # after ``root``
    try:
        bound = inspect.Signature(params).bind(**kwargs)
    except TypeError:
        return kwargs
    bound.apply_defaults()
    out = {}
    for key, value in bound.arguments.items():
        if key in ROOT_RELATIVE and isinstance(value, (str, Path)) and str(value):
            value = os.path.normpath(str(value))
        elif key in CWD_RELATIVE and isinstance(value, (str, Path)) and str(value):
            value = str(Path(value).resolve())
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


__all__ = ["LETTERS", "LOADERS", "AnnotationError", "Question", "question_sha1", "canonical_loader_kwargs", "load_benchmark"]
