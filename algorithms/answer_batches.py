"""Which questions of one prefix are answered together, and in how many pieces their suffixes are prefilled.

Batched answering (:meth:`models.videollama3.answering.SharedPrefixAnswering.start_batched`) left-pads every question
suffix of a batch to the batch's longest, so each batch costs ``rows x longest`` suffix tokens in the prefill and
``rows x (longest + R)`` cached positions while decoding, and every prefill forward builds an attention mask over
``(its query tokens) x (prefix + suffix keys)``. Answering all Q questions of a video in one batch made a short
question pay for a long sibling (a 25,084-token question beside two short ones asked for a [3, 1, n, L + n] mask)
and made the decode batch, with its Q x V logits, as large as the annotation's question count (issue 44 item 1).

* :func:`length_batches` cuts the questions, by length, into batches of at most ``max_rows`` rows whose padding
  stays small: a question joins the batch of the next shorter ones while the padded batch stays within ``max_tokens``
  suffix tokens or its pad tokens stay within its real tokens;
* :func:`query_chunks` splits a batch's suffix columns into causal query chunks of at most ``max_tokens`` tokens
  (rows x columns), each prefilled against the cached prefix and the earlier chunks, so a prefill forward's mask and
  activations grow with the chunk, not with the square of the question.

Pure functions of integers (no torch).
"""
from __future__ import annotations


def length_batches(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Question indices grouped into answer batches.

    The questions are taken shortest first (ties in their order); the next question joins the current batch unless
    the batch already has ``max_rows`` rows, or it would make the padded batch ``rows x longest`` larger than both
    ``max_tokens`` and twice the batch's real tokens (more pads than question tokens). Each batch lists its indices
    in increasing order (the order the questions were given), and the batches are ordered by their first index.
    Questions that fit one batch (at most ``max_rows``, at most ``max_tokens`` padded tokens) stay one batch.

    Args:
        lengths: suffix tokens per question (each >= 1).
        max_rows: most questions per batch (>= 1).
        max_tokens: padded suffix tokens a batch may always reach (>= 1).

    Returns:
        the batches, every index of ``lengths`` exactly once.

    Raises:
        ValueError: ``max_rows`` or ``max_tokens`` below 1.
    """
    if max_rows < 1 or max_tokens < 1:
        raise ValueError(f"max_rows and max_tokens must be >= 1, got {max_rows} and {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        n = lengths[i]
        rows = len(current) + 1
        padded = rows * n                                  # n is the longest so far (ascending order)
        if current and (rows > max_rows or (padded > max_tokens and padded > 2 * (real + n))):
            batches.append(current)
            current, real = [], 0
        current.append(i)
        real += n
    if current:
        batches.append(current)
    return sorted((sorted(b) for b in batches), key=lambda b: b[0])


def query_chunks(rows: int, columns: int, max_tokens: int) -> list[tuple[int, int]]:
    """Column ranges ``[a, b)`` of a batch's ``rows x columns`` suffix, each at most ``max_tokens`` tokens
    (``rows x (b - a)``; at least one column per chunk), covering ``0..columns`` in order; one range when the whole
    suffix fits. The chunks are of equal width but the last, which may be shorter.

    Raises:
        ValueError: ``rows``, ``columns`` or ``max_tokens`` below 1.
    """
    if rows < 1 or columns < 1 or max_tokens < 1:
        raise ValueError(f"rows, columns and max_tokens must be >= 1, got {rows}, {columns}, {max_tokens}")
    width = max(1, max_tokens // rows)
    return [(a, min(a + width, columns)) for a in range(0, columns, width)]
