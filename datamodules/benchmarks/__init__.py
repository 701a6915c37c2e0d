"""Benchmark formats (Video-MME, MLVU dev, LongVideoBench val, WorldSense), their prompts, and the loader registry.

The registry is the explicit table :data:`LOADERS` (name -> loader ``fn(root: Path, **kwargs) -> list[Question]``);
each format module imports only ``base`` (and the ``subtitles`` helpers), so there is no import circle. A new
format is a module with its loader and one row here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from algorithms.errors import SettingError

from .base import LETTERS, AnnotationError, Question
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


__all__ = ["LETTERS", "LOADERS", "AnnotationError", "Question", "load_benchmark"]
