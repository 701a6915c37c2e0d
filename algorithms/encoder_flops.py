"""Analytic matmul FLOPs of the Qwen2.5-Omni thinker's parts as the streaming extraction runs them: the vision tower
per temporal patch, the audio tower per payload, the LLM per prefilled token, and the compute floor of a whole run
(:func:`thinker_floor_flops`) from the batched runner's ``computed`` counts (``models/omni/batch_accounting.py``).

Convention: ``algorithms/flops.py``'s accurate one, FLOPs = 2 x multiply-adds of every matrix product (linear
layers, convolutions, attention ``Q K^T`` and ``P V``); norms, activations, rotary, softmax, pooling, bias adds and
element-wise products are not counted. Padding is not counted either: this is the work the model *must* do, a floor.

Shapes come from the config objects (``thinker.config.vision_config`` / ``.audio_config`` / ``.text_config`` of a
``Qwen2_5OmniThinkerConfig``, or anything with the same attributes), read as transformers' ``modeling_qwen2_5_omni``
builds the modules:

* vision tower (``Qwen2_5OmniVisionEncoder``), per temporal patch of ``h x w`` patches (``P = h w``, width ``C``,
  MLP width ``I``, ``L`` blocks, merge ``m``, output ``D_out``):
  patch embedding ``Conv3d(c_in, C, (t, p, p))``: ``2 P (c_in t p^2) C``;
  per block q, k, v, proj (``C x C`` each) ``8 P C^2`` and the gated MLP gate, up, down ``6 P C I``; attention
  ``4 C sum_w s_w^2`` over the attention groups: windows of ``window_size / p`` patches a side (112 px = 8 x 8 = 64
  patches; edge windows smaller, as ``get_vision_window_index`` cuts them) in the blocks not in
  ``fullatt_block_indexes``, the whole temporal patch (``s = P``, one group per temporal patch as
  ``get_vision_cu_seqlens``) in those;
  merger (``P / m^2`` merged rows) ``2 (P/m^2) (m^2 C)^2 + 2 (P/m^2) (m^2 C) D_out``.
* audio tower (``Qwen2_5OmniAudioEncoder``), per payload of ``n`` mel frames (width ``C``, FFN ``F``, ``L`` layers,
  ``c_mel`` mel bins): the payload is cut into chunks of ``2 n_window`` mel frames (the last shorter); per chunk of
  ``l`` frames ``conv1`` (``c_mel -> C``, kernel 3) ``2 l c_mel 3 C``, ``conv2`` (``C -> C``, kernel 3, stride 2, ``l'
  = (l - 1) // 2 + 1`` outputs) ``2 l' C 3 C``; per layer q, k, v, out ``8 l' C^2``, fc1 + fc2 ``4 l' C F``, attention
  within the chunk ``4 l'^2 C``; after the stride-2 average pool (``(a - 2) // 2 + 1`` rows for ``a = (n - 1) // 2
  + 1``) ``proj`` ``2 rows C D_out``.
* LLM (the thinker's text model), per layer for ``n`` prefilled tokens attending on average ``c`` keys each:
  ``algorithms.flops``' layer formula, ``2 n d (H + 2 H_kv) h + 2 n H h d + 4 H n c h + 6 n d m``; no lm_head
  (extraction reads hidden states). Causal attention is counted as a flash kernel does it: a token sees the cache
  and the tokens before it, not the masked rest of the square (so ``c`` is a mean over the prefilled tokens,
  :func:`llm_mean_context`).

Pure: stdlib and ``algorithms`` only, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass

from .streaming import (COMPLETED_BLOCK_HOLD, MICRO_CHUNK_200MS, MODES, OPEN_STREAM_REPLAY, SLIDING, WINDOW,
                        StreamGeometry, check_memory_policy, memory_blocks)

__all__ = ["vision_grid", "vision_patch_flops", "audio_payload_flops", "audio_spans_ms", "audio_flops_per_second",
           "llm_prefill_flops", "llm_mean_context", "block_tokens", "FloorFlops", "thinker_floor_flops"]


# ------------------------------------------------------------------------------------------------ vision tower
def vision_grid(vision_config, frame_hw: tuple[int, int]) -> tuple[int, int]:
    """Patch grid ``(h, w)`` (unmerged, as ``video_grid_thw`` gives it) of a ``frame_hw`` pixel frame: each side
    rounded to a multiple of ``patch_size x spatial_merge_size`` as the video processor's ``smart_resize`` does
    (its min / max pixel bounds are not applied: the bench's frames lie within them)."""
    p, m = int(vision_config.patch_size), int(vision_config.spatial_merge_size)
    f = p * m
    return tuple(max(f, round(x / f) * f) // p for x in frame_hw)


def _window_sizes(n_merged: int, per_window: int) -> list[int]:
    """Merged rows (or columns) per window along one side: full windows, then the remainder (as
    ``get_vision_window_index`` pads and drops the empty positions)."""
    return [per_window] * (n_merged // per_window) + ([n_merged % per_window] if n_merged % per_window else [])


def vision_patch_flops(vision_config, grid_hw: tuple[int, int]) -> int:
    """FLOPs of one temporal patch of ``grid_hw`` patches (unmerged ``(h, w)``) through the vision tower: patch
    embedding, ``depth`` blocks (windowed attention except ``fullatt_block_indexes``: whole temporal patch) and the
    merger. Raises ValueError when the grid is not a multiple of the merge size."""
    v = vision_config
    h, w = (int(x) for x in grid_hw)
    m = int(v.spatial_merge_size)
    if h % m or w % m:
        raise ValueError(f"grid {h}x{w} is not a multiple of the merge size {m}")
    c, i, depth = int(v.hidden_size), int(v.intermediate_size), int(v.depth)
    p_tok = h * w
    embed = 2 * p_tok * (int(v.in_channels) * int(v.temporal_patch_size) * int(v.patch_size) ** 2) * c
    linear = 8 * p_tok * c * c + 6 * p_tok * c * i
    per_window = int(v.window_size) // m // int(v.patch_size)  # merged rows (cols) of a window: 112 // 2 // 14 = 4
    windows = [a * b * m * m for a in _window_sizes(h // m, per_window) for b in _window_sizes(w // m, per_window)]
    attn_window = 4 * c * sum(s * s for s in windows)
    attn_full = 4 * c * p_tok * p_tok
    full = sum(1 for k in v.fullatt_block_indexes if 0 <= int(k) < depth)
    blocks = depth * linear + (depth - full) * attn_window + full * attn_full
    n_merged, width = p_tok // (m * m), m * m * c
    merger = 2 * n_merged * width * width + 2 * n_merged * width * int(v.out_hidden_size)
    return embed + blocks + merger


# ------------------------------------------------------------------------------------------------- audio tower
def audio_payload_flops(audio_config, n_mel: int) -> int:
    """FLOPs of one payload of ``n_mel`` mel frames through the audio tower (its own chunks of ``2 n_window``
    frames, valid frames only: the library's padding of a short last chunk is not counted)."""
    a = audio_config
    if n_mel <= 0:
        return 0
    c, f, layers, mel = int(a.d_model), int(a.encoder_ffn_dim), int(a.encoder_layers), int(a.num_mel_bins)
    chunk = 2 * int(a.n_window)
    chunks = [chunk] * (n_mel // chunk) + ([n_mel % chunk] if n_mel % chunk else [])
    after = [(x - 1) // 2 + 1 for x in chunks]  # conv2 (stride 2) outputs per chunk
    tokens = sum(after)
    conv = 2 * n_mel * mel * 3 * c + 2 * tokens * c * 3 * c
    per_layer = 8 * tokens * c * c + 4 * tokens * c * f + 4 * c * sum(x * x for x in after)
    pooled = ((n_mel - 1) // 2 + 1 - 2) // 2 + 1
    return conv + layers * per_layer + 2 * max(pooled, 0) * c * int(a.output_dim)


def audio_spans_ms(mode: str, geometry: StreamGeometry = StreamGeometry()) -> list[int]:
    """The audio payload lengths (ms) one native block sends through the audio tower, in steady state: hold one
    whole block, micro one row each (10 x 200), replay every growing tail (200, 400, ..., 2000)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    r, b = geometry.row_ms, geometry.native_block_ms
    if mode == COMPLETED_BLOCK_HOLD:
        return [b]
    if mode == MICRO_CHUNK_200MS:
        return [r] * geometry.rows_per_block
    return [r * k for k in range(1, geometry.rows_per_block + 1)]


def audio_flops_per_second(audio_config, spans_ms: list[int], mel_frames_per_s: int = 100) -> float:
    """Audio-tower FLOPs per second of audio encoded in payloads of ``spans_ms`` (``audio_spans_ms``):
    ``sum(audio_payload_flops(span)) / sum(span)``. ``mel_frames_per_s``: 16 kHz / hop 160 = 100."""
    total_ms = sum(spans_ms)
    flops = sum(audio_payload_flops(audio_config, s * mel_frames_per_s // 1000) for s in spans_ms)
    return flops * 1000.0 / total_ms


# --------------------------------------------------------------------------------------------------------- LLM
def llm_prefill_flops(text_config, num_tokens: float, mean_context: float) -> float:
    """FLOPs of prefilling ``num_tokens`` tokens through the thinker LLM, each attending ``mean_context`` keys on
    average (cache + the causal part of its own prefill): ``algorithms.flops``' layer formula with GQA shapes, no
    lm_head. ``llm_prefill_flops(cfg, n, (n + 1) / 2)`` is one causal from-scratch prefill of ``n`` tokens."""
    t = text_config
    d, hq, hkv, m = int(t.hidden_size), int(t.num_attention_heads), int(t.num_key_value_heads), int(t.intermediate_size)
    h = int(getattr(t, "head_dim", None) or d // hq)
    per_token = 2 * d * (hq + 2 * hkv) * h + 2 * hq * h * d + 6 * d * m + 4 * hq * h * mean_context
    return int(t.num_hidden_layers) * num_tokens * per_token


def block_tokens(vision_config, grid_hw: tuple[int, int], geometry: StreamGeometry = StreamGeometry()) -> int:
    """LLM tokens of one native block's payload: temporal patches per block x merged tokens per patch + audio
    tokens per block (3B at 20x36 merged: 2 x 720 + 50 = 1490)."""
    m = int(vision_config.spatial_merge_size)
    patches = round(geometry.native_block_ms / (1000.0 * geometry.patch_s))
    audio = geometry.audio_tokens_per_s * geometry.native_block_ms // 1000
    return patches * (grid_hw[0] // m) * (grid_hw[1] // m) + audio


def llm_mean_context(mode: str, policy: str, prompt_tokens: int, block_tokens: int, memory_blocks: int,
                     rows_per_block: int = 10) -> float:
    """Mean keys a prefilled token attends to, in steady state (the memory window full), per native block.

    Kept blocks are ``M - 1`` whole blocks of ``B`` tokens after the prompt (``P`` tokens); a group of ``n`` tokens
    prefilled causally on top of ``c`` cached keys sees ``c + (n + 1) / 2`` keys on average. Per native block:

    * hold: its payload, ``B`` tokens on ``P + (M - 1) B``;
    * micro: ``R`` row payloads of ``B / R`` tokens each, on the kept blocks plus the block's earlier rows: the same
      mean as hold;
    * replay: the growing tails of ``k B / R`` tokens (``k = 1..R``) on ``P + (M - 1) B``;
    * ``window`` policy, in addition: the re-prefill of the kept blocks at the slide, ``(M - 1) B`` tokens on ``P``.

    The result is the token-weighted mean of these groups. Simplifications: a stream's first ``M - 1`` blocks (window
    not yet full, no re-prefill: fewer keys) are treated as steady state, so for short streams it overstates the
    attention term a little; tokens are spread evenly over the rows of a block (a row's video tokens arrive with its
    temporal patch in fact); the first ``M - 1`` blocks and the trailing partial block weigh as a full block.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    check_memory_policy(policy)
    p, b, kept, r = float(prompt_tokens), float(block_tokens), float(memory_blocks - 1), int(rows_per_block)
    base = p + kept * b
    if mode == OPEN_STREAM_REPLAY:
        groups = [(k * b / r, base + (k * b / r + 1) / 2) for k in range(1, r + 1)]
    else:  # hold, micro
        groups = [(b, base + (b + 1) / 2)]
    if policy == WINDOW and kept > 0:
        groups.append((kept * b, p + (kept * b + 1) / 2))
    return sum(n * c for n, c in groups) / sum(n for n, _ in groups)


# ------------------------------------------------------------------------------------------------- whole floor
@dataclass(frozen=True)
class FloorFlops:
    """Analytic FLOPs of what an extraction run computed, per part, and the assumptions used.

    Attributes:
        vision / audio / llm: FLOPs of each part; ``total``: their sum.
        vision_per_patch: FLOPs of one temporal patch; audio_per_s: audio-tower FLOPs per audio second.
        llm_mean_context: mean keys per prefilled LLM token (:func:`llm_mean_context`).
        grid_hw: patch grid of a frame; block_tokens: LLM tokens of a native block's payload.
    """

    vision: float
    audio: float
    llm: float
    vision_per_patch: float
    audio_per_s: float
    llm_mean_context: float
    grid_hw: tuple[int, int]
    block_tokens: int

    @property
    def total(self) -> float:
        return self.vision + self.audio + self.llm


def thinker_floor_flops(thinker_config, computed: dict, mode: str, policy: str, frame_hw: tuple[int, int],
                        memory_s: float = 8.0, prompt_tokens: int = 10,
                        geometry: StreamGeometry = StreamGeometry(), mel_frames_per_s: int = 100) -> FloorFlops:
    """FLOPs of what a run computed: ``computed`` holds ``computed_vision_patches``, ``computed_audio_seconds`` and
    ``computed_llm_tokens`` (one session's, or summed over sessions), converted with the functions above for frames
    of ``frame_hw`` pixels, the mode's audio payload lengths and the policy's mean LLM context."""
    v, a, t = thinker_config.vision_config, thinker_config.audio_config, thinker_config.text_config
    grid = vision_grid(v, frame_hw)
    per_patch = vision_patch_flops(v, grid)
    per_s = audio_flops_per_second(a, audio_spans_ms(mode, geometry), mel_frames_per_s)
    b = block_tokens(v, grid, geometry)
    ctx = llm_mean_context(mode, policy, prompt_tokens, b, memory_blocks(memory_s, geometry), geometry.rows_per_block)
    return FloorFlops(vision=float(computed.get("computed_vision_patches", 0)) * per_patch,
                      audio=float(computed.get("computed_audio_seconds", 0)) * per_s,
                      llm=llm_prefill_flops(t, float(computed.get("computed_llm_tokens", 0)), ctx),
                      vision_per_patch=float(per_patch), audio_per_s=per_s, llm_mean_context=ctx, grid_hw=grid,
                      block_tokens=b)
