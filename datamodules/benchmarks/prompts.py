"""Prompt templates per benchmark, in one place. The template name goes into each record's meta."""
from __future__ import annotations

from .base import LETTERS, Question

TEMPLATES = {
    "mcq_letter": (
        "{subtitles}Select the best answer to the following multiple-choice question based on the video. "
        "Respond with only the letter of the correct option.\n{question}\n{options}\nThe best answer is:"
    ),
}


def format_options(options: list[str]) -> str:
    """Options as ``A. text`` lines."""
    return "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))


def build_prompt(q: Question, template: str = "mcq_letter") -> str:
    """The user text that follows the video for question ``q`` (dataset text is inserted verbatim)."""
    subs = f"This video's subtitles are listed below:\n{q.subtitles}\n" if q.subtitles else ""
    return TEMPLATES[template].format(subtitles=subs, question=q.question, options=format_options(q.options))
