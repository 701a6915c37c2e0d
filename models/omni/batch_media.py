"""Batched media encoding of the lockstep batch runner: per row, every stream's payload audio and video through one
log-mel / video-processor call and one tower call, and the payloads' TMRoPE layouts (:class:`LockstepMediaEncoder`).

How the media reach the device, what is reused and why the outputs equal the one-session path's is described in
``models/omni/batch.py``. Legend: B streams of a group, N tokens of one payload, D hidden size.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (get_audio_cu_seqlens, get_pool_indices,
                                                                    get_valid_indices)
from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids, get_vision_window_index

from .batch_accounting import COMPUTED_FIELDS
from .thinker_media import AUDIO_SAMPLE_RATE, frame_indices, frames_tensor, past_samples, video_inputs


@dataclass
class _Stream:
    """One session of a lockstep group: its media, its output states and what the schedule has committed."""

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



def _is_flash(config) -> bool:
    return "flash" in str(getattr(config, "_attn_implementation", ""))



class LockstepMediaEncoder:
    """Encodes one row (or a run of rows) of payloads for every stream of a lockstep group: each native block's
    media to the device once (``_load_block``), one log-mel and one audio-tower call (``_audio``), one
    video-processor and one vision-tower call with completed-patch reuse (``_video``), the towers' index tensors
    and the payload layouts cached per shape (``_audio_kwargs``, ``_vision_kwargs``, ``_layout``).

    Uses the owner's ``runner``, ``_part`` (:class:`~.batch_accounting.PartTimer`), ``_audio_tower`` and the
    caches ``_audio_kw``, ``_vision_kw``, ``_layouts``, ``_grid``.
    """

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

    def _encode_rows(self, active: list[_Stream], block_audio: torch.Tensor, spans: list[tuple[int, int]],
                     reuse: bool, first_frame: int):
        """The payloads ``(a, z]`` of ``spans`` (consecutive rows of one native block) for every stream of
        ``active``: ``(rows, videos, rows_idx)`` with one ``_RowPayload`` per span (video tokens then audio tokens,
        (B, N, D) in the model dtype, and its layout), the vision-tower outputs per span (None: no frame) and the
        frame indices per span. ``first_frame``: index of the first frame of the block."""
        r = self.runner
        rows_idx = [[k for k in frame_indices(a, z, r.geometry.frame_ms) if k < len(active[0].frames)]
                    for a, z in spans]
        if any(rows_idx):
            videos, n_patches, hh, ww = self._video(active, rows_idx, reuse, first_frame)
        else:
            videos, n_patches, hh, ww = [None] * len(spans), [0] * len(spans), 0, 0
        audios = self._audio(active, block_audio, spans)
        rows: list[_RowPayload] = []
        for (a, z), video, n_patch, audio in zip(spans, videos, n_patches, audios):
            blk, rel_pos, shift, rel_d, shift_d = self._layout(a, z, n_patch, hh, ww, audio.shape[1])
            emb = (torch.cat([video, audio], 1) if n_patch else audio).to(r.dtype)  # (B, N, D)
            rows.append(_RowPayload(emb, blk, rel_pos, shift, rel_d, shift_d, n_patch))
        return rows, videos, rows_idx
