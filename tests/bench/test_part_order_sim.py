"""bench/part_order_sim.py: the replay of decode windows through the two orders of parts, by hand."""
import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "part_order_sim.py"


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("part_order_sim", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(name, window, parts=1):
    row = {"video_id": name, "decode_start": 0.0, "decode_end": window, "step_s": 1.0}
    if parts > 1:
        row["decode_parts"] = parts
    return row


ROWS = [_row("A", 1), _row("B", 4, 2), _row("C", 4, 2), _row("D", 1)]


def test_two_workers_by_hand(sim):
    # back to back A B B C C D: A w0 0-1, B w1 0-4 / w0 1-5, C w1 4-8 / w0 5-9, D w1 8-9; ready A 1, B 5, C 9, D 9;
    # steps of 1 s from A's: waits 3 (B) + 3 (C) = 6 of 6 + 3 steps after the first video
    assert sim.simulate(ROWS, [0, 1, 2, 3], 2, 1.0, 0.0) == pytest.approx((11.0, 6.0, 6 / 9))
    # interleaved A B B D C C: D w1 4-5, C w0 5-9 / w1 5-9; ready A 1, B 5, D 5, C 9: waits 3 + 2
    from datamodules.part_join import interleave_parts

    order = interleave_parts([0, 1, 2, 3], [1, 2, 2, 1])
    assert order == [0, 1, 3, 2]
    assert sim.simulate(ROWS, order, 2, 1.0, 0.0) == pytest.approx((10.0, 5.0, 5 / 8))
    # windows halved: back to back A 0-.5, B 0-2 / .5-2.5, C 2-4 / 2.5-4.5, D 4-4.5; GPU from 0.5: B waits 1, C 1
    assert sim.simulate(ROWS, [0, 1, 2, 3], 2, 0.5, 0.0) == pytest.approx((6.5, 2.0, 2 / 5))


def test_main_reads_a_cli_json(sim, tmp_path, capsys):
    f = tmp_path / "cli.json"
    f.write_text(json.dumps({"cli_runs": {"auto": {"per_video": ROWS, "timeline_s": {"model_loaded": 0.5}}}}))
    out = sim.main([str(f), "--workers", "2", "--scales", "1"])
    assert [(r["order"], r["end_s"]) for r in out] == [("back to back", 11.0), ("interleaved", 10.0)]
    assert "4 videos (2 in parts), 2 workers, GPU from 0.5 s" in capsys.readouterr().out


def test_main_picks_a_run_by_label(sim, tmp_path):
    """A workload json holds every CLI run (``cli_runs``) beside ``timing`` (the last): ``--label`` picks one; a
    label the file lacks is refused with the labels it has."""
    whole = [dict(r, decode_parts=1) for r in ROWS]
    f = tmp_path / "cli.json"
    f.write_text(json.dumps({"timing": {"per_video": whole}, "cli_runs": {
        "auto": {"per_video": ROWS, "timeline_s": {"model_loaded": 0.5}}, "auto#2": {"per_video": whole}}}))
    assert sim.load_rows(f, "auto") == (ROWS, 0.5)
    assert sim.load_rows(f) == (whole, 0.0)
    with pytest.raises(SystemExit, match=r"no CLI run 'off'; it has \['auto', 'auto#2'\]"):
        sim.load_rows(f, "off")


def test_synthetic_set_and_its_replay(sim, capsys):
    """``--synthetic N``: a third of the videos long and in 4 parts, the rest whole; every window within 30 % of its
    kind's; the same rows for the same seed; main refuses both a run and --synthetic, or neither."""
    rows = sim.synthetic_rows(12)
    assert len(rows) == 12 and [r.get("decode_parts", 1) for r in rows] == [4] * 4 + [1] * 8
    assert all(0.7 * w <= r["decode_end"] <= 1.3 * w for r, w in zip(rows, [20.0] * 4 + [8.0] * 4 + [3.0] * 4))
    assert rows == sim.synthetic_rows(12)
    out = sim.main(["--synthetic", "12", "--scales", "1"])
    assert len(out) == 2 and "12 videos (4 in parts)" in capsys.readouterr().out
    for bad in ([], ["x.json", "--synthetic", "3"]):
        with pytest.raises(SystemExit):
            sim.main(bad)
