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
* one batched LLM prefill per row: every stream's payload has the same token count and the same TMRoPE positions.
Streams whose frames do not cover their rows (a decode came up short) or whose frame size differs form their own
groups (a group of one runs the same code at batch 1).

Memory policies (``memory_policy``, as ``models/omni.py``):
* ``window`` (default): exact finite memory: the cache always equals a from-scratch prefill of prompt + the last
  ``memory_s`` of media; cost: on every slide the kept blocks are re-prefilled through the LLM at re-based positions
  (up to ``M - 1`` blocks, e.g. ~4,500 tokens per 2 s at 8 s memory and 3B shapes).
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
"""
from __future__ import annotations

import resource
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from algorithms.streaming import (MICRO_CHUNK_200MS, MODES, OPEN_STREAM_REPLAY, SLIDING, accounting,
                                  check_memory_policy, check_micro_chunk_tiling, memory_blocks, schedule)
from models.omni import (AUDIO_SAMPLE_RATE, SLIDING_VERIFY_BLOCKS, OmniThinkerRunner, Payload, StreamResult,
                         frame_indices, verify_candidates)

COMPUTED_FIELDS = {
    "computed_processor_calls": "feature-extractor calls + video-processor calls actually run for the stream "
                                "(per row: one of each at most; the one-session path counts the same way)",
    "computed_audio_seconds": "seconds of audio featurised (log-mel) and encoded by the audio tower",
    "computed_video_seconds": "seconds of video encoded by the vision tower (0.5 s per real frame of a patch)",
    "computed_encoder_seconds_of_media": "computed_audio_seconds + computed_video_seconds",
    "computed_vision_patches": "temporal patches through the vision tower",
    "computed_llm_tokens": "tokens prefilled through the LLM (payloads + window re-prefills under the window "
                           "policy, payloads only under sliding; prompt excluded)",
}


@dataclass
class BatchedStreamResult(StreamResult):
    """``StreamResult`` plus the measured cost of the batched path.

    Attributes:
        computed: ``COMPUTED_FIELDS`` -> value, for this stream.
        batch_size: streams in the lockstep group at its start.
        batch_wall_time_s: wall time of the whole group (``wall_time_s`` is this divided by ``batch_size``).
    """

    computed: dict[str, float] = field(default_factory=dict)
    batch_size: int = 1
    batch_wall_time_s: float = 0.0


def single_session_computed(steps, n_frames: int, geometry=None) -> dict[str, float]:
    """What the one-session path (``run_stream``) computes for ``steps`` (no reuse): same ``COMPUTED_FIELDS``."""
    from algorithms.streaming import DEFAULT_GEOMETRY

    g = geometry or DEFAULT_GEOMETRY
    out = dict.fromkeys(COMPUTED_FIELDS, 0.0)
    for s in steps:
        if s.prepare_ms is None:
            continue
        a, z = s.prepare_ms
        f = len([k for k in frame_indices(a, z, g.frame_ms) if k < n_frames])
        out["computed_processor_calls"] += 1 + (1 if f else 0)
        out["computed_audio_seconds"] += (z - a) / 1000.0
        out["computed_video_seconds"] += f * g.frame_ms / 1000.0
        out["computed_vision_patches"] += -(-f // g.temporal_patch_size)
    out["computed_encoder_seconds_of_media"] = out["computed_audio_seconds"] + out["computed_video_seconds"]
    return {k: round(v, 6) for k, v in out.items()}


# ------------------------------------------------------------------------------------- batched chunk attention
def _chunk_attention(module, q, k, v, cu_seqlens) -> torch.Tensor:
    """Non-causal attention inside each ``cu_seqlens`` chunk of (1, H, S, d) q/k/v, one call per chunk length.

    Returns (S, H * d) in sequence order, as the library's per-chunk loop does (same attention function)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import eager_attention_forward

    fn = ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager_attention_forward)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    _, h, s, d = q.shape
    qs, ks, vs = (t[0].split(lengths, dim=1) for t in (q, k, v))  # each (H, L_i, d)
    outs: list[torch.Tensor | None] = [None] * len(lengths)
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    for n, ids in by_len.items():
        if len(lengths) == len(ids):  # all chunks equal: a view, no copy
            qb, kb, vb = (t[0].view(h, len(ids), n, d).transpose(0, 1) for t in (q, k, v))
        else:
            qb, kb, vb = (torch.stack([parts[i] for i in ids]) for parts in (qs, ks, vs))
        o = fn(module, qb, kb, vb, attention_mask=None, scaling=module.scaling, dropout=0.0, is_causal=False)[0]
        for j, i in enumerate(ids):  # o: (n_chunks, L, H, d)
            outs[i] = o[j]
    return torch.cat(outs, 0).reshape(s, -1)


