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

import logging
import resource
import threading
import time
import types
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (get_audio_cu_seqlens, get_pool_indices,
                                                                    get_valid_indices)
from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids, get_vision_window_index

from algorithms.streaming import (MICRO_CHUNK_200MS, OPEN_STREAM_REPLAY, SLIDING, accounting, memory_blocks,
                                  schedule)
from models.omni.thinker import OmniThinkerRunner
from models.omni.thinker_media import (AUDIO_SAMPLE_RATE, Payload, frame_indices, frames_tensor, past_samples,
                                       video_inputs)
from models.omni.thinker_stream import SLIDING_VERIFY_BLOCKS, StreamResult, verify_candidates
from models.vision_attention import chunk_lengths, fused_rotary_qk

log = logging.getLogger(__name__)

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
BREAKDOWN_PARTS = {  # BatchedOmniRunner(profile=True).breakdown: wall seconds of one run_streams call per part
    "prep_audio": "the block's audio to the device + log-mel (LogMel) of every stream's payload audio",
    "prep_video": "the block's frames to the device + the video processor on every new temporal patch",
    "vision_tower": "vision tower (get_video_features) on the new temporal patches",
    "audio_tower": "audio tower on every stream's payload log-mel",
    "llm": "the batched LLM prefill of the row's payloads (state read-out included)",
    "llm_reprefill": "window policy: re-prefill of the kept blocks when the memory window slides",
    "cache": "KV cache edits: eviction (sliding), cut back (window, temporary tails), finished streams dropped",
    "other": "the rest of the wall time: Python bookkeeping, payload assembly, positions, state copies to the host",
}
_FLUSH_ROWS = 50  # states stay on the device for up to this many rows, then go to the host in one copy


@dataclass
class BatchedStreamResult(StreamResult):
    """``StreamResult`` plus the measured cost of the batched path.

    Attributes:
        computed: ``COMPUTED_FIELDS`` -> value, for this stream.
        batch_size: streams in the lockstep group at its start.
        batch_wall_time_s: wall time of the whole group (``wall_time_s`` is this divided by ``batch_size``).
        group: index of that lockstep group within its ``run_streams`` call (-1: the stream ran in none).
    """

    computed: dict[str, float] = field(default_factory=dict)
    batch_size: int = 1
    batch_wall_time_s: float = 0.0
    group: int = -1


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
    with _tower_sdpa_backends(q.device):
        return _chunk_attention_calls(fn, module, q, k, v, chunk_lengths(cu_seqlens))


def _tower_sdpa_backends(device: torch.device):
    """SDPA backends for the towers' chunk attention on CUDA: flash, memory-efficient, math (cuDNN left out).

    SDPA prefers cuDNN's attention for these unmasked bf16 calls on Hopper, and cuDNN builds an execution plan per
    new shape on the host (about 2.3 ms of CPU per call in a micro-chunk-200ms profile on the H200, where the batch
    of chunks changes with every row), which the host-bound small calls of streaming extraction cannot afford.
    Backends the caller turned off stay off (SDPA's backend switches are process-wide, as ``sdpa_kernel`` itself)."""
    if device.type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cuda = torch.backends.cuda
    keep = [b for b, on in ((SDPBackend.FLASH_ATTENTION, cuda.flash_sdp_enabled()),
                            (SDPBackend.EFFICIENT_ATTENTION, cuda.mem_efficient_sdp_enabled()),
                            (SDPBackend.MATH, cuda.math_sdp_enabled())) if on]   # what the caller left on
    return sdpa_kernel(keep) if keep else nullcontext()


def _chunk_attention_calls(fn, module, q, k, v, lengths: list[int]) -> torch.Tensor:
    _, h, s, d = q.shape
    if all(n == lengths[0] for n in lengths):  # all chunks equal (the usual case): views, one call, no Python loop
        qb, kb, vb = (t[0].view(h, len(lengths), lengths[0], d).transpose(0, 1) for t in (q, k, v))
        o = fn(module, qb, kb, vb, attention_mask=None, scaling=module.scaling, dropout=0.0, is_causal=False)[0]
        return o.reshape(s, -1)  # o: (n_chunks, L, H, d), chunks in sequence order
    qs, ks, vs = (t[0].split(lengths, dim=1) for t in (q, k, v))  # each (H, L_i, d)
    outs: list[torch.Tensor | None] = [None] * len(lengths)
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    for n, ids in by_len.items():
        qb, kb, vb = (torch.stack([parts[i] for i in ids]) for parts in (qs, ks, vs))
        o = fn(module, qb, kb, vb, attention_mask=None, scaling=module.scaling, dropout=0.0, is_causal=False)[0]
        for j, i in enumerate(ids):  # o: (n_chunks, L, H, d)
            outs[i] = o[j]
    return torch.cat(outs, 0).reshape(s, -1)


