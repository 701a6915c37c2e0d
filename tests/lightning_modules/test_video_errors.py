"""Issue 35 §1: any exception raised for one video becomes that video's error records (naming the file and the
cause) and the run goes on, also on a rerun that retries them; a programming error stops the run naming the video,
after the records of the videos before it are on disk."""
from __future__ import annotations

import pytest

from tests.conftest import run_predict
from tests.media_factory import _X264, _src, run_ffmpeg


@pytest.fixture
def wide_bench(demo_bench):
    """The demo benchmark with ``cockatoo.mp4`` replaced by a 4000x8 H.264 clip (aspect ratio 500)."""
    path = demo_bench / "videos" / "cockatoo.mp4"
    path.unlink()
    run_ffmpeg(*_src(3, 4, 4000, 8), *_X264, "-pix_fmt", "yuv420p", str(path))
    return demo_bench


def test_a_4000x8_video_is_its_error_records_and_the_run_goes_on_also_on_rerun(tiny_vl3_dir, wide_bench, tmp_path,
                                                                              caplog, capfd):
    from callbacks.jsonl_writer import read_records

    out = tmp_path / "out"
    recs = run_predict(tiny_vl3_dir, wide_bench, out, budgets=(128,), model_args={"max_new_tokens": 2})
    bad = [r for r in recs if "error" in r]
    assert {r["qid"] for r in bad} == {"001-1", "001-2", "001-3", "001-4"} and len(bad) == 4
    # transformers' smart_resize check, with the file named
    video = wide_bench / "videos" / "cockatoo.mp4"
    assert all(r["error"].startswith(str(video) + ": ValueError: ") and
               "aspect ratio must be smaller than 200" in r["error"] for r in bad)
    # issue 43: on the console one line naming the file; the traceback in the output folder's errors_rank0.log
    failed = [r for r in caplog.records if r.getMessage().startswith("video failed")]
    assert len(failed) == 1 and failed[0].exc_info is None
    assert failed[0].getMessage() == (f"video failed, recorded as an error: {bad[0]['error']} (traceback in "
                                      f"{out / 'errors_rank0.log'})")
    assert "Traceback" not in capfd.readouterr().err
    log = (out / "errors_rank0.log").read_text()
    assert log.count("Traceback (most recent call last)") == 1 and f"{video}: ValueError: " in log
    assert "aspect ratio must be smaller than 200" in log.splitlines()[-1]
    assert sorted(r["qid"] for r in recs if "error" not in r) == ["002-1", "002-2", "002-3"]
    # a rerun retries the error records, fails the same way, and writes nothing twice
    again = run_predict(tiny_vl3_dir, wide_bench, out, budgets=(128,), model_args={"max_new_tokens": 2})
    assert again == read_records(out) and len(again) == len(recs) == 7


