"""The ``window`` memory policy's slides in the lockstep batch runner: the cut back to the prompt, the re-prefill of
the kept blocks, the re-prefills of several slides in one LLM call (``reprefill_slides``) and, with
``fuse_slide_rows``, the slide row's own payload prefill in that same call (:class:`WindowReprefill`, mixed into
``BatchedOmniRunner``).

What ``window`` computes (``models/omni/thinker.py``; the runbook of seed 002 freezes the 8 s memory): at every
row the cache equals one from-scratch prefill of the prompt + the payloads of the last ``memory_s`` of media, at
positions re-based to the window's first block. When the window slides (a block's first payload row), the cache is
cut back to the prompt and the kept blocks (up to ``M - 1``) are prefilled again on top of it; then the row's
payload is prefilled on top of that and read out at its last token.

Why the batching is exact (``models/omni/batch.py`` has the rest): the keys/values a re-prefill leaves depend only on
the prompt cache and the kept payloads, which are encoder outputs (independent of the LLM), so the encoders can run
ahead (the same calls in the same order, buffered) and several slides' kept sequences can go through the LLM as
extra batch rows of one call. The slide row's payload(s) come next in the same causal order, so
``fuse_slide_rows`` appends them to each (slide, stream) batch row: the LLM is causal, so the kept part's
keys/values are the re-prefill's, and each payload's last token sees the prompt, the kept blocks and its own
earlier tokens exactly as the two-call path shows it (equal up to the rounding of another call shape). Legend:
B streams of a group, K slides of one call, L tokens of a (slide, stream) row, D hidden size.
"""
from __future__ import annotations

from collections import deque

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .attention import _lower_right_prefill
from .batch_media import _Stream
from .thinker import OmniThinkerRunner

REPREFILL_SLIDES_MAX = 4  # most window slides whose re-prefills share one LLM call (default reprefill_slides)
REPREFILL_MEMORY_BYTES = 16 * 2 ** 30  # default reprefill_memory_bytes: device memory the rows of such a call may take


