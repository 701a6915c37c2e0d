"""Each benchmark's released aggregation on small hand-computed record sets (callbacks.scoring, ``release``)."""
import json
import random

import pytest

from callbacks.scoring import lvb_fallback_choice, main, score_records

OPTS4 = ["w", "x", "y", "z"]


def rec(qid, answer, response, bench, options=OPTS4, **meta):
    return {"qid": qid, "job": "b64", "budget": 64, "answer": answer, "response": response, "options": options,
            "pred_robust": None, "meta": {"benchmark": bench, **meta}}


def _only(scores):
    (g,) = scores["groups"]
    return g


def test_videomme_divides_by_answered():
    recs = [rec("q1", "A", "A", "videomme", duration="short"),
            rec("q2", "B", "none of the options", "videomme", duration="short"),   # empty extraction
            rec("q3", "C", "Based on it, C", "videomme", duration="medium"),      # "B" from "Based": wrong
            rec("q4", "D", "The answer is D", "videomme", duration="medium"),
            {"qid": "q5", "job": "b64", "budget": 64, "error": "oom", "meta": {"benchmark": "videomme"}}]
    g = _only(score_records(recs))
    off = g["parsers"]["official"]
    assert off["rule"] == "videomme"
    assert (off["correct"], off["unparseable"], off["accuracy"], off["accuracy_all"]) == (2, 1, 0.5, 0.4)
    rel = off["release"]
    assert (rel["answered"], rel["correct"]) == (3, 2) and rel["accuracy_answered"] == pytest.approx(2 / 3)
    assert rel["by"]["duration"] == {"medium": {"answered": 2, "correct": 1, "accuracy": 0.5},
                                     "short": {"answered": 1, "correct": 1, "accuracy": 1.0}}


def test_mlvu_m_avg_over_tasks():
    recs = [rec("q1", "A", "A) w", "mlvu", task="count"),
            rec("q2", "B", "B.", "mlvu", task="count"),          # check_ans: "B." != "B"
            rec("q3", "C", "(C) y", "mlvu", task="count"),
            rec("q4", "A", "A", "mlvu", task="order"),
            rec("q5", "B", "(A) w", "mlvu", task="order")]
    off = _only(score_records(recs))["parsers"]["official"]
    assert off["rule"] == "mlvu"
    assert off["release"]["m_avg"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert off["pooled"] == pytest.approx(3 / 5)
    assert off["release"]["by_task"] == {"count": pytest.approx(2 / 3), "order": 0.5}


def test_lvb_random_fallback_seeded_per_qid_and_expected_accuracy():
    five = OPTS4 + ["v"]
    recs = [rec("q1", "A", "A", "lvb", duration_group="600"),
            rec("q2", "B", "hmm", "lvb", duration_group="600"),                 # nothing parses: random option
            rec("q3", "E", "Answer: E", "lvb", options=five, duration_group="15")]  # "A" of "Answer": wrong
    off = _only(score_records(recs))["parsers"]["official"]
    assert off["rule"] == "lvb" and off["unparseable"] == 1 and off["correct"] == 1
    drawn = random.Random("lvb:q2").choice(["A", "B", "C", "D"])
    assert lvb_fallback_choice("q2", 4) == drawn
    rel = off["release"]
    assert rel["correct_fallback"] == 1 + (drawn == "B")
    assert rel["accuracy_fallback"] == pytest.approx((1 + (drawn == "B")) / 3)
    assert rel["expected_accuracy"] == pytest.approx((1 + 1 / 4 + 0) / 3)
    # a re-score gives the same number
    assert _only(score_records(recs))["parsers"]["official"]["release"] == rel


def test_worldsense_exact_matching_scores_empty_extraction_zero():
    recs = [rec("q1", "A", "A", "worldsense", domain="Music"),
            rec("q2", "B", "b", "worldsense", domain="Music"),
            rec("q3", "C", "Best answer: C", "worldsense", domain="Games")]   # no "Best answer:" prefix: "B"
    off = _only(score_records(recs))["parsers"]["official"]
    assert off["rule"] == "worldsense"
    assert off["release"]["accuracy"] == pytest.approx(1 / 3)
    assert off["release"]["by"]["domain"] == {"Games": 0.0, "Music": 0.5}


def test_old_records_rescore_with_any_rule(tmp_path, capsys):
    # a record written before records carried options: re-parsed from its response with the usual option count
    old = {"qid": "q1", "video": "v", "budget": 64, "answer": "C", "pred": "B", "pred_robust": "C",
           "response": "Answer: C", "meta": {"benchmark": "lvb"}}
    folder = tmp_path / "b64" / "lvb"
    folder.mkdir(parents=True)
    (folder / "rank0.jsonl").write_text(json.dumps(old) + "\n")
    scores = main([str(tmp_path), "--no-plots", "--rules", "videomme", "mlvu"])
    (g,) = scores["groups"]
    p = g["parsers"]
    assert p["official"]["rule"] == "lvb" and p["official"]["correct"] == 0 and p["official"]["n_options_assumed"] == 1
    assert p["videomme"]["correct"] == 1          # "Answer:" is in Video-MME's list
    assert p["mlvu"]["correct"] == 0 and p["mlvu"]["unparseable"] == 1
    assert p["robust"]["correct"] == 1            # no options: the stored pred_robust
    out = capsys.readouterr().out
    assert "lmms-eval LongVideoBench" in out and "MLVU check_ans" in out
    with pytest.raises(ValueError, match="unknown rule"):
        score_records([old], rules=["first_capital"])


def test_a_rescore_with_rules_keeps_the_runs_own_scores_report_and_plots(tmp_path, capsys):
    """``--rules`` writes ``scores_<rules>.json`` / ``report_<rules>.html`` / ``<plot>_<rules>.png`` beside the run's
    own files, which stay byte for byte (they were overwritten); a plain re-score still writes ``scores.json``."""
    recs = [{"qid": f"q{i}", "video": "v", "benchmark": "videomme", "job": f"b{b}", "budget": b, "answer": "A",
             "pred": "A" if i < 2 else None, "pred_robust": "A", "options": ["A. x", "B. y"],
             "response": "A" if i < 2 else "(a)", "meta": {"benchmark": "videomme"}} for b in (64, 128) for i in range(3)]
    for b in (64, 128):
        folder = tmp_path / f"b{b}" / "videomme"
        folder.mkdir(parents=True)
        (folder / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs if r["budget"] == b))
    main([str(tmp_path)])                                            # the run's own scoring
    own = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert {"scores.json", "report.html", "acc_vs_budget_videomme.png"} <= set(own)
    capsys.readouterr()
    scores = main([str(tmp_path), "--rules", "mlvu", "robust", "mlvu"])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in own} == own
    new = {p.name for p in tmp_path.iterdir() if p.is_file()} - set(own)
    assert new == {"scores_mlvu-robust.json", "report_mlvu-robust.html",
                   *(f"{n[:-4]}_mlvu-robust.png" for n in own if n.endswith(".png"))}
    assert json.loads((tmp_path / "scores_mlvu-robust.json").read_text())["groups"][0]["parsers"]["mlvu"] == \
        json.loads(json.dumps(scores["groups"][0]["parsers"]["mlvu"]))
    assert "acc_vs_budget_videomme_mlvu-robust.png" in (tmp_path / "report_mlvu-robust.html").read_text()
    err = capsys.readouterr().err
    assert f"scores: {tmp_path / 'scores_mlvu-robust.json'}" in err and f"report: {tmp_path / 'report_mlvu-robust.html'}" in err
