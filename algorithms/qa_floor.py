"""Analytic floor of one budgeted-QA step (a video at one budget, Q questions, greedy answers of R tokens) with
VideoLLaMA3 + the qbase compressor, part by part: FLOPs and the bytes each part must move, and its floor time
``max(FLOPs / dense rate, bytes / bandwidth)``.

What the step computes (``models/videollama3/budgets.py`` ``prepare_budgets``, ``answering.py``
``answer_batched(decode="graph")``):

* **vision**: the SigLIP-NaViT tower over every sampled frame at the encode grid (``P = m^2 hw`` patches a frame,
  merge ``m = 2``), plus the raw frames re-encoded at a smaller raw grid when the plan's ``raw_hw`` differs;
  per layer q/k/v/o ``8 P C^2``, attention within the frame ``4 P^2 C``, MLP ``4 P C I`` (the bench's long-standing
  formula; the patch embedding, ~0.2 % of a 27-layer tower, and the merge are not counted);
* **compress**: the qbase compressor (``models/videollama3/qbase.py``) over its windows (every group of the plan
  when ``match_encoder_scale`` is on, as ``BudgetedVideoLlama3.compress`` runs them; else the compressed groups),
  window ``b`` of ``L_b`` encoder rows (frames x hw), ``K`` queries, per layer:
  self-attention q/k/v/o on the queries ``8 K C^2`` and its scores ``4 K^2 C``; cross-attention q and o on the
  queries ``4 K C^2``, k and v on the window's rows ``4 L_b C^2``, scores and values ``4 K L_b C``; MLP ``fc1``,
  ``fc2`` ``4 K C I``;
* **project**: the projector (``Linear(C, D)``, GELU, ``Linear(D, D)``) on every vision row of the LLM input
  (raw rows and ``G_c K`` compressed rows): ``2 rows (C D + D^2)``;
* **prefix**: the shared prefix of ``L`` tokens prefilled once (no lm_head), causal;
* **suffix**: each question's ``n_q`` suffix tokens prefilled on the cached prefix, lm_head on its last position
  (``algorithms.flops.extend_flops``, causal);
* **decode**: ``R - 1`` single-token steps (the first answer token comes from the suffix logits), all Q rows in one
  step: FLOPs ``sum_q decode_token_flops(L + n_q + i)`` at step ``i``; bytes per step the LLM weights once for all
  rows, the prefix KV once (the shared-prefix attention reads the batch-1 prefix cache once per layer for every
  row) and each row's own suffix + decoded KV.

Bytes: the weights a part reads once (bf16 by default), plus the KV cache it writes (prefix) or reads (suffix,
decode); activations are not counted. FLOPs follow ``algorithms/flops.py``'s accurate convention (2 x
multiply-adds of every matrix product), attention counted causally where the kernel is causal (what a flash
kernel computes), padding not counted: the work the step must do.

Pure: stdlib and ``algorithms`` only.
"""
from __future__ import annotations

from dataclasses import dataclass

from .flops import ModelShape, decode_token_flops, extend_flops, kv_cache_bytes, weight_bytes

__all__ = ["VisionShape", "CompressorShape", "FloorPart", "PART_NAMES", "vision_tower_flops",
           "vision_tower_weight_bytes", "compressor_flops", "compressor_weight_bytes", "projector_flops",
           "qa_floor_parts", "floor_seconds"]

PART_NAMES = ("vision", "compress", "project", "prefix", "suffix", "decode")


@dataclass(frozen=True)
class VisionShape:
    """The vision tower's shapes: width C, MLP width I, layers."""

    hidden_size: int
    intermediate_size: int
    num_layers: int


@dataclass(frozen=True)
class CompressorShape:
    """The qbase compressor's shapes: width C (the vision width), MLP width I, decoder layers, K queries."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_queries: int


@dataclass(frozen=True)
class FloorPart:
    """One part of the floor: its FLOPs and the bytes it must move."""

    name: str
    flops: int
    bytes: int

    def seconds(self, flops_per_s: float, bytes_per_s: float) -> float:
        """Floor time: ``max(flops / flops_per_s, bytes / bytes_per_s)``."""
        return max(self.flops / flops_per_s, self.bytes / bytes_per_s)


def _nonneg(**values) -> None:
    for name, v in values.items():
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")


def vision_tower_flops(shape: VisionShape, num_frames: int, patches_per_frame: int) -> int:
    """FLOPs of ``num_frames`` frames of ``P = patches_per_frame`` patches through the tower, attention within each
    frame: ``frames * layers * (8 P C^2 + 4 P^2 C + 4 P C I)``.

    Raises:
        ValueError: negative counts.
    """
    _nonneg(num_frames=num_frames, patches_per_frame=patches_per_frame)
    c, i, p = shape.hidden_size, shape.intermediate_size, patches_per_frame
    return num_frames * shape.num_layers * (8 * p * c * c + 4 * p * p * c + 4 * p * c * i)


def vision_tower_weight_bytes(shape: VisionShape, dtype_bytes: int = 2) -> int:
    """Bytes of the tower's layer matrices (q/k/v/o ``4 C^2``, MLP ``2 C I`` a layer)."""
    c, i = shape.hidden_size, shape.intermediate_size
    return dtype_bytes * shape.num_layers * (4 * c * c + 2 * c * i)