def _vision_attention_forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kw):
    # the library's float32 vision rotary (``apply_rotary_pos_emb_vision``), as one fused kernel on CUDA
    # (``models.vision_attention.rotary_qk``: bit-identical in eager, which is what runs on the CPU)
    n = hidden_states.shape[0]
    q = self.q(hidden_states).reshape(n, self.num_heads, -1)
    k = self.k(hidden_states).reshape(n, self.num_heads, -1)
    v = self.v(hidden_states).reshape(n, self.num_heads, -1)
    cos, sin = position_embeddings
    q, k = fused_rotary_qk(q, k, cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float())
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


# ----------------------------------------------------------------------------------- LLM prefill attention
_LOWER_RIGHT_STATE = {"failed": False, "no_native_gqa": False, "installed": 0}
_LOWER_RIGHT_LOCK = threading.Lock()
_LOWER_RIGHT_THREAD = threading.local()     # depth of _lower_right_prefill contexts in this thread


def lower_right_causal_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: float | None = None, is_causal: bool | None = None, force: bool = False,
                            **kwargs):
    """transformers' SDPA attention function for a causal prefill of ``q`` new tokens on top of a cache, with the
    mask as what it is: lower-right causal (every cached key visible, the new tokens causal among themselves).

    transformers passes such a prefill an explicit (B, 1, q, kv) boolean mask (its SDPA integration can only use
    ``is_causal`` when q == kv), which sends SDPA to the masked memory-efficient kernel after copying the keys and
    values once per query group. ``torch.nn.attention.bias.causal_lower_right`` lets SDPA take its flash kernel
    instead (same math); where the flash kernel applies it is called directly on the un-repeated keys/values
    (FlashAttention-2 reads each key/value head for its query group, and its causal flag is bottom-right aligned).
    Used by ``BatchedOmniRunner`` around its own LLM calls, whose caches hold exactly the
    visible context (no padding, no sliding-window layers), so the ignored mask is that pattern.

    Args:
        module: the text attention module (``is_causal``, ``num_key_value_groups``).
        query: (B, H, q, d); key, value: (B, H_kv, kv, d) with kv >= q.
        attention_mask: the library's mask, ignored on the CUDA path (see above).
        force: take the lower-right path on any device (tests; on the CPU SDPA materialises the same mask).

    Returns:
        ``((B, q, H, d) attention output, None)``, as transformers' attention functions.

    Other calls run ``sdpa_attention_forward`` unchanged: from a thread not inside :func:`_lower_right_prefill`
    (the switch is process-wide), a non-causal module, one query, a sliding window, not CUDA (unless ``force``),
    under ``torch.compile`` (dynamo cannot build the bias and would run the whole text model eagerly), or after a
    first failure of the lower-right call (other than running out of memory, which is raised).
    """
    from torch.nn.attention.bias import causal_lower_right
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    def library():
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)

    q_len, kv_len = query.shape[2], key.shape[2]
    if (not force and (getattr(_LOWER_RIGHT_THREAD, "depth", 0) == 0 or query.device.type != "cuda")
            or _LOWER_RIGHT_STATE["failed"] or torch.compiler.is_compiling() or not getattr(module, "is_causal", False)
            or q_len < 2 or kv_len < q_len or kwargs.get("sliding_window") is not None):
        return library()
    groups = getattr(module, "num_key_value_groups", 1)
    if not _LOWER_RIGHT_STATE["no_native_gqa"] and _native_gqa_flash(query, key, value, dropout):
        try:
            # FlashAttention-2's causal flag is bottom-right aligned (what ``causal_lower_right`` dispatches to),
            # and it reads each key/value head for its query group itself: no per-group copies
            out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, is_causal=True,
                                                                     scale=scaling)[0]
            return out.transpose(1, 2).contiguous(), None
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:  # a flash build without native grouped heads: repeat the keys/values below
            log.warning("flash on un-repeated keys/values failed (%s); repeating them", e)
            _LOWER_RIGHT_STATE["no_native_gqa"] = True
    try:
        k, v = (repeat_kv(key, groups), repeat_kv(value, groups)) if groups > 1 else (key, value)
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=causal_lower_right(q_len, kv_len),
                                             dropout_p=dropout, scale=scaling)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:  # a PyTorch without this dispatch: the library's masked call, for good
        log.warning("lower-right causal SDPA failed (%s); using the library's masked SDPA", e)
        _LOWER_RIGHT_STATE["failed"] = True
        return library()
    return out.transpose(1, 2).contiguous(), None


