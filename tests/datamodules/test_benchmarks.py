"""Benchmark loaders on fixtures in each public format, subtitles, prompts."""
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from algorithms.errors import SettingError
from datamodules.benchmarks import AnnotationError, load_benchmark
from datamodules.benchmarks.prompts import TEMPLATES, build_prompt, prompt_and_template, template_for
from datamodules.benchmarks.subtitles import (hms_to_seconds, parse_lvb_subtitles, parse_srt, strip_markup,
                                              subtitles_text)

SRT = """1
00:00:01,000 --> 00:00:02,500
<font color="#ffffff">Hello <b>there</b></font>

2
00:00:03,000 --> 00:00:04,000
{\\an8}second <i>line</i>
continues

3
00:00:00,200 --> 00:00:00,900
<font face="Arial">first</font>

4
00:00:05,000 --> 00:00:06,000
<font color="#fff"></font>
"""


# ------------------------------------------------------------------------------------------------ subtitles
def test_srt_markup_stripped_and_sorted():
    lines = parse_srt(SRT)
    assert lines == [(0.2, 0.9, "first"), (1.0, 2.5, "Hello there"), (3.0, 4.0, "second line continues")]
    assert subtitles_text(lines) == "first\nHello there\nsecond line continues"
    assert strip_markup('<font size="2">a &amp; b</font>') == "a & b"


def test_srt_bad_cue():
    with pytest.raises(AnnotationError, match="x.srt: cue 1"):
        parse_srt("1\n00:00:05,000 --> 00:00:01,000\nbackwards\n", where="x.srt")


def test_lvb_subtitles_timestamp_form_shifted():
    items = [
        {"timestamp": [12.0, 14.5], "text": " later "},
        {"timestamp": [10.5, 11.0], "text": "first"},
        {"timestamp": [2.0, 5.0], "text": "before the clip"},     # ends before the clip starts: dropped
        {"timestamp": [9.0, 10.2], "text": "straddles"},          # start clamped to 0
        {"timestamp": [20.0, None], "text": "open end"},          # lasts to the duration
    ]
    lines = parse_lvb_subtitles(items, starting_timestamp_s=10.0, duration_s=30.0)
    # text as released (VideoLLaMA3@05cee23d longvideobench.py appends subtitle["text"] unchanged): " later " kept
    assert lines == [(0.0, 0.2, "straddles"), (0.5, 1.0, "first"), (2.0, 4.5, " later "), (10.0, 30.0, "open end")]


def test_lvb_subtitles_start_end_form_shifted():
    items = [
        {"start": "00:01:05.500", "end": "00:01:07.000", "line": "<i>two</i>"},
        {"start": "00:01:02.250", "end": "00:01:03.000", "line": "one"},
    ]
    lines = parse_lvb_subtitles(items, starting_timestamp_s=60.0)
    assert lines == [(2.25, 3.0, "one"), (5.5, 7.0, "<i>two</i>")]          # subtitle["line"] unchanged
    assert hms_to_seconds("01:02:03.5") == 3723.5
    with pytest.raises(AnnotationError, match="subs.json: item 0"):
        parse_lvb_subtitles([{"begin": 1}], where="subs.json")


# ------------------------------------------------------------------------------------------------ Video-MME
def _videomme(root, rows):
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    pq.write_table(pa.table(cols), root / "test-00000-of-00001.parquet")


def _vm_row(qid, vid, answer="B", options=None, **kw):
    row = {"video_id": "001", "duration": "short", "domain": "Knowledge", "sub_category": "Humanity & History",
           "url": f"https://www.youtube.com/watch?v={vid}", "videoID": vid, "question_id": qid,
           "task_type": "Counting Problem", "question": "How many dogs?",
           "options": options or ["A. one", "B. two", "C. three", "D. four"], "answer": answer}
    row.update(kw)
    return row


def test_videomme_with_subtitles(tmp_path):
    _videomme(tmp_path, [_vm_row("001-1", "fFjv93ACGo8"),
                         _vm_row("002-1", "xyz", answer="D", duration="long", task_type="OCR Problems")])
    (tmp_path / "subtitles").mkdir()
    (tmp_path / "subtitles" / "fFjv93ACGo8.srt").write_text(SRT, encoding="utf-8")
    qs = load_benchmark("videomme", tmp_path, subtitles=True)
    assert [q.qid for q in qs] == ["001-1", "002-1"]
    q = qs[0]
    assert q.options == ["one", "two", "three", "four"] and q.answer == "B"
    assert q.video_path == str(tmp_path / "videos" / "fFjv93ACGo8.mp4")
    # as VideoLLaMA3@05cee23d videomme.py reads them: pysubs2.load (SubripFormat: <b>/<i> -> {\b1}/{\i1}, other
    # tags removed, newline -> \N), then subtitle.text.replace("\\N", " "); file order, blank cue kept
    assert q.subtitle_lines == [(1.0, 2.5, "Hello {\\b1}there{\\b0}"),
                                (3.0, 4.0, "{\\an8}second {\\i1}line{\\i0} continues"), (0.2, 0.9, "first"),
                                (5.0, 6.0, "")]
    assert q.subtitles == "first\nHello {\\b1}there{\\b0}\n{\\an8}second {\\i1}line{\\i0} continues"
    assert q.option_lines == ["A. one", "B. two", "C. three", "D. four"]       # the parquet's strings
    assert q.meta == {"benchmark": "videomme", "duration": "short", "domain": "Knowledge",
                      "sub_category": "Humanity & History", "task_type": "Counting Problem", "subtitles": True}
    assert qs[1].subtitles is None and qs[1].meta["subtitles"] is False and qs[1].answer == "D"
    plain = load_benchmark("videomme", tmp_path)           # default: no subtitles, signature unchanged
    assert plain[0].subtitles is None and "subtitles" not in plain[0].meta


