"""Scoring over prediction records: hand-computed accuracies, breakdowns, de-duplication, files, plots, callback."""
import json
from types import SimpleNamespace

import pytest
import torch

from callbacks.scoring import ScoreOnPredictEnd, format_table, main, read_records, score_records, write_scores


def rec(qid, answer, pred, robust, bench, budget=1024, variant=None, **meta):
    # the response is the letter itself (every released rule reads a lone capital as that letter), or a reply in
    # which no rule finds one; no options: robust keeps the stored pred_robust
    return {"qid": qid, "video": f"{qid}.mp4", "budget": budget, "variant": variant, "answer": answer,
            "pred": pred, "pred_robust": robust, "response": pred or "no idea", "mode": "hybrid", "vision_tokens": budget - 8,
            "meta": {"benchmark": bench, "template": bench, **meta}}


def err(qid, bench, budget=1024, variant=None, **meta):
    return {"qid": qid, "video": f"{qid}.mp4", "budget": budget, "variant": variant, "error": "CUDA out of memory",
            "meta": {"benchmark": bench, **meta}}


VM = dict(bench="videomme")
VIDEOMME_1024 = [
    rec("q1", "A", "A", "A", duration="short", domain="Knowledge", task_type="Counting", **VM),
    rec("q2", "B", None, "B", duration="short", domain="Knowledge", task_type="OCR", **VM),
    rec("q3", "C", "C", "C", duration="medium", domain="Sports", task_type="Counting", **VM),
    rec("q4", "D", "B", "D", duration="long", domain="Sports", task_type="OCR", **VM),
    err("q5", "videomme", duration="long", domain="Sports", task_type="OCR"),
    rec("q1", "A", "B", "B", duration="short", domain="Knowledge", task_type="Counting", **VM),  # duplicate
]
VIDEOMME_2048 = [rec(f"q{i}", "A", "A", "A", budget=2048, duration=d, domain="Sports", task_type="OCR", **VM)
                 for i, d in zip(range(1, 5), ["short", "short", "medium", "long"])]
VIDEOMME_RHO = [rec("q1", "A", "A", "A", variant="rho32", duration="short", **VM),
                rec("q2", "B", "C", "C", variant="rho32", duration="short", **VM)]
MLVU = [
    rec("plotQA_0", "A", "A", "A", "mlvu", task="plotQA"),
    rec("plotQA_1", "B", "B", "B", "mlvu", task="plotQA"),
    rec("plotQA_2", "C", None, "C", "mlvu", task="plotQA"),
    rec("count_0", "F", "B", "F", "mlvu", task="count"),
]
LVB = [
    rec("a_0", "A", "A", "A", "lvb", duration_group=15, question_category="S2E"),
    rec("b_0", "B", "C", "C", "lvb", duration_group=15, question_category="T3O"),
    rec("c_0", "E", "E", "E", "lvb", duration_group=600, question_category="S2E"),
]


def _write(root, job, bench, records, name="rank0.jsonl", extra=""):
    d = root / job / bench
    d.mkdir(parents=True, exist_ok=True)
    with open(d / name, "a") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
        fh.write(extra)


@pytest.fixture
def out_root(tmp_path):
    _write(tmp_path, "b1024", "videomme", VIDEOMME_1024[:3])
    _write(tmp_path, "b1024", "videomme", VIDEOMME_1024[3:], name="rank1.jsonl", extra='{"qid": "q9", "ans')
    _write(tmp_path, "b2048", "videomme", VIDEOMME_2048)
    _write(tmp_path, "rho32_b1024", "videomme", VIDEOMME_RHO)
    _write(tmp_path, "b1024", "mlvu", MLVU)
    _write(tmp_path, "b1024", "lvb", LVB)
    return tmp_path


def _group(scores, bench, job):
    (g,) = [g for g in scores["groups"] if g["benchmark"] == bench and g["job"] == job]
    return g


