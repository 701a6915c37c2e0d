"""Qwen2.5-Omni thinker runner for causal 5 Hz features: per-block audio/video embedding, incremental TMRoPE,
a KV cache of the fixed prompt plus at most ``memory_s`` of media, and layer readout at each row's last media token.

It executes a schedule of ``algorithms/streaming.py`` (DESIGN §5). Legend: N tokens of one payload, D hidden size,
F sampled video frames, S audio samples, T_rows output rows.

Model: ``Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(model_dir)`` (a full Qwen2.5-Omni checkpoint
directory also loads: the talker/token2wav weights are ignored by the thinker class). The payload is prepared by
the checkpoint's own ``WhisperFeatureExtractor`` and ``Qwen2VLVideoProcessor`` and embedded by the thinker's own
``audio_tower`` (``get_audio_features``) and ``visual`` (``get_video_features``).

Token layout of one payload (as the library's ``use_audio_in_video`` interleave inside one 2 s chunk): the
payload's video tokens (temporal patch by patch, row-major merged cells), then its audio tokens. The fixed prompt
ends with ``<|vision_bos|><|audio_bos|>``; both share one position, as in ``get_rope_index``.

TMRoPE (computed incrementally; the library's ``get_rope_index`` needs the whole sequence): with ``O`` the media
origin (last prompt position + 1), ``b0`` the first native block of the current memory window and ``off`` the
payload's offset in positions from its block start (``25 * seconds``):
    audio token j            (t, h, w) = O + 50 (b - b0) + off + j            (all three equal)
    video patch p, cell (y,x) (t, h, w) = (O + 50 (b - b0) + off + 25 p, O + y, O + x)
For complete blocks this equals ``get_rope_index(..., use_audio_in_video=True)`` over the same window (tested).
Under the ``window`` memory policy positions are re-based when the window slides (the oldest block is evicted and the
kept blocks re-prefilled), so positions stay within ``O + 50 M`` however long the session; under ``sliding`` ``b0``
is always 0 (absolute positions, never re-based).

Memory policies (``memory_policy``; both keep at most ``M = memory_s / 2`` native blocks of media in the cache, slide
at the same rows, and share the schedule and its production accounting):
* ``window`` (default): exact finite memory. When the window slides the cache is cut back to the prompt and the kept
  blocks are re-prefilled at re-based positions, so the cache always equals a from-scratch prefill of the last
  ``memory_s`` of media. Cost: a re-prefill of up to ``M - 1`` blocks per slide (every 2 s once the window is full).
* ``sliding``: a StreamingLLM / Mistral-style sliding-window KV cache. A committed payload's keys/values are computed
  once and kept; when the window slides the evicted blocks' rows are removed from the cache (``_evict_rows``; the
  prompt stays at the front), nothing is re-prefilled. Positions are absolute, so the relative position of any two
  media tokens is the one they had when computed; they grow at 25 per second (a warning names the stream when they
  pass the text config's ``max_position_embeddings``). The kept blocks' deeper-layer keys/values still carry
  information from evicted blocks (they were computed while those were in the cache), so a state is *not* a
  function of the last ``memory_s`` of media alone; its direct attention span is.
Reuse permitted per mode (the one-session path reuses nothing but the KV cache; ``models/omni/batch.py`` details
the encoder reuse): under both policies open-stream-replay tails are temporary (prefilled, read, cropped off) and
only the block-completing tail is committed; completed-block-hold and micro-chunk-200ms commit every payload at
once. Under ``window`` the kept payloads' embeddings are re-prefilled on every slide; under ``sliding`` a committed
payload's KV is reused until its block is evicted and its embeddings are never needed again.

``cache_replay`` (verification): ``window`` compares a row's state with one from-scratch prefill of prompt + the
same window; ``sliding`` compares it with one from-scratch forward over prompt + every payload committed since the
stream start + the row's payload, at absolute positions, under a 4-D additive mask that implements the policy
(``recompute_sliding``); as that history grows with the stream, only rows whose payload block is ``< 3 M`` are
checked (the last such row, after the first eviction once the stream is that long, always is).

Deviations from the official processor, chosen for streaming and written down here:
* audio: the official processor zero-pads every clip to 300 s before the log-mel; we zero-pad the payload by
  ``n_fft`` samples only. Valid frames and the max-normalization are identical (zeros only add -10 log values;
  tested against ``padding="max_length"``), at a fraction of the cost.
* video: ``cap_pixels_per_frame=False`` so that a frame's size does not depend on how many frames the payload has.
* both run on the runner's device (``LogMel``, ``video_inputs``): the log-mel is the feature extractor's own torch
  path (``_torch_extract_fbank_features``) batched over equal-length waveforms and left on the device; the video
  processor is called on device tensors. On CPU both are bit-identical to the official calls (tested); on CUDA
  the log-mel differs from the official (CPU) one by floating-point rounding only (cuFFT / cuBLAS vs the CPU
  kernels; ``LOG_MEL_ATOL``, test marked ``gpu``), the video patches are identical when no resize is needed (a
  resize runs torchvision's CUDA bicubic kernel, which may differ from the CPU uint8 kernel by one grey level).

Where the parts live: ``OmniThinkerRunner`` (here: loading, layer, prompt, geometry) combines the media inputs of
``thinker_media.py`` (``ThinkerMediaInputs``: ``LogMel``, ``prepare``, ``embed``, ``Payload``), the KV cache
handling of ``thinker_cache.py`` (``ThinkerKVCache``: positions, cache cuts, from-scratch references) and the
stream schedule of ``thinker_stream.py`` (``ThinkerStreamSchedule``: ``run_stream``, verification,
``StreamResult``).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import Qwen2_5OmniThinkerForConditionalGeneration

from algorithms.errors import SettingError
from algorithms.streaming import StreamGeometry

from ..loading import load_omni_thinker
from ..tokenizer import load_tokenizer
from .thinker_cache import ThinkerKVCache
from .thinker_media import AUDIO_SAMPLE_RATE, LogMel, ThinkerMediaInputs
from .thinker_stream import ThinkerStreamSchedule

DEFAULT_PROMPT = "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|vision_bos|><|audio_bos|>"
# DEFAULT_PROMPT in Qwen2.5 token ids, used when the model directory has no tokenizer (tiny test models).
DEFAULT_PROMPT_TOKEN_IDS = (151644, 8948, 198, 151645, 198, 151644, 872, 198, 151652, 151647)


class OmniThinkerRunner(ThinkerStreamSchedule, ThinkerKVCache, ThinkerMediaInputs, nn.Module):
    """Streams audio + 2 FPS video through a frozen Qwen2.5-Omni thinker and reads one state per 0.2 s row.

    Args:
        model_dir: local directory with the thinker (or full Omni) checkpoint, ``preprocessor_config.json``
            (feature extractor) and ``video_preprocessor_config.json``; optionally a tokenizer.
        layer: hidden-state index to read: 0 = input embeddings, ``l`` = output of decoder layer ``l``
            (1-based), ``L`` (or -1) = final normed output. Stored resolved (non-negative).
        prompt_token_ids: fixed prompt; default: ``DEFAULT_PROMPT`` tokenized by the directory's tokenizer, or
            ``DEFAULT_PROMPT_TOKEN_IDS`` when there is none.
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        attn_implementation: passed to ``from_pretrained`` (``sdpa`` default; ``eager`` for bit-level checks).
        thinker: an already built thinker (then ``model_dir`` only supplies the feature extractor, the video
            processor and the optional tokenizer; ``dtype`` / ``attn_implementation`` are ignored).
        fused_kernels: fused RMSNorm / rotary / SiLU-gate kernels on CUDA (:mod:`models.kernels`).
        audio_left_context: a payload that does not start the stream takes the ``n_fft // 2`` = 200 samples before
            it as the log-mel's left STFT padding (causal past audio), so its first mel frames equal the whole-clip
            ones; ``False``: the payload's own reflect padding (the earlier behaviour).
    """

    def __init__(self, model_dir: str | Path, layer: int = -1, prompt_token_ids: list[int] | None = None,
                 dtype: str = "float32", attn_implementation: str = "sdpa",
                 thinker: Qwen2_5OmniThinkerForConditionalGeneration | None = None, fused_kernels: bool = True,
                 audio_left_context: bool = True):
        super().__init__()
        self.audio_left_context = bool(audio_left_context)
        # ``thinker`` given (bench: random weights built in memory): used as is
        self.model_dir, self.thinker, self.feature_extractor, self.video_processor = load_omni_thinker(
            model_dir, dtype, attn_implementation, thinker, fused_kernels)
        self.log_mel = LogMel(self.feature_extractor)
        cfg = self.thinker.config
        self.text_config = cfg.get_text_config()
        n_layers = self.text_config.num_hidden_layers
        resolved = layer if layer >= 0 else n_layers + 1 + layer
        if not 0 <= resolved <= n_layers:
            raise SettingError(f"layer={layer} out of range for a {n_layers}-layer thinker (0..{n_layers} or -1)")
        self.layer = resolved
        self.geometry = StreamGeometry(
            native_block_ms=int(round(cfg.seconds_per_chunk * 1000)), positions_per_s=int(cfg.position_id_per_seconds),
            video_fps=2.0, temporal_patch_size=int(cfg.vision_config.temporal_patch_size),
            audio_tokens_per_s=self._audio_tokens_per_s())
        self.prompt_source = "argument"
        if prompt_token_ids is None:
            prompt_token_ids, self.prompt_source = self._default_prompt()
        self.prompt_token_ids = [int(x) for x in prompt_token_ids]
        self.processor_calls = 0
        self.prepared_ms = 0

    # ----------------------------------------------------------------------------------------------- setup
    def _audio_tokens_per_s(self) -> int:
        hop = self.feature_extractor.hop_length
        mel_per_s = AUDIO_SAMPLE_RATE // hop  # 100
        _, out = self.thinker.model.audio_tower._get_feat_extract_output_lengths(torch.tensor(mel_per_s * 2))
        return int(out) // 2  # tokens per second measured on a 2 s window (50 / 2)

    def _default_prompt(self) -> tuple[list[int], str]:
        try:
            tok = load_tokenizer(self.model_dir)
        except Exception:  # no tokenizer saved next to a tiny model
            return list(DEFAULT_PROMPT_TOKEN_IDS), "DEFAULT_PROMPT_TOKEN_IDS"
        return tok(DEFAULT_PROMPT, add_special_tokens=False)["input_ids"], "tokenizer(DEFAULT_PROMPT)"

    @property
    def device(self) -> torch.device:
        return next(self.thinker.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.thinker.parameters()).dtype

    @property
    def hidden_size(self) -> int:
        return int(self.text_config.hidden_size)

