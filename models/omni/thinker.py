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
"""
from __future__ import annotations

import math
import resource
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoTokenizer, DynamicCache, Qwen2_5OmniThinkerForConditionalGeneration
from transformers.cache_utils import DynamicLayer

from algorithms.streaming import (MICRO_CHUNK_200MS, MODES, SLIDING, StreamGeometry, accounting,
                                  check_memory_policy, check_micro_chunk_tiling, memory_blocks, num_rows, schedule)
from algorithms.errors import SettingError

from ..loading import load_omni_thinker

AUDIO_SAMPLE_RATE = 16000
DEFAULT_PROMPT = "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|vision_bos|><|audio_bos|>"
# DEFAULT_PROMPT in Qwen2.5 token ids, used when the model directory has no tokenizer (tiny test models).
DEFAULT_PROMPT_TOKEN_IDS = (151644, 8948, 198, 151645, 198, 151644, 872, 198, 151652, 151647)
SLIDING_VERIFY_BLOCKS = 3  # sliding cache_replay: rows whose payload block is < 3 M (the reference grows with time)
# LogMel vs the library's numpy log-mel (CPU) and, on CUDA, vs the official CPU call: max abs, log-mel units
LOG_MEL_ATOL = 1e-4


class LogMel:
    """Whisper log-mel spectrogram of equal-length waveforms, batched, computed and kept on their device.

    The operations of ``WhisperFeatureExtractor._torch_extract_fbank_features`` (what ``feature_extractor(...)`` runs
    when torch is installed) in the same order: centered STFT (periodic Hann window, reflect padding), power, the
    last frame dropped, the extractor's slaney mel filters, ``log10(max(., 1e-10))``, a clamp at each waveform's own
    maximum minus 8, ``(x + 4) / 4``; dither as the extractor's ``dither``. Unlike the library call it takes and
    returns device tensors (no numpy round trip, no host copy) and caches the window and filters per device.

    Tolerance: bit-identical to the official ``feature_extractor(...)`` call on CPU (tested at the 128-mel shape,
    batched and one waveform at a time); max abs difference <= ``LOG_MEL_ATOL`` = 1e-4 (log-mel units; seen
    <= 1e-5) against the library's numpy implementation (``_np_extract_fbank_features``) and, on CUDA (cuFFT /
    cuBLAS rounding), against the official CPU call (test marked ``gpu``).

    Args:
        feature_extractor: the checkpoint's ``WhisperFeatureExtractor`` (``n_fft``, ``hop_length``, ``mel_filters``).
    """

    def __init__(self, feature_extractor):
        self.n_fft = int(feature_extractor.n_fft)
        self.hop_length = int(feature_extractor.hop_length)
        self.dither = float(getattr(feature_extractor, "dither", 0.0) or 0.0)
        self._filters_np = feature_extractor.mel_filters  # (n_fft // 2 + 1, n_mels) float
        self._cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, waves: torch.Tensor, left: torch.Tensor | None = None) -> torch.Tensor:
        """Log-mel of (B, S) float32 waveforms -> (B, n_mels, S // hop_length) float32 on ``waves.device``.

        ``left``: (B, n_fft // 2) samples that precede each waveform (the past audio of a payload that does not start
        the stream), used as the centred STFT's left padding instead of the reflection of the waveform's own start,
        so the payload's first frames equal those of a whole-clip log-mel (frames 200-201 of a block at 2 s).
        ``None`` (or for a stream's first payload): reflect padding, as ``torch.stft(center=True)``. The right end is
        always reflect-padded, as the library does (callers zero-pad by ``n_fft``, so it reflects zeros).
        """
        if waves.dim() != 2:
            raise ValueError(f"LogMel takes (B, S) waveforms, got shape {tuple(waves.shape)}")
        dev = waves.device
        if dev not in self._cache:
            self._cache[dev] = (torch.hann_window(self.n_fft, device=dev),
                                torch.from_numpy(self._filters_np).to(dev, torch.float32))
        window, filters = self._cache[dev]
        waves = waves.to(torch.float32)
        if self.dither != 0.0:
            waves = waves + self.dither * torch.randn(waves.shape, dtype=waves.dtype, device=dev)
        pad = self.n_fft // 2
        if left is None:
            left = waves[:, 1: pad + 1].flip(-1)  # reflect, as torch.stft(center=True, pad_mode="reflect")
        elif tuple(left.shape) != (waves.shape[0], pad):
            raise ValueError(f"left context must be (B, {pad}), got shape {tuple(left.shape)}")
        padded = torch.cat([left.to(dev, torch.float32), waves, waves[:, -pad - 1: -1].flip(-1)], dim=1)
        stft = torch.stft(padded, self.n_fft, self.hop_length, window=window, center=False, return_complex=True)
        magnitudes = (stft[..., :-1].abs() ** 2).contiguous()
        log_spec = torch.clamp(filters.T @ magnitudes, min=1e-10).log10()
        max_val = log_spec.max(dim=2, keepdim=True)[0].max(dim=1, keepdim=True)[0]
        log_spec = torch.maximum(log_spec, max_val - 8.0)
        return (log_spec + 4.0) / 4.0


def past_samples(audio: np.ndarray, start: int, length: int) -> np.ndarray:
    """(length,) float32: the ``length`` samples before sample ``start`` (zeros before the stream start and past the
    audio's end)."""
    out = np.zeros(length, dtype=np.float32)
    lo = max(0, start - length)
    seg = np.asarray(audio[lo:start], dtype=np.float32)
    out[length - (start - lo): length - (start - lo) + len(seg)] = seg
    return out


def video_inputs(video_processor, clips: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's video processor on (f, 3, H, W) uint8 clips, run where the clips are (one call; clips of
    equal shape are processed as one stack by the processor itself).

    Returns:
        ``pixel_values_videos`` (n_patches, C * temporal_patch * patch * patch) float32 on the clips' device and
        ``video_grid_thw`` (len(clips), 3) long on the CPU.
    """
    vid = video_processor(videos=clips, return_tensors="pt", cap_pixels_per_frame=False)
    return {"pixel_values_videos": vid["pixel_values_videos"], "video_grid_thw": vid["video_grid_thw"].cpu()}


def frames_tensor(frames: torch.Tensor | np.ndarray) -> torch.Tensor:
    """(f, H, W, 3) uint8 frames as a contiguous torch tensor (no copy when already one)."""
    if torch.is_tensor(frames):
        return frames.contiguous()
    return torch.from_numpy(np.ascontiguousarray(frames))


@dataclass
class Payload:
    """One prepared + embedded media interval ``(start_ms, end_ms]`` of native block ``block``.

    Attributes:
        embeds: (N, D) tower outputs in sequence order (video tokens, then audio tokens).
        rel_pos: (3, N) long, positions with the block origin at 0 (time dims) and the media origin at 0 (h, w).
        block_shift: (3, N) long 0/1: which entries move by ``positions_per_block`` per block of the window.
        num_video_tokens / num_audio_tokens: counts inside ``embeds``.
        num_frames: sampled frames in the payload.
    """

    start_ms: int
    end_ms: int
    block: int
    embeds: torch.Tensor
    rel_pos: torch.Tensor
    block_shift: torch.Tensor
    num_video_tokens: int
    num_audio_tokens: int
    num_frames: int


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


def frame_indices(start_ms: int, end_ms: int, frame_ms: float) -> range:
    """Indices ``k`` of right-edged frames whose right edge ``frame_ms * (k + 1)`` lies in ``(start_ms, end_ms]``."""
    lo = int(math.floor(start_ms / frame_ms + 1e-9))
    hi = int(math.floor(end_ms / frame_ms + 1e-9)) - 1
    return range(lo, hi + 1)


class OmniThinkerRunner(nn.Module):
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
            tok = AutoTokenizer.from_pretrained(self.model_dir)
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

    # --------------------------------------------------------------------------------- payload preparation
    def prepare(self, frames: torch.Tensor | np.ndarray, audio: torch.Tensor | np.ndarray, start_ms: int,
                end_ms: int, count: bool = True) -> dict[str, Any]:
        """One processor call: log-mel of the payload's audio and pixel patches of its frames, on the runner's device
        (``LogMel``, ``video_inputs``).

        Args:
            frames: (F, H, W, 3) uint8, right-edged 2 FPS frames of the stream (frame k ends at 0.5 (k + 1) s).
            audio: (S,) float32 mono 16 kHz of the stream (zero-padded if shorter than ``end_ms``).
            start_ms, end_ms: the payload interval ``(start_ms, end_ms]`` in ms since stream start.
            count: add to the production accounting (diagnostic calls pass False).

        Returns:
            dict with ``input_features`` (1, 128, n_mel) float32 (device), ``feature_attention_mask`` (1, n_mel), and,
            when the interval holds frames, ``pixel_values_videos`` (n_patches, C*2*14*14) float32 (device) and
            ``video_grid_thw`` (1, 3).
        """
        fe = self.feature_extractor
        dev = self.device
        a0, a1 = start_ms * AUDIO_SAMPLE_RATE // 1000, end_ms * AUDIO_SAMPLE_RATE // 1000
        audio = np.asarray(audio, dtype=np.float32)
        chunk = np.zeros((1, a1 - a0 + fe.n_fft), dtype=np.float32)
        avail = audio[a0:a1]
        chunk[0, : len(avail)] = avail
        left = None
        if self.audio_left_context and a0 > 0:
            left = past_samples(audio, a0, fe.n_fft // 2)[None]
            left = torch.from_numpy(left).to(dev)
        n_mel = (a1 - a0) // fe.hop_length
        out: dict[str, Any] = {"input_features": self.log_mel(torch.from_numpy(chunk).to(dev), left)[:, :, :n_mel],
                               "feature_attention_mask": torch.ones(1, n_mel, dtype=torch.long)}
        idx = [k for k in frame_indices(start_ms, end_ms, self.geometry.frame_ms) if k < len(frames)]
        if idx:
            clip = frames_tensor(frames[idx[0]: idx[-1] + 1]).to(dev).permute(0, 3, 1, 2)  # (f, 3, H, W)
            out.update(video_inputs(self.video_processor, [clip]))
        out["num_frames"] = len(idx)
        if count:
            self.processor_calls += 1
            self.prepared_ms += end_ms - start_ms
        return out

    @torch.no_grad()
    def embed(self, inputs: dict[str, Any], start_ms: int, end_ms: int) -> Payload:
        """Run the thinker's own towers on one prepared payload and attach its relative TMRoPE positions."""
        g = self.geometry
        block = (end_ms - 1) // g.native_block_ms
        block_start = block * g.native_block_ms
        if start_ms < block_start:
            raise ValueError(f"payload ({start_ms}, {end_ms}] ms crosses the native block starting at {block_start} ms")
        off = (start_ms - block_start) * g.positions_per_s / 1000
        if abs(off - round(off)) > 1e-9:
            raise ValueError(f"payload start {start_ms} ms is not on a TMRoPE position")
        off = int(round(off))
        dev, dt = self.device, self.dtype
        parts, pos, shift = [], [], []
        n_video = 0
        if "pixel_values_videos" in inputs:
            thw = inputs["video_grid_thw"].to(dev)
            vis = self.thinker.model.get_video_features(inputs["pixel_values_videos"].to(dev, dt), thw)
            v = vis.pooler_output[0]  # (n_v, D)
            gt, gh, gw = (int(x) for x in inputs["video_grid_thw"][0])
            m = self.thinker.model.visual.spatial_merge_size
            hh, ww = gh // m, gw // m
            patch_pos = int(round(g.patch_s * g.positions_per_s))  # 25
            t_idx = (off + patch_pos * torch.arange(gt)).view(-1, 1, 1).expand(gt, hh, ww).flatten()
            h_idx = torch.arange(hh).view(1, -1, 1).expand(gt, hh, ww).flatten()
            w_idx = torch.arange(ww).view(1, 1, -1).expand(gt, hh, ww).flatten()
            if v.shape[0] != t_idx.numel():
                raise RuntimeError(f"vision tower gave {v.shape[0]} tokens, grid {gt}x{hh}x{ww} expects {t_idx.numel()}")
            parts.append(v)
            pos.append(torch.stack([t_idx, h_idx, w_idx]))
            sh = torch.zeros(3, t_idx.numel(), dtype=torch.long)
            sh[0] = 1
            shift.append(sh)
            n_video = v.shape[0]
        aud = self.thinker.model.get_audio_features(inputs["input_features"].to(dev, dt),
                                                    feature_attention_mask=inputs["feature_attention_mask"].to(dev))
        a = aud.last_hidden_state  # (n_a, D)
        expect = (end_ms - start_ms) * g.audio_tokens_per_s // 1000
        if a.shape[0] != expect:
            raise RuntimeError(f"audio tower gave {a.shape[0]} tokens for {end_ms - start_ms} ms, expected {expect}")
        parts.append(a)
        pos.append((off + torch.arange(a.shape[0])).view(1, -1).expand(3, -1))
        shift.append(torch.ones(3, a.shape[0], dtype=torch.long))
        return Payload(start_ms=start_ms, end_ms=end_ms, block=block, embeds=torch.cat(parts).to(dt),
                       rel_pos=torch.cat(pos, 1), block_shift=torch.cat(shift, 1), num_video_tokens=n_video,
                       num_audio_tokens=int(a.shape[0]), num_frames=int(inputs["num_frames"]))

    # ------------------------------------------------------------------------------------------- positions
    def prompt_positions(self) -> torch.Tensor:
        """(3, P) positions of the fixed prompt; a trailing ``<|vision_bos|><|audio_bos|>`` shares one position."""
        ids = self.prompt_token_ids
        pos = list(range(len(ids)))
        cfg = self.thinker.config
        if len(ids) >= 2 and ids[-2] == cfg.vision_start_token_id and ids[-1] == cfg.audio_start_token_id:
            pos[-1] = pos[-2]
        return torch.tensor(pos).view(1, -1).expand(3, -1).clone()

    def media_origin(self) -> int:
        """``O``: the first media position (last prompt position + 1)."""
        return int(self.prompt_positions().max()) + 1

    def payload_positions(self, payload: Payload, first_block: int) -> torch.Tensor:
        """(3, N) absolute TMRoPE positions of ``payload`` in a window whose first native block is ``first_block``."""
        ppb = int(round(self.geometry.positions_per_block))
        return self.media_origin() + payload.rel_pos + payload.block_shift * ppb * (payload.block - first_block)

    # ------------------------------------------------------------------------------------------------ LLM
    @torch.no_grad()
    def _forward(self, embeds: torch.Tensor, positions: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Prefill (N, D) ``embeds`` at (3, N) ``positions`` on top of ``cache``; returns (N, D) at ``self.layer``."""
        out = self.thinker.model.language_model(
            inputs_embeds=embeds.unsqueeze(0), position_ids=positions.to(self.device).unsqueeze(1),
            past_key_values=cache, use_cache=True, output_hidden_states=True)
        return out.hidden_states[self.layer][0]

    def _new_cache(self) -> tuple[DynamicCache, int]:
        cache = DynamicCache(config=self.text_config)
        ids = torch.tensor(self.prompt_token_ids, device=self.device)
        emb = self.thinker.get_input_embeddings()(ids)
        self._forward(emb, self.prompt_positions(), cache)
        return cache, len(self.prompt_token_ids)

    @staticmethod
    def _truncate(cache: DynamicCache, length: int) -> None:
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)

    @staticmethod
    def _evict_rows(cache: DynamicCache, start: int, length: int) -> None:
        """Remove cache rows ``[start, start + length)`` of every layer's keys and values (all batch entries).

        Raises:
            TypeError: a layer is not a plain ``DynamicLayer`` (sliding-window / quantized layers keep extra state).
        """
        if length <= 0:
            return
        for layer in cache.layers:
            if type(layer) is not DynamicLayer:
                raise TypeError(f"cannot evict rows from a {type(layer).__name__} cache layer")
            if not layer.is_initialized:
                continue
            n = layer.keys.shape[-2]
            if start + length > n:
                raise ValueError(f"evicting rows [{start}, {start + length}) from a cache of {n} rows")
            layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., start + length:, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :start, :], layer.values[..., start + length:, :]], dim=-2)

    def _position_warning(self, positions: torch.Tensor, n_rows: int) -> bool:
        """Warn (once per stream: the caller stops asking after True) when sliding positions pass the text
        config's ``max_position_embeddings``. Returns whether it warned."""
        limit = getattr(self.text_config, "max_position_embeddings", None)
        top = int(positions.max())
        if limit is None or top < int(limit):
            return False
        seconds = n_rows * self.geometry.row_ms / 1000.0
        warnings.warn(f"memory_policy='sliding': a {seconds:g} s stream reaches TMRoPE position {top}, beyond the "
                      f"thinker text config's max_position_embeddings={limit} (positions 0..{int(limit) - 1}); "
                      f"sliding positions grow at {self.geometry.positions_per_s} per second and are never re-based "
                      f"(memory_policy='window' keeps them below {self.media_origin()} + "
                      f"{int(round(self.geometry.positions_per_block))} M)", stacklevel=3)
        return True

    @torch.no_grad()
    def recompute(self, payloads: list[Payload], first_block: int) -> torch.Tensor:
        """From scratch: prompt + ``payloads`` in one prefill, no cache reuse. Returns (D,) at the last token."""
        cache, _ = self._new_cache()
        emb = torch.cat([p.embeds for p in payloads])
        pos = torch.cat([self.payload_positions(p, first_block) for p in payloads], 1)
        return self._forward(emb, pos, cache)[-1].float().cpu()

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

    @torch.no_grad()
    def recompute_sliding(self, payloads: list[Payload], m_blocks: int) -> torch.Tensor:
        """Sliding-policy reference: ONE forward over prompt + ``payloads`` (every payload committed since the
        stream start, in commit order, then the row's payload) at absolute positions, no cache, under a 4-D additive
        float mask (1, 1, n, n): a token of a payload of block ``k`` attends to every prompt token, to the tokens of
        earlier payloads of blocks ``>= max(0, k - (m_blocks - 1))`` and causally within its own payload; prompt
        tokens attend causally among themselves. Returns (D,) at the last token.

        Raises:
            NotImplementedError: a flash-attention implementation (it takes no 4-D mask); use sdpa or eager.
        """
        lm = self.thinker.model.language_model
        if "flash" in str(lm.config._attn_implementation):
            raise NotImplementedError("the sliding cache_replay reference needs a 4-D attention mask: run with "
                                      "attn_implementation='sdpa' or 'eager' (or verify_rows=0)")
        n_prompt = len(self.prompt_token_ids)
        lens = [p.embeds.shape[0] for p in payloads]
        starts = [n_prompt + sum(lens[:i]) for i in range(len(payloads))]
        n = n_prompt + sum(lens)
        allowed = torch.zeros(n, n, dtype=torch.bool)
        allowed[:n_prompt, :n_prompt] = torch.ones(n_prompt, n_prompt, dtype=torch.bool).tril()
        for i, p in enumerate(payloads):
            rows = slice(starts[i], starts[i] + lens[i])
            allowed[rows, :n_prompt] = True
            first = max(0, p.block - (m_blocks - 1))
            for j in range(i):
                if payloads[j].block >= first:
                    allowed[rows, starts[j]: starts[j] + lens[j]] = True
            allowed[rows, rows] = torch.ones(lens[i], lens[i], dtype=torch.bool).tril()
        mask = torch.zeros(n, n, dtype=self.dtype).masked_fill(~allowed, torch.finfo(self.dtype).min)
        ids = torch.tensor(self.prompt_token_ids, device=self.device)
        emb = torch.cat([self.thinker.get_input_embeddings()(ids)] + [p.embeds for p in payloads])
        pos = torch.cat([self.prompt_positions()] + [self.payload_positions(p, 0) for p in payloads], 1)
        out = lm(inputs_embeds=emb.unsqueeze(0), attention_mask=mask.to(self.device)[None, None],
                 position_ids=pos.to(self.device).unsqueeze(1), use_cache=False, output_hidden_states=True)
        return out.hidden_states[self.layer][0, -1].float().cpu()

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
