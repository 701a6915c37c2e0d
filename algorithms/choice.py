"""Answer-letter extraction from a model's free-text response: each benchmark's released rule and a robust one.

:func:`parse` ``(response, options, rule)`` runs one rule of :data:`RULES`:

==============  =====================================================================================================
rule            released code it reproduces (read in full; repo@commit:path:function)
==============  =====================================================================================================
``videomme``    thanku-all/parse_answer@afd52cfe3dde5b3685e0d4f760c10c756860c758:eval_your_results.py:
                extract_characters_regex (the script Video-MME's README links, MME-Benchmarks/Video-MME@06c2315b)
``mlvu``        JUNJIE99/MLVU@fd060c10a43ea48a35100a22688a927b8e531199:
                evaluation/multiple_choice_evaluation/choice_bench.py:check_ans
``lvb``         EvolvingLMMs-Lab/lmms-eval@75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3:
                lmms_eval/tasks/longvideobench/utils.py:parse_multi_choice_response
``worldsense``  open-compass/VLMEvalKit@e8e78f05f3080fe28154f2130321f17951c3be94:
                vlmeval/dataset/utils/worldsense.py:extract_characters_regex (the regex stage of WorldSense.evaluate)
``omnizip``     KD-TAO/OmniZip@906029177bb3dc1b6e727d8182d9e832f89ccc54:eval/eval.py:evaluate_sample (its WorldSense
                eval, the configuration seed 003:7 follows): the reply stripped, the first of A-F it starts with,
                else its first character (:func:`parse_omnizip`)
``robust``      ours: a standalone option letter or the text of exactly one option (:func:`parse_robust`)
==============  =====================================================================================================

The released rules are reproduced as Python reads the released files, bugs included: Video-MME's and
VLMEvalKit's prefix lists each miss two commas, so two pairs of adjacent string literals concatenate into one
prefix that no reply contains; the letter class is the released one (``[ABCD]`` for Video-MME and WorldSense,
``[ABCDE]`` for LongVideoBench) whatever the number of options, so a letter beyond the options can come back
(and is scored wrong, as released). The released scorers never see ``None``; here ``None`` reads as ``""``.

Convention for "no answer": ``None`` (JSON ``null``), never ``"none"``. Where a release goes on beyond the
extraction, ``None`` marks that point: LongVideoBench draws a random option (scoring applies that fallback,
:mod:`callbacks.scoring`), WorldSense calls a judge model, or under VLMEvalKit's default ``exact_matching`` scores
0; Video-MME leaves the question out of "answered"; MLVU scores it wrong.

Pure stdlib; no lightning, no transformers, no file I/O.
"""
from __future__ import annotations

import re

LETTERS = "ABCDEFGHIJ"

RULES = ("videomme", "mlvu", "lvb", "worldsense", "omnizip", "robust")

# The released rule of each benchmark's own scorer (the "official" prediction of a record).
BENCHMARK_RULES = {"videomme": "videomme", "mlvu": "mlvu", "lvb": "lvb", "worldsense": "worldsense"}

# thanku-all/parse_answer@afd52cfe:eval_your_results.py:extract_characters_regex, ``answer_prefixes`` as Python
# reads it. The released list has no comma after "The best option is" and none after "Best answer:", so those
# literals concatenate with the next one: 12 written strings, 10 prefixes.
VIDEOMME_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is" "The correct option is",   # missing comma in the release: one concatenated prefix
    "Best answer:" "Best option:",                   # missing comma in the release: one concatenated prefix
    "Answer:",
    "Option:",
    "The correct answer",
    "The correct option",
)

# open-compass/VLMEvalKit@e8e78f05:vlmeval/dataset/utils/worldsense.py:extract_characters_regex, as Python reads
# it: the same two missing commas (10 written strings, 8 prefixes).
WORLDSENSE_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is" "The correct option is",   # missing comma in the release
    "Best answer:" "Best option:",                   # missing comma in the release
    "Answer:",
    "Option:",
)

# EvolvingLMMs-Lab/lmms-eval@75571cfe:lmms_eval/tasks/longvideobench/utils.py:parse_multi_choice_response
# (commas all present: 8 prefixes).
LVB_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is",
    "The correct option is",
    "Best answer:",
    "Best option:",
)

# Kept for old imports: the Video-MME list.
OFFICIAL_PREFIXES = VIDEOMME_PREFIXES

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


def _first_capital(response: str | None, prefixes: tuple[str, ...], letter_class: str) -> str | None:
    """The shared core of the Video-MME-style extractions: ``s.strip()``, each prefix removed with a plain
    case-sensitive ``str.replace`` in list order, then: more than 10 whitespace words and no letter of
    ``letter_class`` -> no answer, else the first such letter anywhere (even inside a word), else no answer."""
    s = (response or "").strip()
    for prefix in prefixes:
        s = s.replace(prefix, "")
    m = re.search(letter_class, s)
    if len(s.split()) > 10 and m is None:
        return None
    return m.group(0) if m else None


def parse_videomme(response: str | None) -> str | None:
    """Video-MME's released extraction.

    Follows thanku-all/parse_answer@afd52cfe3dde5b3685e0d4f760c10c756860c758:eval_your_results.py:
    ``extract_characters_regex`` (``s = s.strip()``; ``s = s.replace(answer_prefix, "")`` for each of
    :data:`VIDEOMME_PREFIXES`; ``if len(s.split()) > 10 and not re.search("[ABCD]", s): return ""``;
    ``re.search(r'[ABCD]', s)``). ``""`` there is ``None`` here.
    """
    return _first_capital(response, VIDEOMME_PREFIXES, "[ABCD]")


