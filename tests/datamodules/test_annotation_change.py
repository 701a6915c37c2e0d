"""A resumed run whose annotation changed since its records were written (an answer key or an option fixed) is
refused before anything is decoded or written: resuming would skip those questions and score their old records."""
from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from callbacks.jsonl_writer import JsonlPredictionWriter
from datamodules.benchmarks import AnnotationError
from datamodules.videoqa import VideoQADataModule
from tests.entry_points.test_cli_errors import _bench


def _module_and_writer(tmp_path, records: list[dict]):
    dm = VideoQADataModule(root=str(_bench(tmp_path)), num_workers=0)
    dm.setup("predict")
    out = tmp_path / "out"
    (out / "b128" / "videomme").mkdir(parents=True)
    (out / "b128" / "videomme" / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    writer = JsonlPredictionWriter(out_dir=str(out))
    dm.trainer = SimpleNamespace(lightning_module=SimpleNamespace(jobs={"b128": 128}), callbacks=[writer])
    return dm, out


def _record(q, **change) -> dict:
    return {"qid": q.qid, "job": "b128", "answer": q.answer, "options": list(q.options), "pred": "A", **change}


def test_a_changed_answer_key_or_option_is_named_and_refused(tmp_path):
    probe = VideoQADataModule(root=str(_bench(tmp_path / "probe")), num_workers=0)
    probe.setup("predict")
    q0, q1 = probe.questions[:2]
    other = "B" if q0.answer != "B" else "C"
    dm, out = _module_and_writer(tmp_path, [_record(q0, answer=other), _record(q1, options=["x", "y", "z", "w"]),
                                            {"qid": "gone-1", "job": "b128", "answer": "A"}])   # a qid not in it: fine
    with pytest.raises(AnnotationError) as info:
        dm._run_context()
    msg = str(info.value)
    where = out / "b128" / "videomme" / "rank0.jsonl"
    assert msg.startswith(f"{out}: 2 question(s) answered there differ from the annotation now (")
    assert f"{q0.qid}: answer {other!r} there, {q0.answer!r} now ({where} line 1)" in msg
    assert f"{q1.qid}: options ['x', 'y', 'z', 'w'] there, {list(q1.options)!r} now ({where} line 2)" in msg
    assert "\n" not in msg


def test_a_question_moved_to_another_video_is_named(tmp_path):
    probe = VideoQADataModule(root=str(_bench(tmp_path / "probe")), num_workers=0)
    probe.setup("predict")
    q0 = probe.questions[0]
    dm, out = _module_and_writer(tmp_path, [_record(q0, video="elsewhere")])
    with pytest.raises(AnnotationError, match=rf"{q0.qid}: video 'elsewhere' there, {q0.video_id!r} now \("):
        dm._run_context()
    dm, _ = _module_and_writer(tmp_path / "same", [_record(q0, video=q0.video_id)])   # the same video: resumes
    assert dm._run_context()[2] == {"b128": {q0.qid}}


def test_the_same_annotation_resumes_and_error_records_are_not_compared(tmp_path):
    probe = VideoQADataModule(root=str(_bench(tmp_path / "probe")), num_workers=0)
    probe.setup("predict")
    q0, q1 = probe.questions[:2]
    # an error record carries the answer of its time too, but only answered records are compared
    dm, _ = _module_and_writer(tmp_path, [_record(q0), {"qid": q1.qid, "job": "b128", "answer": "Z", "error": "x"}])
    jobs, _, done = dm._run_context()
    assert jobs == ["b128"] and done == {"b128": {q0.qid}}


def test_a_reworded_question_is_named_and_old_records_without_its_digest_resume(tmp_path):
    """A record keeps the SHA-1 of its question's text (``question_sha1``): a question reworded since is refused,
    naming it; the same text resumes, and a record written before the digest existed (no field) is not compared."""
    from datamodules.benchmarks import question_sha1

    probe = VideoQADataModule(root=str(_bench(tmp_path / "probe")), num_workers=0)
    probe.setup("predict")
    q0 = probe.questions[0]
    assert question_sha1("Q?") == hashlib.sha1(b"Q?").hexdigest()[:16] and len(question_sha1("é")) == 16
    dm, out = _module_and_writer(tmp_path, [_record(q0, question_sha1=question_sha1(q0.question + " (reworded)"))])
    with pytest.raises(AnnotationError, match=rf"{q0.qid}: question text changed \(now "):
        dm._run_context()
    dm, _ = _module_and_writer(tmp_path / "same", [_record(q0, question_sha1=question_sha1(q0.question))])
    assert dm._run_context()[2] == {"b128": {q0.qid}}
    dm, _ = _module_and_writer(tmp_path / "old", [_record(q0)])
    assert dm._run_context()[2] == {"b128": {q0.qid}}
