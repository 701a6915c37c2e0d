"""Prompt templates per benchmark, in one place. The template name goes into each record's meta. The default
(``prompt_template=None``) is VideoLLaMA3's own evaluation prompt for the benchmark (:data:`DEFAULT_FAMILY`).

Each template reproduces the prompt it names byte for byte (source cited beside it): VideoLLaMA3's evaluation
prompts (``videollama3_<benchmark>``), lmms-eval's (``lmms_eval_<benchmark>``) and each benchmark's own released
prompt (``videomme``, ``mlvu``, ``lvb``, ``worldsense``); ``mcq_letter`` is a generic one. Options are written as the
source writes them (``A. text`` or ``(A) text`` lines).

Use :func:`template_for` to pick the template of a benchmark, and :func:`prompt_and_template` to get the text and
the name to write into ``record["meta"]["template"]`` in one call.
"""
from __future__ import annotations

from algorithms.errors import SettingError

from .base import LETTERS, Question
import functools

from .subtitles import interleave_slots, lines_at_frames

_MCQ_LETTER = (
    "{subtitles}Select the best answer to the following multiple-choice question based on the video. "
    "Respond with only the letter of the correct option.\n{question}\n{options}\nThe best answer is:"
)

# VideoLLaMA3's own evaluation prompts (DAMO-NLP-SG/VideoLLaMA3@05cee23deb854fd6ff82dcff1243a4f682e4d617,
# evaluation/benchmarks/<benchmark>.py, generate_instruction), text exactly as released; ``{letters}`` is the
# released "A, B, C, or D" for 4 options (the only count Video-MME has).
_VL3_VIDEOMME = (   # videomme.py:VideoMMEDataset.generate_instruction (options already carry "A. "; each + "\n")
    "{subtitles}Select the best answer to the following multiple-choice question based on the video. "
    "Respond with only the letter ({letters}) of the correct option.\n{question}\n{options}\n"
    "Answer with the option's letter from the given choices directly and only give the best option. "
    "The best answer is:"
)
_VL3_MLVU = (       # mlvu.py:MLVUDataset.generate_instruction: f"({letter}) {option}\n" lines
    "{subtitles}Question: {question}\nOptions:\n{options_paren}\n"
    "Answer with the option's letter from the given choices directly and only give the best option."
)
_VL3_LVB = (        # longvideobench.py:LongVideoBenchDataset.generate_instruction: "\n".join([...]).strip()
    "{subtitles}Question: {question}\n{options}\nAnswer with the option's letter from the given choices directly."
)
# lmms-eval (EvolvingLMMs-Lab/lmms-eval@75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3) LongVideoBench:
# lmms_eval/tasks/longvideobench/utils.py:longvideobench_doc_to_text with longvideobench_val_v.yaml's
# pre_prompt "" and post_prompt "Answer with the option's letter from the given choices directly.\n".
_LMMS_EVAL_LVB = (
    "{subtitles}{question}\n{options}\nAnswer with the option's letter from the given choices directly.\n"
)

# lmms-eval@75571cfe Video-MME: lmms_eval/tasks/videomme/utils.py:videomme_doc_to_text with videomme.yaml's default
# post_prompt "\nAnswer with the option's letter from the given choices directly." (joined after a "\n": a blank line);
# with subtitles, videomme_doc_to_text_subtitle (videomme_w_subtitle.yaml), which ends in "The best answer is:" and
# ignores post_prompt. The option prompt says "and the subtitles" in both, as released.
_LMMS_EVAL_VIDEOMME_OPTION_PROMPT = (
    "Select the best answer to the following multiple-choice question based on the video and the subtitles. "
    "Respond with only the letter ({letters}) of the correct option."
)
_LMMS_EVAL_VIDEOMME = (
    _LMMS_EVAL_VIDEOMME_OPTION_PROMPT + "\n{question}\n{options}\n\n"
    "Answer with the option's letter from the given choices directly."
)
_LMMS_EVAL_VIDEOMME_SUBTITLE = (
    "This video's subtitles are listed below: \n{subtitle_text}\n" + _LMMS_EVAL_VIDEOMME_OPTION_PROMPT
    + "\n{question}\n{options}\nThe best answer is:"
)