def compressor_flops(shape: CompressorShape, window_rows: list[int]) -> int:
    """FLOPs of one qbase call over windows of ``window_rows`` encoder rows each (``L_b`` = frames x hw of the
    group), ``K`` queries a window: ``layers * sum_b (12 K C^2 + 4 K^2 C + 4 K C I + 4 L_b C^2 + 4 K L_b C)``
    (the module docstring lists the terms).

    Raises:
        ValueError: a negative row count.
    """
    c, i, k = shape.hidden_size, shape.intermediate_size, shape.num_queries
    for n in window_rows:
        _nonneg(window_rows=n)
    per_window_queries = 12 * k * c * c + 4 * k * k * c + 4 * k * c * i
    rows = sum(window_rows)
    return shape.num_layers * (len(window_rows) * per_window_queries + 4 * rows * c * c + 4 * k * rows * c)


def compressor_weight_bytes(shape: CompressorShape, dtype_bytes: int = 2) -> int:
    """Bytes of the compressor's matrices: per layer two attentions ``8 C^2`` and the MLP ``2 C I``; the queries
    ``K C``."""
    c, i = shape.hidden_size, shape.intermediate_size
    return dtype_bytes * (shape.num_layers * (8 * c * c + 2 * c * i) + shape.num_queries * c)


def projector_flops(vision_width: int, llm_width: int, rows: int) -> int:
    """FLOPs of the projector ``Linear(C, D) -> GELU -> Linear(D, D)`` on ``rows`` vision rows:
    ``2 rows (C D + D^2)``.

    Raises:
        ValueError: ``rows < 0``.
    """
    _nonneg(rows=rows)
    return 2 * rows * (vision_width * llm_width + llm_width * llm_width)


def qa_floor_parts(llm: ModelShape, vision: VisionShape, compressor: CompressorShape, *, num_frames: int,
                   hw: int, raw_frames_reencoded: int, raw_hw: int, compressor_windows: list[int],
                   vision_rows: int, prefix_len: int, suffix_lens: list[int], new_tokens: int, merge: int = 2,
                   dtype_bytes: int = 2, causal: bool = True) -> list[FloorPart]:
    """The floor of one QA step, part by part (:data:`PART_NAMES`, the module docstring says what each holds).

    Args:
        llm, vision, compressor: the three models' shapes.
        num_frames: frames encoded at the encode grid, ``hw`` merged tokens each (``merge^2 hw`` patches).
        raw_frames_reencoded: raw frames encoded again at ``raw_hw`` merged tokens (0 when the raw grid is the
            encode grid).
        compressor_windows: encoder rows of each window the compressor runs (frames of the group x hw).
        vision_rows: vision rows of the LLM input (raw rows + compressed groups x K): the projector's rows.
        prefix_len: L, the shared prefix's tokens (system prompt, video, the text before the question).
        suffix_lens: ``n_q`` per question answered in the batch.
        new_tokens: R, answer tokens per question (``R - 1`` decode steps).
        merge: the tower's spatial merge (2 for VideoLLaMA3).
        dtype_bytes: bytes per weight and cache element (2: bf16).
        causal: count the prefix's and the suffixes' own attention as the causal triangle (what a flash kernel
            computes, the work the step must do); ``False``: the full square, as ``FlopCounterMode`` counts a dense
            kernel and as the bench's earlier floor (``prefill_flops``) counted the prefix. At a 16k prefix of 7B
            shapes the difference is ~55 TFLOPs.

    Returns:
        One :class:`FloorPart` per name of :data:`PART_NAMES`, in that order.

    Raises:
        ValueError: negative counts.
    """
    _nonneg(num_frames=num_frames, hw=hw, raw_frames_reencoded=raw_frames_reencoded, raw_hw=raw_hw,
            vision_rows=vision_rows, prefix_len=prefix_len, new_tokens=new_tokens)
    for n in suffix_lens:
        _nonneg(suffix_len=n)
    b = dtype_bytes
    vis = FloorPart("vision", vision_tower_flops(vision, num_frames, merge * merge * hw)
                    + vision_tower_flops(vision, raw_frames_reencoded, merge * merge * raw_hw),
                    vision_tower_weight_bytes(vision, b))
    comp = FloorPart("compress", compressor_flops(compressor, compressor_windows) if compressor_windows else 0,
                     compressor_weight_bytes(compressor, b) if compressor_windows else 0)
    c, d = vision.hidden_size, llm.hidden_size
    proj = FloorPart("project", projector_flops(c, d, vision_rows), b * (c * d + d * d))
    prefix = FloorPart("prefix", extend_flops(llm, prefix_len, 0, num_logit_positions=0, causal=causal),
                       weight_bytes(llm, b, with_lm_head=False) + kv_cache_bytes(llm, prefix_len, b))
    suffix = FloorPart("suffix", sum(extend_flops(llm, n, prefix_len, num_logit_positions=1, causal=causal)
                                     for n in suffix_lens),
                       (weight_bytes(llm, b) + kv_cache_bytes(llm, prefix_len + sum(suffix_lens), b))
                       if suffix_lens else 0)
    dec_flops = dec_bytes = 0
    if suffix_lens:
        for i in range(1, new_tokens):
            dec_flops += sum(decode_token_flops(llm, prefix_len + n + i) for n in suffix_lens)
            dec_bytes += (weight_bytes(llm, b) + kv_cache_bytes(llm, prefix_len, b)
                          + sum(kv_cache_bytes(llm, n + i, b) for n in suffix_lens))
    return [vis, comp, proj, prefix, suffix, FloorPart("decode", dec_flops, dec_bytes)]


def floor_seconds(parts: list[FloorPart], flops_per_s: float, bytes_per_s: float) -> dict[str, float]:
    """``{name: part floor time}`` for ``parts`` at the given rates, plus ``"total"``: their sum (parts run one
    after another, so their floors add)."""
    out = {p.name: p.seconds(flops_per_s, bytes_per_s) for p in parts}
    out["total"] = sum(out.values())
    return out
