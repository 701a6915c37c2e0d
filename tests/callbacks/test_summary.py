"""What reports show first (callbacks.scoring.summary, console, report.html): the layout ablation's matrix against
``base``, the pruning table against ``full``, the released figures by name, p-values, the tiny-model banner; and
the release blocks' breakdowns (issue 32 D7), all on small hand-computed record sets."""
import json

import pytest

from callbacks.scoring import format_p, format_table, score_records
from callbacks.scoring.summary import matrix, pruning_rows


def _rec(qid, variant, budget, ok, reused=False):
    return {"qid": qid, "benchmark": "videomme", "job": f"{variant}_b{budget}", "variant": variant, "budget": budget,
            "answer": "A", "pred": "A" if ok else "B", "pred_robust": None, "reused": reused}


def _ablation():
    """10 questions; base right on 4 (b64) / 6 (b256); good +2 / +2 over base, bad -2 / -1, flat = base and reused."""
    right = {("base", 64): 4, ("base", 256): 6, ("good", 64): 6, ("good", 256): 8, ("bad", 64): 2, ("bad", 256): 5,
             ("flat", 64): 4, ("flat", 256): 6}
    return [_rec(f"q{i}", v, b, i < k, reused=(v == "flat")) for (v, b), k in right.items() for i in range(10)]


def test_ablation_matrix_sorted_by_difference_from_base_with_reused_count():
    scores = score_records(_ablation(), n_resamples=200)
    pairs = {(d["a"]["job"], d["b"]["job"]) for d in scores["differences"] if d["parser"] == "official"}
    # only each variant against base at the same budget, and base's budgets against each other
    assert pairs == {("good_b64", "base_b64"), ("good_b256", "base_b256"), ("bad_b64", "base_b64"),
                     ("bad_b256", "base_b256"), ("flat_b64", "base_b64"), ("flat_b256", "base_b256"),
                     ("base_b256", "base_b64")}
    m = matrix(scores, scores["groups"])
    assert m["reference"] == "base" and m["budgets"] == [64, 256]
    assert [r["variant"] for r in m["rows"]] == ["base", "good", "flat", "bad"]     # base, then by mean Δ
    good = m["rows"][1]
    assert good["cells"][64]["difference"] == pytest.approx(0.2) and good["cells"][256]["accuracy"] == 0.8
    assert good["mean_difference"] == pytest.approx(0.2) and m["rows"][3]["mean_difference"] == pytest.approx(-0.15)
    assert m["rows"][2]["cells"][64]["n_reused"] == 10
    lines = format_table(scores).splitlines()
    assert lines[0].startswith("videomme: accuracy % (official rule, unparsed = wrong)")
    assert [ln.split()[0] for ln in lines[3:7]] == ["base", "good", "flat", "bad"]
    assert lines[4].split()[-1] == "+20.0" and "(+20.0" in lines[4]
    assert "records reused from base (same LLM input as base, not recomputed): 20 of 80" in lines[7]
    # the variant differences are in the matrix; below the table only base's budget pair
    listed = [ln for ln in lines if " - " in ln and ": " in ln and ln.startswith("  videomme")]
    assert listed == [ln for ln in listed if "base b256 - base b64" in ln] and len(listed) == 1


def _prune(variant, ok, v, a, flops):
    return [{"qid": f"q{i}", "job": variant if variant == "full" else f"{variant}_r0.5", "benchmark": "worldsense",
             "budget": None, "variant": variant, "answer": "A", "pred": "A" if i < ok else "B",
             "response": "A" if i < ok else "B", "options": ["a", "b", "c", "d"], "num_video_tokens": v,
             "num_audio_tokens": a, "video_retention_reached": v / 100, "audio_retention_reached": a / 40,
             "prefill_flops": {"accurate": {"qwen2.5-omni-7b": 7 * flops, "model": flops},
                               "paper": {"qwen2.5-omni-7b": flops / 3}}} for i in range(4)]


