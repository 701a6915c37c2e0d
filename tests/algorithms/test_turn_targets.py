"""Turn targets on the right-edged 5 Hz grid: hand-computed cases and hypothesis properties."""
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings, strategies as st

from algorithms.turn_targets import (FUTURE_BINS_S, NUM_TARGETS, build_turn_targets, coverage, flat_targets,
                                     merge_intervals, shift_hold_events, target_names)


@dataclass
class U:
    start_s: float
    end_s: float
    participant_id: int


def test_names_and_merge():
    assert target_names()[:2] == ["va_wearer", "va_others"] and len(target_names()) == NUM_TARGETS == 10
    assert merge_intervals([(1, 2), (0, 0.5), (1.5, 3), (3, 4)]) == [(0.0, 0.5), (1.0, 4.0)]
    assert coverage([(0.0, 0.5), (1.0, 4.0)], 0.25, 1.25) == pytest.approx(0.5)


def test_voice_activity_right_edged():
    # wearer (id 2) speaks 0.0-1.0 s; row i covers (0.2 i, 0.2 (i + 1)]
    tt = build_turn_targets([U(0.0, 1.0, 2), U(1.1, 1.3, 5)], num_rows=20, wearer_id=2)
    assert tt.va[:, 0].tolist()[:7] == [1, 1, 1, 1, 1, 0, 0]
    # others speak 1.1-1.3: half of row 5 (1.0, 1.2] and half of row 6 (1.2, 1.4] -> >= 0.5 ratio counts
    assert tt.va[5:7, 1].tolist() == [1, 1] and tt.va[:5, 1].sum() == 0 and tt.va[7:, 1].sum() == 0


def test_future_bins_and_validity():
    # others speak 2.0-3.0 s. Row 4 (t=1.0): bins (1.0,1.2] (1.2,1.6] (1.6,2.2] (2.2,3.0]
    tt = build_turn_targets([U(2.0, 3.0, 1)], num_rows=30, wearer_id=2)
    assert tt.future[4, 1].tolist() == [0, 0, 0, 1]  # (1.6,2.2]: 0.2 of 0.6 s < 0.5
    assert tt.future[6, 1].tolist() == [0, 0, 1, 1]  # t=1.4: (2.0,2.6] full, (2.6,3.4] 0.4/0.8
    assert tt.future[:, 0].sum() == 0
    # session is 6 s: the 2 s window fits up to t_i = 4.0 (row 19)
    assert tt.future_valid[:20].all() and not tt.future_valid[20:].any()
    targets, mask = flat_targets(tt)
    assert targets.shape == mask.shape == (30, 10)
    assert mask[:, :2].all() and not mask[20:, 2:].any()


def test_shift_and_hold_events():
    utts = [U(0.0, 2.0, 2), U(2.5, 4.0, 1),  # shift wearer -> 1 (silence 2.0-2.5)
            U(4.6, 6.0, 1),  # hold by 1 (silence 4.0-4.6)
            U(6.1, 7.5, 3),  # 0.1 s gap: too short, no event
            U(8.0, 9.5, 3), U(8.5, 10.0, 4), U(10.5, 12.0, 1)]  # overlap before silence: pre-condition fails
    ev = shift_hold_events(utts, num_rows=70)
    assert [(e.prev_speaker, e.next_speaker, e.shift) for e in ev] == [(2, 1, True), (1, 1, False)]
    # first row with t_i >= s0 + 0.05: 2.05 -> row 10 (t=2.2); 4.05 -> row 20 (t=4.2)
    assert [e.row for e in ev] == [10, 20]
    tt = build_turn_targets(utts, num_rows=70, wearer_id=2)
    assert tt.event_mask.nonzero().flatten().tolist() == [10, 20]
    assert tt.shift[10] == 1 and tt.shift[20] == 0 and tt.next_speaker[10] == 1 and (tt.shift[~tt.event_mask] == -1).all()


def test_event_needs_post_condition_inside_session_and_errors():
    assert shift_hold_events([U(0.0, 2.0, 2), U(2.5, 3.0, 1)], num_rows=15) == []  # 3.0 + 1.0 > 3.0 s session
    with pytest.raises(ValueError):
        build_turn_targets([U(1.0, 0.5, 2)], num_rows=5)
    with pytest.raises(ValueError):
        build_turn_targets([], num_rows=0)


utterance_lists = st.lists(
    st.tuples(st.floats(0, 30), st.floats(0.05, 4), st.integers(1, 4)).map(lambda x: U(x[0], x[0] + x[1], x[2])),
    max_size=25)


@settings(max_examples=60, deadline=None)
@given(utterance_lists, st.integers(1, 200), st.integers(1, 4))
def test_properties(utts, num_rows, wearer):
    tt = build_turn_targets(utts, num_rows, wearer_id=wearer)
    T = num_rows
    assert tt.va.shape == (T, 2) and tt.future.shape == (T, 2, len(FUTURE_BINS_S))
    assert set(tt.va.unique().tolist()) <= {0.0, 1.0}
    # bin 0 of row i is (t_i, t_i + 0.2] = the present frame of row i + 1
    valid = tt.future_valid[:-1]
    assert torch.equal(tt.future[:-1, :, 0][valid], tt.va[1:][valid])
    for e in tt.events:
        t = 0.2 * (e.row + 1)
        assert e.silence_start_s + 0.05 - 1e-6 <= t < e.silence_end_s
        assert e.shift == (e.prev_speaker != e.next_speaker)
    assert int(tt.event_mask.sum()) == len(tt.events)