TEMPLATES = {
    # generic: Video-MME's wording without its "(A, B, C, or D)", since MLVU and LongVideoBench have 2-6 options
    "mcq_letter": _MCQ_LETTER,
    # Video-MME's evaluation prompt as its README gives it (MME-Benchmarks/Video-MME@06c2315b:README.md,
    # "Prompt"); "(A, B, C, or D)" for its 4 options, the letters of the question otherwise
    "videomme": _MCQ_LETTER.replace("the letter of", "the letter ({letters}) of"),
    # MLVU's own (JUNJIE99/MLVU@fd060c10a43ea48a35100a22688a927b8e531199,
    # evaluation/multiple_choice_evaluation/choice_bench.py): MLVU.qa_template's question (rstripped) followed
    # directly by "Only give the best option." (main: inp = ... + question + "Only give the best option."); its
    # conv.system and the assistant message "Best Option: (" are in SYSTEM_PROMPTS / ANSWER_PREFIXES
    "mlvu": "{subtitles}{mlvu_question}Only give the best option.",
    "lvb": (
        "{subtitles}Question: {question}\n{options}\n"
        "Answer with the option's letter from the given choices directly."
    ),
    # WorldSense's evaluation through VLMEvalKit (open-compass/VLMEvalKit@e8e78f05f3080fe28154f2130321f17951c3be94,
    # vlmeval/dataset/worldsense.py:WorldSense.build_prompt): message = [SYS text, video (+ audio), FRAMES_TMPL_*,
    # 'Question: {}\nAnswer: '.format(question + '\n' + '\n'.join(candidates))], text items joined with nothing
    # between; SYS (PRE_MEDIA_TEXTS) goes before the media. "worldsense": use_audio (FRAMES_TMPL_AUDIO), the
    # audio-visual setting; "worldsense_noaudio": FRAMES_TMPL_NOSUB; with subtitles FRAMES_TMPL_SUB (SUBTITLE_TEMPLATES)
    "worldsense": (
        "\nThese are the frames of a video and the corresponding audio. "
        "Select the best answer to the following multiple-choice question based on the video. "
        "Respond with only the letter ({letters}) of the correct option.\nQuestion: {question}\n{options}\nAnswer: "
    ),
    "worldsense_noaudio": (
        "\nThese are the frames of a video. "
        "Select the best answer to the following multiple-choice question based on the video. "
        "Respond with only the letter ({letters}) of the correct option.\nQuestion: {question}\n{options}\nAnswer: "
    ),
    "videollama3_videomme": _VL3_VIDEOMME,
    "videollama3_mlvu": _VL3_MLVU,
    "videollama3_lvb": _VL3_LVB,
    "lmms_eval_lvb": _LMMS_EVAL_LVB,
    "lmms_eval_videomme": _LMMS_EVAL_VIDEOMME,
    # lmms-eval@75571cfe lmms_eval/tasks/worldsense/utils.py:worldsense_doc_to_text (worldsense.yaml, video + audio):
    # "".join([SYS, FRAMES_TMPL_AUDIO, doc["question"] + "\n"] + [op + "\n" for op in doc["candidates"]]), one user
    # text; the candidates verbatim (VERBATIM_OPTIONS)
    "lmms_eval_worldsense": (
        "Carefully watch this video and pay attention to every detail. Based on your observations, select the best "
        "option that accurately addresses the question.\nThese are the frames of a video and the corresponding "
        "audio. Select the best answer to the following multiple-choice question based on the video. Respond with "
        "only the letter ({letters}) of the correct option.\n{question}\n{options}\n"
    ),
    # OmniZip's WorldSense evaluation, the configuration seed 003 follows (003:7 "遵循 omnizip 中在 WorldSense 数据集上
    # 测试的配置参数"): KD-TAO/OmniZip@906029177bb3dc1b6e727d8182d9e832f89ccc54:eval/eval.py:evaluate_sample,
    # prompt = f"{question}\nOptions:\n{candidates_text}\nAnswer with the option's letter from the given choices
    # directly." with candidates_text = "\n".join(candidates) (verbatim, VERBATIM_OPTIONS), after the video in one
    # user turn; its system turn is SYSTEM_PROMPTS["omnizip_worldsense"]. The omni job's default. (OmniZip's README
    # @11b628c also names an lmms-eval run, eval.sh, for WorldSense; that script is not in its released tree.)
    "omnizip_worldsense": "{question}\nOptions:\n{options}\nAnswer with the option's letter from the given choices directly.",
}
# a template's own text for a question with subtitles (its ``{subtitle_text}`` is the lines, without a header)
_VLMEVALKIT_WORLDSENSE_SUB = (   # FRAMES_TMPL_SUB (chosen before FRAMES_TMPL_AUDIO when subtitles are used)
    "\nThese are the frames of a video. This video's subtitles are listed below:\n{subtitle_text}\n"
    "Select the best answer to the following multiple-choice question based on the video. "
    "Respond with only the letter ({letters}) of the correct option.\nQuestion: {question}\n{options}\nAnswer: "
)
_LMMS_EVAL_WORLDSENSE_SUB = (   # lmms-eval@75571cfe worldsense_doc_to_text_subtitle: SYS + FRAMES_TMPL_SUB.format(...)
    "Carefully watch this video and pay attention to every detail. Based on your observations, select the best "
    "option that accurately addresses the question.\nThese are the frames of a video. This video's subtitles are "
    "listed below:\n\"{subtitle_text}\"\nSelect the best answer to the following multiple-choice question based on "
    "the video. Respond with only the letter ({letters}) of the correct option.\n{question}\n{options}\n"
)
SUBTITLE_TEMPLATES = {"lmms_eval_videomme": _LMMS_EVAL_VIDEOMME_SUBTITLE, "worldsense": _VLMEVALKIT_WORLDSENSE_SUB,
                      "lmms_eval_worldsense": _LMMS_EVAL_WORLDSENSE_SUB,
                      "worldsense_noaudio": _VLMEVALKIT_WORLDSENSE_SUB}
