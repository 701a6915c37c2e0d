"""algorithms/token_check.py on hand-made logits (issue 41, item 5): tokens are compared only where the top-2
margin exceeds the tolerance, and the paths' logits must agree within it."""
import pytest
import torch

from algorithms.token_check import compare_paths, first_divergence, top2_margin

# 3 positions, vocabulary of 4; path p's logits; margins by hand: 3 - 1 = 2.0, 0.55 - 0.5 = 0.05, 4 - 2 = 2.0
P = torch.tensor([[3.0, 1.0, 0.0, -1.0],
                  [0.5, 0.55, 0.1, 0.0],
                  [0.0, 0.0, 4.0, 2.0]])


def test_first_divergence_and_margin_by_hand():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert top2_margin(P).tolist() == pytest.approx([2.0, 0.05, 2.0])
    with pytest.raises(ValueError, match="at least 2"):
        top2_margin(torch.zeros(3, 1))


def test_a_near_tie_flip_is_the_same_path_a_clear_one_is_not():
    q = P.clone()
    q[1, 0] += 0.06                    # q's argmax at position 1 flips to token 0 (0.56 > 0.55); |d| = 0.06
    # p took 0, 1, 2 (its argmaxes); q took 0, 0, ... (diverges at 1)
    near = compare_paths([0, 1, 2], [0, 0, 3], P, q, tol=0.1)
    assert near.same and not near.exact and near.diverge_at == 1
    assert near.margin == pytest.approx(0.01)          # min(0.05 (p), 0.56 - 0.55 (q))
    assert near.max_logit_diff == pytest.approx(0.06)   # rows 0 and 1 only: row 2 follows different prefixes
    # the same flip with a tolerance below the margin: a real difference
    assert not compare_paths([0, 1, 2], [0, 0, 3], P, q, tol=0.005).same
    # a divergence where the margin is clear (position 2: 2.0) is never a near tie
    clear = compare_paths([0, 1, 2], [0, 1, 3], P, P.clone(), tol=0.1)
    assert not clear.same and clear.diverge_at == 2 and clear.margin == pytest.approx(2.0)


def test_equal_tokens_still_need_close_logits():
    q = P.clone()
    q[2, 3] += 0.5                      # same argmaxes, but a logit 0.5 away
    assert compare_paths([0, 1, 2], [0, 1, 2], P, P.clone(), tol=0.1).same
    far = compare_paths([0, 1, 2], [0, 1, 2], P, q, tol=0.1)
    assert far.exact and not far.same and far.max_logit_diff == pytest.approx(0.5)
    assert compare_paths([0, 1, 2], [0, 1, 2], P, q, tol=0.5).same


def test_tokens_only_and_bad_input():
    assert compare_paths([1, 2], [1, 2], None, None, 0.1).same
    only = compare_paths([1, 2], [1, 3], None, None, 0.1)
    assert not only.same and only.diverge_at == 1 and only.margin is None
    assert not compare_paths([0, 1], [0, 1, 2], P[:2], P[:2], 0.1).same   # one path stopped earlier
    with pytest.raises(ValueError, match="both"):
        compare_paths([0], [0], P, None, 0.1)
    with pytest.raises(ValueError, match="shapes"):
        compare_paths([0], [0], P, P[:2], 0.1)
    with pytest.raises(ValueError, match="tol"):
        compare_paths([0], [0], P, P, -1.0)