def _native_gqa_flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float) -> bool:
    """Whether the lower-right prefill may call the flash kernel directly on un-repeated keys/values: CUDA, fp16 /
    bf16, no dropout, head size a multiple of 8 up to 256, query heads a multiple of key heads, and SDPA's own flash
    checks pass for these shapes (with ``enable_gqa``)."""
    if (query.device.type != "cuda" or query.dtype not in (torch.float16, torch.bfloat16) or dropout
            or query.shape[-1] % 8 or query.shape[-1] > 256 or query.shape[1] % key.shape[1]):
        return False
    from torch.backends.cuda import SDPAParams, can_use_flash_attention

    try:
        return bool(can_use_flash_attention(SDPAParams(query, key, value, None, 0.0, False, True)))
    except TypeError:  # a PyTorch whose SDPAParams has no enable_gqa: keep the repeat
        return False


@contextmanager
def _lower_right_prefill(lm, on: bool):
    """Inside: the ``sdpa`` attention function of transformers' interface is :func:`lower_right_causal_sdpa`
    for this thread's calls, when ``on`` and ``lm`` runs SDPA without sliding-window layers. The function is
    installed by the first entry of any thread and removed by the last exit (a lock counts them); calls from
    threads outside such a context go to the library's function unchanged."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cfg = lm.config
    if not on or cfg._attn_implementation != "sdpa" or "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        yield
        return
    with _LOWER_RIGHT_LOCK:
        if _LOWER_RIGHT_STATE["installed"] == 0:
            _LOWER_RIGHT_STATE["saved"] = ALL_ATTENTION_FUNCTIONS._local_mapping.get("sdpa")
            ALL_ATTENTION_FUNCTIONS["sdpa"] = lower_right_causal_sdpa
        _LOWER_RIGHT_STATE["installed"] += 1
    _LOWER_RIGHT_THREAD.depth = getattr(_LOWER_RIGHT_THREAD, "depth", 0) + 1
    try:
        yield
    finally:
        _LOWER_RIGHT_THREAD.depth -= 1
        with _LOWER_RIGHT_LOCK:
            _LOWER_RIGHT_STATE["installed"] -= 1
            if _LOWER_RIGHT_STATE["installed"] == 0:
                saved = _LOWER_RIGHT_STATE.pop("saved")
                if saved is None:
                    del ALL_ATTENTION_FUNCTIONS["sdpa"]
                else:
                    ALL_ATTENTION_FUNCTIONS["sdpa"] = saved


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
    block_frames: torch.Tensor | None = None  # the current native block's frames on the device, (f, H, W, 3) uint8
    last_update: int = -1  # row of the last state update (rows without a payload hold it)
    hold_rows: list = field(default_factory=list)  # (row, source row) pairs, filled once the states are on the host
    computed: dict = field(default_factory=lambda: dict.fromkeys(COMPUTED_FIELDS, 0.0))


class _RowPayload(NamedTuple):
    """One row's payload for every stream of a group: embeddings and its positions (host and device copies)."""

    emb: torch.Tensor          # (B, N, D) video tokens then audio tokens, model dtype
    block: int                 # native block of the payload
    rel_pos: torch.Tensor      # (3, N) host, block-relative positions
    shift: torch.Tensor        # (3, N) host, 0/1: which entries move by positions_per_block per block
    rel_d: torch.Tensor        # rel_pos on the device
    shift_d: torch.Tensor      # shift on the device
    n_patch: int               # temporal patches in the payload (0: audio only)


