"""Issue 44 item 1: questions batched by length with a row cap; long suffixes prefilled in query chunks."""
import pytest

from algorithms.answer_batches import length_batches, query_chunks


def test_ordinary_questions_stay_one_batch_in_their_order():
    assert length_batches([40, 12, 90, 33], max_rows=64, max_tokens=2048) == [[0, 1, 2, 3]]
    assert length_batches([7], 64, 2048) == [[0]]
    assert length_batches([], 64, 2048) == []


def test_a_long_question_is_not_padded_onto_short_siblings():
    # the video: one 25,084-token question between two short ones
    assert length_batches([30, 25_084, 50], 64, 2048) == [[0, 2], [1]]
    # similar long lengths (subtitled questions) stay together: pads 2 x 100 <= real 14,900
    assert length_batches([4_900, 5_000, 5_000], 64, 2048) == [[0, 1, 2]]
    # shortest first: 10 + 10 + 20 fit 2048 padded (3 x 20); 1000 would make 4 x 1000 = 4000 > 2048 and > 2 x 1040
    assert length_batches([1000, 10, 20, 10], 64, 2048) == [[0], [1, 2, 3]]


def test_rows_are_capped():
    got = length_batches([5] * 10, max_rows=4, max_tokens=2048)
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    many = length_batches([3 + i % 7 for i in range(10_000)], 64, 2048)
    assert max(len(b) for b in many) == 64 and len(many) == -(-10_000 // 64)
    assert sorted(i for b in many for i in b) == list(range(10_000))


def test_query_chunks():
    assert query_chunks(3, 100, 2048) == [(0, 100)]
    assert query_chunks(1, 25_084, 2048) == [(a, min(a + 2048, 25_084)) for a in range(0, 25_084, 2048)]
    assert query_chunks(3, 10, 7) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]   # 3 rows x 2 columns <= 7
    assert query_chunks(9, 4, 5) == [(0, 1), (1, 2), (2, 3), (3, 4)]             # at least one column
    with pytest.raises(ValueError, match="max_tokens"):
        query_chunks(1, 4, 0)
    with pytest.raises(ValueError, match="max_rows"):
        length_batches([1], 0, 10)
