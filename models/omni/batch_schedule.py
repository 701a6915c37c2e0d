"""The lockstep row loop of the batch runner: one group of streams through its schedule with one batched KV cache,
the window slides, the batched LLM prefill and the states' read-out (:class:`LockstepSchedule`).

Why the states equal the one-session path's (drop-outs, slides, runs of rows in one prefill) is described in
``models/omni/batch.py``. Legend: B streams of a group, N tokens of one payload, D hidden size.
"""
from __future__ import annotations

import resource
import time
from contextlib import contextmanager

import torch
from transformers import DynamicCache

from algorithms.streaming import MICRO_CHUNK_200MS, OPEN_STREAM_REPLAY, SLIDING, accounting, memory_blocks, schedule

from .attention import _batched_chunk_attention, _lower_right_prefill
from .batch_accounting import BatchedStreamResult
from .batch_media import _RowPayload, _Stream
from .batch_reprefill import REPREFILL_MEMORY_BYTES, REPREFILL_SLIDES_MAX, WindowReprefill, _Ahead, _EncodedRuns
from .thinker import OmniThinkerRunner
from .thinker_media import Payload
from .thinker_stream import SLIDING_VERIFY_BLOCKS, verify_candidates

_FLUSH_ROWS = 50  # states stay on the device for up to this many rows, then go to the host in one copy
__all__ = ["REPREFILL_MEMORY_BYTES", "REPREFILL_SLIDES_MAX", "LockstepSchedule"]


