"""The three causal schedules of algorithms/streaming.py (pure): the DESIGN §5 accounting table and refusals."""
import dataclasses

import pytest

from algorithms.streaming import (COMPLETED_BLOCK_HOLD, DEFAULT_GEOMETRY, MICRO_CHUNK_200MS, MODES,
                                  OPEN_STREAM_REPLAY, accounting, accounting_table, check_micro_chunk_tiling,
                                  format_accounting_table, masks, memory_blocks, num_rows, schedule)

EVERY = list(range(20))
TABLE_4S = {  # DESIGN §5
    OPEN_STREAM_REPLAY: (20, 22.0, EVERY, [9, 19], [9, 19]),
    COMPLETED_BLOCK_HOLD: (2, 4.0, [9, 19], [9, 19], [9, 19]),
    MICRO_CHUNK_200MS: (20, 4.0, EVERY, EVERY, [9, 19]),
}


@pytest.mark.parametrize("mode", MODES)
def test_four_second_table_exact(mode):
    a = accounting(schedule(mode, num_rows(4.0)))
    assert a.n_rows == 20
    assert (a.processor_calls, a.prepared_media_s, a.state_update_rows, a.payload_commit_rows,
            a.native_boundary_rows) == TABLE_4S[mode]


def test_table_text_and_longer_session():
    text = format_accounting_table(accounting_table(4.0))
    assert "| open-stream-replay | 20 | 22.0 | every row | 9, 19 | 9, 19 |" in text
    assert "| completed-block-hold | 2 | 4.0 | 9, 19 | 9, 19 | 9, 19 |" in text
    assert "| micro-chunk-200ms | 20 | 4.0 | every row | every row | 9, 19 |" in text
    long = accounting_table(61.0)  # 305 rows: 30 whole blocks and a 1 s open tail
    assert long[OPEN_STREAM_REPLAY].processor_calls == 305
    assert long[OPEN_STREAM_REPLAY].prepared_media_s == pytest.approx(30 * 11.0 + (0.2 + 0.4 + 0.6 + 0.8 + 1.0))
    assert long[COMPLETED_BLOCK_HOLD].processor_calls == 30 and long[COMPLETED_BLOCK_HOLD].prepared_media_s == 60.0
    assert long[MICRO_CHUNK_200MS].prepared_media_s == pytest.approx(61.0)


def test_bench_prints_the_table(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "accounting_table.py"
    spec = importlib.util.spec_from_file_location("accounting_table", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--durations", "4"])
    out = capsys.readouterr().out
    assert out.startswith("## 4 s stream, 8 s memory\n")
    assert "| completed-block-hold | 2 | 4.0 | 9, 19 | 9, 19 | 9, 19 |" in out


def test_replay_tail_grows_and_is_dropped_unless_complete():
    steps = schedule(OPEN_STREAM_REPLAY, 25)
    assert [s.prepare_ms for s in steps[:3]] == [(0, 200), (0, 400), (0, 600)]
    assert steps[9].prepare_ms == (0, 2000) and steps[9].commit
    assert steps[10].prepare_ms == (2000, 2200) and not steps[10].commit
    assert all(s.source_ms == s.t_ms for s in steps)


def test_hold_initialization_and_source_times():
    steps = schedule(COMPLETED_BLOCK_HOLD, 25)
    m = masks(steps)
    assert m["initialization_mask"][:9] == [1] * 9 and m["initialization_mask"][9:] == [0] * 16
    assert m["state_source_times"][:9] == [-1.0] * 9
    assert m["state_source_times"][9:19] == [2.0] * 10 and m["state_source_times"][19:] == [4.0] * 6


def test_causality_of_every_schedule():
    for mode in MODES:
        for s in schedule(mode, 60, memory_s=4.0):
            assert s.source_ms <= s.t_ms
            if s.prepare_ms is not None:
                assert s.prepare_ms[1] <= s.t_ms and s.prepare_ms[0] >= s.window_first_block * 2000


def test_memory_window_rule():
    steps = schedule(MICRO_CHUNK_200MS, 60, memory_s=4.0)  # M = 2 blocks
    assert steps[25].window_first_block == 1  # block 2 keeps block 1
    assert schedule(OPEN_STREAM_REPLAY, 60, memory_s=2.0)[35].window_first_block == 3
    with pytest.raises(ValueError, match="multiple"):
        memory_blocks(3.0)
    with pytest.raises(ValueError, match="multiple"):
        memory_blocks(0.0)


def test_micro_chunk_tiling_refuses_with_clear_message():
    check_micro_chunk_tiling(DEFAULT_GEOMETRY)
    with pytest.raises(ValueError, match="micro-chunk-200ms refuses to run.*4.8 TMRoPE positions"):
        check_micro_chunk_tiling(dataclasses.replace(DEFAULT_GEOMETRY, positions_per_s=24))
    with pytest.raises(ValueError, match="refuses"):
        schedule(MICRO_CHUNK_200MS, 20, geometry=dataclasses.replace(DEFAULT_GEOMETRY, native_block_ms=2400,
                                                                      positions_per_s=25))
    with pytest.raises(ValueError, match="unknown streaming mode"):
        schedule("open-stream", 20)


def test_num_rows_right_edged():
    assert num_rows(4.0) == 20 and num_rows(4.19) == 20 and num_rows(0.19) == 0 and num_rows(8.262875) == 41
