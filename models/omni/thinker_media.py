"""Media inputs of the one-session thinker runner: a payload's log-mel and video patches, its tower embeddings and
relative TMRoPE positions (:class:`ThinkerMediaInputs`, mixed into ``OmniThinkerRunner``).

The processors run on the runner's device (``LogMel``, ``video_inputs``); their deviations from the official
processors and the tolerances are written down in ``models/omni/thinker.py``. Legend: N tokens of one payload, D
hidden size, F sampled video frames, S audio samples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

AUDIO_SAMPLE_RATE = 16000
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



def frame_indices(start_ms: int, end_ms: int, frame_ms: float) -> range:
    """Indices ``k`` of right-edged frames whose right edge ``frame_ms * (k + 1)`` lies in ``(start_ms, end_ms]``."""
    lo = int(math.floor(start_ms / frame_ms + 1e-9))
    hi = int(math.floor(end_ms / frame_ms + 1e-9)) - 1
    return range(lo, hi + 1)



class ThinkerMediaInputs:
    """Prepares and embeds one payload (``prepare``, ``embed``); the media half of ``OmniThinkerRunner``.

    Uses the runner's ``feature_extractor``, ``video_processor``, ``log_mel``, ``thinker``, ``geometry``,
    ``audio_left_context``, ``device`` and ``dtype``, and counts ``processor_calls`` / ``prepared_ms``.
    """

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