def test_pruning_table_one_row_per_variant_full_first_flops_at_the_models_shape():
    recs = _prune("v4", 3, 50, 20, 4e12) + _prune("full", 4, 100, 40, 8e12) + _prune("baseline", 2, 50, 10, 3e12)
    scores = score_records(recs, n_resamples=100)
    t = pruning_rows(scores, scores["groups"])
    assert t["reference"] == "full" and t["flops_key"] == "prefill_tflops.accurate.model"
    assert [r["variant"] for r in t["rows"]] == ["full", "v4", "baseline"]
    full, v4, base = t["rows"]
    assert (full["accuracy"], full["tflops"], full["tflops_pct_of_full"], full["kept_tokens"]) == (1.0, 8.0, 100.0,
                                                                                                  140.0)
    assert v4["difference"] == pytest.approx(-0.25) and v4["tflops_pct_of_full"] == pytest.approx(50.0)
    assert (v4["video_retention"], v4["audio_retention"], v4["kept_tokens"]) == (0.5, 0.5, 70.0)
    assert base["tflops_pct_of_full"] == pytest.approx(37.5)
    lines = format_table(scores).splitlines()
    assert lines[0].startswith("worldsense: pruning, one row per variant; accuracy = WorldSense overall")
    assert "accurate convention, the model's own shape" in lines[0]
    assert lines[3].split()[:5] == ["full", "4", "100.0", "±0.0", "ref"]
    assert lines[4].split()[:5] == ["v4", "4", "75.0", lines[4].split()[3], "-25.0"]
    assert lines[4].split()[-2:] == ["4", "50.0"]


def test_p_values_are_never_printed_as_zero():
    assert format_p(0.0, 1000) == "< 0.001" and format_p(0.0, 200) == "< 0.005"
    assert format_p(0.5, 1000) == "0.500" and format_p(None, 1000) == "-"


def test_videomme_release_gives_sub_category_and_per_duration_breakdowns():
    """eval_your_results: only non-empty extractions count ("answered"); per duration and overall, for domain,
    sub_category and task_type."""
    def r(qid, resp, dur, sub, task="OCR Problems"):
        return {"qid": qid, "job": "b64", "budget": 64, "answer": "A", "response": resp, "options": ["a"] * 4,
                "pred_robust": None, "meta": {"benchmark": "videomme", "duration": dur, "domain": "Knowledge",
                                              "sub_category": sub, "task_type": task}}
    recs = [r("q1", "A", "short", "Law"), r("q2", "none", "short", "Law"),   # q2: empty extraction, not counted
            r("q3", "C", "short", "Astronomy"), r("q4", "A", "long", "Law", "Counting Problem")]
    rel = score_records(recs, n_resamples=0)["groups"][0]["parsers"]["official"]["release"]
    assert rel["by"]["sub_category"] == {"Astronomy": {"answered": 1, "correct": 0, "accuracy": 0.0},
                                         "Law": {"answered": 2, "correct": 2, "accuracy": 1.0}}
    short = rel["by_duration"]["short"]
    assert (short["answered"], short["correct"], short["accuracy_answered"]) == (2, 1, 0.5)
    assert short["by"]["sub_category"]["Law"] == {"answered": 1, "correct": 1, "accuracy": 1.0}
    assert rel["by_duration"]["long"]["by"]["task_type"] == {"Counting Problem": {"answered": 1, "correct": 1,
                                                                                  "accuracy": 1.0}}


def test_worldsense_release_rates_every_dimension_and_each_audio_class():
    """get_dimension_rating: mean score per domain, sub_category, task_domain, task_type, audio_class (a question
    in each of its classes; the release stores the list as text and evals it) and duration, overall and per
    duration; an unparsed reply scores 0."""
    def r(qid, resp, audio, dur, td):
        return {"qid": qid, "job": "full", "variant": "full", "answer": "A", "response": resp, "options": ["a"] * 4,
                "pred_robust": None, "meta": {"benchmark": "worldsense", "domain": "Music", "sub_category": "Covers",
                                              "task_domain": td, "task_type": "Audio Counting", "audio_class": audio,
                                              "duration": dur}}
    recs = [r("q1", "A", "['Speech', 'Music']", "<1min", "Recognition"), r("q2", "B", ["Speech"], "<1min", "Reasoning"),
            r("q3", "no idea", "['Event']", "1-2min", "Recognition")]
    rel = score_records(recs, n_resamples=0)["groups"][0]["parsers"]["official"]["release"]
    assert rel["accuracy"] == pytest.approx(1 / 3)
    assert rel["by"]["audio_class"] == {"Event": 0.0, "Music": 1.0, "Speech": 0.5}
    assert rel["by"]["task_domain"] == {"Reasoning": 0.0, "Recognition": 0.5}
    assert rel["by"]["duration"] == {"1-2min": 0.0, "<1min": 0.5}
    assert rel["by"]["sub_category"] == {"Covers": pytest.approx(1 / 3)}
    assert rel["by_duration"]["<1min"]["by"]["audio_class"] == {"Music": 1.0, "Speech": 0.5}
    assert rel["by_duration"]["<1min"]["accuracy"] == 0.5 and rel["by_duration"]["<1min"]["n"] == 2