# system messages and answer prefixes (text after the assistant header) of the templates that have them; the model
# puts them into its chat template (models.videollama3.layout.PromptLayout.with_chat)
SYSTEM_PROMPTS = {   # MLVU choice_bench.py main: conv.system = "..."
    "mlvu": ("Carefully watch this video and pay attention to every detail. Based on your observations, select the "
             "best option that accurately addresses the question."),
    # OmniZip@9060291 eval/eval.py evaluate_sample: conversation[0] = {"role": "system", "content": [{"type": "text",
    # "text": ...}]}: Qwen2.5-Omni's own system prompt plus one sentence (VLMEvalKit's WorldSense keeps the model's
    # default system turn and puts its SYS text in the user turn before the media instead)
    "omnizip_worldsense": ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of "
                           "perceiving auditory and visual inputs, as well as generating text and speech. Please "
                           "analyze the video carefully and select the most appropriate answer from the given "
                           "options."),
}
# the omni job's default template (prompt_template=None): the configuration seed 003 follows
OMNI_DEFAULT_TEMPLATE = "omnizip_worldsense"
# text before the media in the user turn (VLMEvalKit WorldSense: the first message item, WorldSense.SYS)
_VLMEVALKIT_WORLDSENSE_SYS = ("Carefully watch this video and pay attention to every detail. Based on your "
                              "observations, select the best option that accurately addresses the question.")