class _Part:
    """Times one part of the row loop into ``breakdown[name]``, synchronizing the device around it."""

    def __init__(self, owner: "BatchedOmniRunner", name: str):
        self.owner, self.name = owner, name

    def __enter__(self):
        self.owner._sync()
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.owner._sync()
        self.owner.breakdown[self.name] += time.perf_counter() - self.t0


_NO_PART = nullcontext()


def _is_flash(config) -> bool:
    return "flash" in str(getattr(config, "_attn_implementation", ""))


class BatchedOmniRunner:
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
    """

    def __init__(self, runner: OmniThinkerRunner, sessions_per_batch: int = 8, reuse: bool = True,
                 batched_attention: bool = True, compile_small_calls: bool = False,
                 compile_backend: str | None = None, profile: bool = False, batch_rows: bool = True,
                 flash_prefill: bool = True):
        if sessions_per_batch < 1:
            raise ValueError(f"sessions_per_batch={sessions_per_batch} must be >= 1")
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

    # --------------------------------------------------------------------------------------------- parts
    def _sync(self) -> None:
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)

    def _part(self, name: str):
        return _Part(self, name) if self.profile else _NO_PART

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

    def _load_block(self, group: list[_Stream], block: int) -> torch.Tensor:
        """Native block ``block``'s media of every stream to the device, once per block: returns its audio
        (B, n_fft // 2 + block samples) float32 (the ``n_fft // 2`` samples before the block, then the block; zeros
        before the stream start and past its end) and sets each stream's ``block_frames``."""
        r = self.runner
        g = r.geometry
        dev = r.device
        pin = dev.type == "cuda"
        n = g.native_block_ms * AUDIO_SAMPLE_RATE // 1000
        ctx = r.log_mel.n_fft // 2  # left context: the samples before the block (log-mel padding, as prepare)
        with self._part("prep_audio"):
            host = torch.zeros(len(group), ctx + n, dtype=torch.float32, pin_memory=pin)
            for j, s in enumerate(group):
                seg = s.audio[block * n: (block + 1) * n]
                host[j, ctx: ctx + len(seg)] = torch.from_numpy(seg)
                host[j, :ctx] = torch.from_numpy(past_samples(s.audio, block * n, ctx))
            audio = host.to(dev, non_blocking=True)
        with self._part("prep_video"):
            per_block = int(round(g.native_block_ms / g.frame_ms))
            for s in group:
                f = frames_tensor(s.frames[block * per_block: (block + 1) * per_block])
                s.block_frames = f.pin_memory().to(dev, non_blocking=True) if pin else f.to(dev)
        return audio

    def _audio_kwargs(self, b: int, n_mel: int) -> dict | None:
        """The audio tower's index tensors for B streams of ``n_mel`` mel frames each (one attention chunk per
        stream), computed once on the host by the library's own helpers; None when a stream spans several chunks."""
        key = (b, n_mel)
        if key not in self._audio_kw:
            tower = self.runner.thinker.model.audio_tower
            kw = None
            if n_mel <= 2 * tower.n_window:
                dev = self.runner.device
                lens = torch.full((b,), n_mel, dtype=torch.long)  # one chunk per stream: chunk lengths = lens
                cu = get_audio_cu_seqlens(lens)
                kw = {"chunk_lengths": lens.to(dev), "valid_indices": get_valid_indices(lens).to(dev),
                      "pool_indices": get_pool_indices(lens).to(dev)}
                if _is_flash(tower.config):
                    kw.update(cu_seqlens=cu.to(dev), max_seqlen=int((cu[1:] - cu[:-1]).max()))
                else:  # SDPA / eager chunk loops only read the lengths: keep them on the host (no device sync)
                    kw["cu_seqlens"] = cu
            self._audio_kw[key] = kw
        return self._audio_kw[key]

    def _vision_kwargs(self, thw: torch.Tensor) -> dict:
        """Precomputed vision-tower inputs for the (n, 3) host grid ``thw`` (``video_`` prefixed, as
        ``get_video_features`` takes them): rotary positions and window order on the device, attention boundaries on
        the host unless the tower runs flash attention. Computed once per grid by the library's own helpers."""
        key = tuple(thw.flatten().tolist())
        if key not in self._vision_kw:
            if len(self._vision_kw) > 64:
                self._vision_kw.clear()
            v = self.runner.thinker.model.visual
            dev = self.runner.device
            cu = get_vision_cu_seqlens(thw)
            win, cu_win = get_vision_window_index(thw, spatial_merge_size=v.spatial_merge_size,
                                                  window_size=v.window_size, patch_size=v.patch_size)
            kw = {"video_position_ids": get_vision_position_ids(thw, v.spatial_merge_size).to(dev),
                  "video_window_index": win.to(dev)}
            if _is_flash(v.config):
                kw.update(video_cu_seqlens=cu.to(dev), video_cu_window_seqlens=cu_win.to(dev),
                          video_max_seqlen=int((cu[1:] - cu[:-1]).max()),
                          video_max_window_seqlen=int((cu_win[1:] - cu_win[:-1]).max()))
            else:
                kw.update(video_cu_seqlens=cu, video_cu_window_seqlens=cu_win)
            self._vision_kw[key] = kw
        return self._vision_kw[key]

    def _audio(self, group: list[_Stream], block_audio: torch.Tensor, spans: list[tuple[int, int]]
               ) -> list[torch.Tensor]:
        """Per span of ``spans``, the (B, n_a, D) audio-tower output of every stream's ``(a, z]`` audio (equal lengths,
        one native block): one log-mel call and one tower call over all spans x streams (each (span, stream) is
        its own payload: own log-mel normalisation, own attention chunk)."""
        r = self.runner
        g = r.geometry
        mel = r.log_mel
        a0, z0 = spans[0]
        if any(z - a != z0 - a0 for a, z in spans):
            raise ValueError(f"audio spans of unequal length in one call: {spans}")
        block_start = (z0 - 1) // g.native_block_ms * g.native_block_ms
        n = (z0 - a0) * AUDIO_SAMPLE_RATE // 1000
        n_mel = n // mel.hop_length
        with self._part("prep_audio"):  # zero-padded by n_fft samples, as OmniThinkerRunner.prepare
            ctx = mel.n_fft // 2
            offs = [ctx + (a - block_start) * AUDIO_SAMPLE_RATE // 1000 for a, _ in spans]
            wav = torch.cat([block_audio[:, off: off + n] for off in offs]) if len(spans) > 1 else \
                block_audio[:, offs[0]: offs[0] + n]                                  # (R * B, n), span-major
            left = None
            if r.audio_left_context:  # the past samples, as OmniThinkerRunner.prepare; a stream's start reflects
                left = torch.cat([block_audio[:, off - ctx: off] if a > 0 else block_audio[:, off + 1: off + ctx + 1].flip(-1)
                                  for off, (a, _) in zip(offs, spans)])               # (R * B, ctx)
            x = mel(F.pad(wav, (0, mel.n_fft)), left)[:, :, :n_mel].to(r.dtype)      # (R * B, 128, n_mel)
        for s in group:
            s.computed["computed_processor_calls"] += len(spans)
            s.computed["computed_audio_seconds"] += len(spans) * (z0 - a0) / 1000.0
        b = x.shape[0]
        _, out_len = r.thinker.model.audio_tower._get_feat_extract_output_lengths(torch.tensor(n_mel))
        n_a = int(out_len)
        expect = (z0 - a0) * g.audio_tokens_per_s // 1000
        if n_a != expect:
            raise RuntimeError(f"audio tower gave {n_a} tokens for {z0 - a0} ms, expected {expect}")
        with self._part("audio_tower"):
            kw = self._audio_kwargs(b, n_mel)
            lens = torch.full((b,), n_mel, dtype=torch.long)
            if kw is not None:  # the library's padded chunk layout (as its pad_sequence + transpose leaves it)
                padded = x.transpose(1, 2).contiguous().transpose(1, 2)
                h = self._audio_tower(padded, feature_lens=lens, padded_feature=padded, **kw).last_hidden_state
            else:  # several chunks per stream: the library chunks the flattened features itself
                flat = x.permute(1, 0, 2).reshape(x.shape[1], b * n_mel)  # the library's masked flatten, all valid
                lens = lens.to(r.device)
                after, _ = r.thinker.model.audio_tower._get_feat_extract_output_lengths(lens)
                h = self._audio_tower(flat, feature_lens=lens, aftercnn_lens=after).last_hidden_state
        return list(h.view(len(spans), len(group), n_a, -1).unbind(0))

    def _video(self, group: list[_Stream], rows_idx: list[list[int]], reuse: bool,
               first_frame: int) -> tuple[list[torch.Tensor | None], list[int], int, int]:
        """Vision-tower outputs of the payloads' temporal patches for every stream, one tower call for all rows of
        ``rows_idx`` (each row's frame indices, split into its own temporal patches): ``(per row (B, n_v, D) or
        None when the row has no frame, per row its patch count, merged rows, merged cols)``; completed patches
        come from the stream's store when ``reuse``. ``first_frame``: index of the first frame in the streams'
        ``block_frames``."""
        r = self.runner
        tps = r.geometry.temporal_patch_size
        rows_patches = [[idx[p: p + tps] for p in range(0, len(idx), tps)] for idx in rows_idx]
        todo: list[tuple[_Stream, list[int]]] = []
        calls: dict[int, int] = {}  # stream -> rows with something to encode (one video-processor call each)
        for patches in rows_patches:
            for s in group:
                mine = [pf for pf in patches if not (reuse and len(pf) == tps and pf[0] in s.patches)]
                todo.extend((s, pf) for pf in mine)
                calls[s.index] = calls.get(s.index, 0) + (1 if mine else 0)
        fresh: dict[tuple[int, int, int], torch.Tensor] = {}
        if todo:
            with self._part("prep_video"):
                clips = [s.block_frames[pf[0] - first_frame: pf[-1] + 1 - first_frame].permute(0, 3, 1, 2)
                         for s, pf in todo]
                if any(len(c) != len(pf) for c, (_, pf) in zip(clips, todo)):
                    raise RuntimeError(f"frames {rows_idx} missing from a stream's block")
                vid = video_inputs(r.video_processor, clips)
                thw = vid["video_grid_thw"]
                pixels = vid["pixel_values_videos"].to(r.dtype)
            with self._part("vision_tower"):
                out = r.thinker.model.get_video_features(pixels, thw, **self._vision_kwargs(thw)).pooler_output
            for s in group:
                s.computed["computed_processor_calls"] += calls[s.index]
            for (s, pf), v in zip(todo, out):
                fresh[(s.index, pf[0], len(pf))] = v
                s.computed["computed_vision_patches"] += 1
                s.computed["computed_video_seconds"] += len(pf) * r.geometry.frame_ms / 1000.0
                if reuse and len(pf) == tps:
                    s.patches[pf[0]] = v
            self._grid = (int(thw[0, 1]), int(thw[0, 2]))
        gh, gw = self._grid  # every patch reused: the grid of the frames seen before (same size in a group)
        videos: list[torch.Tensor | None] = []
        for patches in rows_patches:
            if not patches:
                videos.append(None)
                continue
            parts = [[fresh.get((s.index, pf[0], len(pf)), s.patches.get(pf[0])) for pf in patches] for s in group]
            videos.append(torch.stack([p[0] if len(p) == 1 else torch.cat(p) for p in parts]))
        m = r.thinker.model.visual.spatial_merge_size
        return videos, [len(p) for p in rows_patches], gh // m, gw // m

    def _payload_layout(self, start_ms: int, end_ms: int, n_patch: int, hh: int, ww: int, n_audio: int):
        """(block, rel_pos, block_shift) of a payload, exactly as ``OmniThinkerRunner.embed`` lays it out."""
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

    def _layout(self, start_ms: int, end_ms: int, n_patch: int, hh: int, ww: int, n_audio: int):
        """``_payload_layout`` cached by the payload's place in its block and shape: (block, rel_pos, block_shift)
        on the host and (rel_pos, block_shift) on the device."""
        g = self.runner.geometry
        block = (end_ms - 1) // g.native_block_ms
        base = block * g.native_block_ms
        key = (start_ms - base, end_ms - base, n_patch, hh, ww, n_audio)
        if key not in self._layouts:
            _, rel, shift = self._payload_layout(start_ms - base, end_ms - base, n_patch, hh, ww, n_audio)
            dev = self.runner.device
            self._layouts[key] = (rel, shift, rel.to(dev), shift.to(dev))
        rel, shift, rel_d, shift_d = self._layouts[key]
        return block, rel, shift, rel_d, shift_d

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
        ppb = int(round(g.positions_per_block))
        per_block = int(round(g.native_block_ms / g.frame_ms))
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
            loaded, block_audio = -1, None
            pending: list = []  # states read out on the device, not yet copied to the host
            i = 0
            while i < len(steps):
                st = steps[i]
                keep = [j for j, s in enumerate(active) if st.row < s.n_rows]
                if len(keep) < len(active):  # finished streams drop out of the batch
                    sel = torch.tensor(keep, device=dev)
                    with self._part("cache"):
                        cache.batch_select_indices(sel)
                    if block_audio is not None:
                        block_audio = block_audio.index_select(0, sel)
                    active = [active[j] for j in keep]
                if st.prepare_ms is None:
                    for s in active:
                        if s.last_update >= 0:
                            s.hold_rows.append((st.row, s.last_update))
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
                spans = [x.prepare_ms for x in run]
                rows_idx = [[k for k in frame_indices(a, z, g.frame_ms) if k < len(active[0].frames)]
                            for a, z in spans]
                if any(rows_idx):
                    videos, n_patches, hh, ww = self._video(active, rows_idx, reuse, block * per_block)
                else:
                    videos, n_patches, hh, ww = [None] * len(run), [0] * len(run), 0, 0
                audios = self._audio(active, block_audio, spans)
                rows: list[_RowPayload] = []
                for (a, z), video, n_patch, audio in zip(spans, videos, n_patches, audios):
                    blk, rel_pos, shift, rel_d, shift_d = self._layout(a, z, n_patch, hh, ww, audio.shape[1])
                    emb = (torch.cat([video, audio], 1) if n_patch else audio).to(r.dtype)  # (B, N, D)
                    rows.append(_RowPayload(emb, blk, rel_pos, shift, rel_d, shift_d, n_patch))
                first = max(0, st.block - (m_blocks - 1))
                if first != origin:  # window slid (same row, same token counts in every stream of the group)
                    n_gone = sum(p.embeds.shape[0] for p in active[0].committed if p.block < first)
                    for s in active:
                        s.committed = [p for p in s.committed if p.block >= first]
                    origin = first
                    if sliding:  # evict the older blocks' rows right after the prompt; no re-prefill
                        with self._part("cache"):
                            OmniThinkerRunner._evict_rows(cache, prompt_len, n_gone)
                    else:  # evict, re-prefill the kept blocks at re-based positions (one batched call)
                        with self._part("cache"):
                            OmniThinkerRunner._truncate(cache, prompt_len)
                        kept = active[0].committed
                        if kept:
                            with self._part("llm_reprefill"):
                                kept_emb = torch.stack([torch.cat([p.embeds for p in s.committed]) for s in active])
                                self._forward(kept_emb, torch.cat([r.payload_positions(p, origin) for p in kept], 1),
                                              cache)
                            for s in active:
                                s.computed["computed_llm_tokens"] += kept_emb.shape[1]
                length = cache.get_seq_length()
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
                    h_rows = hidden[:, [e - 1 for e in ends]].to(torch.float32, copy=True)  # (B, R, D)
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
                if not st.commit:  # (a run of several rows only ever holds committed rows)
                    with self._part("cache"):
                        OmniThinkerRunner._truncate(cache, length)
                if len(pending) >= _FLUSH_ROWS:
                    self._flush(pending)
            self._flush(pending)
            del cache, block_audio
        for s in group:
            for row, src in s.hold_rows:
                s.states[row] = s.states[src]
        wall = time.perf_counter() - t0
        if self.profile:
            self.breakdown["other"] += wall - (sum(v for k, v in self.breakdown.items() if k != "other") - parts0)
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
            s.snapshots, s.committed, s.patches, s.history, s.block_frames = {}, [], {}, [], None
            out[s.index] = res
        return out


@contextmanager
def _null():
    yield
