"""Budgeted VideoLLaMA3: encode frames, compress groups with qbase, build ``inputs_embeds``, answer from one prefix.

Legend: T frames, hw merged tokens per frame, C vision hidden size, D LLM hidden size, K rows per compressed group,
G_c compressed groups, N vision rows in the LLM input.

The model is transformers' own ``VideoLlama3ForConditionalGeneration`` loaded with ``from_pretrained`` from a local
directory; preprocessing is transformers' ``VideoLlama3VideoProcessor`` at the size the plan needs. The checkpoint
directory additionally holds ``qbase/`` (the group compressor, :mod:`models.videollama3.qbase`) and, for ``raw_mode="orig"``,
``original_projector/model.safetensors``.

LLM input (DESIGN §3.6): blocks in time order inside the user turn, before the question. A raw frame is
``Time {t:.1f}s:`` + its rows, then ``,`` (``\\n`` after the last block); a compressed group is
``Time:{a}s-{b}s:<|compression_start|>`` + K rows + ``<|compression_end|>`` (``\\n`` after it when last), with
``a``/``b`` the first/last frame times as ``int(round(t))`` whole seconds (seed 001, half to even). Vision rows enter as ``inputs_embeds`` at
``<|video_pad|>`` positions; dataset text is tokenized with ``split_special_tokens=True``, so no question, option
or subtitle can create a placeholder or end the user turn.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from algorithms.budget import (
    K_ROWS, CELL_PIXELS, MIN_TOKENS_PER_FRAME, Plan, frame_grid, frame_token_cap, plan_groups, subsample,
)
from algorithms.errors import CheckpointError, SettingError
from ..loading import local_checkpoint, reading_checkpoint
from .qbase import TransformerDecoderFlatCompressor, load_state_dict_strict
from ..vision_attention import frame_layout

log = logging.getLogger(__name__)

QBASE_DIR = "qbase"
ORIGINAL_PROJECTOR_DIR = "original_projector"
COMPRESSION_START = "<|compression_start|>"
COMPRESSION_END = "<|compression_end|>"
_VIDEO_MARK = "\x00VIDEO\x00"
_TEXT_MARK = "\x00TEXT\x00"


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work so stage timings are real (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def group_second(x: float) -> int:
    """Whole seconds of a compressed group's label, as seed 001 ``build_video`` computes them:
    ``sec = [int(round(t)) for t in ts]`` (Python's ``round``: half to even, 2.5 -> 2, 3.5 -> 4)."""
    return int(round(x))


@dataclass
class VideoPrompt:
    """The shared prefix of one (video, budget): token ids with placeholders, and the vision rows for them.

    Attributes:
        ids: (L,) prefix token ids (system + user header + video blocks, ending with the video's last separator).
        vision_embeds: (N, D) rows for the N placeholder positions of ``ids``, in order.
        last_text: the text of the prefix's last text piece (after the last vision row), tokenized alone at the
            end of ``ids``; the question is appended to it for the fallback check of DESIGN §3.7.
        last_text_len: number of tokens of that last piece at the end of ``ids``.
        answer_prefix: text put after the assistant header, before the answer (MLVU's ``"Best Option: ("``);
            ``""`` for none (:meth:`BudgetedVideoLlama3.with_chat`).
    """

    ids: torch.Tensor
    vision_embeds: torch.Tensor
    last_text: str
    last_text_len: int
    answer_prefix: str = ""


@dataclass
class Answer:
    """One greedy answer: generated token ids (without the prompt), decoded text, prompt length, fallback flag."""

    token_ids: list[int]
    text: str
    seq_len: int
    fallback: bool = False


class BudgetedVideoLlama3(nn.Module):
    """VideoLLaMA3 + qbase compressor with budgeted layouts and shared-prefix answering."""

    # decode-step kinds a CUDA graph was captured for in this process: (model, dtype, fused kernels on, ``q == 1``;
    # PyTorch specializes size-1 dimensions, so a one-row step may compile the fused kernels anew); a capture of a
    # kind seen before skips the warm-up (nothing is left to compile or initialise lazily)
    _graph_warm: set = set()

    def __init__(self, model, tokenizer, video_processor, compressor: TransformerDecoderFlatCompressor,
                 original_projector: nn.Module | None = None):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.video_processor = video_processor
        if compressor.num_queries != K_ROWS:
            raise CheckpointError(f"the token compressor has num_queries={compressor.num_queries}, but the budget "
                                  f"planner's compressed group is K={K_ROWS} rows (seeds 000/001: bd.K)")
        self.compressor = compressor
        self.original_projector = original_projector
        self.placeholder_id = int(model.config.video_token_id)
        self.eos_ids = sorted({i for i in (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id,
                                           tokenizer.convert_tokens_to_ids("<|endoftext|>")) if i is not None})
        for tok in (COMPRESSION_START, COMPRESSION_END):
            if tokenizer.convert_tokens_to_ids(tok) in (None, tokenizer.unk_token_id):
                raise ValueError(f"tokenizer has no special token {tok!r}")
        self._template = self._split_chat_template()
        self._fused = False      # fused kernels bound, LLM and vision encoder (set_fused_kernels)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | str = torch.float32,
                        attn_implementation: str | None = "sdpa", raw_mode: str = "phase3",
                        vision_attn_implementation: str | None = "frame_batched",
                        fused_kernels: bool = True, original_projector: str | Path | None = None,
                        vision_config_dir: str | Path | None = None) -> "BudgetedVideoLlama3":
        """Load a transformers-format VideoLLaMA3 directory plus ``qbase/`` (and ``original_projector/``).

        A directory in the original VideoLLaMA3 layout (``config.json`` with ``vision_encoder_config``, weights named
        as in the original repository, ``model.token_compressor.*``) is also accepted and mapped in memory by
        :func:`models.videollama3.convert.load_original_parts` (the same table as ``python -m models.videollama3.convert``).

        ``vision_attn_implementation``: ``"frame_batched"`` (default) attends all same-size frames of an encode in
        one SDPA call per layer (:mod:`models.vision_attention`); any transformers backend name is passed through;
        ``None`` keeps ``attn_implementation``. ``fused_kernels``: see :meth:`set_fused_kernels`.
        ``original_projector``: for ``raw_mode="orig"``, a projector file (safetensors, or seed 001's ``.pt`` state
        dict read with ``weights_only=True``) instead of ``original_projector/`` in the directory.
        ``vision_config_dir``: an original-layout checkpoint without ``vision_encoder_config``: a local directory
        with the vision encoder's ``config.json`` (see :mod:`models.videollama3.convert`).

        Raises:
            FileNotFoundError: the directory or a required file is missing (path named).
            ValueError: missing/unexpected weight keys (listed).
        """
        from transformers import AutoTokenizer, AutoVideoProcessor, VideoLlama3ForConditionalGeneration

        path = cls.checkpoint_dir(path)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        from .convert import is_original_layout, load_original_parts
        if is_original_layout(path):  # original VideoLLaMA3 layout: mapped in memory (models/videollama3/convert.py)
            return cls(*load_original_parts(path, dtype, attn_implementation, raw_mode, original_projector,
                                            vision_config_dir)).set_vision_attention(
                vision_attn_implementation).set_fused_kernels(fused_kernels)
        with reading_checkpoint(path):
            model, info = VideoLlama3ForConditionalGeneration.from_pretrained(
                path, dtype=dtype, attn_implementation=attn_implementation, output_loading_info=True)
            bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
            if bad:
                raise CheckpointError(f"{path}: checkpoint weights do not match VideoLlama3ForConditionalGeneration: "
                                      f"{bad}")
            tokenizer = AutoTokenizer.from_pretrained(path)
            video_processor = AutoVideoProcessor.from_pretrained(path)
        compressor = TransformerDecoderFlatCompressor.from_pretrained(path / QBASE_DIR).to(dtype)
        orig = None
        if raw_mode == "orig":
            from .convert import find_original_projector, projector_state_from
            w = Path(original_projector) if original_projector is not None else find_original_projector(path)
            if w is None or not w.exists():
                raise FileNotFoundError(f"raw_mode='orig' needs the original projector: "
                                        f"{w or path / ORIGINAL_PROJECTOR_DIR / 'model.safetensors'} (or one *.pt in "
                                        f"{path / ORIGINAL_PROJECTOR_DIR}, or original_projector=PATH)")
            orig = type(model.model.projector)(model.config)
            with reading_checkpoint(w):
                load_state_dict_strict(orig, projector_state_from(w), str(w))
            orig = orig.to(dtype)
        model.requires_grad_(False)  # inference only: no autograd graph can ever hold activations
        compressor.requires_grad_(False)
        return cls(model.eval(), tokenizer, video_processor, compressor.eval(),
                   orig.eval() if orig is not None else None).set_vision_attention(
            vision_attn_implementation).set_fused_kernels(fused_kernels)

    def set_fused_kernels(self, on: bool) -> "BudgetedVideoLlama3":
        """Run the LLM's RMSNorm, rotary and SiLU gate as single fused kernels on CUDA, and in the vision encoder the
        MLP's fc1 + GELU as one GEMM and each residual add with the LayerNorm after it as one kernel
        (:mod:`models.kernels`; the library's math, eager and bit-identical on the CPU), or restore the library's
        forwards (``on=False``; the project's own fused pieces, the vision rotary and the shared-prefix merge, stay
        compiled)."""
        from ..kernels import fuse

        fuse(self.model.model.language_model, on)
        fuse(self.model.model.vision_model, on)
        self._fused = on
        return self

    @staticmethod
    def checkpoint_dir(path: str | Path) -> Path:
        """``path`` as a local checkpoint directory (one with ``config.json``).

        Raises:
            FileNotFoundError: naming the path (and how to build the demo checkpoint).
        """
        return local_checkpoint(path, "VideoLLaMA3", "for the demo run `python -m models.videollama3.tiny` first")

    def set_vision_attention(self, implementation: str | None) -> "BudgetedVideoLlama3":
        """Select the vision encoder's attention backend (``"frame_batched"``, a transformers name, or ``None``)."""
        from .. import vision_attention

        if implementation is not None:
            batched = implementation == "frame_batched"
            if batched:
                implementation = vision_attention.register()
            self.model.set_attn_implementation({"vision_config": implementation})
            vision_attention.bind(self.model.model.vision_model, batched)
        return self

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    # ------------------------------------------------------------------ vision
    @torch.no_grad()
    def encode(self, frames: torch.Tensor, max_tokens: int, chunk_frames: int = 64,
               grid: tuple[int, int] | None = None) -> tuple[torch.Tensor, tuple[int, int]]:
        """Vision-encoder rows of frames resized to at most ``max_tokens`` merged cells each.

        Args:
            frames: (T, H, W, 3) uint8 RGB frames.
            max_tokens: the per-frame cap (:func:`algorithms.budget.frame_token_cap`); the VideoLLaMA3 video
                processor resizes with ``smart_resize(max_pixels = max_tokens * 28²)``, whose grid is
                :func:`algorithms.budget.frame_grid` ``(H, W, max_tokens)``.
            chunk_frames: frames per encoder call (attention is per frame, so chunking changes nothing).
            grid: the frames are already the processor's resize to this grid (``28 gh x 28 gw`` pixels,
                :class:`datamodules.decoding.EncoderFrames`): not resized again.

        Returns:
            ``(rows, (gh, gw))``: rows (T, gh * gw, C) merged encoder rows (before the projector), row-major.

        Raises:
            RuntimeError: the processor's grid differs from ``frame_grid`` (a preprocessing mismatch).
        """
        gh, gw = grid or frame_grid(frames.shape[1], frames.shape[2], max_tokens)
        out = []
        for s in range(0, frames.shape[0], chunk_frames):
            clip = frames[s:s + chunk_frames]
            t = clip.shape[0]
            inputs = self.video_processor(
                videos=[clip.permute(0, 3, 1, 2)], do_sample_frames=False, use_token_compression=False,
                do_resize=grid is None,
                size={"shortest_edge": min(MIN_TOKENS_PER_FRAME, max_tokens) * CELL_PIXELS ** 2,
                      "longest_edge": max_tokens * CELL_PIXELS ** 2 * t},
                return_tensors="pt")
            thw = inputs["video_grid_thw"]
            if tuple(thw[0].tolist()) != (t, 2 * gh, 2 * gw):
                raise RuntimeError(f"video processor produced grid {thw[0].tolist()}, frame_grid says "
                                   f"{(t, 2 * gh, 2 * gw)} for frames of {tuple(clip.shape[1:3])}")
            with frame_layout(t, 4 * gh * gw):   # frames of one size: no per-layer read of the boundaries
                vis = self.model.model.vision_model(
                    pixel_values=inputs["pixel_values_videos"].to(self.device, self.dtype),
                    grid_thw=thw.to(self.device), merge_sizes=inputs["video_merge_sizes"].to(self.device))
            out.append(vis.last_hidden_state.view(t, gh * gw, -1))
        return torch.cat(out), (gh, gw)

    def project(self, rows: torch.Tensor, original: bool = False) -> torch.Tensor:
        """(..., C) vision rows -> (..., D) LLM rows through the checkpoint projector (or the original one)."""
        proj = self.original_projector if original else self.model.model.projector
        if proj is None:
            raise SettingError("raw_mode='orig' needs the original projector (load with raw_mode='orig')")
        return proj(rows)

    @torch.no_grad()
    def compress(self, rows: torch.Tensor, plan: Plan, grid: tuple[int, int]) -> torch.Tensor:
        """qbase rows of the plan's compressed groups, from one compressor call over the whole video.

        As seed 001's ``build_video``: ``cu = [0] + cumsum([L * hw for L in plan.seg_lens])``, ``comp_rows =
        qb(feats, cu, [(hh, ww)] * len(plan.seg_lens))`` with ``qb.adaptive_segmentation = False``, group j's rows
        ``comp_rows[j * K:(j + 1) * K]``. Every group is a window of that call, raw ones included, because with
        ``match_encoder_scale`` the output statistics span the call; without it windows are independent, so only
        the compressed groups are run (the same rows, less work).

        Args:
            rows: (T, hw, C) encoder rows of the plan's frames.
            grid: ``(gh, gw)`` with ``gh * gw = hw``.

        Returns:
            (G_c, K, C) compressed rows (before the projector), in group order.
        """
        k, c = self.compressor.num_queries, rows.shape[-1]
        if not plan.compressed:
            return rows.new_zeros(0, k, c)
        bounds = plan.group_bounds()
        windows = range(len(bounds)) if self.compressor.match_encoder_scale else plan.compressed
        feats = torch.cat([rows[bounds[g][0]:bounds[g][1]].reshape(-1, c) for g in windows])
        cu = [0]
        for g in windows:
            cu.append(cu[-1] + (bounds[g][1] - bounds[g][0]) * rows.shape[1])
        saved = self.compressor.adaptive_segmentation
        self.compressor.adaptive_segmentation = False      # the plan gives the cut; each window -> K rows
        try:
            out = self.compressor(feats, cu, [tuple(grid)] * len(windows)).view(len(windows), k, c)
        finally:
            self.compressor.adaptive_segmentation = saved
        if self.compressor.match_encoder_scale:
            out = out[list(plan.compressed)]
        return out

    # ------------------------------------------------------------------ text
    def _split_chat_template(self, system: str | None = None) -> tuple[str, str, str]:
        """The chat template rendered around a video marker and a text marker: ``(head, mid, tail)``; ``system``:
        a system message before the user turn (``None``: the template's default).

        Rendered as seed 001 ``prompt_embeds`` does, ``apply_chat_template(msgs, tokenize=False,
        add_generation_prompt=True, add_system_prompt=True)``: VideoLLaMA3's template
        (chicheng567/OnlineLong@0b046341:videollama3/model/processor.py:DEFAULT_CHAT_TEMPLATE) writes its system
        turn ``<|im_start|>system\nYou are VideoLLaMA3 created by Alibaba DAMO Academy, a helpful assistant to help
        people understand images and videos.<|im_end|>\n`` only when ``add_system_prompt`` is set; templates that
        do not read the flag (plain ChatML) render unchanged."""
        msgs = [{"role": "user", "content": _VIDEO_MARK + _TEXT_MARK}]
        if system is not None:
            msgs.insert(0, {"role": "system", "content": system})
        text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                  add_system_prompt=True)
        if _VIDEO_MARK not in text or _TEXT_MARK not in text:
            raise ValueError("the tokenizer's chat template does not place string user content verbatim")
        if system is not None and system not in text.split(_VIDEO_MARK)[0]:
            raise ValueError("the tokenizer's chat template does not place a string system message verbatim")
        head, rest = text.split(_VIDEO_MARK)
        mid, tail = rest.split(_TEXT_MARK)
        return head, mid, tail

    def with_chat(self, prompt: VideoPrompt, system: str | None = None, answer_prefix: str = "",
                  pre_media_text: str = "") -> VideoPrompt:
        """``prompt`` with the chat template's head rendered with the system message ``system`` (``None``: the
        template's default) and ``answer_prefix`` put after the assistant header (a released prompt's
        ``"Best Option: ("``, MLVU ``choice_bench.py``). The same ids a prefix built with that head would have: the
        head is tokenized alone at the start of every prefix (:meth:`build_prompt`). ``pre_media_text``: a prompt's
        text before the video in the user turn (VLMEvalKit WorldSense's SYS item), tokenized with the head.

        Raises:
            ValueError: ``prompt`` does not start with the default head's ids.
        """
        default = self._ids(self._template[0])
        n = len(default)
        if prompt.ids[:n].tolist() != default:
            raise ValueError("the prompt does not start with the chat template's default head")
        head_text = self._split_chat_template(system)[0] if system is not None else self._template[0]
        head = self._ids(head_text + pre_media_text) if (system is not None or pre_media_text) else default
        ids = torch.cat([torch.tensor(head, dtype=prompt.ids.dtype), prompt.ids[n:]])
        return VideoPrompt(ids=ids, vision_embeds=prompt.vision_embeds, last_text=prompt.last_text,
                           last_text_len=prompt.last_text_len, answer_prefix=answer_prefix)

    def _ids(self, text: str, untrusted: bool = False) -> list[int]:
        if not text:
            return []
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=untrusted)["input_ids"]

    def build_prompt(self, plan: Plan, times_s: list[float], raw_rows: torch.Tensor,
                     group_rows: torch.Tensor, groups_as_raw: bool = False,
                     subtitle_slots: list[list[str]] | None = None) -> VideoPrompt:
        """The shared prefix for one (video, budget).

        Args:
            plan: the layout.
            times_s: T frame times (s) of the plan's frames.
            raw_rows: (n_raw_frames, raw_hw, D) projected rows of the raw frames, in time order.
            group_rows: (G_c, K, D) projected rows of the compressed groups, in time order.
            groups_as_raw: layout ablations' compressor swaps (DESIGN §4): each compressed group ``[a, b)`` is
                written as one raw frame, ``Time {t:.1f}s:`` + its rows (no compression tokens), with ``t`` the
                time of its middle frame ``a + (b - a - 1) // 2``; ``group_rows`` is then (G_c, K', D).
            subtitle_slots: T+1 lists, ``[k]`` the subtitle texts that go before frame ``k`` (``[T]`` after the
                last; ``datamodules.benchmarks.subtitles.interleave_slots``). As VideoLLaMA3's LongVideoBench
                evaluation renders them (its chat template: a video chunk ends with ``\n``, a text item follows
                verbatim, the next chunk's ``Time`` right after it): the block before them ends with ``\n``, the
                texts follow with nothing between. A slot inside a compressed group goes after the group.
                Subtitle text is tokenized as dataset text (``split_special_tokens``).

        Returns:
            A :class:`VideoPrompt`.
        """
        head, mid, _ = self._template
        ids: list[int] = self._ids(head)
        embeds = []
        blocks = plan.blocks()
        text = ""
        ri = gi = 0
        cs, ce = (self.tokenizer.convert_tokens_to_ids(t) for t in (COMPRESSION_START, COMPRESSION_END))
        subs = False

        def interleave(text: str, lo: int, hi: int) -> str:   # slots lo..hi-1 after the previous block
            nonlocal subs
            got = "".join(t for k in range(lo, hi) for t in subtitle_slots[k])
            if not got:
                return text
            subs = True
            return ("\n" if text in (",", "") and lo > 0 else text) + got

        done = 0     # slots placed so far
        for bi, (kind, a, b) in enumerate(blocks):
            last = bi == len(blocks) - 1
            if subtitle_slots is not None:
                text, done = interleave(text, done, a + 1), a + 1
            if kind == "raw":
                ids += self._ids(text + f"Time {times_s[a]:.1f}s:", untrusted=subs)
                rows = raw_rows[ri]
                ri += 1
                ids += [self.placeholder_id] * rows.shape[0]
                embeds.append(rows)
                text = "\n" if last else ","
            elif groups_as_raw:
                ids += self._ids(text + f"Time {times_s[a + (b - a - 1) // 2]:.1f}s:", untrusted=subs)
                rows = group_rows[gi]
                gi += 1
                ids += [self.placeholder_id] * rows.shape[0]
                embeds.append(rows)
                text = "\n" if last else ","
            else:
                ids += self._ids(text + f"Time:{group_second(times_s[a])}s-{group_second(times_s[b - 1])}s:",
                                 untrusted=subs) + [cs]
                rows = group_rows[gi]
                gi += 1
                ids += [self.placeholder_id] * rows.shape[0] + [ce]
                embeds.append(rows)
                text = "\n" if last else ""
        if subtitle_slots is not None:
            text = interleave(text, done, len(subtitle_slots))
        text += mid
        last_ids = self._ids(text, untrusted=subs)
        ids += last_ids
        vision = torch.cat(embeds) if embeds else raw_rows.new_zeros(0, raw_rows.shape[-1])
        return VideoPrompt(ids=torch.tensor(ids, dtype=torch.long), vision_embeds=vision, last_text=text,
                           last_text_len=len(last_ids))

    def question_ids(self, prompt: VideoPrompt, question_text: str) -> tuple[list[int], bool]:
        """Token ids that follow the prefix for one question, and whether the prefix is *not* reusable.

        The reference is the whole text after the last vision row (``prompt.last_text + question``) tokenized in
        one piece, as a plain pass would. If its first tokens differ from the prefix's own tokenization of
        ``prompt.last_text`` (a BPE merge across the boundary), the shared prefix cannot be used: the returned ids
        then replace the prefix's last piece, and ``fallback`` is True (DESIGN §3.7).

        The template's tail (user turn end, assistant header) and ``prompt.answer_prefix`` are tokenized together
        after the question, as the one text they are in a plain pass.

        Returns:
            ``(ids, fallback)``: without fallback, the ids to append to the full prefix; with fallback, the ids
            to append to ``prompt.ids[:-prompt.last_text_len]``.
        """
        _, _, tail = self._template
        whole = self._ids(prompt.last_text + question_text, untrusted=True)
        n = prompt.last_text_len
        own = prompt.ids[len(prompt.ids) - n:].tolist() if n else []
        tail_ids = self._ids(tail + prompt.answer_prefix)
        if whole[:n] == own:
            return whole[n:] + tail_ids, False
        return whole + tail_ids, True

    # ------------------------------------------------------------------ LLM
    def embed(self, ids: torch.Tensor, vision_embeds: torch.Tensor) -> torch.Tensor:
        """(L,) ids + (N, D) rows -> (1, L, D) ``inputs_embeds`` with rows at the N placeholder positions.

        Raises:
            ValueError: the placeholder count differs from N.
        """
        ids = ids.to(self.device)
        emb = self.model.get_input_embeddings()(ids)
        mask = ids == self.placeholder_id
        if int(mask.sum()) != vision_embeds.shape[0]:
            raise ValueError(f"{int(mask.sum())} placeholders for {vision_embeds.shape[0]} vision rows")
        emb = emb.clone()
        emb[mask] = vision_embeds.to(emb.dtype)
        return emb.unsqueeze(0)

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int, cache=None, inputs_embeds=None,
                  ignore_eos: bool = False) -> list[int]:
        out = self.model.generate(
            input_ids=input_ids.view(1, -1).to(self.device), inputs_embeds=inputs_embeds, past_key_values=cache,
            max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens if ignore_eos else None, do_sample=False,
            num_beams=1, temperature=None, top_p=None, top_k=None, eos_token_id=self.eos_ids,
            pad_token_id=self.tokenizer.pad_token_id, use_cache=True)
        new = out[0, input_ids.numel():].tolist()  # generate returns prompt + new tokens when input_ids is given
        if new and new[-1] in self.eos_ids and not ignore_eos:
            new = new[:-1]
        return new

    def _answer(self, tokens: list[int], seq_len: int, fallback: bool) -> Answer:
        return Answer(token_ids=tokens, text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                      seq_len=seq_len, fallback=fallback)

    @torch.no_grad()
    def answer_from_scratch(self, prompt: VideoPrompt, question_text: str, max_new_tokens: int = 16,
                            ignore_eos: bool = False) -> Answer:
        """Reference path: prefill the whole prompt (prefix + question) in one pass and decode greedily
        (``ignore_eos``: exactly ``max_new_tokens`` tokens)."""
        q_ids, fallback = self.question_ids(prompt, question_text)
        base = prompt.ids if not fallback else prompt.ids[: len(prompt.ids) - prompt.last_text_len]
        full = torch.cat([base, torch.tensor(q_ids, dtype=torch.long)])
        emb = self.embed(full, prompt.vision_embeds)
        return self._answer(self._generate(full, max_new_tokens, inputs_embeds=emb, ignore_eos=ignore_eos), full.numel(),
                            fallback)

    @torch.no_grad()
    def answer_all(self, prompt: VideoPrompt, question_texts: list[str], max_new_tokens: int = 16,
                   ignore_eos: bool = False) -> list[Answer]:
        """Answer every question of a (video, budget) from one prefilled prefix (DESIGN §3.7).

        The prefix is prefilled once into a ``DynamicCache``; each question then runs ``generate`` on the full
        ids, which only feeds the uncached question tokens, and the cache is cropped back to the prefix.
        A question whose text merges with the prefix's last piece falls back to :meth:`answer_from_scratch`.
        """
        cache = self.prefill(prompt)
        prefix_len = prompt.ids.numel()
        answers = []
        for text in question_texts:
            q_ids, fallback = self.question_ids(prompt, text)
            if fallback:
                answers.append(self.answer_from_scratch(prompt, text, max_new_tokens, ignore_eos))
                continue
            full = torch.cat([prompt.ids, torch.tensor(q_ids, dtype=torch.long)])
            tokens = self._generate(full, max_new_tokens, cache=cache, ignore_eos=ignore_eos)
            cache.crop(prefix_len - cache.get_seq_length())  # negative: tokens to drop (transformers 5 API)
            answers.append(self._answer(tokens, full.numel(), False))
        return answers


    @torch.no_grad()
    def prefill(self, prompt: VideoPrompt):
        """Prefill the shared prefix once; returns the ``DynamicCache`` holding its keys/values (batch 1)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config.get_text_config())
        # the base model only: no lm_head (VideoLlama3ForConditionalGeneration ignores logits_to_keep and would
        # compute logits for every prefix position, ~5 GB at 16k rows on 7B shapes)
        self.model.model(inputs_embeds=self.embed(prompt.ids, prompt.vision_embeds), past_key_values=cache,
                         use_cache=True)
        return cache

    @torch.no_grad()
    def answer_batched(self, prompt: VideoPrompt, question_texts: list[str], max_new_tokens: int = 16,
                       ignore_eos: bool = False, decode: str = "dynamic") -> list[Answer]:
        """Answer all questions of a (video, budget) together from one prefilled prefix, greedy.

        The prefix cache (batch 1) is repeated to Q rows; the question suffixes are left-padded *inside the
        suffix region* so they end in the same column, with a 2-D attention mask hiding the pads and explicit
        position ids ``L + j`` for the j-th real suffix token (so every row sees exactly the positions of the
        one-by-one path); then Q tokens are decoded per step until every row has produced an end token or
        ``max_new_tokens``. Token-identical to :meth:`answer_all` up to floating-point reduction order (tested
        exact on the tiny fp32 model). Questions that need the fallback of DESIGN §3.7 are answered alone.

        Args:
            ignore_eos: decode exactly ``max_new_tokens`` tokens (benchmarks with forced answer length).
            decode: ``dynamic`` (``DynamicCache``, masks built by transformers each step), ``static``
                (a ``StaticCache`` of fixed length and a prepared 4-D mask updated in place: fixed shapes every
                step) or ``graph`` (``static`` with the decode step captured once as a CUDA graph and replayed;
                CUDA only).
        """
        if decode not in ("dynamic", "static", "graph"):
            raise SettingError(f"decode must be 'dynamic', 'static' or 'graph', got {decode!r}")
        answers: list[Answer | None] = [None] * len(question_texts)
        batch, rows = [], []
        for i, text in enumerate(question_texts):
            ids, fallback = self.question_ids(prompt, text)
            if fallback:
                answers[i] = self.answer_from_scratch(prompt, text, max_new_tokens, ignore_eos)
            else:
                batch.append(ids)
                rows.append(i)
        if not batch:
            return answers
        dev = self.device
        prefix_len = prompt.ids.numel()
        q = len(batch)
        longest = max(len(x) for x in batch)
        pad = self.tokenizer.pad_token_id or 0
        inp = torch.full((q, longest), pad, dtype=torch.long)
        valid = torch.zeros(q, prefix_len + longest, dtype=torch.bool)   # keys a row may attend (pads excluded)
        valid[:, :prefix_len] = True
        pos = torch.full((q, longest), prefix_len, dtype=torch.long)
        for r, ids in enumerate(batch):
            n = len(ids)
            inp[r, longest - n:] = torch.tensor(ids)
            valid[r, prefix_len + longest - n:] = True
            pos[r, longest - n:] = prefix_len + torch.arange(n)
        # everything the host sends is on the device before the prefill is launched: from here to the final read of
        # the tokens nothing waits for the GPU, so the host-side work of the answer stage overlaps the prefill
        inp, valid, pos = inp.to(dev), valid.to(dev), pos.to(dev)
        eos = torch.tensor(self.eos_ids, device=dev)
        static = None
        if decode != "dynamic":
            static = self._suffix_cache(q, longest + max_new_tokens)
        cache = self.prefill(prompt)                                            # batch 1
        if decode == "dynamic":
            if q > 1:
                cache.batch_repeat_interleave(q)
            mask = valid.long()
            out = self.model(input_ids=inp, attention_mask=mask, position_ids=pos, past_key_values=cache,
                             use_cache=True, logits_to_keep=1)

            def step_fn(nxt: torch.Tensor, step: int) -> torch.Tensor:
                nonlocal mask
                mask = torch.cat([mask, mask.new_ones(q, 1)], 1)
                return self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos[:, -1:] + step,
                                  past_key_values=cache, use_cache=True).logits

            gen = self._greedy(out.logits, step_fn, q, max_new_tokens, ignore_eos, eos)
        else:
            with self._shared_prefix_attention(cache):
                out, step_fn = self._static_decoder(static, inp, valid, pos, max_new_tokens,
                                                    graph=decode == "graph")
                gen = self._greedy(out.logits, step_fn, q, max_new_tokens, ignore_eos, eos)
        for r, i in enumerate(rows):
            toks = gen[r]
            if not ignore_eos:
                for j, t in enumerate(toks):
                    if t in self.eos_ids:
                        toks = toks[:j]
                        break
            answers[i] = self._answer(toks, prefix_len + len(batch[r]), False)
        return answers

    @staticmethod
    def _greedy(logits: torch.Tensor, step_fn, q: int, max_new_tokens: int, ignore_eos: bool,
                eos: torch.Tensor) -> list[list[int]]:
        """Greedy decoding of Q rows from the suffix logits: (Q, steps) token ids."""
        tokens = []
        done = torch.zeros(q, dtype=torch.bool, device=logits.device)
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1)                                      # (Q,)
            tokens.append(nxt)
            if not ignore_eos:
                done |= torch.isin(nxt, eos)
                if bool(done.all()):
                    break
            if step == max_new_tokens - 1:
                break
            logits = step_fn(nxt, step + 1)
        return torch.stack(tokens, 1).tolist()

    @contextlib.contextmanager
    def _shared_prefix_attention(self, cache):
        """Inside the block the LLM attends through :mod:`models.videollama3.shared_prefix` over ``cache`` (the prefill's)."""
        from . import shared_prefix

        name = shared_prefix.register()
        text_cfg = self.model.config.get_text_config()
        old = text_cfg._attn_implementation
        self.model.set_attn_implementation({"text_config": name})
        try:
            with shared_prefix.shared_prefix(cache.layers):
                yield
        finally:
            self.model.set_attn_implementation({"text_config": old})

    def _suffix_cache(self, rows: int, length: int):
        """A ``StaticCache`` of ``length`` positions for ``rows`` question rows, allocated now (not lazily at the
        first update, which would copy host data to the device and wait for the GPU mid-answer)."""
        from transformers import StaticCache

        cfg = self.model.config.get_text_config()
        sc = StaticCache(config=cfg, max_cache_len=length)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        sc.early_initialization(rows, cfg.num_key_value_heads, head_dim, self.dtype, self.device)
        return sc

    def _static_decoder(self, sc, inp: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor, max_new_tokens: int,
                        graph: bool):
        """Suffix prefill + a fixed-shape decode step over the suffix-only ``StaticCache`` ``sc`` (optionally a replayed
        CUDA graph), attending to the shared prefix through :mod:`models.videollama3.shared_prefix` (call inside
        :meth:`_shared_prefix_attention`).

        Layout of the static cache per row: ``[suffix (left-padded to n) | decode steps]``; the prefix stays in the
        prefill's batch-1 cache. The mask covers the suffix region only: an additive 4-D ``(Q, 1, 1, n + R)``
        buffer whose column for the step's own key is opened in place before each step, so the step itself has
        fixed shapes and addresses (what a CUDA graph needs).

        Returns:
            ``(suffix output, step_fn)`` with ``step_fn(next_tokens (Q,), step) -> logits (Q, 1, V)``.
        """
        q, longest = inp.shape
        prefix_len = valid.shape[1] - longest
        s0 = longest
        total = s0 + max_new_tokens
        dev, dtype = self.device, self.dtype
        neg = torch.finfo(dtype).min
        keys = torch.arange(total, device=dev)
        key_ok = torch.ones(q, total, dtype=torch.bool, device=dev)
        key_ok[:, :s0] = valid[:, prefix_len:]
        query_at = torch.arange(longest, device=dev)                           # cache index of suffix queries
        allowed = key_ok[:, None, :] & (keys[None, None, :] <= query_at[None, :, None])  # (Q, n, total)
        mask = torch.zeros(q, 1, longest, total, dtype=dtype, device=dev).masked_fill(~allowed[:, None], neg)
        tok_buf = torch.zeros(q, 1, dtype=torch.long, device=dev)
        pos_buf = pos[:, -1:] + 1
        mask_buf = torch.zeros(q, 1, 1, total, dtype=dtype, device=dev).masked_fill(
            ~(key_ok & (keys[None] < s0))[:, None, None], neg)

        def forward() -> torch.Tensor:
            return self.model(input_ids=tok_buf, attention_mask={"full_attention": mask_buf}, position_ids=pos_buf,
                              past_key_values=sc, use_cache=True).logits

        replay = None
        if graph and max_new_tokens > 1:
            if dev.type != "cuda":
                raise ValueError("decode='graph' needs a CUDA device")
            lengths = [layer.cumulative_length.clone() for layer in sc.layers]
            warm_key = (id(self.model), self.dtype, self._fused, q == 1)
            if warm_key not in BudgetedVideoLlama3._graph_warm:  # first capture of this kind: warm up (lazy
                # initialisation, compilation of the fused kernels) on a side stream
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):                                  # (writes are overwritten)
                    for _ in range(2):
                        forward()
                torch.cuda.current_stream().wait_stream(side)
            # capture on a side stream with the CUDAGraph API itself: ``torch.cuda.graph(...)`` would first
            # synchronize the device, run gc.collect() and empty the allocator cache, i.e. wait for the prefix
            # prefill still running and give its memory back, once per (video, budget)
            cuda_graph = torch.cuda.CUDAGraph()
            capture = torch.cuda.Stream()
            capture.wait_stream(torch.cuda.current_stream())
            try:
                with torch.cuda.stream(capture):
                    cuda_graph.capture_begin()
                    try:
                        static_logits = forward()
                    finally:
                        cuda_graph.capture_end()
            except RuntimeError as e:  # a backend that syncs inside the step cannot be captured: stay eager
                log.warning("CUDA graph capture of the decode step failed (%s); decoding eagerly", e)
                cuda_graph = None
            torch.cuda.current_stream().wait_stream(capture)
            for layer, n in zip(sc.layers, lengths):                           # rewind the cache write position
                layer.cumulative_length.copy_(n)
            # later captures skip the warm-up: lazy initialisation (cuBLAS handles, workspaces, compiled kernels) is done
            if cuda_graph is not None:
                BudgetedVideoLlama3._graph_warm.add(warm_key)

            if cuda_graph is not None:
                def replay_graph() -> torch.Tensor:
                    cuda_graph.replay()
                    return static_logits
                replay = replay_graph
        run = replay or forward
        # the suffix prefill is launched after the capture: recording the graph is host work that overlaps the prefix
        # prefill on the GPU, while the ~1,000 launches of an eager suffix prefill fill the driver's command queue and
        # would block the host until the GPU drains it (measured: the capture then added ~40 ms per (video, budget)).
        # The graph reads the cache write position on the device, so it does not matter that it was recorded first.
        out = self.model(input_ids=inp, attention_mask={"full_attention": mask}, position_ids=pos,
                         past_key_values=sc, use_cache=True, logits_to_keep=1)

        def step_fn(nxt: torch.Tensor, step: int) -> torch.Tensor:
            tok_buf.copy_(nxt[:, None])
            if step > 1:
                pos_buf.add_(1)
            mask_buf[..., s0 + step - 1] = 0                                   # the step's own key
            return run()

        return out, step_fn


