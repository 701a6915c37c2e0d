"""bench/cli_throughput.py: the real CLI run bench, as a CPU smoke run on the tiny model (the figures it prints
come from the run's own ``timing_rank0.json``: one step time per video, the first read as the warm-up)."""
import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cli_throughput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("cli_throughput", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_root_has_three_questions_per_video(tmp_path):
    bench = _bench()
    videos = [bench.MEDIA / "cockatoo.mp4", bench.MEDIA / "realshort.mp4"]
    bench.write_benchmark(tmp_path / "root", videos)
    rows = pq.read_table(tmp_path / "root" / "videomme" / "test-bench.parquet").to_pylist()
    assert [r["question_id"] for r in rows] == ["000-1", "000-2", "000-3", "001-1", "001-2", "001-3"]
    assert {r["videoID"] for r in rows} == {"cockatoo", "realshort"}
    assert (tmp_path / "root" / "videos" / "cockatoo.mp4").resolve() == videos[0].resolve()


def test_tiny_run_prints_warm_up_and_steady(tmp_path, capsys):
    _bench().main(["--tiny", "--work", str(tmp_path)])
    out = capsys.readouterr().out
    timing = json.loads(next(tmp_path.glob("out_*/timing_rank0.json")).read_text())
    steps = timing["step_s"]
    assert timing["videos"] == 2 and len(steps) == 2
    assert f"first video = warm-up (s)                  {steps[0]:.2f}" in out
    assert f"steady step per video, mean (s)            {steps[1]:.3f}" in out
    assert "records (errors)                           18 (0)" in out   # 2 videos x 3 questions x 3 budgets
