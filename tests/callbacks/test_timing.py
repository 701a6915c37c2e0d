"""``timing_rank<r>.json`` keeps every run of a folder (a resumed run with an added budget loses none of the first
run's timings), the report shows the latest, and a file of the old single-run format still reads."""
import json

from callbacks.report import _timing
from callbacks.timing import timing_runs, write_timing
from tests.conftest import run_predict

OLD = {"videos": 2, "wall_s": 9.5, "stages_s": {"load": 1.0, "wait": 0.5, "encode": 2.0, "plan_build": 0.25,
                                                 "answer": 4.0}, "step_s": [3.0, 3.25], "timeline_s": {}}


def _run(n: int) -> dict:
    return {**OLD, "videos": n, "step_s": [1.0] * n}


def test_earlier_runs_are_kept_under_previous_runs_and_an_old_file_reads(tmp_path):
    path = tmp_path / "timing_rank0.json"
    path.write_text(json.dumps(OLD))                               # the old single-run format
    assert timing_runs(json.loads(path.read_text())) == [OLD]
    write_timing(path, _run(1))
    assert json.loads(path.read_text()) == {**_run(1), "previous_runs": [OLD]}
    write_timing(path, _run(0))
    data = json.loads(path.read_text())
    assert data == {**_run(0), "previous_runs": [OLD, _run(1)]}    # oldest first, the latest at the top level
    assert timing_runs(data) == [OLD, _run(1), _run(0)]
    html = _timing(tmp_path)
    latest, earlier = html.split("<details>")
    # videos, first answer, CUDA MPS (files before session 17 do not say: "-"), stages
    assert ("<td>timing_rank0.json</td><td class=\"num\">0</td><td class=\"num\">-</td><td>-</td>"
            "<td>load 1.00 s, wait 0.50 s, encode 2.00 s") in latest
    write_timing(path, {**_run(2), "timeline_s": {"first_answer": 14.83}, "cuda_mps_pipe": "/tmp/tokenbudget-mps-x"})
    row = _timing(tmp_path).split("<details>")[0]
    assert "<td class=\"num\">2</td><td class=\"num\">14.8 s</td><td>on</td>" in row
    write_timing(path, {**_run(1), "cuda_mps_pipe": None})
    assert "<td class=\"num\">1</td><td class=\"num\">-</td><td>off</td>" in _timing(tmp_path).split("<details>")[0]
    write_timing(path, {**_run(1), "cuda_mps_pipe": None, "device_type": "cpu"})     # a CPU run: nothing to share
    assert "<td class=\"num\">1</td><td class=\"num\">-</td><td>no GPU</td>" in _timing(tmp_path).split("<details>")[0]
    path.write_text(json.dumps(data))                              # back to the three runs above
    assert "2 earlier run(s) into this folder (resumed)" in earlier and "<td>1 of 3</td>" in earlier
    assert "<th>first answer</th><th>CUDA MPS</th>" in earlier
    assert "<td>2 of 3</td>" in earlier
    path.write_text("{torn")                                       # unreadable: kept beside, not overwritten
    write_timing(path, _run(1))
    assert (tmp_path / "timing_rank0.json.unreadable").read_text() == "{torn"
    assert json.loads(path.read_text()) == {**_run(1), "previous_runs": []}