def test_report_leads_with_the_result_and_warns_about_a_tiny_model(tmp_path):
    from callbacks.report import render_report

    scores = score_records(_ablation(), n_resamples=100)
    scores["plots"] = []
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 3584}}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"model_path": str(ckpt)}))
    page = render_report(scores, out, [])
    assert 'class="banner"' not in page                                    # a real-sized config: no banner
    head = page.split("<h2>Result</h2>", 1)[1].split("<h2>", 1)[0]
    assert "Δ vs base at the same budget" in head and "<b>20 of 80</b>" in head
    assert head.index(">good<") < head.index(">flat<") < head.index(">bad<")
    (ckpt / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 64}}))
    assert 'class="banner"><b>Tiny random model.</b>' in render_report(scores, out, [])
    (ckpt / "config.json").write_text(json.dumps({"hidden_size": 4096}))
    (ckpt / "TINY_RANDOM_MODEL.json").write_text("{}")                    # models.videollama3.tiny's marker
    assert "Tiny random model." in render_report(scores, out, [])


def test_unparsed_answers_table_names_its_columns():
    """The unparsed-answers table heads the record's ``answer`` as the correct option and ``response`` as the model's
    raw reply (it read ``answer`` / ``response``, and ``answer`` was taken for the reply)."""
    from callbacks.report import _record_lists

    recs = [{"qid": "q1", "job": "b128", "pred_rule": "videomme", "answer": "C", "pred": None,
             "response": "zebra <b>quartz</b>"},
            {"qid": "q2", "job": "b128", "pred_rule": "videomme", "answer": "A", "pred": "A", "response": "A"}]
    _, table = _record_lists(recs)
    assert table == ("<p>1 answers with no option letter under the benchmark's rule</p><table><tr><th>qid</th>"
                     "<th>job</th><th>rule</th><th>correct answer</th><th>model reply (raw, no option letter "
                     "parsed)</th></tr><tr><td>q1</td><td>b128</td><td>videomme</td><td>C</td>"
                     "<td>zebra &lt;b&gt;quartz&lt;/b&gt;</td></tr></table>")


def test_error_records_are_listed_once_per_video_and_cause():
    """A video that failed gives one error record per question and budget; the report lists it once, with the count,
    the jobs and the questions (the trial's 21 identical rows for 2 unreadable videos x 3 budgets)."""
    from callbacks.report import _record_lists

    def err(qid, job, video, cause):
        return {"qid": qid, "job": job, "video": video, "error": cause}

    recs = ([err(f"1-{i}", job, "v1", "/m/v1.mp4: cannot read the container") for job in ("b128", "b256")
             for i in range(3)]
            + [err("2-1", "b128", "v2", "/m/v2.mp4: question 2-1: longer than the context")]
            + [{"qid": "3-1", "job": "b128", "video": "v3", "pred": "A", "answer": "A"}])
    table, _ = _record_lists(recs)
    assert table == ("<p>7 error records, 2 (video, cause)</p><table><tr><th>video</th><th>records</th><th>jobs</th>"
                     "<th>questions</th><th>error</th></tr><tr><td>v1</td><td class=\"num\">6</td><td>b128, b256</td>"
                     "<td>1-0, 1-1, 1-2</td><td>/m/v1.mp4: cannot read the container</td></tr><tr><td>v2</td>"
                     "<td class=\"num\">1</td><td>b128</td><td>2-1</td><td>/m/v2.mp4: question 2-1: longer than "
                     "the context</td></tr></table>")


def test_no_error_records_is_said_plainly():
    from callbacks.report import _record_lists

    table, _ = _record_lists([{"qid": "q", "job": "b128", "video": "v", "pred": "A", "answer": "A"}])
    assert table == "<p>0 error records</p>"