PRE_MEDIA_TEXTS = {"worldsense": _VLMEVALKIT_WORLDSENSE_SYS, "worldsense_noaudio": _VLMEVALKIT_WORLDSENSE_SYS}
ANSWER_PREFIXES = {  # MLVU choice_bench.py main: conv.append_message(conv.roles[1], "Best Option: (")
    "mlvu": "Best Option: (",
}
# templates whose release prints the options as the annotation holds them (``Question.option_lines``): VideoLLaMA3
# videomme.py ``instruction += f"{option}\n"``, lmms-eval videomme/utils.py ``"\n".join([f"{opt}" ...])``, the Video-MME
# README prompt (its ``[Question]`` is the question and the parquet's option strings), VLMEvalKit@e8e78f05
# worldsense.py:WorldSense.build_prompt ``line['question'] + '\n' + '\n'.join(eval(line['candidates']))`` (all three
# of its templates: audio, no audio, subtitles), lmms-eval worldsense_doc_to_text and OmniZip's eval.py
# ``"\n".join(candidates)``: ``"A.Piano"`` stays ``"A.Piano"``
VERBATIM_OPTIONS = ("videollama3_videomme", "lmms_eval_videomme", "lmms_eval_worldsense", "omnizip_worldsense",
                    "videomme", "worldsense", "worldsense_noaudio")
# what a template's release shows, in a subtitle setting, for a video that has no subtitle file: VideoLLaMA3
# videomme.py ``subtitle_string = ""`` under its header; lmms-eval videomme_doc_to_text_subtitle
# ``subtitle = "No subtitles available"``; templates not listed show no subtitle block
NO_SUBTITLE_FILE_TEXT = {"videollama3_videomme": "", "lmms_eval_videomme": "No subtitles available"}
# a family name resolved per benchmark (``<family>_<benchmark>``)
FAMILIES = ("videollama3", "lmms_eval")
# (family, benchmark) pairs a family has no prompt for and that are refused rather than filled in: lmms-eval's MLVU
# prompt is ``pre_prompt + doc["question"] + post_prompt`` (mlvu/utils.py:mlvu_doc_to_text) over the question text of
# its own Hub copy (sy1998/MLVU_dev), whose composition with the options is not in the release's code
REFUSED = {("lmms_eval", "mlvu")}

BENCHMARK_TEMPLATES = {"videomme": "videomme", "mlvu": "mlvu", "lvb": "lvb", "worldsense": "worldsense"}
DEFAULT_TEMPLATE = "mcq_letter"
# ``prompt_template=None`` resolves this family per benchmark: the seeds evaluate VideoLLaMA3, so its own evaluation
# prompts are the default; a benchmark without one (WorldSense) gets its own released prompt
DEFAULT_FAMILY = "videollama3"


def recorded_template(prompt_template: str | None) -> str:
    """What an output folder's ``run.json`` keeps for ``prompt_template``: the name, or for ``None`` the default
    family it means now (``"default:videollama3"``). A folder written when ``None`` meant each benchmark's own
    prompt kept ``null`` there, so resuming it with today's default is refused instead of mixing two prompts."""
    return prompt_template if prompt_template is not None else f"default:{DEFAULT_FAMILY}"


def check_template(template: str | None) -> None:
    """Raise :class:`~algorithms.errors.SettingError` unless ``template`` is a name in :data:`TEMPLATES`, a family
    of :data:`FAMILIES`, or ``None`` (the default family, :data:`DEFAULT_FAMILY`, per benchmark)."""
    if template is not None and template not in TEMPLATES and template not in FAMILIES:
        raise SettingError(f"prompt_template {template!r} is unknown; known: {sorted(TEMPLATES)}, "
                           f"{list(FAMILIES)} (per benchmark), or null for {DEFAULT_FAMILY!r} per benchmark")


def template_for(benchmark: str | None) -> str:
    """Name of ``benchmark``'s own released template ("videomme", "mlvu", "lvb", "worldsense"); unknown or
    ``None`` gives the generic ``"mcq_letter"``. (The default of :func:`resolve_template` is the
    :data:`DEFAULT_FAMILY` template, falling back to this one.)"""
    return BENCHMARK_TEMPLATES.get(benchmark or "", DEFAULT_TEMPLATE)