def test_videomme_scores_by_hand():
    recs = [dict(r, job="b1024") for r in VIDEOMME_1024]
    scores = score_records(recs, expected_qids={"videomme": ["q1", "q2", "q3", "q4", "q5", "q6"]})
    g = _group(scores, "videomme", "b1024")
    assert (g["n_records"], g["n_duplicates"], g["n_errors"], g["n_scored"]) == (5, 1, 1, 4)
    assert (g["n_expected"], g["n_missing"], g["missing_qids"]) == (6, 1, ["q6"])
    assert g["templates"] == ["videomme"]
    off, rob = g["parsers"]["official"], g["parsers"]["robust"]
    # official: q1, q3 right; q2 unparseable; q4 wrong  -> 2/4; with the error and the missing qid 2/6
    assert (off["correct"], off["unparseable"], off["accuracy"]) == (2, 1, 0.5)
    assert off["accuracy_all"] == pytest.approx(2 / 6)
    assert (rob["correct"], rob["unparseable"], rob["accuracy"]) == (4, 0, 1.0)
    assert rob["accuracy_all"] == pytest.approx(4 / 6)
    assert off["by"]["duration"] == {"long": {"n": 1, "correct": 0, "accuracy": 0.0},
                                     "medium": {"n": 1, "correct": 1, "accuracy": 1.0},
                                     "short": {"n": 2, "correct": 1, "accuracy": 0.5}}
    assert off["by"]["domain"]["Knowledge"]["accuracy"] == 0.5 and off["by"]["domain"]["Sports"]["accuracy"] == 0.5
    assert off["by"]["task_type"]["Counting"]["accuracy"] == 1.0 and off["by"]["task_type"]["OCR"]["accuracy"] == 0.0


def test_report_score_table_counts_duplicates_as_the_console_does(tmp_path):
    """The README's columns (``dup``: duplicate records ignored) are the console's and the report's: the report's
    score table has the column, with the group's count (1 here: q1 written twice)."""
    import re

    from callbacks.report import render_report

    recs = [dict(r, job="b1024") for r in VIDEOMME_1024]
    page = render_report(score_records(recs), tmp_path, recs)
    table = page.split("<h2>Scores</h2>", 1)[1].split("</table>", 1)[0]
    header = re.findall(r"<th>(.*?)</th>", table)
    assert header[-4:] == ["err", "unparse", "miss", "dup"]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in table.split("<tr>")[2:]]
    assert rows and all(len(r) == len(header) and r[-1] == "1" and r[-4] == "1" for r in rows)   # 1 dup, 1 err


def test_mlvu_m_avg_and_pooled():
    g = _group(score_records([dict(r, job="b1024") for r in MLVU]), "mlvu", "b1024")
    off, rob = g["parsers"]["official"], g["parsers"]["robust"]
    assert off["by"]["task"]["plotQA"] == {"n": 3, "correct": 2, "accuracy": pytest.approx(2 / 3)}
    assert off["by"]["task"]["count"]["accuracy"] == 0.0
    assert off["m_avg"] == pytest.approx((2 / 3 + 0.0) / 2)   # task mean (official M-Avg)
    assert off["pooled"] == off["accuracy"] == 0.5             # 2 of 4 questions
    assert rob["m_avg"] == rob["pooled"] == 1.0


def test_lvb_breakdowns():
    g = _group(score_records([dict(r, job="b1024") for r in LVB]), "lvb", "b1024")
    off = g["parsers"]["official"]
    assert off["accuracy"] == pytest.approx(2 / 3)
    assert off["by"]["duration_group"] == {"15": {"n": 2, "correct": 1, "accuracy": 0.5},
                                           "600": {"n": 1, "correct": 1, "accuracy": 1.0}}
    assert off["by"]["question_category"]["S2E"]["accuracy"] == 1.0
    assert off["by"]["question_category"]["T3O"]["accuracy"] == 0.0


