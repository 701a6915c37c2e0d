"""Whole-clip multiple-choice QA with the Qwen2.5-Omni thinker, with token pruning between the encoders and the LLM.

Legend: T temporal patches (2 frames each), N merged video tokens per patch, N_a audio tokens (25 per second),
D LLM hidden size, L prompt length before pruning, L' after.

Pipeline for one clip (issue 7 part 3):

1. :meth:`OmniQA.encode`: the checkpoint's own ``Qwen2VLVideoProcessor`` (frames sampled by the caller:
   ``datamodules.omni_qa``'s ``frame_sampling``, by default qwen-omni-utils' even count at 1 fps, at most 128; an
   odd count, which only ``ffmpeg_rate`` gives, is padded by repeating the last frame; seconds per temporal patch
   ``temporal_patch_size * frame_interval_s``, i.e. ``temporal_patch_size / sample_fps`` as the processor's
   ``video_second_per_grid = temporal_patch_size / fps``) and ``WhisperFeatureExtractor`` (16 kHz mono), then the thinker's own towers
   (``get_video_features`` / ``get_audio_features``). While the audio tower runs, a hook on its **last** encoder
   layer's self-attention recomputes that layer's attention map (per 2 s attention window, heads averaged) and
   reduces it to the attention each token *receives* (column mean over queries), average-pooled in pairs exactly
   like the tower's own stride-2 output pooling: that is the "audio encoder attention" the dominant-token
   methods rank by (seed 003's "attn_logits"; OmniZip's encoder returns a whole-clip softmax without the window
   mask instead, a row in docs/deviations.md).
2. :meth:`OmniQA.prune`: :func:`algorithms.pruning.apply_variant` on ``video (T, N, D)`` and ``audio (N_a, D)``
   with ``patches_per_block = max(1, round(seconds_per_chunk / second_per_grid))`` (1 at 1 fps: a temporal patch is
   2 s, one native block; a capped video's patches are longer, still 1) and 50 audio tokens per block. The variant ``"full"`` keeps everything.
3. :meth:`OmniQA.build_inputs`: the **unpruned** prompt is built exactly as ``Qwen2_5OmniProcessor`` does with the
   audio taken from the video (``<|vision_bos|><|audio_bos|>`` + per 2 s chunk the chunk's video tokens then its
   audio tokens + ``<|audio_eos|><|vision_eos|>``, inside the official chat template and system prompt), TMRoPE
   positions come from the library's ``get_rope_index(..., use_audio_in_video=True)`` on that unpruned sequence,
   tower outputs are placed at their placeholders, merged anchor rows (``merge_tokens``) replace their anchors,
   and then tokens and positions are **gathered** with the keep mask. Kept tokens keep their original positions;
   text after the media keeps its original positions too (the gaps left by pruned tokens are not closed).
4. :meth:`OmniQA.answer`: one prefill of the whole pruned prompt (LLM only; ``lm_head`` on the last position),
   timed (CUDA synchronised), peak memory measured (CUDA: max allocated during the prefill; CPU: the process's
   peak RSS), optionally FLOP-counted with ``torch.utils.flop_counter.FlopCounterMode`` (on CPU only with
   ``attn_implementation="eager"``: the CPU SDPA kernel is invisible to the counter), then a greedy answer with
   the KV cache, decoded positions continuing at ``max(position) + 1``.

Analytic prefill FLOPs (:func:`~.qa_inputs.prefill_flop_fields`) use :mod:`algorithms.flops` in both conventions:
the paper form (multiply-adds, multimodal tokens only, as FastV/DyCoke/OmniZip count) and the accurate form (FLOPs =
2 x multiply-adds over every matmul of this prefill: all prompt tokens, lm_head on one position), for the
Qwen2.5-Omni 3B and 7B thinker shapes and for the loaded model's own shape.

Choices written down here: the question follows the media in the same user turn (as the official chat template
renders a video + text message); dataset text is tokenized with ``split_special_tokens=True`` so it can never
create a placeholder; a model directory without a tokenizer (tiny test models) uses the offline real-vocabulary
Qwen2.5 tokenizer of :mod:`models.tokenizer` (the ids the prompt needs are shared with Qwen2.5-Omni).
"""
from __future__ import annotations

