"""``bench/compare_turn_modes.py``'s ``results.md`` says what its figures are (issue 43 item 5): test metrics of the
best checkpoint, mean ± the sample std over the seeds (a7fdaaf: a bare table)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import compare_turn_modes as ctm  # noqa: E402


def test_results_say_test_metrics_and_std_over_seeds(tmp_path):
    results = {"completed-block-hold": [{"auroc_mean": 0.5, "epoch_time_s": 2.0, "rows_per_s": 100.0},
                                        {"auroc_mean": 0.7, "epoch_time_s": 4.0, "rows_per_s": 300.0}]}
    table = ctm.results_preamble([0, 1]) + ctm.format_table(results, columns=("auroc_mean",))
    ctm.write_results(tmp_path, results, [0, 1], table)
    text = (tmp_path / "results.md").read_text()
    head, body = text.split("\n\n| mode |")
    assert "**test** split" in head and "best checkpoint by `val/auroc_mean`" in head
    assert "mean ± the sample standard deviation over 2 seed(s) (0, 1" in head
    # mean 0.6, sample std sqrt(((0.5-0.6)^2 + (0.7-0.6)^2) / 1) = 0.1414; rows/s 200 ± 141
    assert "| completed-block-hold | 2 | 0.600 ± 0.141 | 3.000 ± 1.414 | 200 ± 141 |" in body
