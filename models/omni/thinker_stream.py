"""The stream schedule of the one-session thinker runner: settings checks, ``run_stream`` (one stream row by row on
a schedule of ``algorithms/streaming.py``), its result and its ``cache_replay`` / micro-chunk verification
(:class:`ThinkerStreamSchedule`, mixed into ``OmniThinkerRunner``).

Legend: T_rows output rows, D hidden size; the modes, memory policies and the verification are described in
``models/omni/thinker.py``.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from algorithms.errors import SettingError
from algorithms.streaming import (MICRO_CHUNK_200MS, MODES, SLIDING, accounting, check_memory_policy,
                                  check_micro_chunk_tiling, memory_blocks, num_rows, schedule)

from .thinker_media import AUDIO_SAMPLE_RATE, Payload

SLIDING_VERIFY_BLOCKS = 3  # sliding cache_replay: rows whose payload block is < 3 M (the reference grows with time)


@dataclass
class StreamResult:
    """Output of one stream.

    Attributes:
        states: (T_rows, D) float32 on CPU; zeros on initialization rows.
        masks: per-row lists, see ``algorithms.streaming.masks``.
        processor_calls / prepared_media_s: production cost actually spent (equal to the schedule's accounting).
        verification: ``cache_replay`` and ``micro_chunk_vs_continuous_semantics`` dicts.
        wall_time_s / peak_memory_bytes: cost of the stream (CUDA: max allocated; CPU: process peak RSS).
    """

    states: torch.Tensor
    steps: list
    processor_calls: int
    prepared_media_s: float
    verification: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0
    peak_memory_bytes: int = 0



class ThinkerStreamSchedule:
    """Runs one stream on its schedule and verifies it (``check_settings``, ``run_stream``, ``_verify``); the
    schedule half of ``OmniThinkerRunner``.

    Uses the runner's media inputs (``prepare``, ``embed``: :class:`~.thinker_media.ThinkerMediaInputs`), its KV
    cache handling (:class:`~.thinker_cache.ThinkerKVCache`), ``geometry``, ``hidden_size``, ``device`` and the
    ``processor_calls`` / ``prepared_ms`` counters.
    """

    def check_settings(self, mode: str, memory_s: float, memory_policy: str, verify_rows: int) -> int:
        """Refuse a run's settings before any media is prepared: the mode, the memory policy, ``memory_s`` as whole
        native blocks of this geometry, the micro-chunk tiling and (``sliding`` with ``verify_rows != 0``) the
        ``cache_replay`` reference. Returns the memory in native blocks ``M``.

        Raises:
            SettingError: any of them invalid (the field named).
        """
        if mode not in MODES:
            raise SettingError(f"unknown streaming mode {mode!r}; expected one of {MODES}")
        if check_memory_policy(memory_policy) == SLIDING and verify_rows != 0:
            self.check_sliding_verifiable()
        if mode == MICRO_CHUNK_200MS:
            check_micro_chunk_tiling(self.geometry)
        return memory_blocks(memory_s, self.geometry)

    def check_sliding_verifiable(self) -> None:
        """Raise before a stream starts when the sliding ``cache_replay`` reference cannot run.

        Raises:
            SettingError: a flash-attention implementation (the reference needs a 4-D mask) with ``verify_rows``
                other than 0.
        """
        impl = str(self.thinker.model.language_model.config._attn_implementation)
        if "flash" in impl:
            raise SettingError(f"memory_policy='sliding' with verify_rows != 0 needs attn_implementation 'sdpa' or "
                               f"'eager' for its cache_replay reference (a 4-D mask), got {impl!r}; or set "
                               f"verify_rows=0")

    # --------------------------------------------------------------------------------------------- stream
    @torch.no_grad()
    def run_stream(self, frames: torch.Tensor | np.ndarray, audio: torch.Tensor | np.ndarray, mode: str,
                   memory_s: float = 8.0, n_rows: int | None = None, verify_rows: int = 4,
                   cache_replay_tol: float = 1e-5, memory_policy: str = "window") -> StreamResult:
        """Run one stream in ``mode`` and read one state per 0.2 s row.

        Args:
            frames: (F, H, W, 3) uint8 right-edged 2 FPS frames (frame k ends at 0.5 (k + 1) s).
            audio: (S,) float32 mono 16 kHz.
            mode: one of ``algorithms.streaming.MODES``.
            memory_s: media memory (s), a multiple of the 2 s native block.
            n_rows: rows to produce (default ``floor(duration / 0.2)`` with duration = S / 16000).
            verify_rows: how many updated rows (evenly spaced, always including the last) get the from-scratch
                ``cache_replay`` check; -1 = all, 0 = none. Micro-chunk mode also compares up to this many boundary
                rows with the continuous (native-block) reading.
            cache_replay_tol: max abs difference accepted as "effectively exact".
            memory_policy: ``window`` (default: evict + re-prefill the kept blocks at re-based positions) or
                ``sliding`` (evict the oldest blocks' cache rows, keep the rest, absolute positions); module
                docstring. Under ``sliding`` only rows whose payload block is ``< 3 M`` are ``cache_replay`` candidates.

        Returns:
            ``StreamResult`` with states (T_rows, D).

        Raises:
            ValueError: unknown mode or memory policy, bad memory, or (micro-chunk) the tiling check fails.
        """
        m_blocks = self.check_settings(mode, memory_s, memory_policy, verify_rows)
        sliding = memory_policy == SLIDING
        g = self.geometry
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if n_rows is None:
            n_rows = num_rows(len(audio) / AUDIO_SAMPLE_RATE, g)
        steps = schedule(mode, n_rows, memory_s, g)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        calls0, prep0 = self.processor_calls, self.prepared_ms
        states = torch.zeros(n_rows, self.hidden_size, dtype=torch.float32)
        check_rows = set(verify_candidates(steps, verify_rows, m_blocks, memory_policy))
        snapshots: dict[int, tuple[list[Payload], int]] = {}
        cache, prompt_len = self._new_cache()
        committed: list[Payload] = []  # payloads whose keys/values are in the cache, in cache order
        history: list[Payload] = []  # sliding: every committed payload of blocks < 3 M (cache_replay reference)
        origin = 0
        held = None
        warned = not sliding
        for s in steps:
            if s.prepare_ms is None:
                if held is not None:
                    states[s.row] = held
                continue
            payload = self.embed(self.prepare(frames, audio, *s.prepare_ms), *s.prepare_ms)
            first = max(0, s.block - (m_blocks - 1))
            if first != origin:  # the window slid
                gone = [p for p in committed if p.block < first]  # a prefix: blocks are committed in order
                committed = [p for p in committed if p.block >= first]
                origin = first
                if sliding:  # evict the older blocks' rows (right after the prompt), keep the rest as computed
                    self._evict_rows(cache, prompt_len, sum(p.embeds.shape[0] for p in gone))
                else:  # evict older blocks, re-prefill the kept ones at re-based positions
                    self._truncate(cache, prompt_len)
                    if committed:
                        self._forward(torch.cat([p.embeds for p in committed]),
                                      torch.cat([self.payload_positions(p, origin) for p in committed], 1), cache)
            length = cache.get_seq_length()
            pos = self.payload_positions(payload, 0 if sliding else origin)
            if not warned:
                warned = self._position_warning(pos, n_rows)
            h = self._forward(payload.embeds, pos, cache)[-1]
            held = h.float().cpu()
            states[s.row] = held
            if s.row in check_rows:
                snapshots[s.row] = (history + [payload], 0) if sliding else (committed + [payload], origin)
            if s.commit:
                committed.append(payload)
                if sliding and payload.block < SLIDING_VERIFY_BLOCKS * m_blocks and check_rows:
                    history.append(payload)
            else:
                self._truncate(cache, length)
        wall = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        result = StreamResult(states=states, steps=steps, processor_calls=self.processor_calls - calls0,
                              prepared_media_s=round((self.prepared_ms - prep0) / 1000.0, 6),
                              wall_time_s=wall, peak_memory_bytes=int(peak))
        plan = accounting(steps)
        if (plan.processor_calls, plan.prepared_media_s) != (result.processor_calls, result.prepared_media_s):
            raise RuntimeError(f"spent {result.processor_calls} calls / {result.prepared_media_s} s, schedule says "
                               f"{plan.processor_calls} / {plan.prepared_media_s}")
        result.verification = self._verify(states, snapshots, steps, frames, audio, mode, m_blocks, verify_rows,
                                           cache_replay_tol, memory_policy)
        return result

    def _verify(self, states, snapshots, steps, frames, audio, mode, m_blocks, verify_rows, tol,
                memory_policy: str = "window") -> dict[str, Any]:
        sliding = memory_policy == SLIDING
        diffs = {}
        for row, (payloads, first) in sorted(snapshots.items()):
            ref = self.recompute_sliding(payloads, m_blocks) if sliding else self.recompute(payloads, first)
            diffs[row] = float((ref - states[row]).abs().max())
        worst = max(diffs.values(), default=0.0)
        what = ("incremental cached state vs one from-scratch forward over prompt + every payload committed since "
                "the stream start + the row's payload, at absolute positions, under a 4-D mask implementing the "
                f"sliding policy; only rows whose payload block is < {SLIDING_VERIFY_BLOCKS} M are checked"
                if sliding else "incremental cached state vs one from-scratch prefill of prompt + the same window")
        out: dict[str, Any] = {"cache_replay": {
            "rows": sorted(diffs), "max_abs_diff": worst, "tolerance": tol, "passed": worst <= tol,
            "memory_policy": memory_policy, "what": what}}
        if mode != MICRO_CHUNK_200MS:
            out["micro_chunk_vs_continuous_semantics"] = {"applicable": False}
            return out
        # Diagnostic: micro-chunk state at block boundaries vs the continuous reading of the same window prepared
        # as native 2 s blocks. Not an equivalence (payloads are featurized and encoded differently).
        g = self.geometry
        boundary_rows = _spread([s.row for s in steps if s.boundary], verify_rows)
        native: dict[int, Payload] = {}
        rows, cos, mad = [], [], []
        for row in boundary_rows:
            b = steps[row].block
            first = max(0, b - (m_blocks - 1))
            for k in range(first, b + 1):
                if k not in native:
                    a, z = k * g.native_block_ms, (k + 1) * g.native_block_ms
                    native[k] = self.embed(self.prepare(frames, audio, a, z, count=False), a, z)
            ref = self.recompute([native[k] for k in range(first, b + 1)], 0 if sliding else first)
            rows.append(row)
            cos.append(float(torch.nn.functional.cosine_similarity(ref, states[row], dim=0)))
            mad.append(float((ref - states[row]).abs().max()))
        out["micro_chunk_vs_continuous_semantics"] = {
            "applicable": bool(rows), "rows": rows, "cosine": cos, "max_abs_diff": mad,
            "mean_cosine": float(np.mean(cos)) if cos else None,
            "what": "diagnostic, not an equivalence: micro-chunk state vs native-block prefill of the same window"
                    + (" at absolute positions" if sliding else "")}
        return out


def verify_candidates(steps, verify_rows: int, m_blocks: int, memory_policy: str = "window") -> list[int]:
    """Rows that get the ``cache_replay`` check: ``verify_rows`` evenly spaced updated rows including the last;
    under ``sliding`` only among rows whose payload block is ``< 3 M`` (their last one, which follows the first
    eviction whenever the stream reaches block ``M``, is always included unless ``verify_rows == 0``)."""
    rows = [s.row for s in steps if s.update]
    if memory_policy == SLIDING:
        rows = [r for r in rows if steps[r].block < SLIDING_VERIFY_BLOCKS * m_blocks]
    return _spread(rows, verify_rows)


def _spread(rows: list[int], k: int) -> list[int]:
    """Up to ``k`` evenly spaced entries of ``rows`` including the last (-1: all, 0: none)."""
    if k < 0 or k >= len(rows):
        return list(rows)
    if k == 0 or not rows:
        return []
    idx = {round(j * (len(rows) - 1) / max(k - 1, 1)) for j in range(k)} if k > 1 else {len(rows) - 1}
    return [rows[j] for j in sorted(idx)]
