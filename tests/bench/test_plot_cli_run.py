"""bench/plot_cli_run.py: a CLI run's busy shares and per-video windows over time, as a PNG."""
import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def plot():
    return _load("plot_cli_run")


ROWS = [{"video_id": "long", "decode_start": 1.0, "decode_end": 9.0, "step_start": 9.5, "wait_s": 1.5, "step_s": 2.0,
         "decode_parts": 4},
        {"video_id": "short", "decode_start": 1.0, "decode_end": 2.0, "step_start": 3.0, "wait_s": 0.0, "step_s": 2.0}]


def _json(tmp_path, series=True):
    run = {"per_video": ROWS, "timeline_s": {"model_loaded": 2.5, "first_answer": 5.0}, "steady_wait_share": 0.2,
           "util": {"series": {"cpu": [[1.0, 0.5], [2.0, 0.7]], "gpu": [[1.0, 0.3, 0.9], [2.0, 0.6, 1.0]]}}
           if series else {}}
    f = tmp_path / "run.json"
    f.write_text(json.dumps({"cli_runs": {"auto": run, "auto#2": {**run, "per_video": ROWS[:1]}}}))
    return f


def test_the_run_is_picked_by_label_and_its_videos_in_step_order(plot, tmp_path):
    f = _json(tmp_path)
    label, run = plot.load_run(f)
    assert label == "auto#2" and len(run["per_video"]) == 1            # the last run by default
    label, run = plot.load_run(f, "auto")
    assert [r["video_id"] for r in plot.rows_in_step_order(run)] == ["short", "long"]   # steps at 3.0, 9.5
    with pytest.raises(SystemExit, match=r"no CLI run 'x'; it has \['auto', 'auto#2'\]"):
        plot.load_run(f, "x")
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(SystemExit, match="no CLI run"):
        plot.load_run(empty)


@pytest.mark.parametrize("series", [True, False])
def test_a_png_is_written_with_or_without_the_busy_series(plot, tmp_path, series):
    out = plot.main([str(_json(tmp_path, series)), "--label", "auto", "-o", str(tmp_path / "p" / "run.png")])
    assert out == tmp_path / "p" / "run.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    default = plot.main([str(_json(tmp_path, series)), "--label", "auto#2"])
    assert default == tmp_path / "run_auto_2.png" and default.is_file()


def test_rows_without_a_decode_window_are_left_out_and_the_series_smoothed(plot, tmp_path):
    """A run without workers writes rows without decode windows: they are not drawn (no crash); a run of 0 videos
    draws; the busy line is a 2 s trailing mean of the samples, by hand."""
    run = {"per_video": [{"video_id": "a", "step_start": 1.0, "wait_s": 0.0, "step_s": 1.0}, *ROWS],
           "timeline_s": {}, "util": {"series": {"cpu": [], "gpu": []}}}
    assert [r["video_id"] for r in plot.rows_in_step_order(run)] == ["short", "long"]
    assert plot.plot(run, "x", tmp_path / "a.png").is_file()
    assert plot.plot({"per_video": []}, "empty", tmp_path / "b.png").is_file()
    ts, pct = plot.smoothed([[0.0, 0.2], [1.0, 0.4], [2.0, 0.6], [3.5, 1.0]], 1)
    assert ts == [0.0, 1.0, 2.0, 3.5]
    assert pct == pytest.approx([20.0, 30.0, 40.0, 80.0])   # at 3.5 s: the samples at 2.0 and 3.5 s


def test_the_cli_runs_busy_series_is_kept_in_seconds_after_the_start():
    """bench/workload.py's cli_util keeps every sample, shifted by the launch time, for the plot."""
    workload = _load("workload")
    u = workload.UtilSampler()
    u.cpu, u.cpu_at = [0.1234, 0.5], [10.5, 11.0]
    u.gpu, u.gpu_at = [(0.25, 1.0)], [10.75]
    got = workload.cli_util(u, 10.0, {"first_decode_start": 0.2, "predict_end": 2.0})
    assert got["series"] == {"cpu": [[0.5, 0.123], [1.0, 0.5]], "gpu": [[0.75, 0.25, 1.0]]}
    assert workload.cli_util(u, 10.0, {})["series"] == got["series"]
