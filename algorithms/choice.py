"""Answer-letter extraction from a model's free-text response: the benchmarks' official rule and a robust one.

Two parsers run side by side on every response and both predictions go into each record (``pred`` and
``pred_robust``), so that a reported number always says which parser produced it.

* :func:`parse_official` reproduces the rule of the benchmarks' own scorers: Video-MME's
  ``eval_your_results.py`` (``extract_characters_regex``), which VLMEvalKit/lmms-eval reuse for Video-MME,
  LongVideoBench, MLVU multiple-choice and WorldSense: strip the response, delete the usual answer prefixes
  (case-sensitive, as released), then take the **first capital option letter anywhere** in what is left. This is
  deliberately naive: ``"Based on the video"`` parses as ``B`` (from "Based"), lower-case ``"b"`` is not found.
* :func:`parse_robust` accepts the forms models actually produce (``(B)``, ``b)``, ``Answer: c``,
  ``The answer is D.``, a lone letter, or the text of one option without its letter) and refuses to guess.

Convention for "no answer": both parsers return ``None`` (written as JSON ``null``), never the string
``"none"``. For the robust parser ``None`` means nothing matched *or* several different letters matched.

Pure stdlib; no lightning, no transformers, no file I/O.
"""
from __future__ import annotations

import re

LETTERS = "ABCDEFGHIJ"

# Video-MME's answer prefixes, in the released order (removed with plain, case-sensitive str.replace).
OFFICIAL_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is",
    "The correct option is",
    "Best answer:",
    "Best option:",
    "Answer:",
    "Option:",
    "The correct answer",
    "The correct option",
)

# Robust: prefixes removed case-insensitively before looking at the remainder.
_ROBUST_PREFIX = re.compile(
    r"^\s*(?:(?:the\s+)?(?:best|correct|right|final)?\s*(?:answer|option|choice)\s*(?:is|would\s+be|:)?\s*:?"
    r"|(?:i\s+(?:think|believe)\s+(?:it\s+is|it's)?))\s*",
    re.IGNORECASE,
)


def _valid_letters(num_options: int) -> str:
    if not 1 <= num_options <= len(LETTERS):
        raise ValueError(f"num_options must be in 1..{len(LETTERS)}, got {num_options}")
    return LETTERS[:num_options]


def parse_official(response: str | None, num_options: int = 4) -> str | None:
    """Official answer letter: the first capital option letter after removing answer prefixes.

    Follows Video-MME's official scorer (``eval_your_results.py``, ``extract_characters_regex``): ``s.strip()``;
    delete each of :data:`OFFICIAL_PREFIXES` (case-sensitive); if more than 10 words remain and no option letter
    occurs, no answer; else the first occurrence of any capital letter in ``A..`` (``[ABCD]`` for 4 options,
    ``[ABCDE]`` for LongVideoBench's 5), even inside a word.

    Args:
        response: the generated text (``None`` is treated as empty).
        num_options: number of options of the question (1..10); letters beyond it are ignored.

    Returns:
        The letter, or ``None`` when no option letter occurs.

    Raises:
        ValueError: ``num_options`` outside 1..10.
    """
    letters = _valid_letters(num_options)
    s = (response or "").strip()
    for prefix in OFFICIAL_PREFIXES:
        s = s.replace(prefix, "")
    pattern = f"[{letters}]"
    m = re.search(pattern, s)
    if len(s.split()) > 10 and m is None:
        return None
    return m.group(0) if m else None


def _norm_text(s: str) -> str:
    """Lower-case, punctuation to spaces, single spaces (for option-text matching)."""
    s = re.sub(r"[^\w\s]", " ", s.lower())
    return " ".join(s.split())


