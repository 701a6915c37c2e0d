"""What a (re-)scoring leaves in a folder (issue 43 item 5): no repeated official row, a re-score report titled as
one, no PNG the report does not show, captions that say what a plot shows, the budget axis in log2."""
import json
import re

from callbacks.scoring import main, score_records
from callbacks.scoring.plots import build_figures


def _folder(tmp_path, benchmark="videomme"):
    recs = [{"qid": f"q{i}", "video": "v", "benchmark": benchmark, "job": f"b{b}", "budget": b, "answer": "A",
             "pred": "A" if i < 2 else None, "pred_robust": "A", "options": ["A. x", "B. y"],
             "response": "A" if i < 2 else "(a)", "meta": {"benchmark": benchmark}}
            for b in (64, 256) for i in range(3)]
    for b in (64, 256):
        folder = tmp_path / f"b{b}" / benchmark
        folder.mkdir(parents=True)
        (folder / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs if r["budget"] == b))
    return recs


def test_a_rule_that_is_the_benchmarks_own_is_not_a_second_row(tmp_path):
    """``--rules videomme`` on Video-MME records: the official parser already is that rule (a7fdaaf printed it
    twice, as ``official`` and as ``videomme``); on another benchmark it is a parser of its own."""
    recs = _folder(tmp_path)
    by_job = {g["job"]: g for g in score_records(recs, rules=["videomme", "mlvu"])["groups"]}
    assert set(by_job["b64"]["parsers"]) == {"official", "robust", "mlvu"}
    assert by_job["b64"]["parsers"]["official"]["rule"] == "videomme"
    lvb = [{**r, "benchmark": "lvb", "meta": {"benchmark": "lvb"}} for r in recs]
    assert set(score_records(lvb, rules=["videomme"])["groups"][0]["parsers"]) == {"official", "robust", "videomme"}


def test_a_rescore_report_is_titled_as_one(tmp_path, capsys):
    _folder(tmp_path)
    main([str(tmp_path), "--no-plots"])
    main([str(tmp_path), "--no-plots", "--rules", "mlvu", "robust"])
    own = (tmp_path / "report.html").read_text()
    rescore = (tmp_path / "report_mlvu-robust.html").read_text()
    assert f"<title>{tmp_path.name} report</title>" in own and f"<h1>Run report: {tmp_path}</h1>" in own
    assert re.search(r"<title>[^<]*re-score with rules mlvu, robust</title>", rescore)
    assert f"<h1>Re-score with rules mlvu, robust: {tmp_path}</h1>" in rescore and "Run report" not in rescore
    assert "<a href='report.html'>" in rescore


def test_no_plots_removes_the_plots_an_earlier_scoring_wrote(tmp_path, capsys):
    """A scoring with plots, then ``--no-plots``: the earlier PNGs go (the report no longer shows them); a
    re-score's own PNGs stay until a re-score with the same rules drops them."""
    _folder(tmp_path)
    main([str(tmp_path)])
    main([str(tmp_path), "--rules", "mlvu"])
    own = {p.name for p in tmp_path.glob("*.png") if "_mlvu" not in p.name}
    tagged = {p.name for p in tmp_path.glob("*_mlvu.png")}
    assert own == {"acc_vs_budget_videomme.png", "duration_videomme.png"}
    assert tagged == {"acc_vs_budget_videomme_mlvu.png", "duration_videomme_mlvu.png"}
    main([str(tmp_path), "--no-plots"])
    assert {p.name for p in tmp_path.glob("*.png")} == tagged          # the re-score's plots are not this one's
    assert json.loads((tmp_path / "scores.json").read_text())["plots"] == []
    assert "<p>No plots.</p>" in (tmp_path / "report.html").read_text()
    main([str(tmp_path), "--no-plots", "--rules", "mlvu"])
    assert not list(tmp_path.glob("*.png"))
    (tmp_path / "mine.png").write_bytes(b"not a plot of the scoring")  # a file no scoring listed stays
    main([str(tmp_path), "--no-plots"])
    assert (tmp_path / "mine.png").exists()


def test_report_captions_say_what_a_plot_shows(tmp_path, capsys):
    _folder(tmp_path)
    main([str(tmp_path)])
    page = (tmp_path / "report.html").read_text()
    budget, duration = re.findall(r"<figcaption>(.*?)</figcaption>", page)    # a7fdaaf: the file name only
    assert budget.startswith("Accuracy (correct / scored, %) against the vision-token budget (log2 axis)")
    assert budget.endswith("<code>acc_vs_budget_videomme.png</code>")
    assert duration.startswith("Accuracy per duration group") and duration.endswith("<code>duration_videomme.png</code>")


def test_budget_axis_is_log2_and_the_headline_figure_is_plotted(tmp_path):
    """Budget axis in log2 with the budgets as ticks; the official panel also draws the figure the report leads
    with (Video-MME: correct / answered = 2 / 2, while accuracy = 2 / 3 scored)."""
    recs = _folder(tmp_path)
    fig = build_figures(score_records(recs, n_resamples=0))["acc_vs_budget_videomme.png"]
    panels = [a for a in fig.axes if a.get_visible() and a.lines]
    assert [a.get_title() for a in panels] == ["official parser, rule videomme", "robust parser, rule robust"]
    for ax in panels:
        assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
        assert list(ax.get_xticks()) == [64, 256]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "256"]
        assert "log2" in ax.get_xlabel()
    (released,) = [ln for ln in panels[0].lines if ln.get_label() == "base: released figure"]
    assert list(released.get_xdata()) == [64, 256] and list(released.get_ydata()) == [100.0, 100.0]
    assert released.get_linestyle() == "--"
    assert not [ln for ln in panels[1].lines if "released" in ln.get_label()]
    assert "Video-MME Overall (eval_your_results.py: correct / answered)" in fig._suptitle.get_text()