class WindowReprefill:
    """The window slides of the row loop (``_slide_window``) and the re-prefills computed ahead of their slides
    (``_plan_slides``, ``_reprefill_ahead``, ``_install``).

    Uses the owner's ``runner``, ``_part``, ``_lm``, ``_forward``, ``_prompt_cache`` and the flags
    ``reprefill_slides``, ``reprefill_memory_bytes``, ``fuse_slide_rows``, ``flash_prefill``.
    """

    def _slide_window(self, active: list[_Stream], cache: DynamicCache, prompt_len: int, first: int,
                      sliding: bool, ahead: "_Ahead | None" = None, encoded: "_EncodedRuns | None" = None,
                      run_tokens: int = 0) -> torch.Tensor | None:
        """The memory window now starts at native block ``first`` (same row, same token counts in every stream):
        drop the older committed payloads; ``sliding``: evict their cache rows right after the prompt, no
        re-prefill; ``window``: cut the cache back to the prompt and re-prefill the kept blocks at re-based
        positions (one batched call), or install the keys/values that ``_reprefill_ahead`` computed for this slide
        (``reprefill_slides`` > 1: one call for several slides).

        Returns the slide row's states (B, R, D) float32 when ``fuse_slide_rows`` computed them with the
        re-prefill (the cache then also holds the row's payloads if its run commits them), else None (the row
        loop prefills the row's payloads itself). ``run_tokens``: tokens of the row's payloads (memory bound)."""
        r = self.runner
        n_gone = sum(p.embeds.shape[0] for p in active[0].committed if p.block < first)
        for s in active:
            s.committed = [p for p in s.committed if p.block >= first]
        if sliding:  # evict the older blocks' rows right after the prompt; no re-prefill
            with self._part("cache"):
                OmniThinkerRunner._evict_rows(cache, prompt_len, n_gone)
            return None
        with self._part("cache"):
            OmniThinkerRunner._truncate(cache, prompt_len)
        kept = active[0].committed
        if not kept:
            return None
        fuse = bool(self.fuse_slide_rows)
        if ahead is not None and first not in ahead.kv:
            tokens = prompt_len + sum(p.embeds.shape[0] for p in kept) + (run_tokens if fuse else 0)
            slides = self._plan_slides(active, first, tokens, ahead)
            if len(slides) > 1 or fuse:
                self._reprefill_ahead(slides, ahead, encoded, fuse)
        if ahead is not None and first in ahead.kv:
            return self._install(cache, active, ahead.kv.pop(first))
        # evict, re-prefill the kept blocks at re-based positions (one batched call)
        with self._part("llm_reprefill"):
            kept_emb = torch.stack([torch.cat([p.embeds for p in s.committed]) for s in active])
            self._forward(kept_emb, torch.cat([r.payload_positions(p, first) for p in kept], 1), cache)
        for s in active:
            s.computed["computed_llm_tokens"] += kept_emb.shape[1]
            s.computed["computed_reprefill_calls"] += 1
        return None

    def _slides_per_call(self, streams: int, tokens: int) -> int:
        """Slides whose re-prefills share one LLM call: ``reprefill_slides``, or (None) the most, up to
        ``REPREFILL_SLIDES_MAX``, whose rows (``streams`` x ``tokens`` each: prompt + kept blocks, + the slide row's
        payloads with ``fuse_slide_rows``) fit in ``reprefill_memory_bytes`` at ``reprefill_bytes_per_token``."""
        if self.reprefill_slides is not None:
            return self.reprefill_slides
        per_slide = streams * tokens * reprefill_bytes_per_token(self.runner.text_config, self.runner.dtype)
        return int(max(1, min(REPREFILL_SLIDES_MAX, self.reprefill_memory_bytes // max(per_slide, 1))))

    def _plan_slides(self, active: list[_Stream], first: int, tokens: int, ahead: "_Ahead") -> list[tuple]:
        """The slides whose re-prefills run in one call with this one (window start ``first``): this slide and
        the next ones, up to ``_slides_per_call``, while the schedule has them; each as ``(window start, row,
        streams)`` with the streams of ``active`` still running at the slide's row (a finished stream drops out
        of the later slides' rows, as it drops out of the batch)."""
        k = self._slides_per_call(len(active), tokens)
        out = []
        for f in range(first, first + k):
            row = ahead.slide_row.get(f + ahead.m_blocks - 1)
            streams = [] if row is None else [s for s in active if row < s.n_rows]
            if not streams:
                break
            out.append((f, row, streams))
        return out

    def _reprefill_ahead(self, slides: list[tuple], ahead: "_Ahead", encoded: "_EncodedRuns",
                         fuse: bool = False) -> None:
        """The window re-prefills of ``slides`` (``_plan_slides``) in as few LLM calls as their sequences' layouts
        allow (one when every slide has the same token layout), stored in ``ahead.kv``; with ``fuse`` each
        (slide, stream) row also carries the slide row's payloads (the run of rows starting at the slide row),
        whose states are read out of the same call.

        Why this is exact: at a slide the cache is cut back to the prompt and the kept blocks are prefilled on top
        of it at positions re-based to the window start, so the keys/values the re-prefill leaves depend only on the
        prompt cache and the kept payloads, and these are encoder outputs that do not depend on the LLM. The
        encoders run ahead (``encoded.through``: the same calls in the same order, so every payload is the one the
        row loop uses later) up to the last payload the latest slide keeps (``fuse``: up to the latest slide row's
        payloads); each (slide, stream) pair is one batch row on top of the prompt cache repeated over the rows, and
        a row's keys/values are those of the one-slide call (the rows of a call do not interact; equal up to the
        rounding of another call shape). ``fuse``: the row's payloads follow the kept blocks in the causal order the
        row loop prefills them, at the positions ``_prefill_rows`` gives them."""
        r = self.runner
        m = ahead.m_blocks
        b0, b_end = slides[0][0] + m - 1, slides[-1][0] + m - 1  # the committed blocks in [b0, b_end) come later
        need = max((ahead.commit_row.get(b, -1) for b in range(b0, b_end)), default=-1)
        slide_rows = {row for _, row, _ in slides}
        if fuse:
            need = max(need, max(slide_rows))
        future: dict[int, list] = {}  # stream index -> (embeds, block, rel_pos, shift) committed in [b0, b_end)
        at_row: dict[int, tuple] = {}  # fuse: slide row -> (stream indices, rows) of the run starting there
        for run, streams, rows, _, _ in encoded.through(need):
            if fuse and run[0].row in slide_rows:
                at_row[run[0].row] = ([s.index for s in streams], rows, run[-1].commit)
            for step, x in zip(run, rows):
                if step.commit and b0 <= x.block < b_end:
                    for j, s in enumerate(streams):
                        future.setdefault(s.index, []).append((x.emb[j], x.block, x.rel_pos, x.shift))
        origin = r.media_origin()
        ppb = int(round(r.geometry.positions_per_block))
        calls: list[list[tuple]] = []  # slides of one call: (window start, streams, sequences, positions, ends, keep)
        for f, row, streams in slides:
            run_idx, run_rows, commits = at_row.get(row, (None, [], False))
            if fuse and run_idx != [s.index for s in streams]:
                raise RuntimeError(f"the run at slide row {row} holds streams {run_idx}, the slide "
                                   f"{[s.index for s in streams]}")
            seqs = []
            for j, s in enumerate(streams):
                parts = ([(p.embeds, p.block, p.rel_pos, p.block_shift) for p in s.committed if p.block >= f]
                         + [q for q in future.get(s.index, []) if f <= q[1] < f + m - 1])
                seqs.append(torch.cat([q[0] for q in parts] + [x.emb[j] for x in run_rows]))
            pos = torch.cat([origin + rel + shift * ppb * (blk - f) for _, blk, rel, shift in parts]
                            + [origin + x.rel_pos + x.shift * ppb * (x.block - f) for x in run_rows], 1)
            n_kept = sum(q[0].shape[0] for q in parts)
            ends, e = [], n_kept
            for x in run_rows:
                e += x.emb.shape[1]
                ends.append(e - 1)
            entry = (f, streams, seqs, pos, ends, n_kept + (e - n_kept if commits else 0), n_kept)
            same = next((c for c in calls if c[0][3].shape == pos.shape and torch.equal(c[0][3], pos)), None)
            if same is None:
                calls.append([entry])
            else:
                same.append(entry)
        for call in calls:
            with self._part("llm_reprefill"):
                emb = torch.stack([q for entry in call for q in entry[2]])  # (rows, L, D)
                cache, prompt_len = self._prompt_cache(emb.shape[0])
                if fuse:
                    hidden = self._forward(emb, call[0][3], cache)  # (rows, L, D) at the read-out layer
                    states = hidden[:, call[0][4]].to(torch.float32, copy=True)  # (rows, R, D)
                    del hidden
                else:
                    self._reprefill(emb, call[0][3], cache)
            a = 0
            for f, streams, seqs, _, _, keep, n_kept in call:
                n = len(seqs)
                kv = [(layer.keys[a: a + n, :, : prompt_len + keep], layer.values[a: a + n, :, : prompt_len + keep])
                      for layer in cache.layers]
                ahead.kv[f] = ([s.index for s in streams], kv, states[a: a + n] if fuse else None)
                a += n
                for s in streams:
                    s.computed["computed_llm_tokens"] += n_kept  # the row's own payloads: _record_rows
            for s in {s.index: s for entry in call for s in entry[1]}.values():
                s.computed["computed_reprefill_calls"] += 1

    def _reprefill(self, embeds: torch.Tensor, positions: torch.Tensor, cache: DynamicCache) -> None:
        """Prefill (R, L, D) on top of ``cache`` at shared (3, L) positions for its keys/values only (no hidden
        states kept: nothing is read out of a re-prefill)."""
        pos = positions.to(self.runner.device).unsqueeze(1).expand(3, embeds.shape[0], -1)
        with _lower_right_prefill(self.runner.thinker.model.language_model, self.flash_prefill):
            self._lm(inputs_embeds=embeds, position_ids=pos, past_key_values=cache, use_cache=True,
                     output_hidden_states=False)

    def _install(self, cache: DynamicCache, active: list[_Stream], entry: tuple) -> torch.Tensor | None:
        """Make ``cache`` (cut back to the prompt) hold a slide's re-prefilled keys/values (``ahead.kv`` entry);
        returns the entry's slide-row states ((B, R, D), ``fuse_slide_rows``) or None."""
        streams, kv, states = entry
        if streams != [s.index for s in active] or len(kv) != len(cache.layers):
            raise RuntimeError(f"re-prefill computed ahead for streams {streams}, the batch holds "
                               f"{[s.index for s in active]}")
        with self._part("cache"):
            for layer, (k, v) in zip(cache.layers, kv):
                if type(layer) is not DynamicLayer:
                    raise TypeError(f"cannot install keys/values into a {type(layer).__name__} cache layer")
                layer.keys, layer.values = k, v
        return states


def reprefill_bytes_per_token(text_config, dtype: torch.dtype) -> int:
    """Device bytes one token of a window re-prefill holds: its keys and values in every layer (kept until its
    slide) plus the transient activations of one decoder layer (hidden-size and FFN-size tensors); the bound behind
    the default ``reprefill_slides``."""
    elem = torch.finfo(dtype).bits // 8
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    kv = 2 * text_config.num_hidden_layers * text_config.num_key_value_heads * head_dim
    return elem * (kv + 4 * text_config.hidden_size + 3 * text_config.intermediate_size)


class _EncodedRuns:
    """The row loop's view of ``_encoded_runs``: ``next()`` gives the next run (buffered or encoded now),
    ``current`` is the run the row loop is at and ``through(row)`` encodes ahead until a run reaching ``row`` is
    buffered."""

    def __init__(self, runs):
        self._runs, self.buffer, self.current = runs, deque(), None

    def next(self) -> tuple:
        return self.buffer.popleft() if self.buffer else next(self._runs)

    def through(self, row: int) -> list[tuple]:
        """The current run and the buffered ones, encoding further runs until the last reaches ``row`` (or the
        schedule ends)."""
        out = [self.current, *self.buffer]
        while out[-1][0][-1].row < row:
            nxt = next(self._runs, None)
            if nxt is None:
                break
            self.buffer.append(nxt)
            out.append(nxt)
        return out


class _Ahead:
    """Where the window slides in a schedule and the re-prefills computed ahead of their slide.

    Attributes:
        m_blocks: memory in native blocks.
        slide_row: block -> first row of the block that prepares a payload (where the row loop slides the window).
        commit_row: block -> last row of the block that commits a payload.
        kv: window start of a slide -> (stream indices, per layer (keys, values), the slide row's states (B, R, D)
            or None) computed ahead for it.
    """

    def __init__(self, steps: list, m_blocks: int):
        self.m_blocks = m_blocks
        self.slide_row: dict[int, int] = {}
        self.commit_row: dict[int, int] = {}
        for st in steps:
            if st.prepare_ms is not None:
                self.slide_row.setdefault(st.block, st.row)
            if st.commit:
                self.commit_row[st.block] = st.row
        self.kv: dict[int, tuple] = {}
