"""Paired bootstrap intervals (algorithms.bootstrap) and their use in callbacks.scoring (issue 23 item 2)."""
import numpy as np
import pytest

from algorithms.bootstrap import bootstrap_interval, paired_bootstrap_difference
from callbacks.scoring import format_table, score_records


def test_interval_coverage_on_a_seeded_synthetic_case():
    """Over 300 synthetic benchmarks of 200 questions with true accuracy 0.6, the 95 % interval holds 0.6 in close to
    95 % of them (binomial sd of the rate ~1.3 %: 0.91..0.98 allowed), and its width is near 2 x 1.96 x sqrt(.24/200)."""
    rng = np.random.default_rng(123)
    hits, widths = 0, []
    for t in range(300):
        x = (rng.random(200) < 0.6).astype(float)
        lo, hi = bootstrap_interval(x, seed=t)
        hits += lo <= 0.6 <= hi
        widths.append(hi - lo)
    assert 0.91 <= hits / 300 <= 0.98
    assert np.mean(widths) == pytest.approx(2 * 1.96 * np.sqrt(0.24 / 200), rel=0.08)


def test_paired_difference_coverage_and_pairing():
    """Two systems answering the same 300 questions, B right where A is plus on 5 % more: the paired interval holds
    the true difference (0.05 on average) in ~95 % of synthetic runs and is far narrower than the unpaired one."""
    rng = np.random.default_rng(7)
    hits, paired_w, unpaired_w = 0, [], []
    for t in range(200):
        a = (rng.random(300) < 0.5).astype(float)
        b = np.maximum(a, rng.random(300) < 0.1)     # P(b=1, a=0) = 0.5 x 0.1 = 0.05
        res = paired_bootstrap_difference(b, a, seed=t)
        assert res["difference"] == pytest.approx(b.mean() - a.mean())
        hits += res["low"] <= 0.05 <= res["high"]
        paired_w.append(res["high"] - res["low"])
        la, ha = bootstrap_interval(a, seed=t)
        lb, hb = bootstrap_interval(b, seed=t + 1000)
        unpaired_w.append((ha - la + hb - lb) / 2)
    assert 0.90 <= hits / 200 <= 0.99
    assert np.mean(paired_w) < 0.5 * np.mean(unpaired_w)


def test_hand_cases_seeding_and_errors():
    assert bootstrap_interval([1, 1, 1]) == (1.0, 1.0) and bootstrap_interval([]) is None
    x = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert bootstrap_interval(x, seed=3) == bootstrap_interval(x, seed=3)      # reproducible
    same = paired_bootstrap_difference(x, x)
    assert same == {"difference": 0.0, "low": 0.0, "high": 0.0, "p_two_sided": 1.0}
    # B never worse than A: every resampled difference is >= 0, so the interval starts at >= 0
    d = paired_bootstrap_difference([1, 1, 0, 0, 1, 0, 1, 1], [0, 1, 0, 0, 0, 0, 1, 1])
    assert d["difference"] == 0.25 and d["low"] >= 0.0 and d["high"] <= 0.75
    with pytest.raises(ValueError, match="same questions: 2 vs 3"):
        paired_bootstrap_difference([1, 0], [1, 0, 1])
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval(x, level=95)


def _rec(qid, budget, ok, variant=None):
    return {"qid": qid, "benchmark": "videomme", "job": f"{variant + '_' if variant else ''}b{budget}",
            "budget": budget, "variant": variant, "answer": "A", "pred": "A" if ok else "B", "pred_robust": None}