class LockstepSchedule(WindowReprefill):
    """Runs one lockstep group row by row (``_run_group``): streams drop out when done, runs of committed rows
    share one prefill (``_row_run``), the batched cache slides with the window (``_slide_window`` of
    :class:`~.batch_reprefill.WindowReprefill`), each row's
    payloads are prefilled in one LLM call and read out at their last tokens (``_prefill_rows``, ``_record_rows``),
    states reach the host in one copy every ``_FLUSH_ROWS`` rows (``_flush``) and each stream gets its result
    (``_group_results``).

    Uses the owner's ``runner``, the media encoder (``_load_block``, ``_encode_rows``:
    :class:`~.batch_media.LockstepMediaEncoder`), ``_part`` (:class:`~.batch_accounting.PartTimer`), ``_lm``,
    ``_prompt`` and the flags ``reuse``, ``batch_rows``, ``batched_attention``, ``flash_prefill``, ``profile``,
    ``reprefill_slides``, ``reprefill_memory_bytes``. The media half of the loop is a generator (``_encoded_runs``)
    that the row loop pulls one run at a time, or further ahead when the window re-prefills of several slides run
    as one LLM call (``_reprefill_ahead``).
    """

    def _prompt_cache(self, batch: int) -> tuple[DynamicCache, int]:
        if self._prompt is None:
            self._prompt = self.runner._new_cache()
        one, length = self._prompt
        cache = DynamicCache(config=self.runner.text_config)
        for li, layer in enumerate(one.layers):
            cache.update(layer.keys.repeat(batch, 1, 1, 1), layer.values.repeat(batch, 1, 1, 1), li)
        return cache, length

    def _forward(self, embeds: torch.Tensor, positions: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Prefill (B, N, D) on top of the batched cache at shared (3, N) positions; (B, N, D) at ``layer``."""
        b = embeds.shape[0]
        pos = positions.to(self.runner.device).unsqueeze(1).expand(3, b, -1)
        layer = self.runner.layer
        final = layer in (-1, self.runner.text_config.num_hidden_layers)
        # the final state is ``last_hidden_state`` (the same tensor as hidden_states[-1]); asking for every layer's
        # output would keep all of them alive over a whole block's prefill (~4x the peak at 3B shapes, 16 sessions)
        with _lower_right_prefill(self.runner.thinker.model.language_model, self.flash_prefill):
            out = self._lm(inputs_embeds=embeds, position_ids=pos, past_key_values=cache, use_cache=True,
                           output_hidden_states=not final)
        return out.last_hidden_state if final else out.hidden_states[layer]

    @staticmethod
    def _flush(pending: list) -> None:
        """Copy the states read out on the device (``(row, streams, (B, D))`` entries) to the host in one copy."""
        if not pending:
            return
        host = torch.cat([h for _, _, h in pending]).cpu()
        i = 0
        for row, streams, _ in pending:
            for s in streams:
                s.states[row] = host[i]
                i += 1
        pending.clear()

    def _row_run(self, steps: list, i: int, active: list[_Stream], mode: str) -> list:
        """Steps ``i, i+1, ...`` that go through the encoders and the LLM as one call each: consecutive rows of one
        native block that all commit their payload, with no stream dropping out in between (so only
        ``micro-chunk-200ms`` forms runs longer than one row; the window slides only at a block's first row).

        Why the states are unchanged: every payload is encoded on its own (own log-mel, own temporal patches, own
        attention chunks), and the LLM is causal: prefilling rows ``i..j`` in one call shows each row's last token
        exactly the cache + payloads the row-by-row prefill shows it, and leaves the same cache. Off with
        ``batch_rows=False`` (one row per call, as a live stream must run)."""
        st = steps[i]
        run = [st]
        if not (self.batch_rows and st.commit and mode == MICRO_CHUNK_200MS):
            return run  # (only micro has several committed rows per block; reuse would also need a second look)
        while i + len(run) < len(steps):
            nx = steps[i + len(run)]
            if not (nx.commit and nx.prepare_ms is not None and nx.block == st.block
                    and all(nx.row < s.n_rows for s in active)):
                break
            run.append(nx)
        return run

    def _run_group(self, group: list[_Stream], mode: str, memory_s: float, verify_rows: int,
                   tol: float, memory_policy: str = "window") -> dict[int, BatchedStreamResult]:
        """One lockstep group (streams of one mode and frame size, longest first) through ``schedule(mode, ...)``
        under ``memory_policy``; returns stream index -> its ``BatchedStreamResult``."""
        r = self.runner
        g = r.geometry
        dev = r.device
        sliding = memory_policy == SLIDING
        m_blocks = memory_blocks(memory_s, g)
        n_max = max(s.n_rows for s in group)
        steps = schedule(mode, n_max, memory_s, g)
        reuse = self.reuse and mode == OPEN_STREAM_REPLAY
        checks = {s.index: set(verify_candidates(steps[: s.n_rows], verify_rows, m_blocks, memory_policy))
                  for s in group}
        for s in group:
            s.warned = not sliding
        if self._cached_on != dev:  # index tensors and layouts cached on another device
            self._audio_kw, self._vision_kw, self._layouts, self._cached_on = {}, {}, {}, dev
        media_origin = r.media_origin()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        parts0 = sum(v for k, v in self.breakdown.items() if k != "other")  # earlier groups' parts (profile)
        ctx = _batched_chunk_attention(r.thinker) if self.batched_attention else _null()
        with ctx:
            active = list(group)
            cache, prompt_len = self._prompt_cache(len(active))
            origin = 0
            pending: list = []  # states read out on the device, not yet copied to the host
            encoded = _EncodedRuns(self._encoded_runs(group, steps, mode, reuse))
            ahead = None if sliding or m_blocks < 2 else _Ahead(steps, m_blocks)
            i = 0
            while i < len(steps):
                st = steps[i]
                keep = [j for j, s in enumerate(active) if st.row < s.n_rows]
                if len(keep) < len(active):  # finished streams drop out of the batch
                    sel = torch.tensor(keep, device=dev)
                    with self._part("cache"):
                        cache.batch_select_indices(sel)
                    active = [active[j] for j in keep]
                if st.prepare_ms is None:
                    for s in active:
                        if s.last_update >= 0:
                            s.hold_rows.append((st.row, s.last_update))
                    i += 1
                    continue
                encoded.current = encoded.next()
                run, _, rows, videos, rows_idx = encoded.current
                i += len(run)
                first = max(0, st.block - (m_blocks - 1))
                fused = None  # fuse_slide_rows: the slide row's states, computed with the window re-prefill
                if first != origin:  # window slid (same row, same token counts in every stream of the group)
                    origin = first
                    fused = self._slide_window(active, cache, prompt_len, origin, sliding, ahead, encoded,
                                               sum(x.emb.shape[1] for x in rows))
                length = cache.get_seq_length()
                h_rows = (fused if fused is not None
                          else self._prefill_rows(rows, active, cache, origin, sliding, media_origin))
                self._record_rows(run, rows, videos, rows_idx, h_rows, active, pending, checks, origin, sliding,
                                  m_blocks)
                if not st.commit:  # (a run of several rows only ever holds committed rows)
                    with self._part("cache"):
                        OmniThinkerRunner._truncate(cache, length)
                if len(pending) >= _FLUSH_ROWS:
                    self._flush(pending)
            self._flush(pending)
            del cache, encoded
        for s in group:
            for row, src in s.hold_rows:
                s.states[row] = s.states[src]
        wall = time.perf_counter() - t0
        if self.profile:
            self.breakdown["other"] += wall - (sum(v for k, v in self.breakdown.items() if k != "other") - parts0)
        peak = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return self._group_results(group, steps, wall, peak, mode, m_blocks, verify_rows, tol, memory_policy)

    def _encoded_runs(self, group: list[_Stream], steps: list, mode: str, reuse: bool):
        """The media half of the row loop, as a generator: for every run of rows that prepares payloads
        (``_row_run``), in row order, ``(run, streams, rows, videos, rows_idx)``: the streams still running at its
        first row and their payloads through the encoders (``_encode_rows``). The encoders get exactly the calls of
        the row-by-row loop whether the row loop pulls one run at a time or runs ahead (``_reprefill_ahead``)."""
        r = self.runner
        g = r.geometry
        per_block = int(round(g.native_block_ms / g.frame_ms))
        active = list(group)
        loaded, block_audio = -1, None
        i = 0
        while i < len(steps):
            st = steps[i]
            keep = [j for j, s in enumerate(active) if st.row < s.n_rows]
            if len(keep) < len(active):  # finished streams drop out of the batch
                if block_audio is not None:
                    block_audio = block_audio.index_select(0, torch.tensor(keep, device=r.device))
                active = [active[j] for j in keep]
            if st.prepare_ms is None:
                i += 1
                continue
            run = self._row_run(steps, i, active, mode)
            i += len(run)
            block = st.block
            if block != loaded:
                block_audio, loaded = self._load_block(active, block), block
            if reuse:  # completed patches of earlier blocks are never needed again
                lo = block * per_block
                for s in active:
                    s.patches = {k: v for k, v in s.patches.items() if k >= lo}
            rows, videos, rows_idx = self._encode_rows(active, block_audio, [x.prepare_ms for x in run], reuse,
                                                       block * per_block)
            yield run, active, rows, videos, rows_idx

    def _prefill_rows(self, rows: list[_RowPayload], active: list[_Stream], cache: DynamicCache, origin: int,
                      sliding: bool, media_origin: int) -> torch.Tensor:
        """One causal LLM prefill of the rows' payloads (each (B, N, D)) on top of ``cache`` at their TMRoPE
        positions in the window starting at block ``origin`` (0 under ``sliding``); returns the (B, R, D) float32
        states at each row's last token, on the device (the sliding position warning is raised once per stream)."""
        r = self.runner
        ppb = int(round(r.geometry.positions_per_block))
        positions, ends = [], []
        for x in rows:
            shift_blocks = x.block - (0 if sliding else origin)
            positions.append(x.rel_d + x.shift_d * (ppb * shift_blocks) + media_origin)  # payload_positions
            ends.append((ends[-1] if ends else 0) + x.emb.shape[1])
            if not all(s.warned for s in active):
                host_pos = media_origin + x.rel_pos + x.shift * (ppb * shift_blocks)
                for s in active:
                    if not s.warned:
                        s.warned = r._position_warning(host_pos, s.n_rows)
        emb_all = rows[0].emb if len(rows) == 1 else torch.cat([x.emb for x in rows], 1)
        pos_all = positions[0] if len(rows) == 1 else torch.cat(positions, 1)
        with self._part("llm"):
            hidden = self._forward(emb_all, pos_all, cache)  # (B, sum N, D): causal, so each row's last
            # token sees exactly what the row-by-row prefill would show it
            return hidden[:, [e - 1 for e in ends]].to(torch.float32, copy=True)  # (B, R, D)

    @staticmethod
    def _record_rows(run: list, rows: list[_RowPayload], videos: list, rows_idx: list[list[int]],
                     h_rows: torch.Tensor, active: list[_Stream], pending: list, checks: dict[int, set],
                     origin: int, sliding: bool, m_blocks: int) -> None:
        """Book the rows of ``run`` for every stream: the read-out states go to ``pending`` (host copy later), each
        stream's payload record is kept for ``cache_replay`` snapshots and, when the row commits, as committed
        (``sliding``: also in the verification history)."""
        for k, (step, x) in enumerate(zip(run, rows)):
            a, z = step.prepare_ms
            pending.append((step.row, list(active), h_rows[:, k]))
            n_v = int(videos[k].shape[1]) if x.n_patch else 0
            for j, s in enumerate(active):
                p = Payload(start_ms=a, end_ms=z, block=x.block, embeds=x.emb[j], rel_pos=x.rel_pos,
                            block_shift=x.shift, num_video_tokens=n_v, num_audio_tokens=x.emb.shape[1] - n_v,
                            num_frames=len(rows_idx[k]))
                s.computed["computed_llm_tokens"] += x.emb.shape[1]
                s.last_update = step.row
                if step.row in checks[s.index]:
                    s.snapshots[step.row] = ((s.history + [p], 0) if sliding
                                             else (s.committed + [p], origin))
                if step.commit:
                    s.committed.append(p)
                    if sliding and x.block < SLIDING_VERIFY_BLOCKS * m_blocks and checks[s.index]:
                        s.history.append(p)

    def _group_results(self, group: list[_Stream], steps: list, wall: float, peak: int, mode: str, m_blocks: int,
                       verify_rows: int, tol: float, memory_policy: str) -> dict[int, BatchedStreamResult]:
        """Each stream's ``BatchedStreamResult`` (own steps, production accounting, measured ``computed``, the
        group's wall time shared out, ``cache_replay`` verification); clears the stream's per-group stores."""
        r = self.runner
        out = {}
        for s in group:
            own = steps[: s.n_rows]
            plan = accounting(own)
            s.computed["computed_encoder_seconds_of_media"] = (s.computed["computed_audio_seconds"]
                                                               + s.computed["computed_video_seconds"])
            res = BatchedStreamResult(states=s.states, steps=own, processor_calls=plan.processor_calls,
                                      prepared_media_s=plan.prepared_media_s, wall_time_s=wall / len(group),
                                      peak_memory_bytes=int(peak),
                                      computed={k: round(v, 6) for k, v in s.computed.items()},
                                      batch_size=len(group), batch_wall_time_s=wall)
            res.verification = r._verify(s.states, s.snapshots, own, s.frames, s.audio, mode, m_blocks,
                                         verify_rows, tol, memory_policy)
            s.snapshots, s.committed, s.patches, s.history, s.block_frames = {}, [], {}, [], None
            out[s.index] = res
        return out


@contextmanager
def _null():
    yield
