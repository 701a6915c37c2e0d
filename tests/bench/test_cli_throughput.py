"""bench/cli_throughput.py: the real CLI run bench, as a CPU smoke run on the tiny model (the figures it prints
come from the run's own ``timing_rank0.json``: one step time per video, the first read as the warm-up)."""
import json

import pyarrow.parquet as pq
import pytest

from tests.conftest import load_bench_script


def _bench():
    return load_bench_script("cli_throughput")


def test_benchmark_root_has_three_questions_per_video(tmp_path):
    bench = _bench()
    videos = [bench.MEDIA / "cockatoo.mp4", bench.MEDIA / "realshort.mp4"]
    bench.write_benchmark(tmp_path / "root", videos)
    rows = pq.read_table(tmp_path / "root" / "videomme" / "test-bench.parquet").to_pylist()
    assert [r["question_id"] for r in rows] == ["000-1", "000-2", "000-3", "001-1", "001-2", "001-3"]
    assert {r["videoID"] for r in rows} == {"cockatoo", "realshort"}
    assert (tmp_path / "root" / "videos" / "cockatoo.mp4").resolve() == videos[0].resolve()
    # copies: each video again under its own name (a benchmark's many videos in flight), the same file behind it
    bench.write_benchmark(tmp_path / "copies", videos, copies=2)
    rows = pq.read_table(tmp_path / "copies" / "videomme" / "test-bench.parquet").to_pylist()
    assert [r["videoID"] for r in rows[::3]] == ["cockatoo_c0", "realshort_c0", "cockatoo_c1", "realshort_c1"]
    assert len({r["question_id"] for r in rows}) == 12
    assert (tmp_path / "copies" / "videos" / "realshort_c1.mp4").resolve() == videos[1].resolve()


def test_report_prints_the_timing_files_figures(tmp_path, capsys):
    """The default run's twin of the tiny run below: the figures of a hand-written ``timing_rank0.json`` and
    records folder, computed by hand."""
    timing = {"videos": 3, "wall_s": 20.0, "first_wait_s": 1.5, "step_s": [4.0, 2.0, 3.0],
              "stages_s": {"load": 6.5, "wait": 2.0, "encode": 5.0, "plan_build": 0.5, "answer": 3.5},
              "stages_share": {"wait": 0.125}, "timeline_s": {"first_answer": 12.25}}
    rank = tmp_path / "out" / "b128" / "videomme" / "rank0.jsonl"
    rank.parent.mkdir(parents=True)
    rank.write_text("".join(json.dumps({"qid": f"q{i}", "job": "b128", **({"error": "x"} if i == 0 else {})}) + "\n"
                            for i in range(5)))
    _bench().report(tmp_path / "out", timing, total_s=31.04, ckpt_s=0.0)
    out = capsys.readouterr().out
    for line in ["videos                                     3",
                 "records (errors)                           5 (1)",
                 "model load (s)                             6.5",
                 "first-video wait (s)                       1.50",
                 "first video = warm-up (s)                  4.00",
                 "first answer after process start (s)       12.2",       # 12.25 to one decimal (half to even)
                 "steady step per video, mean (s)            2.500",      # (2 + 3) / 2
                 "steady step per video, median (s)          2.500",
                 "steady wall per video after the first (s)  4.000",      # (20 - 6.5 - 1.5 - 4) / 2
                 "wait share                                 12.5%",
                 "process wall (s)                           31.0",
                 "steps (s): 4.00 2.00 3.00"]:
        assert line in out.splitlines(), line


@pytest.mark.slow   # ~30 s: builds a tiny checkpoint and runs evaluate.py in a subprocess (twin above)
def test_tiny_run_prints_warm_up_and_steady(tmp_path, capsys):
    _bench().main(["--tiny", "--work", str(tmp_path)])
    out = capsys.readouterr().out
    timing = json.loads(next(tmp_path.glob("out_*/timing_rank0.json")).read_text())
    steps = timing["step_s"]
    assert timing["videos"] == 2 and len(steps) == 2
    assert f"first video = warm-up (s)                  {steps[0]:.2f}" in out
    assert f"steady step per video, mean (s)            {steps[1]:.3f}" in out
    assert "records (errors)                           18 (0)" in out   # 2 videos x 3 questions x 3 budgets