# ---------------------------------------------------------------------- one video, several budgets
@dataclass
class BudgetInput:
    """Everything the LLM needs for one (video, budget): the frames used, the plan and the shared prefix.

    Attributes:
        budget: B.
        frame_idx: indices into the decoded frames used by this budget (``subsample(T, B)``).
        plan: the layout.
        prompt: the shared prefix (ids + vision rows).
        grid, raw_grid: merged-token grids of the encode and of raw frames.
    """

    budget: int
    frame_idx: list[int]
    plan: Plan
    prompt: VideoPrompt
    grid: tuple[int, int]
    raw_grid: tuple[int, int]


class EncodeCache:
    """Encoder rows per grid, each grid encoded at most once per video over the union of requested frames.

    ``encode_calls`` lists ``(grid, n_frames)`` of every encode, for instrumentation (tests assert one per size).
    """

    def __init__(self, vlm: "BudgetedVideoLlama3", frames: torch.Tensor, chunk_frames: int = 64):
        self.vlm, self.frames, self.chunk_frames = vlm, frames, chunk_frames
        self.rows: dict[tuple[int, int], dict[int, torch.Tensor]] = {}
        self.encode_calls: list[tuple[tuple[int, int], int]] = []
        self.encode_seconds = 0.0

    def grid_for(self, max_tokens: int) -> tuple[int, int]:
        return frame_grid(self.frames.shape[1], self.frames.shape[2], max_tokens)

    def encode(self, requests: list[tuple[list[int], int]]) -> None:
        """Encode, per grid, the union of frames requested for it that are not cached yet (one call per grid).

        Args:
            requests: ``(frame indices, max_tokens)`` pairs.
        """
        want: dict[tuple[int, int], tuple[set[int], int]] = {}
        for idx, cap in requests:
            grid = self.grid_for(cap)
            have = self.rows.get(grid, {})
            missing = {i for i in idx if i not in have}
            if missing:
                s, _ = want.setdefault(grid, (set(), cap))
                s.update(missing)
        for grid, (idx_set, cap) in want.items():
            idx = sorted(idx_set)
            t0 = time.perf_counter()
            held = getattr(self.frames, "at_grid", None)   # frames held at the encoder's sizes
            rows, got = (self.vlm.encode(held(idx, grid), cap, self.chunk_frames, grid) if held
                         else self.vlm.encode(self.frames[idx], cap, self.chunk_frames))
            _sync(rows.device)
            self.encode_seconds += time.perf_counter() - t0
            assert got == grid
            self.encode_calls.append((grid, len(idx)))
            store = self.rows.setdefault(grid, {})
            for j, i in enumerate(idx):
                store[i] = rows[j]

    def get(self, idx: list[int], max_tokens: int) -> torch.Tensor:
        """(len(idx), gh * gw, C) rows (encoding what is missing)."""
        self.encode([(idx, max_tokens)])
        store = self.rows[self.grid_for(max_tokens)]
        return torch.stack([store[i] for i in idx])