import functools
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from transformers import DynamicCache

from algorithms.pruning import PruneResult, apply_variant, merge_tokens

from ..loading import load_omni_thinker
from ..tokenizer import load_tokenizer
from .qa_inputs import EncodedClip, PromptInputs, interleave_media_ids, model_shape

__all__ = ["FULL", "SYSTEM_PROMPT", "Answer", "OmniQA"]

FULL = "full"  # the no-pruning variant
AUDIO_SAMPLE_RATE = 16000
SYSTEM_PROMPT = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
                 "auditory and visual inputs, as well as generating text and speech.")
_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


@functools.lru_cache(maxsize=1)
def _offline_tokenizer():
    from ..tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Answer:
    """A greedy answer and the cost of its prefill."""

    text: str
    token_ids: list[int]
    prefill_seconds: float
    peak_memory_bytes: int
    peak_memory_kind: str
    measured_flops: int | None
    last_logits: Tensor = field(repr=False)


class _AudioAttentionProbe:
    """Forward pre-hook on the audio tower's last self-attention: received attention per pre-pool position."""

    def __init__(self, attn: nn.Module):
        self.attn = attn
        self.received: Tensor | None = None
        self.handle = attn.register_forward_pre_hook(self._hook, with_kwargs=True)

    @torch.no_grad()
    def _hook(self, module, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)  # (S, C)
        cu = kwargs.get("cu_seqlens", args[1] if len(args) > 1 else None)
        s = x.shape[0]
        heads = module.num_heads
        q = module.q_proj(x).reshape(s, heads, -1).transpose(0, 1).float()  # (H, S, h)
        k = module.k_proj(x).reshape(s, heads, -1).transpose(0, 1).float()
        received = torch.zeros(s, dtype=torch.float32, device=x.device)
        bounds = cu.tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            probs = torch.softmax(q[:, a:b] @ k[:, a:b].transpose(1, 2) * module.scaling, dim=-1)  # (H, c, c)
            received[a:b] = probs.mean(0).sum(0)  # column sums, heads averaged
        self.received = received / s  # = column mean of the (block-diagonal) full map

    def remove(self) -> None:
        self.handle.remove()