def chat_parts(template: str) -> tuple[str | None, str]:
    """``(system message or None, answer prefix)`` of template ``template`` (``None`` / ``""``: none; the model's
    chat template then keeps its default system message)."""
    return SYSTEM_PROMPTS.get(template), ANSWER_PREFIXES.get(template, "")


def pre_media_text(template: str) -> str:
    """The text of template ``template`` that goes before the media in the user turn (``""``: none)."""
    return PRE_MEDIA_TEXTS.get(template, "")


def mlvu_question(question: str, options: list[str]) -> str:
    """MLVU ``choice_bench.py`` ``MLVU.qa_template``: ``"Question: q\nOptions:\n(A) a\n(B) b"``, built with a
    ``"\n"`` after every line and then ``rstrip()``-ed as released."""
    text = f"Question: {question}\nOptions:\n" + "".join(f"({LETTERS[i]}) {o}\n" for i, o in enumerate(options))
    return text.rstrip()


def format_options(options: list[str]) -> str:
    """Options as ``A. text`` lines."""
    return "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))


def format_options_paren(options: list[str]) -> str:
    """Options as ``(A) text`` lines (MLVU's ``choice_bench.qa_template``, VideoLLaMA3's ``mlvu.py``)."""
    return "\n".join(f"({LETTERS[i]}) {o}" for i, o in enumerate(options))


def letters_phrase(n: int) -> str:
    """The option letters as the released Video-MME prompt writes them: ``"A, B, C, or D"`` for 4, ``"A or B"``
    for 2, ``"A, B, or C"`` for 3 (a question is never told letters it does not have)."""
    letters = list(LETTERS[:n])
    if n <= 2:
        return " or ".join(letters)
    return ", ".join(letters[:-1]) + ", or " + letters[-1]


def resolve_template(template: str | None, benchmark: str | None) -> str:
    """The template name used for a question of ``benchmark``: a family of :data:`FAMILIES` ->
    ``<family>_<benchmark>``; ``None`` -> the :data:`DEFAULT_FAMILY` (``videollama3``) resolved so, which for a
    benchmark VideoLLaMA3 never evaluated (WorldSense) is the benchmark's own (:func:`template_for`).

    Raises:
        SettingError: another family without a template for ``benchmark`` (never filled in silently), or a pair of
            :data:`REFUSED`.
    """
    if template is None:
        template = DEFAULT_FAMILY
    if template in FAMILIES:
        name = f"{template}_{benchmark}"
        if (template, benchmark) in REFUSED:
            raise SettingError(f"prompt_template {template!r} has no prompt for {benchmark!r} (its release builds it "
                               f"from a question text this package cannot reproduce); pick a template by name, e.g. "
                               f"{template_for(benchmark)!r}")
        if name in TEMPLATES:
            return name
        if template != DEFAULT_FAMILY:
            raise SettingError(f"prompt_template {template!r} has no prompt for {benchmark!r}; known: "
                               f"{sorted(t for t in TEMPLATES if t.startswith(template + '_'))}")
        return template_for(benchmark)   # VideoLLaMA3 has no WorldSense evaluation: the benchmark's own (README)
    return template


# benchmarks whose references interleave subtitles between the frames (LongVideoBench's dataset, VideoLLaMA3's and
# lmms-eval's LongVideoBench evaluations: insert_subtitles_into_frames); the model puts them into the video prefix
INTERLEAVED_BENCHMARKS = ("lvb",)


def interleaved_subtitles(questions: list):
    """``f(frame_times_s) -> slots`` placing the video's subtitle lines between its frames
    (:func:`~datamodules.benchmarks.subtitles.interleave_slots`) when the questions' benchmark interleaves them
    and they have timed lines; else ``None``. The questions are those of one video (they share its subtitles):
    :class:`Question` objects or their dicts (a batch item's ``questions``)."""
    for q in questions:
        q = vars(q) if isinstance(q, Question) else q
        lines = q.get("subtitle_lines")
        if (q.get("meta") or {}).get("benchmark") in INTERLEAVED_BENCHMARKS and lines:
            return functools.partial(interleave_slots, [tuple(x) for x in lines])
    return None