def parse_lvb(response: str | None) -> str | None:
    """LongVideoBench's extraction in lmms-eval (the harness its repository points to).

    Follows EvolvingLMMs-Lab/lmms-eval@75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3:
    lmms_eval/tasks/longvideobench/utils.py:``parse_multi_choice_response``: strip, remove
    :data:`LVB_PREFIXES`, then ``[ABCDE]`` as in :func:`parse_videomme`. Where the release returns
    ``random.choice(all_choices)`` this returns ``None``; :mod:`callbacks.scoring` applies that fallback.
    """
    return _first_capital(response, LVB_PREFIXES, "[ABCDE]")


def parse_worldsense(response: str | None) -> str | None:
    """WorldSense's extraction in VLMEvalKit (the harness WorldSense's README points to), regex stage.

    Follows open-compass/VLMEvalKit@e8e78f05f3080fe28154f2130321f17951c3be94:
    vlmeval/dataset/utils/worldsense.py:``extract_characters_regex`` (:data:`WORLDSENSE_PREFIXES`, ``[ABCD]``).
    Where it returns ``''``, ``WorldSense.evaluate`` calls ``extract_option``: a judge model, or under the
    default ``exact_matching`` the prefetch ``can_infer`` on an empty choice dict (the TSV's ``question`` holds no
    option lines), i.e. ``'Z'``, score 0. Here: ``None``.
    """
    return _first_capital(response, WORLDSENSE_PREFIXES, "[ABCD]")


# KD-TAO/OmniZip@9060291:eval/eval.py:evaluate_sample: ``for opt in ["A", "B", "C", "D", "E", "F"]``
OMNIZIP_LETTERS = ("A", "B", "C", "D", "E", "F")


def parse_omnizip(response: str | None) -> str | None:
    """OmniZip's WorldSense answer: the letter its evaluation compares with the gold letter.

    Follows KD-TAO/OmniZip@906029177bb3dc1b6e727d8182d9e832f89ccc54:eval/eval.py:evaluate_sample::

        resp_text = answers[0].strip() if answers and answers[0] else ""
        for opt in ["A", "B", "C", "D", "E", "F"]:
            if resp_text.upper().strip().startswith(opt): predicted_answer = opt; break
        if predicted_answer is None and len(resp_text) > 0: predicted_answer = resp_text[0].upper()

    so ``"b) two"`` is ``B``, ``"The answer is C"`` is ``T`` (scored wrong, as released), ``""`` is ``None``. The
    result may be any upper-cased character; it is correct iff it equals the gold letter.
    """
    text = (response or "").strip()
    for opt in OMNIZIP_LETTERS:
        if text.upper().strip().startswith(opt):
            return opt
    return text[0].upper() if text else None


def parse_mlvu(response: str | None, num_options: int) -> str | None:
    """MLVU's released check, as the letter it compares.

    Follows JUNJIE99/MLVU@fd060c10a43ea48a35100a22688a927b8e531199:
    evaluation/multiple_choice_evaluation/choice_bench.py:``check_ans``: ``if ")" in pred: pred =
    pred[index3-1:index3]`` (the character before the first ``)``; ``""`` when the reply starts with ``)``), then
    ``pred == gt_option`` with no stripping and no case folding. The reply is correct iff that string equals the
    gold letter, so this returns it when it is one of the first ``num_options`` capital letters, else ``None``
    (never equal to a gold letter).

    Raises:
        ValueError: ``num_options`` outside 1..10.
    """
    letters = _valid_letters(num_options)
    pred = response or ""
    if ")" in pred:
        i = pred.index(")")
        pred = pred[i - 1:i]
    return pred if len(pred) == 1 and pred in letters else None


def parse(response: str | None, options: list[str], rule: str) -> str | None:
    """The answer letter of ``response`` under ``rule`` (one of :data:`RULES`; see the module table).

    Args:
        response: the generated text (``None`` reads as ``""``).
        options: the option texts without their letters, in order (1..10); ``mlvu`` and ``robust`` use them,
            the other rules match their released fixed letter class.
        rule: a name in :data:`RULES`.

    Returns:
        A capital letter, or ``None`` where the rule finds none (what the release does then is in the module
        docstring).

    Raises:
        ValueError: unknown rule, or no / more than 10 options.
    """
    if rule not in RULES:
        raise ValueError(f"unknown answer rule {rule!r}; known: {', '.join(RULES)}")
    _valid_letters(len(options))
    if rule == "videomme":
        return parse_videomme(response)
    if rule == "lvb":
        return parse_lvb(response)
    if rule == "worldsense":
        return parse_worldsense(response)
    if rule == "omnizip":
        return parse_omnizip(response)
    if rule == "mlvu":
        return parse_mlvu(response, len(options))
    return parse_robust(response, options)


def official_rule(benchmark: str | None) -> str:
    """The released rule of ``benchmark`` (:data:`BENCHMARK_RULES`); another or unknown benchmark gets
    ``"videomme"``, the rule the other harnesses derive from."""
    return BENCHMARK_RULES.get(benchmark or "", "videomme")


def parse_official(response: str | None, options: list[str], benchmark: str | None = None) -> str | None:
    """``parse(response, options, official_rule(benchmark))``: the benchmark's own released rule."""
    return parse(response, options, official_rule(benchmark))


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