def test_a_resumed_run_with_an_added_budget_keeps_the_first_runs_timing(tiny_vl3_dir, demo_bench, tmp_path,
                                                                        monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "mps"))   # as under the run's own daemon (models.mps)
    timer = ["--trainer.callbacks+=callbacks.timing.StageTimer"]
    # a budget below the folder's largest (256) is added: a larger one is refused (largest_budget in run.json)
    first = run_predict(tiny_vl3_dir, demo_bench, out, budgets=(256,), extra=timer,
                        model_args={"max_new_tokens": 2})
    one = json.loads((out / "timing_rank0.json").read_text())
    assert one["videos"] == 2 and one["previous_runs"] == [] and len(first) == 7
    assert one["cuda_mps_pipe"] == str(tmp_path / "mps")                   # which daemon the run's processes used
    assert one["device_type"] == "cpu"
    rows = one["per_video"]      # a wait is traced to its video: the rows' waits are the run's wait
    assert len({r["video_id"] for r in rows}) == 2 and None not in {r["video_id"] for r in rows}
    assert abs(sum(r["wait_s"] for r in rows) - one["stages_s"]["wait"]) < 1e-3
    for r in rows:   # decoded before its step started (the boot clock and the process clock agree to ms)
        assert r["decode_start"] <= r["decode_end"] <= r["step_start"] + 0.05, r
    assert [r["step_s"] for r in rows] == one["step_s"]
    for stage in ("encode", "plan_build", "answer"):   # each video's stages add up to the run's
        assert abs(sum(r["stages_s"][stage] for r in rows) - one["stages_s"][stage]) < 1e-3, stage
    assert all(sum(r["stages_s"].values()) <= r["step_s"] + 1e-3 for r in rows)
    second = run_predict(tiny_vl3_dir, demo_bench, out, budgets=(128, 256), extra=timer,
                         model_args={"max_new_tokens": 2})
    two = json.loads((out / "timing_rank0.json").read_text())
    assert len(second) == 14 and two["videos"] == 2
    assert two["previous_runs"] == [{k: v for k, v in one.items() if k != "previous_runs"}]
    from callbacks.scoring.command import main as rescore   # (the run's report was written before its timer ran)

    rescore([str(out), "--no-plots"])
    page = (out / "report.html").read_text()
    assert "1 earlier run(s) into this folder (resumed)" in page
    assert '<img alt="timeline" src="data:image/png;base64,' in page      # the latest run's per-video timeline


def test_timeline_counts_from_the_interpreters_start_not_the_shells(tmp_path):
    """Issue 43 item 7: ``bash -c 'a && b && python evaluate.py ...'`` execs the interpreter in the shell's process,
    whose ``/proc`` start time is the shell's; ``evaluate.py`` marks the interpreter's own start, so a shell that
    slept 1.5 s first does not add 1.5 s to every ``timeline_s`` mark."""
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    code = "import evaluate; from callbacks.process_clock import process_age_s; print(process_age_s())"
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "-c", f'sleep 1.5 && exec "{sys.executable}" -c "{code}"'], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    age = float(r.stdout.strip().splitlines()[-1])
    assert wall >= 1.5 and 0.0 < age < wall - 1.5 + 0.05     # the interpreter's life, not the shell's sleep


def test_longest_waits_names_the_videos_after_the_first():
    from callbacks.timing import StageTimer

    rows = [{"video_id": "fill", "wait_s": 9.0},                       # the first video: the pipeline fill, left out
            {"video_id": "a", "wait_s": 0.2},
            {"video_id": "long", "wait_s": 2.5, "decode_start": 16.6, "decode_end": 42.6, "step_start": 43.0},
            {"video_id": "b", "wait_s": 0.7}, {"video_id": "c", "wait_s": 0.6}, {"video_id": "d", "wait_s": 0.55}]
    assert StageTimer.longest_waits({"per_video": rows}) == (
        "longest data waits: long 2.50 s (decoded 16.6-42.6 s, its step at 43.0 s); b 0.70 s; c 0.60 s")
    assert StageTimer.longest_waits({"per_video": rows[:2]}) is None and StageTimer.longest_waits({}) is None


