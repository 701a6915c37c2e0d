"""Lockstep batched streaming extraction (issue 12): several streams of one mode through the thinker at once.

``BatchedOmniRunner(runner).run_streams(streams, mode, memory_s)`` gives, for every stream, the same
``StreamResult`` as ``OmniThinkerRunner.run_stream`` (same states, masks, production accounting and
verification; bit-identical in fp32 on CPU, tested on the tiny model), plus measured ``computed`` figures.

Batching (one lockstep group = streams of one mode, one schedule, one frame size):
* every stream follows ``schedule(mode, n_rows, memory_s)`` from its own start (stream-local time); the schedule of a
  shorter stream is a prefix of the longer one's, so row ``i`` does the same thing in every stream of the group;
* the KV cache is one batched ``DynamicCache`` whose batch dimension is the group's active streams (per-stream
  caches stacked once, not per step). The fixed prompt is prefilled once (batch 1, exactly as the one-session path)
  and repeated over the batch. Window slides happen at the same row for all streams and evict the same token slice
  (right after the prompt), so one batched crop + one batched re-prefill (``window``) or one batched row eviction
  (``sliding``) serves the group;
* streams of different lengths: a stream whose rows are done **drops out** (``batch_select_indices`` on the cache;
  the others go on at a smaller batch); nothing is padded, so no stream's numbers depend on another's;
* the encoders run once per row over the whole group: one vision-tower call for every new temporal patch of every
  stream (grid ``(1, h, w)`` per patch), one audio-tower call for every stream's audio (same length). Their
  variable-length attention (``cu_seqlens``), which the library runs as one small SDPA call per window / per audio
  chunk, is run as one batched SDPA call per group of equal-length chunks (``_batched_chunk_attention``; identical
  math, far fewer launches);
* one batched LLM prefill per row: every stream's payload has the same token count and the same TMRoPE positions;
  ``micro-chunk-200ms`` rows of one native block go further (``batch_rows``, default on): the block's payloads are
  encoded in one audio-tower and one vision-tower call and prefilled in one causal LLM call whose states are read at
  each row's last token (10 calls -> 1 per block; the LLM is causal and nothing leaves the cache inside a block,
  so each state sees what the row-by-row prefill shows it; equal to fp32 rounding, not bit for bit, because other
  call shapes round differently; ``batch_rows=False`` is bit-identical). An offline extraction may do this, all
  payloads being recorded; a live stream cannot (its next 200 ms has not happened);
* payloads are prepared on the device, with the processors' own operations (``models.omni.thinker.LogMel``, ``video_inputs``):
  each native block's audio and frames go to the device once, then per row one log-mel call over all streams'
  audio and one video-processor call over all new temporal patches. The one-session path prepares the same way, so
  both agree bit for bit on CPU; against the official processors see ``models/omni/thinker.py`` (tolerances);
* the row loop issues work without waiting for the device: tower index tensors are computed once per shape, payload
  positions come from cached device layouts and states are copied to the host every ``_FLUSH_ROWS`` rows.
  ``profile=True`` times the parts (``BREAKDOWN_PARTS``) with a device synchronization around each.
Streams whose frames do not cover their rows (a decode came up short) or whose frame size differs form their own
groups (a group of one runs the same code at batch 1).

Memory policies (``memory_policy``, as ``models/omni/thinker.py``):
* ``window`` (default): exact finite memory: the cache always equals a from-scratch prefill of prompt + the last
  ``memory_s`` of media; cost: on every slide the kept blocks are re-prefilled through the LLM at re-based positions
  (up to ``M - 1`` blocks, e.g. ~4,500 tokens per 2 s at 8 s memory and 3B shapes).
  Re-prefills of several slides in one call (``reprefill_slides``): at a slide the cache is cut back to the
  prompt and the kept blocks are prefilled on top of it at positions re-based to the window start, so the keys and
  values it leaves depend only on the prompt cache and the kept payloads, which are encoder outputs (independent of
  the LLM). So at a slide the row loop lets the encoders run ahead (the same calls in the same order, the encoded
  runs buffered until the row loop reaches them) up to the last payload that the K-th next slide keeps, stacks each
  (slide, stream)'s kept sequence as one batch row on top of the prompt cache repeated over the rows, runs one LLM
  call per distinct kept layout (token count and positions; one in the steady state) and, at each of those slides,
  installs that slide's keys/values instead of prefilling. A stream that finishes before a slide has no row for
  it; streams of a group share a layout, so nothing is padded. The tokens prefilled (``computed_llm_tokens``) are
  the same for every K; the calls (``computed_reprefill_calls``) fall to about 1/K. Equal to the K = 1 path up to the
  rounding of other call shapes (tested to 1e-5 on the tiny model; K = 1 is the per-slide call, bit for bit).
  hold / open-stream-replay commit one payload per block (its boundary row), micro-chunk-200ms ten; all slide at a
  block's first payload row, so the batching applies to the three modes alike. Memory: K slides' keys/values
  (bounded by ``reprefill_memory_bytes``) plus the runs encoded ahead (open-stream-replay: every tail of up to
  K - 1 blocks).
  The slide row's own payloads in that call (``fuse_slide_rows``, off by default; issue 41): each (slide, stream)
  batch row is the kept blocks followed by the payload(s) the slide row prefills (hold / replay: the block's first
  payload; micro-chunk-200ms: the run of the block's rows), read out at each payload's last token; the cache then
  holds the slide's keys/values and, when the row commits, the row's (a replay tail's are left out, as the row loop
  crops them). LLM calls per slide fall from ``1/K + 1`` to ``1/K`` (hold: the only other calls are the rows before
  the first slide), the tokens are the same; equal to the unfused path up to the rounding of other call shapes
  (tested to 1e-5 on the tiny model). A stream that finishes inside a micro block cuts that block's run short, so
  its slide gets a layout (and a call) of its own. ``models/omni/batch_reprefill.py``.
* ``sliding``: StreamingLLM / Mistral-style sliding-window KV cache: committed blocks' keys/values are computed
  exactly once and kept; a slide only removes the evicted blocks' rows (``OmniThinkerRunner._evict_rows``).
  Positions are absolute (never re-based). The kept blocks' deeper-layer keys/values still carry information from
  the evicted blocks (computed while those were in the cache), so the state is not a function of the last
  ``memory_s`` alone; only its direct attention span is bounded.

Reuse, per mode (what the semantics of DESIGN §5 and the memory policy permit, and no more):
* ``completed-block-hold``: a payload is a whole committed 2 s block, prepared and encoded once when the block
  completes. ``window``: its encoder outputs are kept and reused when the memory window slides (the kept blocks are
  re-prefilled through the LLM from those stored embeddings; the LLM re-prefill itself cannot be reused, because the
  kept blocks' keys/values in deeper layers depend on the evicted block and on the old positions, and the semantics
  require the cache to equal a from-scratch prefill of the window). ``sliding``: its LLM keys/values are reused
  until the block is evicted (that is the policy), so each block goes through the encoders and the LLM exactly once.
* ``micro-chunk-200ms``: every 0.2 s payload is new and committed at once, so each is prepared and encoded exactly
  once (a frame that lands in a micro step forms its own temporal patch, padded by repetition, as the one-session
  path does). ``window``: committed embeddings are reused on window slides (LLM re-prefill); ``sliding``: committed
  keys/values are kept, each payload goes through the LLM once. Nothing else can be reused: no payload recurs.
* ``open-stream-replay``: the tail ``(block start, t]`` is temporary and re-prepared at every row, but its video
  splits into temporal patches of 2 frames that the vision tower encodes independently (its attention never crosses
  a temporal patch: ``cu_seqlens`` cut per patch, windows inside a patch; the video processor works per frame), so
  the encoder output of a **completed** temporal patch (both frames present) is a function of those two frames
  only and is computed once, when its second frame arrives, then reused by every later tail of the block and by the
  committed block. A **partial** patch (one frame, padded by repetition) is temporary and recomputed at each row
  that needs it. The tail's **audio** is recomputed at every row: the log-mel is normalised by the maximum over the
  whole tail and the audio tower attends bidirectionally within its 2 s window, so earlier audio tokens change as
  the tail grows. The tail's LLM prefill is temporary and dropped, as the mode defines (it is not reused either),
  under both policies; the committing tail's keys/values are re-prefilled on slides (``window``) or kept
  (``sliding``).
The ``production_*`` accounting keeps the mode's definition (a processor call per prepared payload, its length in
seconds); ``computed`` reports what this path actually ran (see ``COMPUTED_FIELDS``).

Fast small calls (flag ``compile_small_calls``, default off): ``torch.compile`` of the audio tower (fixed shapes:
one per tail length / the 0.2 s micro step; CUDA: ``mode="reduce-overhead"``, i.e. CUDA graphs) and of the language
model (dynamic shapes). Whether it pays is measured by ``bench/extract_throughput.py --compile``.

Where the parts live: ``BatchedOmniRunner`` (here: construction, grouping of the streams) is the row loop of
``batch_schedule.py`` (``LockstepSchedule``: schedule, batched cache, read-out) over the media encoding of
``batch_media.py`` (``LockstepMediaEncoder``), with the window slides and re-prefills of ``batch_reprefill.py``
(``WindowReprefill``), the accounting and profile timing of ``batch_accounting.py`` and the attention kernels of
``attention.py``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from algorithms.errors import check_int

from .batch_accounting import BREAKDOWN_PARTS, COMPUTED_FIELDS, BatchedStreamResult, PartTimer, single_session_computed
from .batch_media import LockstepMediaEncoder
from .batch_media import _Stream
from .batch_reprefill import REPREFILL_MEMORY_BYTES, REPREFILL_SLIDES_MAX, reprefill_bytes_per_token
from .batch_schedule import LockstepSchedule
from .thinker import OmniThinkerRunner
from .thinker_media import AUDIO_SAMPLE_RATE

__all__ = ["BREAKDOWN_PARTS", "COMPUTED_FIELDS", "REPREFILL_MEMORY_BYTES", "REPREFILL_SLIDES_MAX", "BatchedOmniRunner",
           "BatchedStreamResult", "reprefill_bytes_per_token", "single_session_computed"]


class BatchedOmniRunner(LockstepSchedule, LockstepMediaEncoder, PartTimer):
    """Runs several streams in lockstep on one ``OmniThinkerRunner`` (module docstring).

    Per row, the host only issues work: each native block's media goes to the device once (audio and frames of every
    stream of the group, pinned and asynchronous on CUDA); the log-mel of all streams' payload audio is one
    ``LogMel`` call and the video processor one call over all new temporal patches, both on the device; the towers'
    index tensors (chunk lengths, pooling / window indices, rotary positions) are computed once per shape and kept on
    the device; payload positions are built on the device from cached layouts; states are read out on the device and
    copied to the host every ``_FLUSH_ROWS`` rows. So the row loop's own code waits for the device only at those
    copies and when a stream drops out (the library's tower / LLM forwards are used as they are); the towers'
    batched chunk attention reads each ``cu_seqlens`` tensor's lengths once per tower call
    (:func:`models.vision_attention.chunk_lengths`).

    Args:
        runner: the one-session runner (its thinker, processors, layer, prompt and geometry are used as they are).
        sessions_per_batch: most streams in one lockstep group.
        reuse: keep encoder outputs of completed temporal patches (open-stream-replay); False recomputes every
            tail's video like the one-session path (for measurement).
        batched_attention: run the towers' chunked attention as batched SDPA calls.
        compile_small_calls: ``torch.compile`` the audio tower and the language model (off by default).
        compile_backend: ``torch.compile`` backend (default inductor; tests use ``"eager"``).
        profile: fill ``breakdown`` (``BREAKDOWN_PARTS`` -> wall seconds of the last ``run_streams`` call), with a
            device synchronization around every part (off by default: the parts then overlap).
        batch_rows: run the committed rows of one native block as one encoder call and one causal LLM prefill
            (``micro-chunk-200ms``: 10 rows per 2 s block instead of 10 calls; ``_row_run``). An offline
            extraction may do this because every row's payload is already recorded; a live stream, whose next
            200 ms has not happened yet, cannot. False: one row per call.
        flash_prefill: on CUDA, the LLM prefills on top of the cache run SDPA with a lower-right causal bias (flash
            kernel) instead of the library's explicit mask (masked kernel): :func:`lower_right_causal_sdpa`.
        reprefill_slides: ``window`` policy: the re-prefills of up to this many upcoming window slides run as one
            LLM call (the encoders run ahead as far as those slides keep; module docstring). 1: one call per slide,
            bit-identical to the one-session path. None (default): the most, up to ``REPREFILL_SLIDES_MAX``, whose
            rows fit in ``reprefill_memory_bytes`` (``reprefill_bytes_per_token``).
        reprefill_memory_bytes: the device-memory bound of the default ``reprefill_slides``.
        fuse_slide_rows: ``window`` policy: the slide row's own payloads (hold / replay: the block's first payload;
            micro-chunk-200ms: the run of the block's rows) ride in the re-prefill call as the tail of each (slide,
            stream) batch row, their states read out of it, instead of a second LLM call on top of the installed
            cache (``models/omni/batch_reprefill.py``). LLM calls per slide: ``1/K + 1`` -> ``1/K``; the same tokens.
            Equal to the unfused path up to the rounding of other call shapes (tested to 1e-5 on the tiny model).
            Off by default (numerics differ by rounding; issue 41).
    """

    def __init__(self, runner: OmniThinkerRunner, sessions_per_batch: int = 8, reuse: bool = True,
                 batched_attention: bool = True, compile_small_calls: bool = False,
                 compile_backend: str | None = None, profile: bool = False, batch_rows: bool = True,
                 flash_prefill: bool = True, reprefill_slides: int | None = None,
                 reprefill_memory_bytes: int = REPREFILL_MEMORY_BYTES, fuse_slide_rows: bool = False):
        if sessions_per_batch < 1:
            raise ValueError(f"sessions_per_batch={sessions_per_batch} must be >= 1")
        check_int("reprefill_slides", reprefill_slides, 1, allow_none=True,
                  none_means="the most that fit in reprefill_memory_bytes")
        check_int("reprefill_memory_bytes", reprefill_memory_bytes, 1)
        self.reprefill_slides = reprefill_slides
        self.reprefill_memory_bytes = reprefill_memory_bytes
        self.fuse_slide_rows = bool(fuse_slide_rows)
        self.runner = runner
        self.sessions_per_batch = int(sessions_per_batch)
        self.reuse = reuse
        self.batched_attention = batched_attention
        self.compile_small_calls = compile_small_calls
        self.profile = profile
        self.batch_rows = batch_rows
        self.flash_prefill = flash_prefill
        self.breakdown: dict[str, float] = {}
        self._prompt = None
        self._grid = None
        self._audio_kw: dict[tuple, dict | None] = {}
        self._vision_kw: dict[tuple, dict] = {}
        self._layouts: dict[tuple, tuple] = {}
        self._cached_on: torch.device | None = None
        model = runner.thinker.model
        self._audio_tower = model.audio_tower
        self._lm = model.language_model
        if compile_small_calls:
            kw: dict[str, Any] = {"backend": compile_backend} if compile_backend else {}
            if runner.device.type == "cuda" and not compile_backend:
                kw["mode"] = "reduce-overhead"
            self._audio_tower = torch.compile(model.audio_tower, dynamic=False, **kw)
            kw.pop("mode", None)
            self._lm = torch.compile(model.language_model, dynamic=True, **kw)

    # ---------------------------------------------------------------------------------------- public API
    @torch.no_grad()
    def run_streams(self, streams: list[dict[str, Any]], mode: str, memory_s: float = 8.0, verify_rows: int = 4,
                    cache_replay_tol: float = 1e-5, memory_policy: str = "window") -> list[BatchedStreamResult]:
        """Run ``streams`` (``{"frames": (F, H, W, 3) uint8, "audio": (S,) float32, "n_rows": int | None}``) in
        ``mode`` under ``memory_policy``; returns one ``BatchedStreamResult`` per stream, in input order (see
        ``run_stream`` for the arguments)."""
        self.runner.check_settings(mode, memory_s, memory_policy, verify_rows)
        g = self.runner.geometry
        self.breakdown = dict.fromkeys(BREAKDOWN_PARTS, 0.0) if self.profile else {}
        items = []
        for i, st in enumerate(streams):
            frames = np.asarray(st["frames"])
            audio = np.asarray(st["audio"], dtype=np.float32).reshape(-1)
            n = st.get("n_rows")
            if n is None:
                from algorithms.streaming import num_rows

                n = num_rows(len(audio) / AUDIO_SAMPLE_RATE, g)
            items.append(_Stream(i, frames, audio, int(n), torch.zeros(int(n), self.runner.hidden_size)))
        groups: dict[Any, list[_Stream]] = {}
        for s in items:
            need = s.n_rows * g.row_ms // int(round(g.frame_ms))
            key = (tuple(s.frames.shape[1:]), "covered") if len(s.frames) >= need else ("short", s.index)
            groups.setdefault(key, []).append(s)
        results: dict[int, BatchedStreamResult] = {}
        n_groups = 0
        for members in groups.values():
            members.sort(key=lambda s: -s.n_rows)
            for j in range(0, len(members), self.sessions_per_batch):
                chunk = [s for s in members[j: j + self.sessions_per_batch] if s.n_rows > 0]
                if chunk:
                    ran = self._run_group(chunk, mode, memory_s, verify_rows, cache_replay_tol, memory_policy)
                    for res in ran.values():
                        res.group = n_groups
                    results.update(ran)
                    n_groups += 1
                for s in members[j: j + self.sessions_per_batch]:
                    if s.n_rows == 0:
                        results[s.index] = BatchedStreamResult(states=s.states, steps=[], processor_calls=0,
                                                               prepared_media_s=0.0, computed=dict(s.computed))
        return [results[i] for i in range(len(items))]