def test_videomme_read_imports_neither_dataset_nor_pandas(tmp_path):
    """The annotation is read with ``ParquetFile(f).read()``: the same rows as ``pq.read_table`` (a one-file table),
    without ``pyarrow.dataset``, which pulled pandas in on the GPU machine before the first decode."""
    import subprocess
    import sys

    rows = [_vm_row("001-1", "a"), _vm_row("001-2", "a", answer="C", options=["A. x", "B. y", "C. z", "D. w"])]
    _videomme(tmp_path, rows)
    f = tmp_path / "test-00000-of-00001.parquet"
    assert pq.ParquetFile(f).read().equals(pq.read_table(f))
    code = ("import sys; from datamodules.benchmarks import load_benchmark; "
            f"qs = load_benchmark('videomme', {str(tmp_path)!r}); "
            "print(len(qs), qs[1].answer, 'pyarrow.dataset' in sys.modules, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["2", "C", "False", "False"]


def test_videomme_bad_rows(tmp_path):
    _videomme(tmp_path, [_vm_row("001-1", "a"), _vm_row("001-2", "a", answer="E")])
    with pytest.raises(AnnotationError, match=r"row 1 \(question_id='001-2'\)"):
        load_benchmark("videomme", tmp_path)
    _videomme(tmp_path, [_vm_row("001-1", "../../etc/x")])
    with pytest.raises(AnnotationError, match="escapes"):
        load_benchmark("videomme", tmp_path)


# ------------------------------------------------------------------------------------------------ MLVU
def _mlvu(root):
    (root / "json").mkdir()
    plot = [
        {"video": "movie101_66.mp4", "duration": 246, "question": "What is the color of the car?",
         "candidates": ["red", "blue", "green", "black"], "answer": "green", "question_type": "plotQA"},
        {"video": "movie101_67.mp4", "duration": 300, "question": "Who enters first?",
         "candidates": ["the man", "the woman", "the dog", "nobody"], "answer": "the man",
         "question_type": "plotQA"},
    ]
    count = [{"video": "count_1.mp4", "duration": 500, "question": "How many times?",
              "candidates": ["1", "2", "3", "4", "5", "6"], "answer": "6", "question_type": "count"}]
    summary = [{"video": "s.mp4", "duration": 900, "question": "Summarise.", "answer": "long text",
                "question_type": "summary"}] * 3
    (root / "json" / "1_plotQA.json").write_text(json.dumps(plot))
    (root / "json" / "4_count.json").write_text(json.dumps(count))
    (root / "json" / "9_summary.json").write_text(json.dumps(summary))


def test_mlvu(tmp_path, caplog):
    _mlvu(tmp_path)
    with caplog.at_level(logging.INFO, logger="datamodules.benchmarks.mlvu"):
        qs = load_benchmark("mlvu", tmp_path)
    assert "skipped 3 open-ended" in caplog.text
    assert [q.qid for q in qs] == ["plotQA_0", "plotQA_1", "count_0"]
    assert [q.answer for q in qs] == ["C", "A", "F"]
    assert qs[0].video_path == str(tmp_path / "video" / "1_plotQA" / "movie101_66.mp4")
    assert qs[0].options == ["red", "blue", "green", "black"]
    assert qs[0].meta == {"benchmark": "mlvu", "task": "plotQA", "duration": 246, "question_type": "plotQA"}
    assert [q.qid for q in load_benchmark("mlvu", tmp_path, tasks=["count"])] == ["count_0"]


def test_mlvu_answer_not_a_candidate(tmp_path):
    _mlvu(tmp_path)
    rows = json.loads((tmp_path / "json" / "4_count.json").read_text())
    rows.append(dict(rows[0], answer="seven"))
    (tmp_path / "json" / "4_count.json").write_text(json.dumps(rows))
    with pytest.raises(AnnotationError, match=r"4_count.json row 1: answer 'seven'"):
        load_benchmark("mlvu", tmp_path)


# ------------------------------------------------------------------------------------------------ LongVideoBench
def _lvb(root):
    rows = [
        {"id": "86CxyhFV9MI_0", "video_id": "86CxyhFV9MI", "video_path": "86CxyhFV9MI.mp4",
         "question": "What does the man hold?", "candidates": ["a cup", "a pen", "a phone", "a book", "a key"],
         "correct_choice": 3, "duration_group": 600, "question_category": "S2E", "level": "L1-Perception",
         "subtitle_path": "86CxyhFV9MI_en.json", "starting_timestamp_for_subtitles": 100.0, "duration": 420.5},
        {"id": "xyz_1", "video_id": "xyz", "video_path": "xyz.mp4", "question": "Then?",
         "candidates": ["yes", "no", "maybe"], "correct_choice": 0, "duration_group": 15,
         "question_category": "T3O", "level": "L2-Relation", "subtitle_path": "xyz_en.json",
         "starting_timestamp_for_subtitles": 0, "duration": 12.0},
    ]
    (root / "lvb_val.json").write_text(json.dumps(rows))
    (root / "subtitles").mkdir()
    (root / "subtitles" / "86CxyhFV9MI_en.json").write_text(json.dumps([
        {"timestamp": [105.0, 107.0], "text": "second"}, {"timestamp": [101.0, 103.0], "text": "first"}]))
    (root / "subtitles" / "xyz_en.json").write_text(json.dumps([
        {"start": "00:00:03.000", "end": "00:00:04.000", "line": "<font color=red>hi</font>"}]))
    return rows


def test_lvb(tmp_path):
    _lvb(tmp_path)
    qs = load_benchmark("lvb", tmp_path, subtitles=True)
    assert [q.qid for q in qs] == ["86CxyhFV9MI_0", "xyz_1"]
    assert [q.answer for q in qs] == ["D", "A"]
    assert len(qs[0].options) == 5 and len(qs[1].options) == 3
    assert qs[0].video_path == str(tmp_path / "videos" / "86CxyhFV9MI.mp4")
    assert qs[0].meta == {"benchmark": "lvb", "duration_group": 600, "question_category": "S2E",
                          "level": "L1-Perception", "duration": 420.5, "subtitles": True}
    assert qs[0].subtitle_lines == [(1.0, 3.0, "first"), (5.0, 7.0, "second")]
    assert qs[0].subtitles == "first\nsecond"
    assert qs[1].subtitle_lines == [(3.0, 4.0, "<font color=red>hi</font>")]
    assert load_benchmark("lvb", tmp_path)[0].subtitles == "first\nsecond"     # on by default (VideoLLaMA3's eval)
    assert load_benchmark("lvb", tmp_path, subtitles=False)[0].subtitles is None


def test_lvb_bad_rows(tmp_path):
    rows = _lvb(tmp_path)
    rows[1]["correct_choice"] = 3
    (tmp_path / "lvb_val.json").write_text(json.dumps(rows))
    with pytest.raises(AnnotationError, match=r"lvb_val.json row 1 \(id='xyz_1'\): correct_choice 3"):
        load_benchmark("lvb", tmp_path)
    rows[1]["correct_choice"] = 0
    rows[1]["video_path"] = "../../outside.mp4"
    (tmp_path / "lvb_val.json").write_text(json.dumps(rows))
    with pytest.raises(AnnotationError, match="row 1.*escapes"):
        load_benchmark("lvb", tmp_path)


# ------------------------------------------------------------------------------------------------ WorldSense
def _ws_release():
    return {
        "vid_a": {"video_id": "vid_a", "video_duration": "60s", "duration": "<1min", "domain": "Music",
                  "sub_category": "Concert", "audio_class": ["Music"], "video_caption": "...",
                  "task0": {"task_domain": "Recognition", "task_type": "Audio Recognition",
                            "question": "Which instrument?", "answer": "C",
                            "candidates": ["A. piano", "B. violin", "C. drums", "D. flute"]},
                  "task1": {"task_domain": "Reasoning", "task_type": "Causal Reasoning",
                            "question": "Why clap?", "answer": "A",
                            "candidates": ["A. song ended", "B. rain", "C. joke", "D. goal"]}},
        "vid_b": {"video_id": "vid_b", "domain": "Sports", "sub_category": "Soccer",
                  "task0": {"task_domain": "Perception", "task_type": "Object Counting",
                            "question": "How many players?", "answer": "B",
                            "candidates": ["A. 1", "B. 2", "C. 3", "D. 4"]}},
    }


def test_worldsense_release_shape(tmp_path):
    (tmp_path / "worldsense_qa.json").write_text(json.dumps(_ws_release()))
    qs = load_benchmark("worldsense", tmp_path)
    assert [q.qid for q in qs] == ["vid_a_task0", "vid_a_task1", "vid_b_task0"]
    assert [q.answer for q in qs] == ["C", "A", "B"]
    assert qs[0].options == ["piano", "violin", "drums", "flute"]
    assert qs[0].video_path == str(tmp_path / "videos" / "vid_a.mp4")
    assert qs[0].meta == {"benchmark": "worldsense", "domain": "Music", "sub_category": "Concert",
                          "task_domain": "Recognition", "task_type": "Audio Recognition", "duration": "<1min",
                          "audio_class": ["Music"]}


def test_worldsense_flat_shape_and_errors(tmp_path):
    rows = [{"video_id": "v1", "question": "Q?", "options": ["x", "y", "z", "w"], "answer": "D",
             "domain": "Games", "task_type": "Event Sorting"}]
    (tmp_path / "ws.json").write_text(json.dumps(rows))
    qs = load_benchmark("worldsense", tmp_path, annotation="ws.json")
    assert qs[0].qid == "v1_0" and qs[0].answer == "D" and qs[0].meta["domain"] == "Games"
    # lmms-eval@75571cfe worldsense_process_results scores 3-candidate rows (A-C): one odd row is accepted
    rows.append(dict(rows[0], options=["x", "y", "z"], answer="C"))
    (tmp_path / "ws.json").write_text(json.dumps(rows))
    qs = load_benchmark("worldsense", tmp_path, annotation="ws.json")
    assert [len(q.options) for q in qs] == [4, 3] and qs[1].answer == "C"
    rows[1]["answer"] = "D"
    (tmp_path / "ws.json").write_text(json.dumps(rows))
    with pytest.raises(AnnotationError, match="ws.json row 1: answer 'D' is not a letter A-C"):
        load_benchmark("worldsense", tmp_path, annotation="ws.json")
    bad = _ws_release()
    bad["vid_b"]["task0"]["answer"] = "F"
    (tmp_path / "worldsense_qa.json").write_text(json.dumps(bad))
    with pytest.raises(AnnotationError, match="video 'vid_b' task0: answer 'F'"):
        load_benchmark("worldsense", tmp_path)


# ------------------------------------------------------------------------------------------------ prompts
def test_prompts_per_benchmark(tmp_path):
    _lvb(tmp_path)
    q = load_benchmark("lvb", tmp_path, subtitles=True)[0]
    assert template_for("lvb") == "lvb" and template_for("videomme") == "videomme"
    assert template_for(None) == "mcq_letter"
    # the default is VideoLLaMA3's own evaluation prompt for the benchmark (the seeds evaluate VideoLLaMA3)
    text, name = prompt_and_template(q)
    assert name == "videollama3_lvb"
    assert text == build_prompt(q, template=None) == build_prompt(q, "videollama3_lvb") == build_prompt(q, "videollama3")
    assert text.startswith("This video's subtitles are listed below:\nfirst\nsecond\n")
    assert "\nA. a cup\nB. a pen\nC. a phone\nD. a book\nE. a key\n" in text
    assert text.rstrip().endswith("letter from the given choices directly.")
    for bench in ("videomme", "mlvu"):
        q.meta["benchmark"] = bench
        assert prompt_and_template(q)[1] == f"videollama3_{bench}"
    q.meta["benchmark"] = "worldsense"          # no VideoLLaMA3 prompt: the benchmark's own
    assert prompt_and_template(q)[1] == "worldsense"
    assert prompt_and_template(q, "lmms_eval")[1] == "lmms_eval_worldsense"
    q.meta["benchmark"] = "mlvu"                # lmms-eval's MLVU prompt is not reproducible: refused, not filled in
    with pytest.raises(SettingError, match="'lmms_eval' has no prompt for 'mlvu'"):
        prompt_and_template(q, "lmms_eval")
    q.meta["benchmark"] = "lvb"
    # the generic template is Video-MME's without its letter list; Video-MME's names the question's own letters
    assert build_prompt(q, "videomme") == build_prompt(q, "mcq_letter").replace(
        "the letter of", "the letter (A, B, C, D, or E) of")
    assert build_prompt(q, "mcq_letter") != build_prompt(q, "videomme")
    # a family name resolves per benchmark; one without a template for the benchmark falls back to its own
    assert prompt_and_template(q, "videollama3")[1] == "videollama3_lvb"
    assert prompt_and_template(q, "lmms_eval")[1] == "lmms_eval_lvb"
    q.meta["benchmark"] = "worldsense"
    assert prompt_and_template(q, "videollama3")[1] == "worldsense"


# Full prompts written out by hand from the published prompts the templates cite (datamodules/benchmarks/prompts.py
# docstring): options always as "A. text" lines, subtitles (when on) first under "This video's subtitles are listed
# below:"; question text and options inserted verbatim.
_SUBS = "This video's subtitles are listed below:\nfirst\nsecond\n"
_Q = "What does the man hold?"
_OPTS = "A. a cup\nB. a pen\nC. a phone\nD. a book\nE. a key"
_OPTS_PAREN = "(A) a cup\n(B) a pen\n(C) a phone\n(D) a book\n(E) a key"
_EXPECTED = {
    "mcq_letter": ("Select the best answer to the following multiple-choice question based on the video. "
                   "Respond with only the letter of the correct option.\n" + _Q + "\n" + _OPTS
                   + "\nThe best answer is:"),
    # Video-MME's evaluation prompt as published (its questions always have 4 options)
    "videomme": ("Select the best answer to the following multiple-choice question based on the video. "
                 "Respond with only the letter (A, B, C, D, or E) of the correct option.\n" + _Q + "\n" + _OPTS
                 + "\nThe best answer is:"),
    # VideoLLaMA3@05cee23d evaluation/benchmarks/videomme.py generate_instruction, written out from the release
    "videollama3_videomme": ("Select the best answer to the following multiple-choice question based on the video. "
                             "Respond with only the letter (A, B, C, D, or E) of the correct option.\n" + _Q + "\n"
                             + _OPTS + "\nAnswer with the option's letter from the given choices directly and only "
                             "give the best option. The best answer is:"),
    # VideoLLaMA3 mlvu.py: f"Question: {question}\nOptions:\n{option_string}Answer with ..." with "(A) c\n" lines
    "videollama3_mlvu": ("Question: " + _Q + "\nOptions:\n" + _OPTS_PAREN + "\nAnswer with the option's letter "
                         "from the given choices directly and only give the best option."),
    # VideoLLaMA3 longvideobench.py: "\n".join(["Question: " + q, "A. c", ..., "Answer with ..."]).strip()
    "videollama3_lvb": ("Question: " + _Q + "\n" + _OPTS
                        + "\nAnswer with the option's letter from the given choices directly."),
    # lmms-eval@75571cfe longvideobench_doc_to_text: f"{pre_prompt}{question}\n{post_prompt}", question already
    # holding the "A. c" lines, post_prompt ending in "\n"
    "lmms_eval_lvb": (_Q + "\n" + _OPTS + "\nAnswer with the option's letter from the given choices directly.\n"),
    # MLVU@fd060c10 choice_bench.py: qa_template's "Question: q\nOptions:\n(A) c\n...".rstrip() + "Only give the best
    # option." with no separator (main: inp = ... + question + "Only give the best option.")
    # lmms-eval@75571cfe videomme/utils.py videomme_doc_to_text: option_prompt + "\n" + question + "\n" + options +
    # "\n" + videomme.yaml's post_prompt "\nAnswer with the option's letter from the given choices directly."
    "lmms_eval_videomme": ("Select the best answer to the following multiple-choice question based on the video "
                           "and the subtitles. Respond with only the letter (A, B, C, D, or E) of the correct "
                           "option.\n" + _Q + "\n" + _OPTS + "\n\nAnswer with the option's letter from the given "
                           "choices directly."),
    "mlvu": "Question: " + _Q + "\nOptions:\n" + _OPTS_PAREN + "Only give the best option.",
    # OmniZip@9060291 eval/eval.py evaluate_sample: f"{question}\nOptions:\n{candidates_text}\nAnswer with the
    # option's letter from the given choices directly.", candidates_text = "\n".join(candidates)
    "omnizip_worldsense": (_Q + "\nOptions:\n" + _OPTS + "\nAnswer with the option's letter from the given "
                           "choices directly."),
    # lmms-eval@75571cfe worldsense/utils.py worldsense_doc_to_text: "".join([SYS, FRAMES_TMPL_AUDIO,
    # question + "\n", *(op + "\n" for op in candidates)]); FRAMES_TMPL_AUDIO triple-quoted (leading/trailing "\n")
    "lmms_eval_worldsense": ("Carefully watch this video and pay attention to every detail. Based on your "
                             "observations, select the best option that accurately addresses the question.\nThese "
                             "are the frames of a video and the corresponding audio. Select the best answer to the "
                             "following multiple-choice question based on the video. Respond with only the letter "
                             "(A, B, C, D, or E) of the correct option.\n" + _Q + "\n" + _OPTS + "\n"),
    "lvb": "Question: " + _Q + "\n" + _OPTS + "\nAnswer with the option's letter from the given choices directly.",
    # VLMEvalKit@e8e78f05 vlmeval/dataset/worldsense.py WorldSense.FRAMES_TMPL_AUDIO / _NOSUB (triple-quoted: a
    # leading and a trailing newline, backslash-continued lines) + 'Question: {}\nAnswer: ' (SYS goes before the media)
    "worldsense": ("\nThese are the frames of a video and the corresponding audio. Select the best answer to the "
                   "following multiple-choice question based on the video. Respond with only the letter "
                   "(A, B, C, D, or E) of the correct option.\nQuestion: " + _Q + "\n" + _OPTS + "\nAnswer: "),
    "worldsense_noaudio": ("\nThese are the frames of a video. Select the best answer to the following "
                           "multiple-choice question based on the video. Respond with only the letter "
                           "(A, B, C, D, or E) of the correct option.\nQuestion: " + _Q + "\n" + _OPTS
                           + "\nAnswer: "),
}


@pytest.mark.parametrize("name", sorted(_EXPECTED))
def test_prompt_templates_full_text(tmp_path, name):
    assert set(TEMPLATES) == set(_EXPECTED)
    _lvb(tmp_path)
    with_subs = load_benchmark("lvb", tmp_path, subtitles=True)[0]
    without = load_benchmark("lvb", tmp_path, subtitles=False)[0]
    if name == "lmms_eval_videomme":   # videomme_doc_to_text_subtitle: its own header (with a space) and ending
        assert build_prompt(with_subs, name) == (
            "This video's subtitles are listed below: \nfirst\nsecond\nSelect the best answer to the following "
            "multiple-choice question based on the video and the subtitles. Respond with only the letter "
            "(A, B, C, D, or E) of the correct option.\n" + _Q + "\n" + _OPTS + "\nThe best answer is:")
    elif name == "lmms_eval_worldsense":   # worldsense_doc_to_text_subtitle: FRAMES_TMPL_SUB, '"{}"' quoted
        assert build_prompt(with_subs, name) == (
            "Carefully watch this video and pay attention to every detail. Based on your observations, select the "
            "best option that accurately addresses the question.\nThese are the frames of a video. This video's "
            "subtitles are listed below:\n\"first\nsecond\"\nSelect the best answer to the following multiple-choice "
            "question based on the video. Respond with only the letter (A, B, C, D, or E) of the correct option.\n"
            + _Q + "\n" + _OPTS + "\n")
    elif name == "omnizip_worldsense":     # OmniZip's eval has no subtitle setting: the prompt is the same
        assert build_prompt(with_subs, name) == _EXPECTED[name]
    elif name.startswith("worldsense"):   # FRAMES_TMPL_SUB (used whenever subtitles are, audio or not)
        assert build_prompt(with_subs, name) == (
            "\nThese are the frames of a video. This video's subtitles are listed below:\nfirst\nsecond\nSelect the "
            "best answer to the following multiple-choice question based on the video. Respond with only the letter "
            "(A, B, C, D, or E) of the correct option.\nQuestion: " + _Q + "\n" + _OPTS + "\nAnswer: ")
    else:
        assert build_prompt(with_subs, name) == _SUBS + _EXPECTED[name]
    assert build_prompt(without, name) == _EXPECTED[name]
    q3 = load_benchmark("lvb", tmp_path, subtitles=False)[1]          # 3 options: only A-C lines, nothing left over
    three = (_EXPECTED[name].replace(_Q, "Then?").replace(_OPTS, "A. yes\nB. no\nC. maybe")
             .replace(_OPTS_PAREN, "(A) yes\n(B) no\n(C) maybe").replace("(A, B, C, D, or E)", "(A, B, or C)"))
    assert build_prompt(q3, name) == three
    assert "(A, B, C, or D)" not in build_prompt(q3, name)


def test_mlvu_release_system_prompt_and_answer_prefix():
    from datamodules.benchmarks.prompts import chat_parts, mlvu_question

    # MLVU@fd060c10 choice_bench.py main: conv.system = ..., conv.append_message(conv.roles[1], "Best Option: (")
    assert chat_parts("mlvu") == ("Carefully watch this video and pay attention to every detail. Based on your "
                                  "observations, select the best option that accurately addresses the question.",
                                  "Best Option: (")
    assert chat_parts("videollama3_mlvu") == (None, "") and chat_parts("lvb") == (None, "")
    # qa_template rstrips the whole question: an option's trailing spaces at the end go, inner ones stay
    assert mlvu_question("Q ", ["a ", "b  "]) == "Question: Q \nOptions:\n(A) a \n(B) b"


def test_letters_phrase_is_the_release_for_four():
    from datamodules.benchmarks.prompts import letters_phrase

    assert letters_phrase(4) == "A, B, C, or D"          # Video-MME's released text
    assert (letters_phrase(2), letters_phrase(3), letters_phrase(1)) == ("A or B", "A, B, or C", "A")


def test_unknown_benchmark():
    from algorithms.errors import SettingError

    with pytest.raises(SettingError, match="unknown benchmark 'nope'; known"):
        load_benchmark("nope", ".")


def test_videomme_subtitles_keep_the_lines_at_sampled_frames():
    """VideoLLaMA3@05cee23d videomme.py generate_instruction: per frame, the first cue with start < t*1000 < end
    (strict), no de-duplication, frames outside every cue add nothing."""
    from datamodules.benchmarks import Question
    from datamodules.benchmarks.subtitles import lines_at_frames, parse_srt

    srt = ("1\n00:00:01,000 --> 00:00:03,000\nhello\nthere\n\n"
           "2\n00:00:02,500 --> 00:00:05,000\noverlap\n\n"
           "3\n00:00:06,000 --> 00:00:07,500\n<i>last</i>\n")
    lines = parse_srt(srt)
    # t=0.5: none; 1.0: not strictly inside cue 1; 2.0 and 2.9: cue 1 (first match, twice); 3.0: cue 2 only;
    # 6.0: none (start not < t); 7.0: cue 3
    assert lines_at_frames(lines, [0.5, 1.0, 2.0, 2.9, 3.0, 6.0, 7.0]) == "hello there\nhello there\noverlap\nlast"
    assert lines_at_frames(lines, [0.0, 10.0]) == ""
    q = Question(qid="q", video_id="v", video_path="/v.mp4", question="Q?", options=["a", "b", "c", "d"],
                 answer="A", meta={"benchmark": "videomme"}, subtitles="hello there\noverlap\nlast",
                 subtitle_lines=lines)
    opts = "A. a\nB. b\nC. c\nD. d\n"
    body = ("Select the best answer to the following multiple-choice question based on the video. Respond with only "
            "the letter (A, B, C, or D) of the correct option.\nQ?\n" + opts + "Answer with the option's letter "
            "from the given choices directly and only give the best option. The best answer is:")
    assert build_prompt(q, None, [2.0, 7.0]) == "This video's subtitles are listed below:\nhello there\nlast\n" + body
    # no frame inside a cue: the header stays with an empty list, as released for a video with a subtitle file
    assert build_prompt(q, None, [0.5]) == "This video's subtitles are listed below:\n\n" + body
    # without frame times: the whole text (what the loader attached)
    assert build_prompt(q, None) == "This video's subtitles are listed below:\nhello there\noverlap\nlast\n" + body
    q.meta["benchmark"] = "mlvu"     # a benchmark without a placement rule keeps its subtitles as loaded
    assert "overlap" in build_prompt(q, "videollama3_videomme", [2.0])


def test_lvb_interleave_slots_follow_insert_subtitles_into_frames():
    """VideoLLaMA3@05cee23d longvideobench.py / lmms-eval@75571cfe longvideobench/utils.py
    insert_subtitles_into_frames, worked by hand for frames at 0, 2, 4, 6 s."""
    from datamodules.benchmarks import Question
    from datamodules.benchmarks.prompts import interleaved_subtitles
    from datamodules.benchmarks.subtitles import interleave_slots

    lines = [(0.2, 0.6, "a"),    # mid 0.4: after frame 0; widened to (-0.1, 0.9) covers frame 0 -> kept
             (2.5, 3.5, "b"),    # mid 3.0: after frame 2; 1 s long, no frame strictly inside -> left out
             (3.0, 5.0, "c"),    # mid 4.0: frame 4 <= mid goes first; covers 4 -> kept
             (3.5, 4.5, "d"),    # mid 4.0: same place, after "c"
             (6.0, 6.5, "e")]    # mid 6.25: after frame 6; widened (5.75, 6.75) covers 6 -> kept, after the last
    assert interleave_slots(lines, [0.0, 2.0, 4.0, 6.0]) == [[], ["a"], [], ["c", "d"], ["e"]]
    assert interleave_slots([], [0.0]) == [[], []]
    q = Question(qid="q", video_id="v", video_path="/v.mp4", question="Q?", options=["a", "b"], answer="A",
                 meta={"benchmark": "lvb"}, subtitles="a\nc", subtitle_lines=lines)
    assert interleaved_subtitles([q])([0.0, 2.0, 4.0, 6.0]) == [[], ["a"], [], ["c", "d"], ["e"]]
    # the model interleaves them, so the question text has no subtitle block (the text path without times keeps it)
    assert build_prompt(q, None, [0.0]) == ("Question: Q?\nA. a\nB. b\n"
                                            "Answer with the option's letter from the given choices directly.")
    assert build_prompt(q, None).startswith("This video's subtitles are listed below:\na\nc\n")
    q.meta["benchmark"] = "videomme"
    assert interleaved_subtitles([q]) is None


def test_interleaved_subtitles_reads_batch_item_dicts():
    """A batch item's questions are dicts (JSON-like; timed lines may be lists): the same placement."""
    from datamodules.benchmarks.prompts import interleaved_subtitles

    qd = {"qid": "q", "meta": {"benchmark": "lvb"}, "subtitle_lines": [[0.2, 0.6, "a"], [6.0, 6.5, "e"]]}
    assert interleaved_subtitles([qd])([0.0, 2.0, 4.0, 6.0]) == [[], ["a"], [], [], ["e"]]
    assert interleaved_subtitles([{"qid": "q", "meta": {}}]) is None


def test_videomme_release_options_and_missing_subtitle_file(tmp_path):
    """VideoLLaMA3@05cee23d videomme.py ``instruction += f"{option}\\n"`` and lmms-eval@75571cfe videomme/utils.py
    ``"\\n".join([f"{opt}" ...])`` print the parquet's option strings as they are; in the subtitle setting a video
    without ``.srt`` gets VideoLLaMA3's header over ``subtitle_string = ""`` and lmms-eval's
    ``"No subtitles available"``."""
    _videomme(tmp_path, [_vm_row("001-1", "nosrt", options=["A.one", "B)  two", "C. three", "D. four "])])
    q = load_benchmark("videomme", tmp_path, subtitles=True)[0]
    assert q.options == ["one", "two", "three", "four "] and q.meta["subtitles"] is False
    vl3 = build_prompt(q, "videollama3_videomme")
    assert vl3 == ("This video's subtitles are listed below:\n\nSelect the best answer to the following "
                   "multiple-choice question based on the video. Respond with only the letter (A, B, C, or D) of the "
                   "correct option.\nHow many dogs?\nA.one\nB)  two\nC. three\nD. four \nAnswer with the option's "
                   "letter from the given choices directly and only give the best option. The best answer is:")
    assert build_prompt(q, "lmms_eval_videomme") == (
        "This video's subtitles are listed below: \nNo subtitles available\nSelect the best answer to the following "
        "multiple-choice question based on the video and the subtitles. Respond with only the letter (A, B, C, or D) "
        "of the correct option.\nHow many dogs?\nA.one\nB)  two\nC. three\nD. four \nThe best answer is:")
    plain = load_benchmark("videomme", tmp_path)[0]                     # no subtitle setting: no block at all
    assert build_prompt(plain, "videollama3_videomme") == vl3.split("\n", 2)[2]
    assert build_prompt(q, "mcq_letter") == build_prompt(plain, "mcq_letter")   # not listed: no block
    # the README prompt's [Question]: the parquet's strings as stored (MME-Benchmarks/Video-MME@06c2315b README)
    assert build_prompt(plain, "videomme") == (
        "Select the best answer to the following multiple-choice question based on the video. Respond with only the "
        "letter (A, B, C, or D) of the correct option.\nHow many dogs?\nA.one\nB)  two\nC. three\nD. four \n"
        "The best answer is:")


# DAMO-NLP-SG/VideoLLaMA3@05cee23d:evaluation/benchmarks/videomme.py:VideoMMEDataset.generate_instruction, run on
# this hand case (the .srt below loaded with pysubs2.load(path, encoding="utf-8"), timestamps [1.5, 2.0, 4.5]) -
# its output, quoted:
_VL3_BLANK_SRT = ("This video's subtitles are listed below:\n\nSelect the best answer to the following multiple-choice "
                  "question based on the video. Respond with only the letter (A, B, C, or D) of the correct option.\n"
                  "How many dogs?\nA.one\nB)  two\nC. three\nD. four \nAnswer with the option's letter from the given "
                  "choices directly and only give the best option. The best answer is:")


def test_videomme_blank_srt_keeps_the_header(tmp_path):
    """An ``.srt`` whose every cue is blank: VideoLLaMA3's evaluation still prints its subtitle header (the file
    exists, ``subtitles is not None``), over an empty list; the question's meta says it had a file."""
    _videomme(tmp_path, [_vm_row("001-1", "blank", options=["A.one", "B)  two", "C. three", "D. four "])])
    (tmp_path / "subtitles").mkdir()
    (tmp_path / "subtitles" / "blank.srt").write_text(
        '1\n00:00:01,000 --> 00:00:03,000\n \n\n2\n00:00:04,000 --> 00:00:05,000\n<font color="#fff"></font>\n',
        encoding="utf-8")
    q = load_benchmark("videomme", tmp_path, subtitles=True)[0]
    assert q.meta["subtitles"] is True and q.subtitles == "" and [t for _, _, t in q.subtitle_lines] == ["", ""]
    assert build_prompt(q, "videollama3_videomme", [1.5, 2.0, 4.5]) == _VL3_BLANK_SRT
    assert build_prompt(q, None, [1.5, 2.0, 4.5]) == _VL3_BLANK_SRT     # the default family is VideoLLaMA3's


def test_worldsense_vlmevalkit_prints_candidates_as_stored(tmp_path):
    """VLMEvalKit@e8e78f05 vlmeval/dataset/worldsense.py:WorldSense.build_prompt: ``question_str = line['question'] +
    '\\n' + '\\n'.join(eval(line['candidates']))``, ``'Question: {}\\nAnswer: '.format(question_str)`` after
    FRAMES_TMPL_AUDIO / FRAMES_TMPL_NOSUB: the candidates as stored, ``"A.Piano"`` not re-lettered."""
    data = _ws_release()
    data["vid_a"]["task0"]["candidates"] = ["A.Piano", "B. violin", "C)drums", "D.  flute "]
    (tmp_path / "worldsense_qa.json").write_text(json.dumps(data))
    q = load_benchmark("worldsense", tmp_path)[0]
    assert q.options == ["Piano", "violin", "drums", "flute "]
    stored = "A.Piano\nB. violin\nC)drums\nD.  flute "
    question_str = q.question + "\n" + stored           # the release's two lines, on this row
    assert build_prompt(q, "worldsense") == (
        "\nThese are the frames of a video and the corresponding audio. Select the best answer to the following "
        "multiple-choice question based on the video. Respond with only the letter (A, B, C, or D) of the correct "
        "option.\n" + "Question: {}\nAnswer: ".format(question_str))
    assert build_prompt(q, "worldsense_noaudio") == (
        "\nThese are the frames of a video. Select the best answer to the following multiple-choice question based "
        "on the video. Respond with only the letter (A, B, C, or D) of the correct option.\n"
        + "Question: {}\nAnswer: ".format(question_str))


def test_worldsense_odd_option_count_is_that_questions_error(tmp_path):
    """A WorldSense row with 1 option or more than 10 does not refuse the file: the question carries ``error``
    (file and row named) and the runs write its error records; the other questions load as before."""
    data = _ws_release()
    data["vid_a"]["task1"]["candidates"] = ["A. only"]
    data["vid_b"]["task0"]["candidates"] = [f"{c}. x{c}" for c in "ABCDEFGHIJK"]
    data["vid_b"]["task0"]["answer"] = "K"
    (tmp_path / "worldsense_qa.json").write_text(json.dumps(data))
    qs = {q.qid: q for q in load_benchmark("worldsense", tmp_path)}
    assert qs["vid_a_task0"].error is None and qs["vid_a_task0"].options == ["piano", "violin", "drums", "flute"]
    one, many = qs["vid_a_task1"], qs["vid_b_task0"]
    assert one.error == (f"{tmp_path / 'worldsense_qa.json'} video 'vid_a' task1: 1 option; a multiple-choice "
                         "question needs 2..10 (letters A-J)")
    assert many.error.endswith("video 'vid_b' task0: 11 options; a multiple-choice question needs 2..10 (letters A-J)")
    assert (one.answer, many.answer) == ("A", "K") and many.options[-1] == "K. xK"
    data["vid_a"]["task1"]["candidates"] = "A. only"        # not a list at all: still the file's error
    (tmp_path / "worldsense_qa.json").write_text(json.dumps(data))
    with pytest.raises(AnnotationError, match="video 'vid_a' task1: options must be a list"):
        load_benchmark("worldsense", tmp_path)