def test_timeline_figure_draws_each_videos_decode_wait_and_step_where_they_were():
    from callbacks.scoring.plots import timeline_figure

    run = {"timeline_s": {"model_loaded": 10.0, "first_answer": 14.0},
           "per_video": [{"video_id": "a", "wait_s": 1.0, "decode_start": 2.0, "decode_end": 6.0, "step_start": 11.0,
                          "step_s": 3.0},
                         {"video_id": "b", "wait_s": 0.0, "decode_start": 2.5, "decode_end": 9.0, "step_start": 14.0,
                          "step_s": 1.5}]}
    fig = timeline_figure({"timing_rank0.json": run, "timing_rank1.json": {"per_video": [{"video_id": "x"}]}})
    (ax,) = fig.axes                                      # rank 1 has no decode windows: no panel
    bars = sorted((round(p.get_x(), 3), round(p.get_width(), 3), round(p.get_y() + p.get_height() / 2, 3))
                  for p in ax.patches)
    assert bars == [(2.0, 4.0, 0.0), (2.5, 6.5, 1.0), (10.0, 1.0, 0.0), (11.0, 3.0, 0.0), (14.0, 1.5, 1.0)]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert sorted(line.get_xdata()[0] for line in ax.lines) == [10.0, 14.0]
    assert timeline_figure({"timing_rank0.json": {"per_video": []}}) is None and timeline_figure({}) is None


def test_a_video_row_says_how_it_was_decoded_in_parts():
    from callbacks.timing import StageTimer

    t = StageTimer()
    t._video_row({"video_id": "long", "decode_parts": 4}, 0.0, 0.25)
    t._video_row({"video_id": "odd", "decode_parts": 1, "parts_fallback": "part 1, read by decord, lists x"}, 0.0, 0.0)
    t._video_row({"video_id": "short"}, 0.0, 0.0)
    assert t.per_video == [{"video_id": "long", "wait_s": 0.25, "decode_parts": 4},
                           {"video_id": "odd", "wait_s": 0.0, "parts_fallback": "part 1, read by decord, lists x"},
                           {"video_id": "short", "wait_s": 0.0}]


def test_timeline_figure_names_a_video_decoded_in_parts():
    from callbacks.scoring.plots import timeline_figure

    row = {"wait_s": 0.0, "decode_start": 1.0, "decode_end": 2.0, "step_start": 3.0, "step_s": 1.0}
    run = {"per_video": [{"video_id": "long", "decode_parts": 4, **row},
                         {"video_id": "odd", "parts_fallback": "part 1 failed", **row}, {"video_id": "s", **row}]}
    (ax,) = timeline_figure({"timing_rank0.json": run}).axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["long (4 parts)", "odd (decoded again whole)", "s"]


def test_an_interrupt_after_predict_end_does_not_list_the_run_twice(tmp_path):
    """Ctrl-C while the scores are written (after predict end): the run's figures were written whole at predict end;
    the interrupt's write would have pushed them under ``previous_runs`` and listed the same run twice (a new
    user's trial); an interrupt during predict still writes them, marked."""
    import time
    from types import SimpleNamespace

    from callbacks.timing import StageTimer

    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=SimpleNamespace(type="cpu")), callbacks=[],
                              global_rank=0, datamodule=None)
    timer = StageTimer(out_dir=str(tmp_path))
    timer._start, timer.videos, timer.per_video = time.perf_counter(), 1, [{"video_id": "a", "wait_s": 0.1}]
    timer.on_predict_end(trainer, SimpleNamespace())
    timer.on_exception(trainer, SimpleNamespace(), KeyboardInterrupt())
    data = json.loads((tmp_path / "timing_rank0.json").read_text())
    assert data["previous_runs"] == [] and "interrupted" not in data and data["videos"] == 1
    timer._reset()                                   # the next run, interrupted mid-predict
    timer._start, timer.videos, timer.per_video = time.perf_counter(), 1, [{"video_id": "b", "wait_s": 0.1}]
    timer.on_exception(trainer, SimpleNamespace(), KeyboardInterrupt())
    data = json.loads((tmp_path / "timing_rank0.json").read_text())
    assert data["interrupted"] is True and [r["per_video"][0]["video_id"] for r in data["previous_runs"]] == ["a"]
    row = _timing(tmp_path).split("<details>")[0]                  # the report says which run was interrupted
    assert "<td>interrupted: load 0.00 s, wait 0.00 s" in row
    assert "interrupted" not in _timing(tmp_path).split("<details>")[1]
