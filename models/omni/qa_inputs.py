"""Building blocks of an omni QA prompt and its cost: the placeholder interleave of a video with its audio, the
encoded-clip and prompt records, and the analytic prefill-FLOPs fields of the records (used by ``models/omni/qa.py``).

Legend: T temporal patches (2 frames each), N merged video tokens per patch, N_a audio tokens (25 per second),
D LLM hidden size, L prompt length before pruning, L' after. The FLOPs conventions are described in
``models/omni/qa.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

from algorithms.flops import NO_ATTENTION, ModelShape, get_shape, paper_prefill_flops, prefill_flops

__all__ = ["FLOP_SHAPES", "EncodedClip", "PromptInputs", "interleave_media_ids", "model_shape", "prefill_flop_fields"]

FLOP_SHAPES = ("qwen2.5-omni-3b", "qwen2.5-omni-7b")


def model_shape(text_config, name: str = "model") -> ModelShape:
    """The :class:`~algorithms.flops.ModelShape` of a loaded thinker's text config."""
    c = text_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return ModelShape(name, c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
                      c.num_key_value_heads, head_dim, c.vocab_size, rope_rows=3)


def prefill_flop_fields(num_prefill_tokens: int, num_multimodal_tokens: int,
                        own_shape: ModelShape | None = None) -> dict[str, dict[str, int]]:
    """Analytic prefill FLOPs of one query in both conventions (see the module docstring).

    Returns:
        ``{"paper": {shape: multiply-adds with n = multimodal tokens}, "accurate": {shape: FLOPs with n = all
        prompt tokens and lm_head on 1 position, "model": the same for ``own_shape`` when given},
        "no_attention": the same without the attention products (``algorithms.flops.NO_ATTENTION``, the
        convention of seed 003's decode figure)}``.
    """
    out = {"paper": {s: paper_prefill_flops(get_shape(s), num_multimodal_tokens) for s in FLOP_SHAPES},
           "accurate": {s: prefill_flops(get_shape(s), num_prefill_tokens, 1) for s in FLOP_SHAPES},
           NO_ATTENTION: {s: prefill_flops(get_shape(s), num_prefill_tokens, 1, attention=False) for s in FLOP_SHAPES}}
    if own_shape is not None:
        out["accurate"]["model"] = prefill_flops(own_shape, num_prefill_tokens, 1)
        out[NO_ATTENTION]["model"] = prefill_flops(own_shape, num_prefill_tokens, 1, attention=False)
    return out


def _chunk_bounds(values: np.ndarray, per_chunk: int) -> list[tuple[int, int]]:
    """``Qwen2_5OmniProcessor.get_chunked_index``: slices of increasing ``values`` per ``per_chunk`` range."""
    out, start, current = [], 0, 1
    for i, v in enumerate(values):
        if v >= current * per_chunk:
            out.append((start, i))
            start = i
            current += 1
    out.append((start, len(values)))
    return out


def interleave_media_ids(grid_thw: tuple[int, int, int], merge_size: int, num_audio: int, second_per_grid: float,
                         position_id_per_seconds: float, seconds_per_chunk: float, video_token_id: int,
                         audio_token_id: int) -> list[int]:
    """Placeholder ids between ``<|audio_bos|>`` and ``<|audio_eos|>`` for a video with its own audio, as
    ``Qwen2_5OmniProcessor.replace_video_with_audio_token`` writes them: per chunk of ``seconds_per_chunk``, the
    chunk's video tokens, then its audio tokens."""
    t, h, w = grid_thw
    per_patch = (h // merge_size) * (w // merge_size)
    video_t = np.repeat(np.arange(t), per_patch) * second_per_grid * position_id_per_seconds
    per_chunk = int(position_id_per_seconds * seconds_per_chunk)
    vc = _chunk_bounds(video_t, per_chunk)
    ac = _chunk_bounds(np.arange(num_audio), per_chunk)
    ids: list[int] = []
    for j in range(max(len(vc), len(ac))):
        if j < len(vc):
            ids += [video_token_id] * (vc[j][1] - vc[j][0])
        if j < len(ac):
            ids += [audio_token_id] * (ac[j][1] - ac[j][0])
    return ids


@dataclass
class EncodedClip:
    """Tower outputs of one clip (shared by every variant and question of the clip).

    Attributes:
        video_tokens: (T, N, D) visual tower output, temporal patch by patch, merged cells row-major.
        audio_tokens: (N_a, D) audio tower output.
        audio_attention: (N_a,) attention each audio token receives in the audio encoder's last layer.
        video_grid_thw: (1, 3) long, the processor's grid (patches, not merged).
        second_per_grid: seconds per temporal patch (``temporal_patch_size / sample_fps``: 2 at 1 fps).
        mel_length: valid log-mel frames of the audio (the ``audio_seqlens`` of ``get_rope_index``).
        inputs: the processor outputs (``pixel_values_videos``, ``video_grid_thw``, ``input_features``,
            ``feature_attention_mask``), for a plain thinker forward on the same input.
        num_frames: frames given to the processor (after padding to an even count).
        encode_seconds: wall time of processors + towers.
    """

    video_tokens: Tensor
    audio_tokens: Tensor
    audio_attention: Tensor
    video_grid_thw: Tensor
    second_per_grid: float
    mel_length: int
    inputs: dict[str, Tensor] = field(repr=False)
    num_frames: int = 0
    encode_seconds: float = 0.0


@dataclass
class PromptInputs:
    """One query's LLM input before and after pruning.

    Attributes:
        input_ids: (L,) unpruned ids with media placeholders (what ``Qwen2_5OmniProcessor`` would produce).
        full_position_ids: (3, L) ``get_rope_index`` positions of the unpruned sequence.
        keep: (L,) bool, tokens entering the LLM.
        embeds: (L', D) gathered input embeddings (merged anchors in place).
        position_ids: (3, L') gathered positions (``full_position_ids[:, keep]``).
        num_video / num_audio / num_text: kept tokens per modality (text is never pruned).
        num_video_full / num_audio_full: before pruning.
        num_audio_merged: kept audio tokens that are merged anchors.
    """

    input_ids: Tensor
    full_position_ids: Tensor
    keep: Tensor
    embeds: Tensor
    position_ids: Tensor
    num_video: int
    num_audio: int
    num_text: int
    num_video_full: int
    num_audio_full: int
    num_audio_merged: int

    @property
    def num_prefill(self) -> int:
        return int(self.embeds.shape[0])
