"""FeatureWriter's end-of-run line reports the run's true wall time; the extract configs show a progress bar."""
from pathlib import Path
from types import SimpleNamespace

import yaml

from callbacks import feature_writer as fw

ROOT = Path(__file__).resolve().parents[2]


def test_summary_reports_the_run_wall_time_beside_the_model_steps(tmp_path, monkeypatch, capsys):
    clock = iter([100.0, 123.6])                       # predict setup, predict end
    monkeypatch.setattr(fw.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(fw, "process_age_s", lambda: 31.04)  # the command also imported and loaded for 7.4 s
    w = fw.FeatureWriter(out_dir=str(tmp_path), plot=False)
    trainer = SimpleNamespace(global_rank=0)
    module = SimpleNamespace(hparams=SimpleNamespace(verify_rows=0))
    w.setup(trainer, module, stage="predict")
    w.on_predict_start(trainer, module)
    w.kept = [{"session": "Session_1", "meta": {"num_rows": 40, "wall_time_s": 0.1}},
              {"session": "Session_2", "meta": {"num_rows": 34, "wall_time_s": 0.2}}]
    w.on_predict_end(trainer, module)
    assert capsys.readouterr().out.strip() == (
        f"[rank 0] wrote 2 feature file(s) to {tmp_path} (74 rows = 14.8 s of session timeline in 23.6 s (31.0 s "
        "since the command started), of which model steps 0.3 s; cache_replay not checked (verify_rows = 0))")
    # where the process start is unknown, the predict's own seconds only
    monkeypatch.setattr(fw, "process_age_s", lambda: None)
    clock = iter([100.0, 105.4])
    w.on_predict_start(trainer, module)
    w.kept = [{"session": "Session_1", "meta": {"num_rows": 40, "wall_time_s": 0.1}}]
    w.on_predict_end(trainer, module)
    assert "in 5.4 s, of which model steps 0.1 s" in capsys.readouterr().out


def test_extract_configs_show_a_progress_bar():
    for cfg in sorted((ROOT / "configs" / "extract").glob("*.yaml")):
        assert yaml.safe_load(cfg.read_text())["trainer"]["enable_progress_bar"] is True, cfg.name