def _vision_attention_forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kw):
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import apply_rotary_pos_emb_vision

    n = hidden_states.shape[0]
    q = self.q(hidden_states).reshape(n, self.num_heads, -1)
    k = self.k(hidden_states).reshape(n, self.num_heads, -1)
    v = self.v(hidden_states).reshape(n, self.num_heads, -1)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    return self.proj(_chunk_attention(self, q, k, v, cu_seqlens).contiguous())


def _audio_attention_forward(self, hidden_states, cu_seqlens, max_seqlen=None, **kw):
    n = hidden_states.shape[0]
    q, k, v = (p(hidden_states).reshape(n, self.num_heads, -1).transpose(0, 1).unsqueeze(0)
               for p in (self.q_proj, self.k_proj, self.v_proj))
    return self.out_proj(_chunk_attention(self, q, k, v, cu_seqlens).contiguous())


def _per_sample_conv_forward(self, x):
    return torch.cat([type(self).forward(self, x[i: i + 1]) for i in range(x.shape[0])])


@contextmanager
def _batched_chunk_attention(thinker):
    """Inside: the towers' per-chunk attention loops become one SDPA call per chunk length (flash-attention
    implementations, which already take ``cu_seqlens``, are left alone)."""
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as mq

    patched = []
    for m in ([] if "flash" in str(thinker.config._attn_implementation) else thinker.modules()):
        if isinstance(m, mq.Qwen2_5OmniVisionAttention):
            m.forward = types.MethodType(_vision_attention_forward, m)
        elif isinstance(m, mq.Qwen2_5OmniAudioAttention):
            m.forward = types.MethodType(_audio_attention_forward, m)
        else:
            continue
        patched.append(m)
    for conv in (thinker.model.audio_tower.conv1, thinker.model.audio_tower.conv2):
        # one conv call per audio chunk: a batched CPU conv (oneDNN) may round differently from a batch of one,
        # and these calls are few (2 per stream and row)
        conv.forward = types.MethodType(_per_sample_conv_forward, conv)
        patched.append(conv)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


# --------------------------------------------------------------------------------------------------- runner
@dataclass
class _Stream:
    index: int
    frames: np.ndarray
    audio: np.ndarray
    n_rows: int
    states: torch.Tensor
    committed: list = field(default_factory=list)
    history: list = field(default_factory=list)  # sliding: committed payloads of blocks < 3 M (cache_replay)
    warned: bool = False
    snapshots: dict = field(default_factory=dict)
    patches: dict = field(default_factory=dict)  # first frame index -> (n_tok, D) output of a completed patch
    held: torch.Tensor | None = None
    computed: dict = field(default_factory=lambda: dict.fromkeys(COMPUTED_FIELDS, 0.0))