def test_a_programming_error_stops_the_run_naming_the_video_after_earlier_records_are_safe(
        tiny_vl3_dir, demo_bench, tmp_path, monkeypatch):
    from lightning_modules.budgeted_qa import VideoStepError
    from models.videollama3 import BudgetedVideoLlama3

    real = BudgetedVideoLlama3.encode
    calls = []

    def encode(self, frames, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:   # the second video (cockatoo: the run order puts the cheaper realshort first)
            raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType' (simulated bug)")
        return real(self, frames, *args, **kwargs)

    monkeypatch.setattr(BudgetedVideoLlama3, "encode", encode)
    out = tmp_path / "out"
    with pytest.raises(VideoStepError, match=r"cockatoo\.mp4: TypeError: unsupported operand.*the run stops") as e:
        run_predict(tiny_vl3_dir, demo_bench, out, budgets=(128,), model_args={"max_new_tokens": 2})
    assert isinstance(e.value.__cause__, TypeError)
    from callbacks.jsonl_writer import read_records

    recs = read_records(out)   # the first video's records were written before the run stopped
    assert sorted(r["qid"] for r in recs) == ["002-1", "002-2", "002-3"]
    assert not any("error" in r for r in recs)


@pytest.mark.parametrize("exc, fatal", [(ValueError("absolute aspect ratio must be smaller than 200, got 500.0"),
                                         False),
                                        (RuntimeError("shape '[3, 5]' is invalid for input of size 8"), False),
                                        (OSError(5, "Input/output error"), False),
                                        (ZeroDivisionError("division by zero"), False),
                                        (AssertionError("plan rows"), True), (NameError("name 'x' is not defined"), True),
                                        (AttributeError("'NoneType' object has no attribute 'ids'"), True),
                                        (KeyError("hw"), True), (IndexError("list index out of range"), True)])
def test_which_exceptions_are_records_and_which_stop_the_run(exc, fatal):
    from lightning_modules.budgeted_qa import VideoStepError, run_or_error_records

    def run():
        raise exc

    item = {"video_id": "v", "video_path": "/data/v.mp4"}
    if fatal:
        with pytest.raises(VideoStepError, match=rf"^/data/v\.mp4: {type(exc).__name__}: ") as e:
            run_or_error_records(item, run, lambda msg: [msg])
        assert e.value.__cause__ is exc
    else:
        first = str(exc).splitlines()[0]
        assert run_or_error_records(item, run, lambda msg: [msg]) == [f"/data/v.mp4: {type(exc).__name__}: {first}"]


def test_an_unanswered_question_in_the_layout_ablation_is_its_error_record():
    from types import SimpleNamespace

    from datamodules.benchmarks import Question
    from lightning_modules.layout_ablation import LayoutAblationQA
    from models.videollama3 import Answer

    m = LayoutAblationQA(jobs="rho32:256")
    lj = SimpleNamespace(layout=SimpleNamespace(stats=lambda: {}), frame_idx=[0, 1], budget=256, variant="rho32")
    item = {"video_id": "v", "video_path": "/data/v.mp4", "benchmark": "videomme"}
    q = Question(qid="q1", video_id="v", video_path="/data/v.mp4", question="?", options=["x", "y"], answer="A")
    rec = m._record(item, q, Answer([], "", 9, error="prompt too long"), lj, "t")
    assert rec == {"qid": "q1", "video": "v", "benchmark": "videomme", "job": "rho32_b256", "budget": 256,
                   "variant": "rho32", "answer": "A", "meta": {}, "error": "/data/v.mp4: question q1: prompt too long"}


def test_a_questions_loader_error_gives_its_error_records_and_the_video_goes_on(monkeypatch):
    """``Question.error`` (a WorldSense row with 1 or more than 10 options): that question's records are error
    records carrying the loader's message; the video's other questions are answered (BudgetedQA, its layout
    ablation and the omni pruning job)."""
    from lightning_modules.budgeted_qa import BudgetedQA
    from lightning_modules.layout_ablation import LayoutAblationQA
    from lightning_modules.omni_qa import OmniPruningQA

    good = {"qid": "v_task0", "answer": "B", "meta": {"benchmark": "worldsense"}, "error": None}
    bad = {"qid": "v_task1", "answer": "A", "meta": {"benchmark": "worldsense"},
           "error": "ws.json video 'v' task1: 1 option; a multiple-choice question needs 2..10 (letters A-J)"}
    for module, job in ((BudgetedQA(budgets=[128]), "b128"), (LayoutAblationQA(jobs="base:128"), "base_b128"),
                        (OmniPruningQA("/nonexistent/omni", variants=["full"]), "full")):
        seen = []

        def answered(item, _job=job, _seen=seen):
            _seen.append([q["qid"] for q in item["questions"]])
            return [{"qid": q["qid"], "job": _job, "pred": "B"} for q in item["questions"]]

        monkeypatch.setattr(module, "_answer_video" if not isinstance(module, OmniPruningQA) else "answer_video",
                            answered)
        item = {"video_id": "v", "benchmark": "worldsense", "video_path": "/v.mp4", "error": None,
                "questions": [good, bad], "jobs": {"v_task0": [job], "v_task1": [job]}}
        recs = module.predict_step(item)
        assert seen == [["v_task0"]]                      # only the askable question reaches the model
        by = {r["qid"]: r for r in recs}
        assert by["v_task0"] == {"qid": "v_task0", "job": job, "pred": "B"}
        assert by["v_task1"]["error"] == bad["error"] and by["v_task1"]["job"] == job
        assert by["v_task1"]["answer"] == "A" and "pred" not in by["v_task1"]
        item["questions"] = [bad]                          # nothing askable: no model call at all
        seen.clear()
        assert [r["qid"] for r in module.predict_step(item)] == ["v_task1"] and seen == []