class OmniQA(nn.Module):
    """Qwen2.5-Omni thinker answering multiple-choice questions on whole clips, with per-modality pruning.

    Args:
        model_dir: local thinker (or full Omni) checkpoint directory with ``preprocessor_config.json`` and
            ``video_preprocessor_config.json``; a tokenizer is optional (see the module docstring).
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        attn_implementation: ``sdpa`` (default) or ``eager`` (needed for measured FLOPs on CPU).
        system_prompt: the system turn (default: the official Qwen2.5-Omni system prompt).
        max_new_tokens: greedy answer length.
    """

    def __init__(self, model_dir: str | Path, dtype: str = "float32", attn_implementation: str = "sdpa",
                 system_prompt: str = SYSTEM_PROMPT, max_new_tokens: int = 16):
        super().__init__()
        self.attn_implementation = attn_implementation
        self.model_dir, self.thinker, self.feature_extractor, self.video_processor = load_omni_thinker(
            model_dir, dtype, attn_implementation)
        try:
            self.tokenizer = load_tokenizer(self.model_dir)
        except Exception:  # noqa: BLE001 - tiny test models ship no tokenizer
            self.tokenizer = _offline_tokenizer()
        self.config = self.thinker.config
        self.text_config = self.config.get_text_config()
        self.shape = model_shape(self.text_config, "model")
        self.system_prompt = system_prompt
        self.max_new_tokens = max_new_tokens
        self.eos_ids = {i for i in self.tokenizer.convert_tokens_to_ids(list(_EOS_TOKENS)) if i is not None}

    @property
    def device(self) -> torch.device:
        return next(self.thinker.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.thinker.parameters()).dtype

    # ------------------------------------------------------------------------------------------- encoders
    def preprocess(self, frames: Tensor | np.ndarray, audio: Tensor | np.ndarray,
                   frame_interval_s: float = 1.0) -> tuple[dict[str, Tensor], float, int]:
        """Processor outputs for a clip: ``(inputs, second_per_grid, num_frames)``.

        Args:
            frames: (F, H, W, 3) uint8 frames sampled every ``frame_interval_s`` seconds (``1 / sample_fps``;
                1 at 1 fps).
            audio: (S,) float32 mono 16 kHz.
        """
        frames = torch.as_tensor(np.asarray(frames))
        tp = int(self.config.vision_config.temporal_patch_size)
        if frames.shape[0] % tp:
            frames = torch.cat([frames, frames[-1:].expand(tp - frames.shape[0] % tp, *frames.shape[1:])])
        vid = self.video_processor(videos=[frames.permute(0, 3, 1, 2)], return_tensors="pt",
                                   cap_pixels_per_frame=True)
        fe = self.feature_extractor
        wav = np.asarray(audio, dtype=np.float32).reshape(-1)
        n_mel = len(wav) // fe.hop_length
        padded = np.concatenate([wav, np.zeros(fe.n_fft, dtype=np.float32)])  # zeros, like the official padding
        feats = fe(padded, sampling_rate=AUDIO_SAMPLE_RATE, padding="longest", return_tensors="pt")
        inputs = {"pixel_values_videos": vid["pixel_values_videos"], "video_grid_thw": vid["video_grid_thw"],
                  "input_features": feats["input_features"][:, :, :n_mel],
                  "feature_attention_mask": torch.ones(1, n_mel, dtype=torch.long)}
        return inputs, tp * float(frame_interval_s), int(frames.shape[0])

    @torch.no_grad()
    def encode(self, frames: Tensor | np.ndarray, audio: Tensor | np.ndarray,
               frame_interval_s: float = 1.0) -> EncodedClip:
        """Processors + towers for one clip (see the module docstring, step 1)."""
        t0 = time.perf_counter()
        inputs, spg, n_frames = self.preprocess(frames, audio, frame_interval_s)
        dev, dt = self.device, self.dtype
        model = self.thinker.model
        grid = inputs["video_grid_thw"]
        vis = model.get_video_features(inputs["pixel_values_videos"].to(dev, dt), grid.to(dev))
        gt, gh, gw = (int(x) for x in grid[0])
        m = model.visual.spatial_merge_size
        video = vis.pooler_output[0].reshape(gt, (gh // m) * (gw // m), -1)  # (T, N, D)
        probe = _AudioAttentionProbe(model.audio_tower.layers[-1].self_attn)
        try:
            mask = inputs["feature_attention_mask"].to(dev)
            audio_tokens = model.get_audio_features(inputs["input_features"].to(dev, dt),
                                                    feature_attention_mask=mask).last_hidden_state  # (N_a, D)
        finally:
            probe.remove()
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import get_pool_indices

        pool = get_pool_indices(mask.sum(-1))
        attention = (probe.received[pool] + probe.received[pool + 1]) / 2  # (N_a,)
        if attention.numel() != audio_tokens.shape[0]:
            raise RuntimeError(f"audio attention covers {attention.numel()} tokens, tower gave {audio_tokens.shape[0]}")
        _sync(dev)
        return EncodedClip(video_tokens=video, audio_tokens=audio_tokens, audio_attention=attention.cpu(),
                           video_grid_thw=grid, second_per_grid=spg, mel_length=int(mask.sum()), inputs=inputs,
                           num_frames=n_frames, encode_seconds=time.perf_counter() - t0)

    # ------------------------------------------------------------------------------------------- pruning
    def prune(self, clip: EncodedClip, variant: str, retention: float | tuple[float, float]) -> PruneResult | None:
        """Keep indices of ``variant`` at ``retention`` (``None`` for :data:`FULL`)."""
        if variant == FULL:
            return None
        ppb = max(1, int(round(float(self.config.seconds_per_chunk) / clip.second_per_grid)))
        apb = int(round(float(self.config.seconds_per_chunk) * self.audio_tokens_per_s()))
        return apply_variant(variant, clip.video_tokens.float().cpu(), clip.audio_tokens.float().cpu(),
                             clip.audio_attention, retention, patches_per_block=ppb, audio_tokens_per_block=apb)

    def audio_tokens_per_s(self) -> float:
        """Audio tokens per second (25 for Qwen2.5-Omni: 100 mel frames, two stride-2 stages)."""
        _, out = self.thinker.model.audio_tower._get_feat_extract_output_lengths(torch.tensor(200))
        return int(out) / 2.0

    # ------------------------------------------------------------------------------------------- prompt
    def _ids(self, text: str, untrusted: bool = False) -> list[int]:
        if not text:
            return []
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=untrusted)["input_ids"]

    def text_ids(self, question_text: str, pre_media_text: str = "",
                 system_prompt: str | None = None) -> tuple[list[int], list[int]]:
        """Ids before and after the media: ``(system + user header [+ pre_media_text], question + assistant
        header)``; ``pre_media_text`` is a prompt's text before the media (VLMEvalKit WorldSense's SYS item);
        ``system_prompt``: the system turn's text (``None``: :attr:`system_prompt`; OmniZip's WorldSense
        evaluation sends its own)."""
        system = self.system_prompt if system_prompt is None else system_prompt
        head = self._ids(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{pre_media_text}")
        tail = self._ids(question_text, untrusted=True) + self._ids("<|im_end|>\n<|im_start|>assistant\n")
        return head, tail

    @torch.no_grad()
    def build_inputs(self, clip: EncodedClip, prune: PruneResult | None, question_text: str,
                     pre_media_text: str = "", system_prompt: str | None = None) -> PromptInputs:
        """The query's LLM input: unpruned ids and positions, then the kept tokens gathered (module step 3).
        ``pre_media_text``, ``system_prompt``: see :meth:`text_ids`."""
        cfg = self.config
        t, n, _ = clip.video_tokens.shape
        n_a = clip.audio_tokens.shape[0]
        media = interleave_media_ids(tuple(int(x) for x in clip.video_grid_thw[0]),
                                     self.thinker.model.visual.spatial_merge_size, n_a, clip.second_per_grid,
                                     float(cfg.position_id_per_seconds), float(cfg.seconds_per_chunk),
                                     cfg.video_token_id, cfg.audio_token_id)
        head, tail = self.text_ids(question_text, pre_media_text, system_prompt)
        ids = torch.tensor(head + [cfg.vision_start_token_id, cfg.audio_start_token_id] + media
                           + [cfg.audio_end_token_id, cfg.vision_end_token_id] + tail, dtype=torch.long)
        pos, _ = self.thinker.model.get_rope_index(
            ids[None], None, clip.video_grid_thw, torch.ones(1, ids.numel(), dtype=torch.long),
            use_audio_in_video=True, audio_seqlens=torch.tensor([clip.mel_length]),
            second_per_grids=torch.tensor([clip.second_per_grid]))
        pos = pos[:, 0]  # (3, L)
        dev = self.device
        embeds = self.thinker.get_input_embeddings()(ids.to(dev))  # (L, D)
        v_slots = torch.nonzero(ids == cfg.video_token_id).flatten()
        a_slots = torch.nonzero(ids == cfg.audio_token_id).flatten()
        if v_slots.numel() != t * n or a_slots.numel() != n_a:
            raise RuntimeError(f"placeholders ({v_slots.numel()} video, {a_slots.numel()} audio) do not match the "
                               f"towers ({t * n} video, {n_a} audio)")
        audio_rows = clip.audio_tokens
        n_merged = 0
        keep = torch.ones(ids.numel(), dtype=torch.bool)
        if prune is not None:
            if prune.audio_merge is not None and prune.audio_merge.anchors.numel():
                audio_rows = audio_rows.clone()
                mg = prune.audio_merge
                audio_rows[mg.anchors.to(dev)] = merge_tokens(clip.audio_tokens, _to(mg, dev))
                n_merged = int(mg.anchors.numel())
            v_keep = torch.zeros(t * n, dtype=torch.bool)
            v_keep[prune.video_keep] = True
            a_keep = torch.zeros(n_a, dtype=torch.bool)
            a_keep[prune.audio_keep] = True
            keep[v_slots[~v_keep]] = False
            keep[a_slots[~a_keep]] = False
        embeds = embeds.clone()
        embeds[v_slots.to(dev)] = clip.video_tokens.reshape(t * n, -1).to(embeds.dtype)
        embeds[a_slots.to(dev)] = audio_rows.to(embeds.dtype)
        num_video = int(keep[v_slots].sum())
        num_audio = int(keep[a_slots].sum())
        return PromptInputs(input_ids=ids, full_position_ids=pos, keep=keep, embeds=embeds[keep.to(dev)],
                            position_ids=pos[:, keep], num_video=num_video, num_audio=num_audio,
                            num_text=int(keep.sum()) - num_video - num_audio, num_video_full=t * n,
                            num_audio_full=n_a, num_audio_merged=n_merged)

    # ------------------------------------------------------------------------------------------- LLM
    def _step(self, embeds: Tensor, positions: Tensor, cache: DynamicCache) -> Tensor:
        """(n, D) embeds at (3, n) positions on top of ``cache``; returns the last position's logits (V,)."""
        out = self.thinker.model.language_model(inputs_embeds=embeds[None],
                                                position_ids=positions.to(self.device)[:, None],
                                                past_key_values=cache, use_cache=True)
        return self.thinker.lm_head(out.last_hidden_state[:, -1])[0]

    @torch.no_grad()
    def answer(self, inputs: PromptInputs, max_new_tokens: int | None = None, measure_flops: bool = False) -> Answer:
        """Prefill the pruned prompt once (timed, peak memory, optionally FLOP-counted) and decode greedily."""
        from torch.utils.flop_counter import FlopCounterMode

        max_new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        dev = self.device
        cache = DynamicCache(config=self.text_config)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        measured = None
        t0 = time.perf_counter()
        if measure_flops:
            with FlopCounterMode(display=False) as counter:
                logits = self._step(inputs.embeds, inputs.position_ids, cache)
            measured = int(counter.get_total_flops())
        else:
            logits = self._step(inputs.embeds, inputs.position_ids, cache)
        _sync(dev)
        prefill_s = time.perf_counter() - t0
        if dev.type == "cuda":
            peak, kind = int(torch.cuda.max_memory_allocated(dev)), "cuda_max_allocated"
        else:
            peak, kind = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process_max_rss"
        last_logits = logits.float().cpu()
        next_pos = int(inputs.position_ids.max()) + 1
        tokens: list[int] = []
        embed = self.thinker.get_input_embeddings()
        for i in range(max_new):
            tok = int(logits.argmax())
            if tok in self.eos_ids:
                break
            tokens.append(tok)
            if i == max_new - 1:
                break
            p = torch.full((3, 1), next_pos + i, dtype=torch.long)
            logits = self._step(embed(torch.tensor([tok], device=dev)), p, cache)
        return Answer(text=self.tokenizer.decode(tokens, skip_special_tokens=True), token_ids=tokens,
                      prefill_seconds=prefill_s, peak_memory_bytes=peak, peak_memory_kind=kind,
                      measured_flops=measured, last_logits=last_logits)


def _to(merge, device):
    from algorithms.pruning import AnchorMerge

    return AnchorMerge(anchors=merge.anchors.to(device), sources=merge.sources.to(device),
                       weights=merge.weights.to(device))