class BatchedOmniRunner:
    """Runs several streams in lockstep on one ``OmniThinkerRunner`` (module docstring).

    Args:
        runner: the one-session runner (its thinker, processors, layer, prompt and geometry are used as they are).
        sessions_per_batch: most streams in one lockstep group.
        reuse: keep encoder outputs of completed temporal patches (open-stream-replay); False recomputes every
            tail's video like the one-session path (for measurement).
        batched_attention: run the towers' chunked attention as batched SDPA calls.
        compile_small_calls: ``torch.compile`` the audio tower and the language model (off by default).
        compile_backend: ``torch.compile`` backend (default inductor; tests use ``"eager"``).
    """

    def __init__(self, runner: OmniThinkerRunner, sessions_per_batch: int = 8, reuse: bool = True,
                 batched_attention: bool = True, compile_small_calls: bool = False,
                 compile_backend: str | None = None):
        if sessions_per_batch < 1:
            raise ValueError(f"sessions_per_batch={sessions_per_batch} must be >= 1")
        self.runner = runner
        self.sessions_per_batch = int(sessions_per_batch)
        self.reuse = reuse
        self.batched_attention = batched_attention
        self.compile_small_calls = compile_small_calls
        self._prompt = None
        self._grid = None
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
        if mode not in MODES:
            raise ValueError(f"unknown streaming mode {mode!r}; expected one of {MODES}")
        check_memory_policy(memory_policy)
        g = self.runner.geometry
        if mode == MICRO_CHUNK_200MS:
            check_micro_chunk_tiling(g)
        memory_blocks(memory_s, g)
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
        for members in groups.values():
            members.sort(key=lambda s: -s.n_rows)
            for j in range(0, len(members), self.sessions_per_batch):
                chunk = [s for s in members[j: j + self.sessions_per_batch] if s.n_rows > 0]
                if chunk:
                    results.update(self._run_group(chunk, mode, memory_s, verify_rows, cache_replay_tol,
                                                   memory_policy))
                for s in members[j: j + self.sessions_per_batch]:
                    if s.n_rows == 0:
                        results[s.index] = BatchedStreamResult(states=s.states, steps=[], processor_calls=0,
                                                               prepared_media_s=0.0, computed=dict(s.computed))
        return [results[i] for i in range(len(items))]

    # --------------------------------------------------------------------------------------------- parts
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
        out = self._lm(inputs_embeds=embeds, position_ids=pos, past_key_values=cache, use_cache=True,
                       output_hidden_states=True)
        return out.hidden_states[self.runner.layer]

    def _audio(self, group: list[_Stream], a: int, z: int) -> torch.Tensor:
        """(B, n_a, D) audio-tower output of every stream's ``(a, z]`` audio, one tower call."""
        r = self.runner
        empty = np.zeros((0, 1, 1, 3), np.uint8)
        feats = [r.prepare(empty, s.audio, a, z, count=False)["input_features"] for s in group]
        for s in group:
            s.computed["computed_processor_calls"] += 1
            s.computed["computed_audio_seconds"] += (z - a) / 1000.0
        x = torch.cat(feats).to(r.device, r.dtype)  # (B, 128, n_mel)
        b, _, n_mel = x.shape
        flat = x.permute(1, 0, 2).reshape(x.shape[1], b * n_mel)  # the library's masked flatten, all valid
        lens = torch.full((b,), n_mel, dtype=torch.long, device=r.device)
        after, out_lens = r.thinker.model.audio_tower._get_feat_extract_output_lengths(lens)
        h = self._audio_tower(flat, feature_lens=lens, aftercnn_lens=after).last_hidden_state
        n_a = int(out_lens[0])
        expect = (z - a) * r.geometry.audio_tokens_per_s // 1000
        if n_a != expect:
            raise RuntimeError(f"audio tower gave {n_a} tokens for {z - a} ms, expected {expect}")
        return h.view(b, n_a, -1)

    def _video(self, group: list[_Stream], idx: list[int], reuse: bool) -> tuple[list[torch.Tensor], int, int, int]:
        """Vision-tower outputs of the payload's temporal patches for every stream: ``([ (n_v, D) per stream ],
        patches, merged rows, merged cols)``; completed patches come from the stream's store when ``reuse``."""
        r = self.runner
        tps = r.geometry.temporal_patch_size
        patches = [idx[p: p + tps] for p in range(0, len(idx), tps)]
        todo: list[tuple[_Stream, list[int]]] = []
        for s in group:
            for pf in patches:
                if not (reuse and len(pf) == tps and pf[0] in s.patches):
                    todo.append((s, pf))
        fresh: dict[tuple[int, int], torch.Tensor] = {}
        if todo:
            clips = [torch.as_tensor(np.asarray(s.frames[pf[0]: pf[-1] + 1])).permute(0, 3, 1, 2) for s, pf in todo]
            vid = r.video_processor(videos=clips, return_tensors="pt", cap_pixels_per_frame=False)
            thw = vid["video_grid_thw"]
            out = r.thinker.model.get_video_features(vid["pixel_values_videos"].to(r.device, r.dtype),
                                                     thw.to(r.device)).pooler_output
            for s in {s.index: s for s, _ in todo}.values():
                s.computed["computed_processor_calls"] += 1  # one video-processor call per stream and row
            for (s, pf), v in zip(todo, out):
                fresh[(s.index, pf[0])] = v
                s.computed["computed_vision_patches"] += 1
                s.computed["computed_video_seconds"] += len(pf) * r.geometry.frame_ms / 1000.0
                if reuse and len(pf) == tps:
                    s.patches[pf[0]] = v
            self._grid = (int(thw[0, 1]), int(thw[0, 2]))
        gh, gw = self._grid  # every patch reused: the grid of the frames seen before (same size in a group)
        per_stream = [torch.cat([fresh.get((s.index, pf[0]), s.patches.get(pf[0])) for pf in patches])
                      for s in group]
        m = r.thinker.model.visual.spatial_merge_size
        return per_stream, len(patches), gh // m, gw // m

    def _payload_layout(self, start_ms: int, end_ms: int, n_patch: int, hh: int, ww: int, n_audio: int):
        """(rel_pos, block_shift) of a payload, exactly as ``OmniThinkerRunner.embed`` lays it out."""
        g = self.runner.geometry
        block = (end_ms - 1) // g.native_block_ms
        off = int(round((start_ms - block * g.native_block_ms) * g.positions_per_s / 1000))
        pos, shift = [], []
        if n_patch:
            patch_pos = int(round(g.patch_s * g.positions_per_s))
            t_idx = (off + patch_pos * torch.arange(n_patch)).view(-1, 1, 1).expand(n_patch, hh, ww).flatten()
            h_idx = torch.arange(hh).view(1, -1, 1).expand(n_patch, hh, ww).flatten()
            w_idx = torch.arange(ww).view(1, 1, -1).expand(n_patch, hh, ww).flatten()
            pos.append(torch.stack([t_idx, h_idx, w_idx]))
            sh = torch.zeros(3, t_idx.numel(), dtype=torch.long)
            sh[0] = 1
            shift.append(sh)
        pos.append((off + torch.arange(n_audio)).view(1, -1).expand(3, -1))
        shift.append(torch.ones(3, n_audio, dtype=torch.long))
        return block, torch.cat(pos, 1), torch.cat(shift, 1)

    def _run_group(self, group: list[_Stream], mode: str, memory_s: float, verify_rows: int,
                   tol: float, memory_policy: str = "window") -> dict[int, BatchedStreamResult]:
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
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        ctx = _batched_chunk_attention(r.thinker) if self.batched_attention else _null()
        with ctx:
            active = list(group)
            cache, prompt_len = self._prompt_cache(len(active))
            origin = 0
            for st in steps:
                keep = [j for j, s in enumerate(active) if st.row < s.n_rows]
                if len(keep) < len(active):  # finished streams drop out of the batch
                    cache.batch_select_indices(torch.tensor(keep, device=dev))
                    active = [active[j] for j in keep]
                if st.prepare_ms is None:
                    for s in active:
                        if s.held is not None:
                            s.states[st.row] = s.held
                    continue
                a, z = st.prepare_ms
                block = (z - 1) // g.native_block_ms
                if reuse:  # completed patches of earlier blocks are never needed again
                    lo = block * g.native_block_ms // int(round(g.frame_ms))
                    for s in active:
                        s.patches = {k: v for k, v in s.patches.items() if k >= lo}
                idx = list(frame_indices(a, z, g.frame_ms))
                idx = [k for k in idx if k < len(active[0].frames)]
                video, n_patch, hh, ww = self._video(active, idx, reuse) if idx else ([None] * len(active), 0, 0, 0)
                audio = self._audio(active, a, z)
                blk, rel_pos, shift = self._payload_layout(a, z, n_patch, hh, ww, audio.shape[1])
                payloads = []
                for j, s in enumerate(active):
                    parts = ([video[j]] if n_patch else []) + [audio[j]]
                    payloads.append(Payload(start_ms=a, end_ms=z, block=blk, embeds=torch.cat(parts).to(r.dtype),
                                            rel_pos=rel_pos, block_shift=shift,
                                            num_video_tokens=int(video[j].shape[0]) if n_patch else 0,
                                            num_audio_tokens=int(audio.shape[1]), num_frames=len(idx)))
                first = max(0, st.block - (m_blocks - 1))
                if first != origin:  # window slid (same row, same token counts in every stream of the group)
                    n_gone = sum(p.embeds.shape[0] for p in active[0].committed if p.block < first)
                    for s in active:
                        s.committed = [p for p in s.committed if p.block >= first]
                    origin = first
                    if sliding:  # evict the older blocks' rows right after the prompt; no re-prefill
                        OmniThinkerRunner._evict_rows(cache, prompt_len, n_gone)
                    else:  # evict, re-prefill the kept blocks at re-based positions (one batched call)
                        OmniThinkerRunner._truncate(cache, prompt_len)
                        kept = active[0].committed
                        if kept:
                            emb = torch.stack([torch.cat([p.embeds for p in s.committed]) for s in active])
                            self._forward(emb, torch.cat([r.payload_positions(p, origin) for p in kept], 1), cache)
                            for s in active:
                                s.computed["computed_llm_tokens"] += emb.shape[1]
                length = cache.get_seq_length()
                emb = torch.stack([p.embeds for p in payloads])
                pos = r.payload_positions(payloads[0], 0 if sliding else origin)
                for s in active:
                    if not s.warned:
                        s.warned = r._position_warning(pos, s.n_rows)
                h = self._forward(emb, pos, cache)[:, -1].float().cpu()
                for j, s in enumerate(active):
                    s.computed["computed_llm_tokens"] += emb.shape[1]
                    s.held = h[j].clone()
                    s.states[st.row] = s.held
                    if st.row in checks[s.index]:
                        s.snapshots[st.row] = ((s.history + [payloads[j]], 0) if sliding
                                               else (s.committed + [payloads[j]], origin))
                    if st.commit:
                        s.committed.append(payloads[j])
                        if sliding and blk < SLIDING_VERIFY_BLOCKS * m_blocks and checks[s.index]:
                            s.history.append(payloads[j])
                if not st.commit:
                    OmniThinkerRunner._truncate(cache, length)
            del cache
        wall = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
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
            s.snapshots, s.committed, s.patches, s.history = {}, [], {}, []
            out[s.index] = res
        return out


@contextmanager
def _null():
    yield