def _budget_geometry(height: int, width: int, budget: int, num_frames: int, max_tokens_per_frame: int,
                     raw_mode: str, raw_max_tokens: int) -> tuple[list[int], int, tuple[int, int], int, tuple[int, int]]:
    idx = subsample(num_frames, budget)
    cap = frame_token_cap(budget, len(idx), max_tokens_per_frame)
    grid = frame_grid(height, width, cap)
    raw_cap = cap
    if raw_mode == "phase3" and grid[0] * grid[1] > raw_max_tokens:
        raw_cap = raw_max_tokens
    elif raw_mode not in ("phase3", "orig"):
        raise SettingError(f"raw_mode must be 'phase3' or 'orig', got {raw_mode!r}")
    return idx, cap, grid, raw_cap, frame_grid(height, width, raw_cap)


@torch.no_grad()
def prepare_budgets(vlm: BudgetedVideoLlama3, frames: torch.Tensor, times_s: list[float], budgets: list[int],
                    raw_mode: str = "phase3", raw_max_tokens: int = 256, max_tokens_per_frame: int = 256,
                    chunk_frames: int = 64, cache: EncodeCache | None = None,
                    subtitle_slots=None) -> list[BudgetInput]:
    """DESIGN §3 steps 2-6 for every budget of one decoded video.

    Per budget: frames ``subsample(T, B)``; grid from ``frame_token_cap``; one encode per grid over the union of
    the budgets' frames; plan from per-frame mean rows; raw frames re-encoded once per smaller raw grid
    (``raw_mode="phase3"``, rows capped at ``raw_max_tokens``) or kept at the group grid through the original
    projector (``raw_mode="orig"``); qbase over the compressed groups; the shared prefix.

    Args:
        frames: (T, H, W, 3) uint8 decoded frames (for the largest budget).
        times_s: T frame times in seconds.
        subtitle_slots: ``None``, or ``f(frame_times_s) -> T_b + 1`` lists of subtitle texts interleaved before
            each frame of a budget (LongVideoBench; see :meth:`BudgetedVideoLlama3.build_prompt`).

    Returns:
        One :class:`BudgetInput` per budget, in the order given.
    """
    t, h, w = frames.shape[0], frames.shape[1], frames.shape[2]
    cache = cache or EncodeCache(vlm, frames, chunk_frames)
    geo = [_budget_geometry(h, w, b, t, max_tokens_per_frame, raw_mode, raw_max_tokens) for b in budgets]
    cache.encode([(idx, cap) for idx, cap, *_ in geo])
    plans = []
    for b, (idx, cap, grid, raw_cap, raw_grid) in zip(budgets, geo):
        rows = cache.get(idx, cap)                                     # (T_b, hw, C)
        plans.append((rows, plan_groups(rows.float().mean(1), grid[0] * grid[1], b, raw_grid[0] * raw_grid[1])))
    # raw frames at a smaller grid: one encode per raw grid over all budgets' raw frames
    raw_requests = []
    for (idx, cap, grid, raw_cap, raw_grid), (_, plan) in zip(geo, plans):
        if raw_grid != grid:
            raw_requests.append(([idx[a] for kind, a, _ in plan.blocks() if kind == "raw"], raw_cap))
    cache.encode(raw_requests)
    out = []
    for b, (idx, cap, grid, raw_cap, raw_grid), (rows, plan) in zip(budgets, geo, plans):
        raw_pos = [a for kind, a, _ in plan.blocks() if kind == "raw"]
        if raw_grid != grid:
            raw_rows = cache.get([idx[a] for a in raw_pos], raw_cap) if raw_pos else rows[:0]
        else:
            raw_rows = rows[raw_pos]
        raw_llm = vlm.project(raw_rows, original=raw_mode == "orig")   # (n_raw, raw_hw, D)
        group_llm = vlm.project(vlm.compress(rows, plan, grid))          # (G_c, K, D)
        times = [times_s[i] for i in idx]
        prompt = vlm.build_prompt(plan, times, raw_llm, group_llm,
                                  subtitle_slots=subtitle_slots(times) if subtitle_slots else None)
        out.append(BudgetInput(budget=b, frame_idx=idx, plan=plan, prompt=prompt, grid=grid, raw_grid=raw_grid))
    return out