def subtitle_text(q: Question, frame_times_s: list[float] | None = None) -> str | None:
    """The subtitles shown with ``q``: for Video-MME, with the times of the frames the model sees, only the lines
    at those frames (:func:`~datamodules.benchmarks.subtitles.lines_at_frames`, VideoLLaMA3's
    ``videomme.py``); for a benchmark of :data:`INTERLEAVED_BENCHMARKS` with frame times, ``None`` (the lines are
    interleaved with the frames in the video prefix, :func:`interleaved_subtitles`); otherwise the whole subtitle
    text ``q.subtitles`` (or ``None``)."""
    if frame_times_s is not None and q.subtitle_lines and q.meta.get("benchmark") in INTERLEAVED_BENCHMARKS:
        return None
    if frame_times_s is not None and q.subtitle_lines and q.meta.get("benchmark") == "videomme":
        return lines_at_frames(q.subtitle_lines, frame_times_s)
    return q.subtitles


def build_prompt(q: Question, template: str | None = None, frame_times_s: list[float] | None = None) -> str:
    """The user text that follows the video for question ``q`` (dataset text is inserted verbatim).

    Args:
        q: the question; its ``subtitles`` (if any) are prepended under "This video's subtitles are listed below:".
        template: a name in :data:`TEMPLATES`, a family of :data:`FAMILIES`, or ``None`` for the default family
            resolved for ``q.meta["benchmark"]`` (:func:`resolve_template`).
        frame_times_s: times (s) of the frames the model sees; Video-MME then shows only their subtitle lines
            (:func:`subtitle_text`). A subtitled question (``q.subtitles`` not ``None``, ``""`` included: an
            ``.srt`` whose cues are all blank) always gets the header, even when no line is left, as VideoLLaMA3's
            ``videomme.py`` writes it for a video with a subtitle file; in a subtitle setting a video
            without a file gets :data:`NO_SUBTITLE_FILE_TEXT` (``meta["subtitles"] is False``). Templates of
            :data:`VERBATIM_OPTIONS` print ``q.option_lines`` (the release's strings) instead of ``A. text`` lines.

    Raises:
        KeyError: unknown template name.
    """
    name = resolve_template(template, q.meta.get("benchmark"))
    # ``is not None``: an .srt whose cues are all blank gives ``""`` and still gets the header (VideoLLaMA3@05cee23d
    # videomme.py: ``if subtitles is not None`` -> header over the selected lines; lmms-eval@75571cfe
    # videomme_doc_to_text_subtitle: an existing file's ``readlines()`` is never ``""``)
    lines = subtitle_text(q, frame_times_s) if q.subtitles is not None else None
    if lines is None and q.meta.get("subtitles") is False and name in NO_SUBTITLE_FILE_TEXT:
        lines = NO_SUBTITLE_FILE_TEXT[name]   # subtitle setting, no file: as the template's release
    subs = f"This video's subtitles are listed below:\n{lines}\n" if lines is not None else ""
    text = SUBTITLE_TEMPLATES[name] if lines is not None and name in SUBTITLE_TEMPLATES else TEMPLATES[name]
    options = ("\n".join(q.option_lines) if q.option_lines and name in VERBATIM_OPTIONS
               else format_options(q.options))
    return text.format(subtitles=subs, subtitle_text=lines or "", question=q.question, options=options,
                                  options_paren=format_options_paren(q.options),
                                  mlvu_question=mlvu_question(q.question, q.options),
                                  letters=letters_phrase(len(q.options)))


def prompt_and_template(q: Question, template: str | None = None,
                        frame_times_s: list[float] | None = None) -> tuple[str, str]:
    """``(prompt text, template name)``; the name is what callers write into ``record["meta"]["template"]``.
    ``template=None`` picks VideoLLaMA3's template for the benchmark, else the benchmark's own
    (:func:`resolve_template`)."""
    name = resolve_template(template, q.meta.get("benchmark"))
    return build_prompt(q, name, frame_times_s), name
