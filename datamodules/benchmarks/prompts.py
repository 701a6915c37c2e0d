"""Prompt templates per benchmark, in one place. The template name goes into each record's meta.

Every template shows the options as ``A. text`` lines and closes with an instruction to answer with the letter.
Templates follow each benchmark's published evaluation prompt where one exists (Video-MME's
``"Select the best answer ... Respond with only the letter (A, B, C, or D) of the correct option."``; LongVideoBench's and MLVU's lmms-eval prompts
``"Answer with the option's letter from the given choices directly."``; WorldSense's VLMEvalKit prompt), with the
options always as ``A. text`` lines so that the two answer parsers see the same layout everywhere.

Use :func:`template_for` to pick the template of a benchmark, and :func:`prompt_and_template` to get the text and
the name to write into ``record["meta"]["template"]`` in one call.
"""
from __future__ import annotations

from algorithms.errors import SettingError

from .base import LETTERS, Question

_MCQ_LETTER = (
    "{subtitles}Select the best answer to the following multiple-choice question based on the video. "
    "Respond with only the letter of the correct option.\n{question}\n{options}\nThe best answer is:"
)

TEMPLATES = {
    # generic: Video-MME's wording without its "(A, B, C, or D)", since MLVU and LongVideoBench have 2-6 options
    "mcq_letter": _MCQ_LETTER,
    # Video-MME's evaluation prompt as its repository gives it (always 4 options)
    "videomme": _MCQ_LETTER.replace("the letter of", "the letter (A, B, C, or D) of"),
    "mlvu": (
        "{subtitles}Question: {question}\nOptions:\n{options}\n"
        "Answer with the option's letter from the given choices directly. Only give the best option."
    ),
    "lvb": (
        "{subtitles}Question: {question}\n{options}\n"
        "Answer with the option's letter from the given choices directly."
    ),
    "worldsense": (
        "{subtitles}Carefully watch this video and listen to its audio. "
        "Select the best answer to the following multiple-choice question based on the video and the audio. "
        "Respond with only the letter (A, B, C, or D) of the correct option.\n{question}\n{options}\n"
        "The best answer is:"
    ),
}

BENCHMARK_TEMPLATES = {"videomme": "videomme", "mlvu": "mlvu", "lvb": "lvb", "worldsense": "worldsense"}
DEFAULT_TEMPLATE = "mcq_letter"


def check_template(template: str | None) -> None:
    """Raise :class:`~algorithms.errors.SettingError` unless ``template`` is a name in :data:`TEMPLATES` or
    ``None`` (each benchmark's own)."""
    if template is not None and template not in TEMPLATES:
        raise SettingError(f"prompt_template {template!r} is unknown; known: {sorted(TEMPLATES)}, or null for each "
                           "benchmark's own")


def template_for(benchmark: str | None) -> str:
    """Name of the template used for ``benchmark`` ("videomme", "mlvu", "lvb", "worldsense"); unknown or
    ``None`` gives the generic ``"mcq_letter"``."""
    return BENCHMARK_TEMPLATES.get(benchmark or "", DEFAULT_TEMPLATE)


def format_options(options: list[str]) -> str:
    """Options as ``A. text`` lines."""
    return "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))


def build_prompt(q: Question, template: str | None = "mcq_letter") -> str:
    """The user text that follows the video for question ``q`` (dataset text is inserted verbatim).

    Args:
        q: the question; its ``subtitles`` (if any) are prepended under "This video's subtitles are listed below:".
        template: a name in :data:`TEMPLATES`, or ``None`` for the template of ``q.meta["benchmark"]``
            (:func:`template_for`).

    Raises:
        KeyError: unknown template name.
    """
    name = template_for(q.meta.get("benchmark")) if template is None else template
    subs = f"This video's subtitles are listed below:\n{q.subtitles}\n" if q.subtitles else ""
    return TEMPLATES[name].format(subtitles=subs, question=q.question, options=format_options(q.options))


def prompt_and_template(q: Question, template: str | None = None) -> tuple[str, str]:
    """``(prompt text, template name)``; the name is what callers write into ``record["meta"]["template"]``.
    ``template=None`` picks the benchmark's own template (:func:`template_for`)."""
    name = template_for(q.meta.get("benchmark")) if template is None else template
    return build_prompt(q, name), name