def test_scoring_reports_intervals_and_paired_differences():
    """Each parser gets ``accuracy_ci95`` = the bootstrap interval of its 0/1 correctness (``accuracy_all_ci95`` with
    errors as 0); budgets of one variant and variants of one budget are compared over their common questions;
    the table shows ``±`` half-widths and the differences; nothing is drawn at random between re-scores."""
    qids = [f"q{i}" for i in range(40)]
    ok128 = [i % 2 == 0 for i in range(40)]                 # 20 / 40
    ok1024 = [ok or i % 4 == 1 for i, ok in enumerate(ok128)]   # 30 / 40, never worse
    records = [_rec(q, 128, ok) for q, ok in zip(qids, ok128)] + [_rec(q, 1024, ok) for q, ok in zip(qids, ok1024)]
    records += [_rec(q, 128, True, "rho") for q in qids[:30]]  # a variant at 128 on 30 of the questions
    records.append({"qid": "q40", "benchmark": "videomme", "job": "b128", "budget": 128, "variant": None,
                    "error": "decode failed"})
    s = score_records(records)
    g128 = next(g for g in s["groups"] if g["budget"] == 128 and g["variant"] is None)
    p = g128["parsers"]["official"]
    assert p["accuracy"] == 0.5
    order = sorted(range(40), key=lambda i: qids[i])   # resampled in question-id order, whatever the file order
    assert p["accuracy_ci95"] == list(bootstrap_interval([int(ok128[i]) for i in order]))
    # the scored answers, then a 0 per error record (q40) and missing question
    assert p["accuracy_all_ci95"] == list(bootstrap_interval([int(ok128[i]) for i in order] + [0]))
    pairs = {(d["a"]["variant"], d["a"]["budget"], d["b"]["variant"], d["b"]["budget"]): d
             for d in s["differences"] if d["parser"] == "official"}
    assert set(pairs) == {(None, 1024, None, 128), ("rho", 128, None, 128)}   # rho b128 vs b1024 differs in both
    d = pairs[(None, 1024, None, 128)]
    assert d["compared"] == "budget" and d["n_common"] == 40 and d["difference"] == 0.25 and d["ci95"][0] >= 0
    ref = paired_bootstrap_difference([int(ok1024[i]) for i in order], [int(ok128[i]) for i in order])
    assert d["ci95"] == [ref["low"], ref["high"]]
    v = pairs[("rho", 128, None, 128)]
    assert v["compared"] == "variant" and v["n_common"] == 30 and v["difference"] == pytest.approx(1 - 15 / 30)
    assert score_records(records) == s
    assert s["bootstrap"]["n_resamples"] == 1000 and s["bootstrap"]["seed"] == 0
    table = format_table(s)
    half = 100 * (p["accuracy_ci95"][1] - p["accuracy_ci95"][0]) / 2
    assert f"±{half:.1f}" in table
    assert "videomme b1024 - b128: +25.0 [" in table and "n 40" in table
    none = score_records(records, n_resamples=0)
    assert none["differences"] == [] and none["groups"][0]["parsers"]["official"]["accuracy_ci95"] is None


def test_plots_have_one_panel_per_parser_distinct_series_and_labelled_zero_bars():
    """``build_figures``: accuracy-vs-budget panels per parser with one line per variant (distinct colour+marker,
    legend outside the axes), duration bars with every value printed (a 0 % bar shows "0"), titles naming the
    accuracy and the rule."""
    from callbacks.scoring import build_figures

    recs = []
    for variant in (None, "rho16", "rho32"):
        for budget in (64, 256):
            for i in range(12):
                ok = not (variant == "rho16" and budget == 64) and i % 3 != 0
                r = _rec(f"q{i}", budget, ok, variant)
                r["meta"] = {"duration": ("short", "long")[i % 2]}
                r["pred_robust"] = r["pred"]
                recs.append(r)
    figs = build_figures(score_records(recs, n_resamples=50))
    assert set(figs) == {"acc_vs_budget_videomme.png", "duration_videomme.png", "diff_vs_base_videomme.png"}
    acc = figs["acc_vs_budget_videomme.png"]
    axes = [ax for ax in acc.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["official parser, rule videomme", "robust parser, rule robust"]
    for ax in axes:
        lines = [c.lines[0] for c in ax.containers]                     # one ErrorbarContainer per variant
        assert len(lines) == 3
        assert len({(ln.get_color(), ln.get_marker()) for ln in lines}) == 3
    assert [t.get_text() for t in acc.legends[0].get_texts()] == ["base", "rho16", "rho32"]
    assert "correct / scored" in acc._suptitle.get_text()
    dur = figs["duration_videomme.png"]
    ax0 = dur.axes[0]
    assert len(ax0.containers) == 2                                     # short, long
    assert [t.get_text() for t in ax0.get_xticklabels()] == ["b64", "b256", "rho16_b64", "rho16_b256",
                                                             "rho32_b64", "rho32_b256"]
    texts = [t.get_text() for t in ax0.texts]
    assert len(texts) == 12 and texts.count("0") == 2                  # rho16_b64: 0 % in both groups, labelled
    assert ax0.get_title() == "official parser, rule videomme" and "per duration" in dur._suptitle.get_text()
