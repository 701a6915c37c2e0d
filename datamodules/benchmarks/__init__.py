"""Benchmark formats (Video-MME, MLVU dev, LongVideoBench val, WorldSense) and their prompts."""
from .base import LETTERS, AnnotationError, Question, load_benchmark, register

__all__ = ["LETTERS", "AnnotationError", "Question", "load_benchmark", "register"]