def test_read_and_write_scores(out_root):
    records, stats = read_records(out_root)
    assert stats == {"n_files": 6, "n_bad_lines": 1}
    assert len(records) == len(VIDEOMME_1024) + len(VIDEOMME_2048) + len(VIDEOMME_RHO) + len(MLVU) + len(LVB)
    scores = write_scores(out_root, expected_qids={"videomme": ["q1", "q2", "q3", "q4", "q5", "q6"]})
    on_disk = json.loads((out_root / "scores.json").read_text())
    assert on_disk["groups"] == json.loads(json.dumps(scores["groups"]))
    assert [(g["benchmark"], g["job"], g["variant"], g["budget"]) for g in on_disk["groups"]] == [
        ("lvb", "b1024", None, 1024), ("mlvu", "b1024", None, 1024), ("videomme", "b1024", None, 1024),
        ("videomme", "b2048", None, 2048), ("videomme", "rho32_b1024", "rho32", 1024)]
    # the duplicate q1 in rank1.jsonl (pred B) lost to the first one (pred A), read earlier
    assert _group(on_disk, "videomme", "b1024")["parsers"]["official"]["accuracy"] == 0.5
    assert _group(on_disk, "videomme", "b2048")["parsers"]["official"]["accuracy"] == 1.0
    assert _group(on_disk, "videomme", "b2048")["n_missing"] == 2
    rho = _group(on_disk, "videomme", "rho32_b1024")
    assert rho["parsers"]["robust"]["accuracy"] == 0.5 and rho["n_missing"] == 4
    assert sorted(on_disk["plots"]) == ["acc_vs_budget_lvb.png", "acc_vs_budget_mlvu.png",
                                        "acc_vs_budget_videomme.png", "diff_vs_base_videomme.png", "duration_lvb.png",
                                        "duration_videomme.png"]
    for name in on_disk["plots"]:
        data = (out_root / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert not [p for p in out_root.iterdir() if p.name.endswith(".tmp")]


def test_table_and_cli(out_root, capsys):
    main([str(out_root), "--no-plots"])
    table = capsys.readouterr().out
    lines = table.splitlines()
    (head,) = [k for k, ln in enumerate(lines) if ln.startswith("benchmark ")]
    assert lines[head].split()[:7] == ["benchmark", "job", "variant", "budget", "parser", "rule", "n"]
    # the summary above it: each release's headline by its name, first
    assert lines[0] == "lvb: LongVideoBench Overall (lmms-eval: random option when unparsed)"
    assert "mlvu: MLVU M-Avg (choice_bench.py: mean of task accuracies)" in lines[:head]
    (mlvu_off,) = [ln for ln in lines if ln.startswith("mlvu") and " official " in ln]
    assert "50.0" in mlvu_off and "M-Avg 33.3  pooled 50.0" in mlvu_off
    (vm_off,) = [ln for ln in lines if ln.startswith("videomme") and "b1024" in ln and "rho32" not in ln
                 and " official " in ln]
    # n, acc% (2 of 4 answered), acc_all% (2 of 4 answered + 1 error), err, unparse, miss
    assert vm_off.split()[5:12] == ["videomme", "4", "50.0", "40.0", "1", "1", "0"]
    assert "short 50.0  medium 100.0  long 0.0" in vm_off
    assert "answered-only 66.7 (n 3)" in vm_off                 # the release divides by answered questions
    # the footer names the rules that appear, with their released form
    assert any(ln.strip().startswith("videomme: Video-MME eval_your_results.py") for ln in lines)
    assert any(ln.strip().startswith("mlvu: MLVU check_ans") for ln in lines)
    assert "A-D" not in table
    assert not (out_root / "acc_vs_budget_videomme.png").exists()
    assert format_table({"groups": []}).startswith("benchmark")
    # Video-MME: the released figure is correct / answered (q1, q3 right of q1, q3, q4 answered: 66.7), beside
    # acc% = 2 of 4 scored; "of" counts every question of the job: 4 scored + 1 error record + 0 missing = 5
    # (issue 43: it read "of 4", the scored ones, for a job of 5 questions)
    (vm_head,) = [ln for ln in lines[:head] if ln.strip().startswith("b1024 ") and "answered of" in ln]
    assert vm_head.split()[:6] == ["b1024", "66.7", "3", "answered", "of", "5"]


def test_callback_fake_trainer(out_root, capsys):
    calls = []
    writer = SimpleNamespace(out_root=str(out_root))
    trainer = SimpleNamespace(strategy=SimpleNamespace(barrier=lambda name=None: calls.append(name)),
                              is_global_zero=False, callbacks=[writer], loggers=[], datamodule=None)
    cb = ScoreOnPredictEnd(plots=False)
    cb.on_predict_end(trainer, None)
    assert calls and cb.last_scores is None and not (out_root / "scores.json").exists()
    trainer.is_global_zero = True
    trainer.datamodule = SimpleNamespace(expected_qids=lambda: {"lvb": ["a_0", "b_0", "c_0", "d_0"]})
    cb.on_predict_end(trainer, None)
    assert _group(cb.last_scores, "lvb", "b1024")["n_missing"] == 1
    out = capsys.readouterr().out
    assert "lvb" in out and (out_root / "scores.json").exists()
    assert out.rstrip().splitlines()[-1].startswith(f"report: {out_root / 'report.html'}")   # predict ends naming it


def test_callback_in_real_predict(out_root):
    from lightning.pytorch import LightningModule, Trainer

    class Tiny(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def predict_step(self, batch, batch_idx):
            return self.layer(batch)

    cb = ScoreOnPredictEnd(out_root=str(out_root), plots=False)
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, callbacks=[cb])
    trainer.predict(Tiny(), torch.utils.data.DataLoader(torch.zeros(2, 2), batch_size=1))
    assert _group(cb.last_scores, "mlvu", "b1024")["parsers"]["official"]["m_avg"] == pytest.approx(1 / 3)


def test_wandb_table_and_images(out_root):
    from lightning.pytorch.loggers import WandbLogger

    from callbacks.scoring import log_to_wandb

    class RecordingWandb(WandbLogger):  # records calls instead of starting a run
        def __init__(self):
            self.calls = []

        def log_table(self, key, columns=None, data=None, **kw):
            self.calls.append(("table", key, columns, data))

        def log_image(self, key, images, **kw):
            self.calls.append(("image", key, images))

    scores = write_scores(out_root)
    lg = RecordingWandb()
    assert log_to_wandb(SimpleNamespace(loggers=[lg]), scores, out_root)
    kind, key, columns, data = lg.calls[0]
    assert (kind, key) == ("table", "scores") and len(data) == 10  # 5 groups x 2 parsers
    mlvu_official = [r for r in data if r[0] == "mlvu" and r[4] == "official"][0]
    assert mlvu_official[columns.index("accuracy")] == 0.5
    assert {c[1] for c in lg.calls[1:]} == {"scores/acc_vs_budget_lvb", "scores/acc_vs_budget_mlvu",
                                             "scores/acc_vs_budget_videomme", "scores/diff_vs_base_videomme",
                                             "scores/duration_lvb", "scores/duration_videomme"}
    assert not log_to_wandb(SimpleNamespace(loggers=[]), scores, out_root)


def test_budget_and_variant_from_job_name(tmp_path):
    r = rec("q1", "A", "A", "A", "videomme", duration="short")
    del r["budget"], r["variant"]
    _write(tmp_path, "rho64_b512", "videomme", [r])
    _write(tmp_path, "b256", "videomme", [r])
    records, _ = read_records(tmp_path)
    assert sorted((x["job"], x["variant"], x["budget"]) for x in records) == [
        ("b256", None, 256), ("rho64_b512", "rho64", 512)]


def test_successful_retry_replaces_an_error_record():
    from callbacks.scoring import score_records

    base = {"job": "b256", "budget": 256, "variant": None, "meta": {"benchmark": "videomme", "duration": "short"}}
    recs = [{**base, "qid": "q1", "error": "video.mp4: cannot read the container"},
            {**base, "qid": "q2", "answer": "A", "pred": "B", "pred_robust": "B"},
            {**base, "qid": "q1", "answer": "A", "pred": "A", "pred_robust": "A"},   # retried after the error
            {**base, "qid": "q2", "answer": "A", "pred": "A", "pred_robust": "A"}]   # a true duplicate: dropped
    (g,) = score_records(recs)["groups"]
    assert (g["n_retried"], g["n_duplicates"], g["n_errors"], g["n_scored"]) == (1, 1, 0, 2)
    assert g["parsers"]["official"]["accuracy"] == 0.5


def test_a_retry_answered_in_an_earlier_rank_file_is_no_duplicate():
    """A two-process run's rank 1 failed q1 (rank1.jsonl); a resumed one-process run answered it (rank0.jsonl). The
    files are read in path order, the answer first: before, the error record was counted as a duplicate (``dup`` 1)
    and the retry was not counted."""
    from callbacks.scoring import score_records

    base = {"job": "b256", "budget": 256, "variant": None, "meta": {"benchmark": "videomme", "duration": "short"}}
    answered = {**base, "qid": "q1", "answer": "A", "pred": "A", "pred_robust": "A"}
    failed = {**base, "qid": "q1", "error": "video.mp4: CUDA out of memory"}
    for recs in ([answered, failed], [failed, answered]):
        (g,) = score_records(recs, n_resamples=0)["groups"]
        assert (g["n_retried"], g["n_duplicates"], g["n_errors"], g["n_scored"]) == (1, 0, 0, 1)
        assert g["parsers"]["official"]["accuracy"] == 1.0


def test_cli_refuses_a_folder_without_records_and_counts_missing_from_run_json(tmp_path, demo_bench, capsys):
    for folder, msg in ((tmp_path / "nonexist", "no such output folder"), (tmp_path, "no records")):
        with pytest.raises(SystemExit) as info:
            main([str(folder), "--no-plots"])
        assert info.value.code == 2 and f"{folder}: {msg}" in capsys.readouterr().err
    assert not (tmp_path / "nonexist").exists() and not (tmp_path / "scores.json").exists()
    # 2 of the demo annotation's 7 questions answered; run.json names the benchmark and its root
    out = tmp_path / "out"
    _write(out, "b128", "videomme", [rec("001-1", "B", "B", "B", "videomme", budget=128),
                                     rec("002-1", "B", "A", "A", "videomme", budget=128)])
    (out / "run.json").write_text(json.dumps({"benchmark": "videomme", "root": str(demo_bench),
                                              "loader_kwargs": {}}))
    g = _group(main([str(out), "--no-plots"]), "videomme", "b128")
    assert (g["n_expected"], g["n_missing"]) == (7, 5)
    assert g["missing_qids"] == ["001-2", "001-3", "001-4", "002-2", "002-3"]
    assert "counted against videomme" in capsys.readouterr().err
    (out / "run.json").write_text(json.dumps({"benchmark": "videomme", "root": str(tmp_path / "moved")}))
    g = _group(main([str(out), "--no-plots"]), "videomme", "b128")
    assert g["n_missing"] == 0 and g["n_expected"] is None
    assert "missing questions are not counted" in capsys.readouterr().err


def test_a_read_only_folder_is_still_scored(out_root, monkeypatch, capsys):
    import callbacks.scoring.output as sc

    def refuse(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(sc, "atomic_write_bytes", refuse)
    scores = main([str(out_root), "--no-plots"])
    out, err = capsys.readouterr()
    assert "\nbenchmark " in out and "videomme" in out                  # the table is printed
    assert f"warning: {out_root}: scores.json and plots not written (PermissionError" in err
    assert _group(scores, "videomme", "b1024")["n_errors"] == 1 and not (out_root / "scores.json").exists()


def test_writer_refuses_an_unwritable_folder_at_setup(tmp_path, monkeypatch):
    import callbacks.jsonl_writer as jw

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    writer = jw.JsonlPredictionWriter(str(tmp_path / "out"))
    trainer = SimpleNamespace(global_rank=0, is_global_zero=True, world_size=1, datamodule=None)
    monkeypatch.setattr(jw.tempfile, "TemporaryFile", refuse)
    with pytest.raises(PermissionError, match=rf"^{tmp_path / 'out'}: the output folder is not writable \(Permission "
                                              r"denied\); choose another out_dir$"):
        writer.setup(trainer, None, "predict")
    assert writer._lock_fd is None                                      # the lock is released
    monkeypatch.undo()
    writer.setup(trainer, None, "predict")                               # writable: set up as before
    writer.teardown(trainer, None, "predict")


def test_report_page_shows_scores_intervals_errors_and_unparsed(out_root):
    """``report.html`` is written with scores.json: one row per (group, parser) with its interval, the plots inline,
    the error records with their messages, the unparsed answers with their (escaped) responses."""
    import re

    (out_root / "run.json").write_text(json.dumps({"model": {"model_path": "/ckpt/x"}}))
    scores = write_scores(out_root, expected_qids={"videomme": ["q1", "q2", "q3", "q4", "q5", "q6"]})
    page = (out_root / "report.html").read_text()
    n_rows = sum(len(g["parsers"]) for g in scores["groups"])
    table = page.split("<h2>Scores</h2>", 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == n_rows + 1                               # header + one row per (group, parser)
    g = _group(scores, "videomme", "b1024")
    ci = g["parsers"]["official"]["accuracy_ci95"]
    assert f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" in table
    assert page.count("<img") == len(scores["plots"]) >= 1 and "data:image/png;base64," in page
    errors = page.split("<h2>Errors</h2>", 1)[1].split("<h2>", 1)[0]
    assert "CUDA out of memory" in errors and "q5" in errors
    unparsed = page.split("<h2>Unparsed answers</h2>", 1)[1].split("<h2>", 1)[0]
    n_unparsed = int(re.search(r"<p>(\d+) answers with no option letter", unparsed).group(1))
    assert n_unparsed == sum(1 for r in read_records(out_root)[0] if not r.get("error") and r.get("pred") is None)
    assert "/ckpt/x" in page.split("<h2>Settings (run.json)</h2>", 1)[1]


def test_report_escapes_dataset_text(tmp_path):
    from callbacks.report import render_report

    rec = {"qid": "<script>alert(1)</script>", "job": "b64", "pred": None, "answer": "A",
           "response": "<img src=x onerror=alert(1)>"}
    page = render_report({"groups": [], "plots": []}, tmp_path, [rec])
    assert "<script>alert" not in page and "<img src=x" not in page and "&lt;img src=x" in page


@pytest.mark.slow
def test_report_renders_in_headless_chromium(out_root, tmp_path):
    import shutil as _shutil
    import subprocess

    chromium = _shutil.which("chromium") or _shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    write_scores(out_root)
    shot = tmp_path / "report.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=1200,1600", (out_root / "report.html").as_uri()], check=True, timeout=120,
                   capture_output=True)
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_pruning_groups_carry_cost_means_and_no_none_budget():
    recs = [{"qid": f"q{i}", "job": "baseline_r0.5", "benchmark": "worldsense", "budget": None, "variant": "baseline",
             "answer": "A", "pred": "A", "response": "A", "options": ["a", "b", "c", "d"],
             "num_video_tokens": v, "num_audio_tokens": a, "video_retention_reached": v / 100,
             "audio_retention_reached": a / 50, "prefill_time_s": t,
             "prefill_flops": {"paper": {"qwen2.5-omni-7b": f}, "accurate": {"qwen2.5-omni-7b": 2 * f}}}
            for i, (v, a, t, f) in enumerate([(50, 25, 0.5, 4e12), (60, 13, 1.5, 6e12)])]
    recs.append({"qid": "q9", "job": "baseline_r0.5", "benchmark": "worldsense", "budget": None,
                 "variant": "baseline", "error": "x.mp4: unreadable"})            # errors do not enter the means
    scores = score_records(recs, n_resamples=0)
    (g,) = scores["groups"]
    assert g["cost"] == {"num_video_tokens": 55.0, "num_audio_tokens": 19.0, "video_retention_reached": 0.55,
                         "audio_retention_reached": 0.38, "prefill_time_s": 1.0,
                         "prefill_tflops.paper.qwen2.5-omni-7b": 5.0, "prefill_tflops.accurate.qwen2.5-omni-7b": 10.0}
    row = [line for line in format_table(scores).splitlines() if "baseline_r0.5" in line][0]
    assert "None" not in row and row.split()[3] == "-"
    assert "cost" not in score_records([dict(recs[0], num_video_tokens=None, num_audio_tokens=None,
                                             video_retention_reached=None, audio_retention_reached=None,
                                             prefill_time_s=None, prefill_flops=None)], n_resamples=0)["groups"][0]


def test_report_lists_pruning_costs(tmp_path):
    from callbacks.report import render_report

    scores = {"groups": [{"benchmark": "worldsense", "job": "v4_r0.5", "variant": "v4", "budget": None,
                          "parsers": {}, "cost": {"num_video_tokens": 55.0, "prefill_tflops.accurate.m": 10.0}}],
              "plots": []}
    page = render_report(scores, tmp_path, [])
    table = page.split("prefill cost (means per group)</h2>", 1)[1].split("</table>", 1)[0]
    assert "<th>num_video_tokens</th>" in table and ">55</td>" in table and ">10</td>" in table


def test_pruning_cost_figure(tmp_path):
    from callbacks.scoring import build_figures

    recs = []
    for job, v, f, ok in (("full", 100, 8e12, 2), ("baseline_r0.5", 50, 4e12, 1), ("v4_r0.5", 40, 3e12, 1)):
        for i in range(2):
            recs.append({"qid": f"q{i}", "job": job, "benchmark": "worldsense", "budget": None, "variant": job,
                         "answer": "A", "pred": "A" if i < ok else "B", "response": "A" if i < ok else "B",
                         "options": ["a", "b", "c", "d"], "num_video_tokens": v, "num_audio_tokens": 10,
                         "prefill_flops": {"accurate": {"qwen2.5-omni-7b": f}}})
    figs = build_figures(score_records(recs, n_resamples=50))
    fig = figs["acc_vs_cost_worldsense.png"]
    tokens_ax, flops_ax = fig.axes[:2]
    assert "kept tokens" in tokens_ax.get_xlabel() and "TFLOPs" in flops_ax.get_xlabel()
    # one point per job: (tokens, accuracy) and (TFLOPs, accuracy) as computed by hand
    pts = sorted((c.lines[0].get_xdata()[0], c.lines[0].get_ydata()[0]) for c in tokens_ax.containers)
    assert pts == [(50.0, 50.0), (60.0, 50.0), (110.0, 100.0)]
    pts = sorted((c.lines[0].get_xdata()[0], c.lines[0].get_ydata()[0]) for c in flops_ax.containers)
    assert pts == [(3.0, 50.0), (4.0, 50.0), (8.0, 100.0)]
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["baseline_r0.5", "full", "full (reference)",
                                                                         "v4_r0.5"]
    assert "qwen2.5-omni-7b" in flops_ax.get_xlabel()
    # full's accuracy as the reference line, on both panels
    for ax in (tokens_ax, flops_ax):
        (ref_line,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert list(ref_line.get_ydata()) == [100.0, 100.0]


def test_official_parser_follows_the_jobs_recorded_rule():
    """The omni pruning job answers with OmniZip's rule (``pred_rule: omnizip``): its groups' official parser is
    that rule, re-parsed from each response; VLMEvalKit's WorldSense regex stays available as ``--rules worldsense``
    (with the release aggregation); records that disagree on ``pred_rule`` fall back to the benchmark's own rule."""
    def ws(qid, answer, response, rule):
        return {"qid": qid, "video": f"{qid}.mp4", "budget": None, "variant": "full", "job": "full",
                "answer": answer, "pred_rule": rule, "response": response, "options": ["a", "b", "c", "d"],
                "meta": {"benchmark": "worldsense", "domain": "Music", "task_type": "T"}}

    # OmniZip: "The answer is B" -> "T" (wrong), "b) two" -> B; VLMEvalKit: "The answer is B" -> B, "b) two" -> None
    recs = [ws("q1", "B", "The answer is B", "omnizip"), ws("q2", "B", "b) two", "omnizip")]
    scores = score_records(recs, rules=["worldsense"])
    g = _group(scores, "worldsense", "full")
    off, vlm = g["parsers"]["official"], g["parsers"]["worldsense"]
    from callbacks.scoring.summary import headline_rows

    assert headline_rows(scores["groups"])[0]["name"] == "accuracy under the job's omnizip rule"   # not VLMEvalKit's
    assert (off["rule"], off["correct"]) == ("omnizip", 1) and "release" not in off
    assert (vlm["rule"], vlm["correct"], vlm["unparseable"]) == ("worldsense", 1, 1) and "release" in vlm
    mixed = [recs[0], ws("q2", "B", "b) two", "worldsense")]
    assert _group(score_records(mixed), "worldsense", "full")["parsers"]["official"]["rule"] == "worldsense"


def test_concealed_frames_counted_per_video(tmp_path):
    """Issue 42 item 1: answered records whose decode had concealed frames (``video_info.frames_concealed``) are
    counted once per video (two questions of v1: 2 frames, not 4); error records are not counted; the console
    shows one line only when a group has any, naming the videos (a new-user trial asked which file it was)."""
    recs = [dict(rec(q, "A", "A", "A", **VM), job="b1024", video=v, video_info=vi) for q, v, vi in (
        ("q1", "v1", {"frames_concealed": [1, 2]}), ("q2", "v1", {"frames_concealed": [1, 2]}),
        ("q3", "v2", {"frames_concealed": [0]}), ("q4", "v3", {}))]
    recs.append(dict(err("q5", "videomme"), job="b1024", video="v4", video_info={"frames_concealed": [0]}))
    g = _group(score_records(recs), "videomme", "b1024")
    assert (g["n_concealed_videos"], g["n_concealed_frames"], g["concealed_videos"]) == (2, 3, ["v1", "v2"])
    lines = [ln for ln in format_table(score_records(recs)).splitlines() if ln.startswith("concealed frames")]
    assert len(lines) == 1 and lines[0].endswith("b1024 2 videos (v1, v2), 3 frames")
    clean = [dict(r, video_info={}) for r in recs]
    assert _group(score_records(clean), "videomme", "b1024")["n_concealed_videos"] == 0
    assert "concealed frames" not in format_table(score_records(clean))
    from callbacks.report import render_report   # the report says it too, above its score table

    page = render_report(score_records(recs), tmp_path, recs)
    result = page.split("<h2>Result</h2>", 1)[1].split("<h2>Scores</h2>", 1)[0]
    assert "concealed frames (damaged packets" in result and "b1024 2 videos (v1, v2), 3 frames" in result
    assert "concealed frames" not in render_report(score_records(clean), tmp_path, clean)


def test_unchecked_videos_counted_per_video(tmp_path):
    """Issue 42 item 1: videos whose frames NVDEC decoded (``video_info.concealment_checked: false``: no decode
    status to check) are counted once per video in their group (v1's two questions count once; v3, checked, and the
    error record of v4 not), and the console names the count, only when a group has any."""
    recs = [dict(rec(q, "A", "A", "A", **VM), job="b1024", video=v, video_info=vi) for q, v, vi in (
        ("q1", "v1", {"concealment_checked": False}), ("q2", "v1", {"concealment_checked": False}),
        ("q3", "v2", {"decoder": "nvdec", "concealment_checked": False}), ("q4", "v3", {"decoder": "pyav_skip"}))]
    recs.append(dict(err("q5", "videomme"), job="b1024", video="v4", video_info={"concealment_checked": False}))
    g = _group(score_records(recs), "videomme", "b1024")
    assert (g["n_unchecked_videos"], g["n_concealed_videos"]) == (2, 0)
    lines = [ln for ln in format_table(score_records(recs)).splitlines() if ln.startswith("not checked for conceal")]
    assert len(lines) == 1 and lines[0].endswith("b1024 2 videos")
    clean = [dict(r, video_info={}) for r in recs]
    assert _group(score_records(clean), "videomme", "b1024")["n_unchecked_videos"] == 0
    assert "not checked for concealment" not in format_table(score_records(clean))
    from callbacks.report import render_report

    result = render_report(score_records(recs), tmp_path, recs).split("<h2>Scores</h2>", 1)[0]
    assert "not checked for concealment (decoded by NVDEC" in result and "b1024 2 videos" in result


def test_rescore_names_a_cut_line_once(out_root, caplog):
    """`python -m callbacks.scoring` on a folder with a line cut by a crash: one console line naming it, not one per
    read of the folder (scoring and the report both read the records)."""
    import logging

    with caplog.at_level(logging.WARNING):
        main([str(out_root), "--no-plots"])
    cut = [r.getMessage() for r in caplog.records if "unreadable line" in r.getMessage()]
    assert cut == [f"scoring: skipping unreadable line 4 of {out_root / 'b1024' / 'videomme' / 'rank1.jsonl'}"]


def test_intervals_do_not_depend_on_the_order_of_the_records():
    """Records come in worker / resume order; the bootstrap resamples them in question-id order, so any order of
    the same records gives the same interval (a run and its resumed twin report the same ±95)."""
    recs = [rec(f"q{i}", "A", "A" if i % 3 else "B", "A", bench="videomme", duration="short", domain="d",
                task_type="t") | {"job": "b1024"} for i in range(12)]
    a = _group(score_records(recs), "videomme", "b1024")["parsers"]["official"]["accuracy_ci95"]
    b = _group(score_records(recs[::-1]), "videomme", "b1024")["parsers"]["official"]["accuracy_ci95"]
    assert a is not None and a == b


def test_a_run_where_every_record_is_an_error_says_nothing_was_answered():
    """Every video unreadable (a text file named .mp4): 3 error records and no answer. The table's empty cells
    said nothing of it; the note under the table (and in report.html) does. One answered record: no note."""
    from callbacks.scoring.console import data_notes

    errors = [{"qid": f"q{i}", "job": "b128", "budget": 128, "answer": "A", "meta": {"benchmark": "videomme"},
               "error": f"/v/{i}.mp4: cannot read the container"} for i in range(3)]
    groups = score_records(errors, n_resamples=0)["groups"]
    note = ("NOTHING WAS ANSWERED: all 3 records are error records (the Errors section of "
            "report.html names each file and cause)")
    assert data_notes(groups)[0] == note and note in format_table({"groups": groups}).splitlines()
    answered = errors[:2] + [{"qid": "q2", "job": "b128", "budget": 128, "answer": "A", "response": "B",
                              "meta": {"benchmark": "videomme"}}]
    assert not [n for n in data_notes(score_records(answered, n_resamples=0)["groups"]) if "NOTHING" in n]


def test_records_of_questions_removed_from_the_annotation_are_left_out():
    """The trial's case: a finished folder, then a row (002-3) removed from the annotation: the table said "6
    answered of 7" and scored the removed question. With the annotation's qids given, its record is left out,
    counted, and said under the table."""
    def rec(qid, pred):
        return {"qid": qid, "job": "b128", "budget": 128, "answer": "A", "response": pred,
                "meta": {"benchmark": "videomme"}}

    records = [rec("001-1", "A"), rec("001-2", "B"), rec("002-3", "A")]
    (g,) = score_records(records, {"videomme": ["001-1", "001-2"]}, n_resamples=0)["groups"]
    assert (g["n_records"], g["n_scored"], g["n_not_in_annotation"], g["n_missing"]) == (2, 2, 1, 0)
    assert g["parsers"]["official"]["correct"] == 1 and g["parsers"]["official"]["accuracy"] == 0.5
    assert "left out, their questions no longer in the annotation: videomme b128 1" in \
        format_table({"groups": [g]}).splitlines()
    (g,) = score_records(records, None, n_resamples=0)["groups"]          # no annotation given: every record
    assert (g["n_scored"], g["n_not_in_annotation"]) == (3, 0)


def test_the_concealed_line_names_at_most_three_videos_and_reads_old_scores():
    from callbacks.scoring.console import _videos

    assert _videos(1, ["cockatoo"]) == "1 video (cockatoo)"
    assert _videos(5, ["a", "b", "c", "d", "e"]) == "5 videos (a, b, c, ...)"
    assert _videos(2, None) == "2 videos"                     # a scores.json from before the ids were kept