# Strong letter markers (case-insensitive letter): "(b)", "[b]", "b)", "b." / "b:" at a line start,
# "answer is b" / "answer: b" / "option b" / "choice b".
_STRONG = (
    re.compile(r"[(\[]\s*([a-j])\s*[)\]]", re.IGNORECASE),
    re.compile(r"(?:^|\n|\s)([a-j])\s*\)", re.IGNORECASE),
    re.compile(r"(?:^|\n)\s*\**([a-j])\**\s*[.:](?!\w)", re.IGNORECASE),
    re.compile(
        r"\b(?:answer|option|choice)\s*(?:is|would\s+be|should\s+be|:|=)?\s*:?\s*[\"'*]*\(?([a-j])\)?[\"'*]*"
        r"(?=\s*(?:$|[.,;!)\]\n]))",  # the letter must end the phrase: "answer is a red car" is not "A"
        re.IGNORECASE,
    ),
)
# Words after a capital "A"/"I" that make it a letter, not the article/pronoun ("A is correct" vs "A dog ...").
_LETTER_VERBS = {"is", "was", "and", "or", "seems", "would", "should", "fits", "matches", "best", "correct"}
_WEAK = re.compile(r"(?<![A-Za-z0-9'])([A-J])(?![A-Za-z0-9'])(?:\s+([a-z]+))?")


def _distinct(found: list[str]) -> list[str]:
    out: list[str] = []
    for f in found:
        if f not in out:
            out.append(f)
    return out


def parse_robust(response: str | None, options: list[str]) -> str | None:
    """Robust answer letter: explicit letter forms first, then the text of exactly one option.

    Steps (letters outside ``A..`` + ``len(options)`` are ignored throughout):

    1. Strip; drop a leading answer phrase ("The answer is", "Answer:", "Best option:", ... any case).
       If what remains is one letter with punctuation only (``b``, ``(C)``, ``D.``, ``**A**``) -> it.
    2. Strong markers, letter in any case: ``(b)``/``[b]``, ``b)``, ``B.``/``B:`` at a line start,
       ``answer is d`` / ``Answer: c`` / ``option B``. Exactly one distinct letter -> it; several -> ``None``.
    3. Stand-alone capital letters (``B`` but not inside a word; ``A``/``I`` followed by a lower-case word
       count only before "is", "and", "or"..., so the article "A dog" is not read as ``A``).
       One distinct letter -> it; several -> ``None``.
    4. Option text without its letter (case/punctuation-insensitive): an option equal to the remainder, else
       the options contained in the response; one match (or one longest match containing all the others) -> its
       letter, several unrelated matches -> ``None``.

    Args:
        response: the generated text (``None`` is treated as empty).
        options: option texts without letters, in order (option i has letter ``LETTERS[i]``); 1..10 options.

    Returns:
        The letter, or ``None`` when nothing matches or several different letters match (the "none" case).

    Raises:
        ValueError: more than 10 or no options.
    """
    letters = _valid_letters(len(options))
    s = (response or "").strip()
    if not s:
        return None
    rest = _ROBUST_PREFIX.sub("", s, count=1).strip()

    # 1. a lone letter
    core = re.sub(r"[\s\"'`*_()\[\]{}<>.,:;!?-]", "", rest)
    if len(core) == 1 and core.upper() in letters:
        return core.upper()

    # 2. strong markers (on the full response so "answer: c" is seen with its prefix)
    strong = _distinct([m.group(1).upper() for pat in _STRONG for m in pat.finditer(s)
                        if m.group(1).upper() in letters])
    if len(strong) == 1:
        return strong[0]
    if len(strong) > 1:
        return None

    # 3. stand-alone capital letters
    weak = []
    for m in _WEAK.finditer(rest):
        letter, next_word = m.group(1), m.group(2)
        if letter not in letters:
            continue
        if letter in "AI" and next_word is not None and next_word not in _LETTER_VERBS:
            continue  # article / pronoun
        weak.append(letter)
    weak = _distinct(weak)
    if len(weak) == 1:
        return weak[0]
    if len(weak) > 1:
        return None

    # 4. option text
    norm_rest = _norm_text(rest)
    norm_opts = [_norm_text(o) for o in options]
    exact = [i for i, o in enumerate(norm_opts) if o and o == norm_rest]
    if len(exact) == 1:
        return letters[exact[0]]
    padded = f" {_norm_text(s)} "
    hits = [i for i, o in enumerate(norm_opts) if o and f" {o} " in padded]
    if len(hits) == 1:
        return letters[hits[0]]
    if len(hits) > 1:
        longest = max(hits, key=lambda i: len(norm_opts[i]))
        if all(i == longest or norm_opts[i] in norm_opts[longest] for i in hits) and \
                sum(len(norm_opts[i]) == len(norm_opts[longest]) for i in hits) == 1:
            return letters[longest]
    return None
