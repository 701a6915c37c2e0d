"""Loading and vision encoding of budgeted VideoLLaMA3: checkpoint in, frames to encoder rows, projected and compressed.

Legend: T frames, hw merged tokens per frame, C vision hidden size, D LLM hidden size, K rows per compressed group,
G_c compressed groups.

The model is transformers' own ``VideoLlama3ForConditionalGeneration`` loaded with ``from_pretrained`` from a local
directory; preprocessing is transformers' ``VideoLlama3VideoProcessor`` at the size the plan needs. The checkpoint
directory additionally holds ``qbase/`` (the group compressor, :mod:`models.videollama3.qbase`) and, for ``raw_mode="orig"``,
``original_projector/model.safetensors``.

:class:`VisionEncoding` is one of the parts composed by :class:`models.videollama3.model.BudgetedVideoLlama3`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from algorithms.budget import CELL_PIXELS, MIN_TOKENS_PER_FRAME, Plan, frame_grid
from algorithms.errors import CheckpointError, SettingError
from ..loading import check_model_type, local_checkpoint, reading_checkpoint
from .chat_template import processor_chat_template
from .qbase import TransformerDecoderFlatCompressor, load_state_dict_strict
from .weight_files import ORIGINAL_PROJECTOR_DIR, QBASE_DIR
from .. import vision_attention
from ..kernels import host_to_device
from ..vision_attention import frame_layout



# seed 001:1202 "then the pixel rows resized": hybrid_raw.reencode_frames' filter is not public; the processor's own
# resample (VideoLLaMA3: bicubic), with antialiasing as the processor's resize of a frame has it
REENCODE_RESAMPLE = "bicubic"


def unpatchify(pixels: torch.Tensor, t: int, grid: tuple[int, int], patch_size: int, merge_size: int) -> torch.Tensor:
    """The inverse of ``VideoLlama3VideoProcessor.patchify`` (temporal patch 1): flat pixel rows
    ``(t * (m gh) * (m gw), C * p * p)`` at merged grid ``(gh, gw)`` -> images ``(t, C, m p gh, m p gw)``.

    The processor lays a frame out as ``(gh, gw, m, m, C, 1, p, p)`` blocks (``permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)``
    of ``(B, t, 1, C, gh, m, p, gw, m, p)``); this undoes that permutation.
    """
    gh, gw = grid
    m, p = merge_size, patch_size
    c = pixels.shape[-1] // (p * p)
    x = pixels.reshape(t, gh, gw, m, m, c, p, p)
    return x.permute(0, 5, 1, 3, 6, 2, 4, 7).reshape(t, c, gh * m * p, gw * m * p)


def resize_pixel_rows(pixels: torch.Tensor, t: int, grid: tuple[int, int], out_grid: tuple[int, int],
                      processor) -> torch.Tensor:
    """Flat pixel rows at merged grid ``grid`` -> the same frames' flat pixel rows at ``out_grid``: images again
    (:func:`unpatchify`), ``F.interpolate`` to ``28 gh' x 28 gw'`` (:data:`REENCODE_RESAMPLE`, antialiased, fp32
    inside, cast back to ``pixels.dtype``), the processor's own ``patchify``."""
    import torch.nn.functional as F

    p, m = int(processor.patch_size), int(processor.merge_size)
    if int(getattr(processor, "temporal_patch_size", 1) or 1) != 1:
        raise SettingError("re-encoding pixel rows needs temporal_patch_size 1 (VideoLLaMA3's)")
    img = unpatchify(pixels, t, grid, p, m).float()
    size = (out_grid[0] * m * p, out_grid[1] * m * p)
    img = F.interpolate(img, size=size, mode=REENCODE_RESAMPLE, align_corners=False, antialias=True)
    flat, *_ = processor.patchify(img.to(pixels.dtype)[None], patch_size=p, merge_size=m, temporal_patch_size=1)
    return flat[0]



def device_map_kwargs(device: torch.device | str | None) -> dict:
    """``{"device_map": "<device>"}`` for ``from_pretrained`` when ``device`` is given and ``accelerate`` is
    installed (transformers 5.23 raises without it), else ``{}`` (load on the CPU: also for a CPU ``device``)."""
    import importlib.util

    if device is None or torch.device(device).type == "cpu" or importlib.util.find_spec("accelerate") is None:
        return {}
    return {"device_map": str(torch.device(device))}


def _load_read_state(path: Path, dtype: torch.dtype, attn_implementation: str | None,
                     device: torch.device | str | None, ahead=None):
    """``VideoLlama3ForConditionalGeneration`` of the checkpoint at ``path`` with its weights read by
    :func:`models.weight_reader.read_safetensors` onto ``device`` (the CPU when ``None``) and loaded by transformers
    from that ``state_dict``; returns ``(model, loading_info)`` as ``from_pretrained(output_loading_info=True)``.
    ``ahead``: a :class:`models.weight_reader.ReadAhead` of those files already reading (its result is used)."""
    from transformers import VideoLlama3Config, VideoLlama3ForConditionalGeneration

    from ..weight_reader import checkpoint_files, read_safetensors

    config = VideoLlama3Config.from_pretrained(path)
    state = ahead.result() if ahead is not None else \
        read_safetensors(checkpoint_files(path), device if device is not None else "cpu")
    model, info = VideoLlama3ForConditionalGeneration.from_pretrained(
        None, config=config, state_dict=state, dtype=dtype, attn_implementation=attn_implementation,
        output_loading_info=True, **device_map_kwargs(device))
    model.config._name_or_path = str(path)   # as from_pretrained(path) sets it
    return model, info


class VisionEncoding:
    """Load a checkpoint and turn frames into vision rows: encoder rows, the projector, the qbase compressor.

    A part of :class:`~models.videollama3.model.BudgetedVideoLlama3`, which sets the attributes read here:
    ``model`` (``VideoLlama3ForConditionalGeneration``), ``video_processor``, ``compressor``
    (:class:`~models.videollama3.qbase.TransformerDecoderFlatCompressor`), ``original_projector`` (or ``None``) and
    ``_fused``.
    """

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | str = torch.float32,
                        attn_implementation: str | None = "sdpa", raw_mode: str = "phase3",
                        vision_attn_implementation: str | None = "frame_batched",
                        fused_kernels: bool = True, original_projector: str | Path | None = None,
                        vision_config_dir: str | Path | None = None,
                        device: torch.device | str | None = None,
                        weight_reader: str = "library") -> "BudgetedVideoLlama3":
        """Load a transformers-format VideoLLaMA3 directory plus ``qbase/`` (and ``original_projector/``).

        The tokenizer renders with the template seed 001's ``Videollama3Processor`` gives it: the processor's saved
        one, VideoLLaMA3's ``DEFAULT_CHAT_TEMPLATE`` when the directory saves none
        (:func:`models.videollama3.chat_template.processor_chat_template`).

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
        ``device``: where the weights are read to (issue 41: straight to the GPU, no CPU copy of the model first):
        the LLM and vision tower through ``from_pretrained(device_map=device)`` where ``accelerate`` is installed
        (transformers refuses a ``device_map`` without it; else they load on the CPU and the caller moves them), the
        qbase compressor through ``safetensors.torch.load_file(device=...)``. ``None``: the CPU, as before. The
        original layout and the original projector load on the CPU either way (the caller's ``.to``).
        ``weight_reader``: ``"library"`` (default) transformers' loader reads the files; ``"pinned"``
        :func:`models.weight_reader.read_safetensors` reads them to ``device`` (the CPU when ``None``) and
        transformers loads that ``state_dict`` (the same keys, checks and bytes; the original layout keeps its own
        reader).

        Raises:
            FileNotFoundError: the directory or a required file is missing (path named).
            ValueError: missing/unexpected weight keys (listed).
        """
        from .original_config import is_original_layout

        path = cls.checkpoint_dir(path)
        original = is_original_layout(path)
        ahead = None
        if weight_reader == "pinned" and not original:
            # the reads start before transformers' modeling imports and the model's construction (seconds of Python
            # under the GIL), which they then overlap: the 7B files took 1.4 s after 3.5 s of those on the H100
            from ..early_weights import take
            from ..weight_reader import ReadAhead, checkpoint_files

            with reading_checkpoint(path):   # (its file checks first: a FIFO is never opened)
                files, to = checkpoint_files(path), device if device is not None else "cpu"
                # the same files read to the same device beside the CLI's imports (evaluate.py), else read now
                taken = take(files, to)
                ahead = taken[0] if taken is not None else ReadAhead(files, to)
        from transformers import AutoVideoProcessor, VideoLlama3ForConditionalGeneration

        from ..tokenizer import load_tokenizer

        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        from .convert import load_original_parts
        if original:  # original VideoLLaMA3 layout: mapped in memory (models/videollama3/convert.py)
            return cls(*load_original_parts(path, dtype, attn_implementation, raw_mode, original_projector,
                                            vision_config_dir)).set_vision_attention(
                vision_attn_implementation).set_fused_kernels(fused_kernels)
        with reading_checkpoint(path):
            if weight_reader == "pinned":
                model, info = _load_read_state(path, dtype, attn_implementation, device, ahead)
            elif weight_reader == "library":
                model, info = VideoLlama3ForConditionalGeneration.from_pretrained(
                    path, dtype=dtype, attn_implementation=attn_implementation, output_loading_info=True,
                    **device_map_kwargs(device))
            else:
                raise ValueError(f"weight_reader must be 'library' or 'pinned', got {weight_reader!r}")
            bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
            if bad:
                raise CheckpointError(f"{path}: checkpoint weights do not match VideoLlama3ForConditionalGeneration: "
                                      f"{bad}")
            tokenizer = load_tokenizer(path)   # tokenizer.json parsed once (models/tokenizer.py)
            tokenizer.chat_template = processor_chat_template(path)  # seed 001: Videollama3Processor's template
            video_processor = AutoVideoProcessor.from_pretrained(path)
        compressor = TransformerDecoderFlatCompressor.from_pretrained(path / QBASE_DIR, device=device).to(dtype)
        orig = None
        if raw_mode == "orig":
            from .original_weights import find_original_projector, projector_state_from
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
        from ..fused_forwards import fuse

        fuse(self.model.model.language_model, on)
        fuse(self.model.model.vision_model, on)
        self._fused = on
        return self

    @staticmethod
    def checkpoint_dir(path: str | Path) -> Path:
        """``path`` as a local checkpoint directory (one with ``config.json``).

        Raises:
            FileNotFoundError: naming the path (and how to build the demo checkpoint).
            CheckpointError: no weights file beside ``config.json``, or another family's checkpoint (its
                ``model_type`` named).
        """
        from .original_config import is_original_layout

        p = local_checkpoint(path, "VideoLLaMA3", "for the demo run `python -m models.videollama3.tiny` first")
        if not is_original_layout(p):   # (the original layout's own model_type is videollama3_qwen2)
            check_model_type(p, "VideoLLaMA3", ("video_llama_3",))   # transformers' VideoLlama3Config
        return p

    def set_vision_attention(self, implementation: str | None) -> "BudgetedVideoLlama3":
        """Select the vision encoder's attention backend (``"frame_batched"``, a transformers name, or ``None``)."""
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
                :class:`datamodules.decode.EncoderFrames`): not resized again.

        Returns:
            ``(rows, (gh, gw))``: rows (T, gh * gw, C) merged encoder rows (before the projector), row-major.

        Raises:
            RuntimeError: the processor's grid differs from ``frame_grid`` (a preprocessing mismatch).
        """
        gh, gw = grid or frame_grid(frames.shape[1], frames.shape[2], max_tokens)
        out = []
        for s in range(0, frames.shape[0], chunk_frames):
            pixels, t = self._pixel_rows(frames[s:s + chunk_frames], max_tokens, (gh, gw), resize=grid is None)
            out.append(self._encode_pixel_rows(pixels, t, (gh, gw)))
        return torch.cat(out), (gh, gw)

    @torch.no_grad()
    def reencode(self, frames: torch.Tensor, max_tokens: int, grid: tuple[int, int], chunk_frames: int = 64,
                 src_grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Encoder rows of frames at the explicit merged grid ``grid``, made smaller the way Phase-3 training does.

        Seed 001:1200 ``reencode``: "Encoder rows of ``frames`` at the merged grid ``grid``, the way Phase-3
        training makes a raw frame smaller (hybrid_raw.reencode_frames): processed at the groups' size ``tok``,
        then the pixel rows resized and passed through the encoder again." Here: the processor's pixel rows at
        the groups' size (the very call of :meth:`encode` with ``max_tokens``, cast to the model dtype as the seed's
        ``x["pixel_values"].cuda().to(torch.bfloat16)``), turned back into ``28 gh x 28 gw`` images
        (:func:`unpatchify`), resized to ``28 gh' x 28 gw'`` with :data:`REENCODE_RESAMPLE` (fp32 inside), patched
        again by the processor's own ``patchify`` and encoded at ``(t, 2 gh', 2 gw')``. ``hybrid_raw.reencode_frames``
        itself is not public (docs/deviations.md: the resize filter is the processor's own, bicubic with
        antialiasing). When ``grid`` is the groups' grid nothing is resized: the rows are :meth:`encode`'s.

        Args:
            frames: (T, H, W, 3) uint8 frames (already at ``src_grid`` when that is given, as for :meth:`encode`).
            max_tokens: the groups' per-frame cap (seed ``tok``).
            grid: ``(gh', gw')`` target merged grid.

        Returns:
            (T, gh' * gw', C) merged encoder rows, row-major.
        """
        src = src_grid or frame_grid(frames.shape[1], frames.shape[2], max_tokens)
        grid = tuple(int(g) for g in grid)
        out = []
        for s in range(0, frames.shape[0], chunk_frames):
            pixels, t = self._pixel_rows(frames[s:s + chunk_frames], max_tokens, src, resize=src_grid is None)
            if grid != tuple(src):
                pixels = resize_pixel_rows(pixels.to(self.dtype), t, src, grid, self.video_processor)
            out.append(self._encode_pixel_rows(pixels, t, grid))
        return torch.cat(out)

    def _pixel_rows(self, clip: torch.Tensor, max_tokens: int, grid: tuple[int, int], resize: bool
                    ) -> tuple[torch.Tensor, int]:
        """The video processor's flat pixel rows (t * 4 gh gw, 3 * 14²) of ``clip`` at ``grid`` (host tensor)."""
        gh, gw = grid
        t = clip.shape[0]
        inputs = self.video_processor(
            videos=[clip.permute(0, 3, 1, 2)], do_sample_frames=False, use_token_compression=False,
            do_resize=resize,
            size={"shortest_edge": min(MIN_TOKENS_PER_FRAME, max_tokens) * CELL_PIXELS ** 2,
                  "longest_edge": max_tokens * CELL_PIXELS ** 2 * t},
            return_tensors="pt")
        thw = inputs["video_grid_thw"]
        if tuple(thw[0].tolist()) != (t, 2 * gh, 2 * gw):
            raise RuntimeError(f"video processor produced grid {thw[0].tolist()}, frame_grid says "
                               f"{(t, 2 * gh, 2 * gw)} for frames of {tuple(clip.shape[1:3])}")
        return inputs["pixel_values_videos"], t

    def _encode_pixel_rows(self, pixels: torch.Tensor, t: int, grid: tuple[int, int]) -> torch.Tensor:
        """(t, gh * gw, C) merged encoder rows of ``t`` frames' flat pixel rows at merged grid ``grid``."""
        gh, gw = grid
        merge = int(self.video_processor.merge_size)
        thw = torch.tensor([[t, 2 * gh, 2 * gw]])
        with frame_layout(t, 4 * gh * gw):   # frames of one size: no per-layer read of the boundaries
            vis = self.model.model.vision_model(
                pixel_values=pixels.to(self.device, self.dtype), grid_thw=thw,
                merge_sizes=torch.tensor([merge]), **self._vision_layout(t, 2 * gh, 2 * gw, merge))
        return vis.last_hidden_state.view(t, gh * gw, -1)

    def _vision_layout(self, t: int, h: int, w: int, merge: int) -> dict:
        """The vision model's ``position_ids`` (on the device, built there: no host-to-device copy) and
        ``cu_seqlens`` / ``max_seqlen`` for one video grid of ``t`` frames of ``h x w`` patches, passed to its
        forward so that nothing in it reads the grid from the device. The grid itself stays on the host
        (``grid_thw``, ``merge_sizes``: the library's ``.tolist()`` calls on it in ``get_vision_position_ids`` and
        ``pixel_unshuffle`` then cost no wait for the GPU, where a device grid made about 150 host waits per
        predict step at 7B size, ``bench/qa_step_profile.py``).

        ``position_ids`` (t h w, 2): transformers' ``get_vision_position_ids`` for ``grid_thw = [[t, h, w]]`` (each
        frame's (row, column) indices laid out block-major over ``merge x merge`` blocks, repeated per frame;
        equality tested). ``cu_seqlens`` (t + 1,) int32 frame boundaries: on the device for attention backends
        that read it there, on the host for the frame-batched backend, which only checks its length.
        """
        on_host = self.model.config.vision_config._attn_implementation == vision_attention.FRAME_BATCHED_SDPA
        key = (t, h, w, merge, self.device, on_host)
        cached = self.__dict__.setdefault("_tb_vision_layouts", {})
        if key not in cached:
            dev = self.device
            hp, wp = torch.meshgrid(torch.arange(h, device=dev), torch.arange(w, device=dev), indexing="ij")
            blocks = (h // merge, merge, w // merge, merge)
            pos = torch.stack([hp.reshape(blocks).transpose(1, 2).flatten(),
                               wp.reshape(blocks).transpose(1, 2).flatten()], dim=-1).repeat(t, 1)
            cu = torch.arange(t + 1, dtype=torch.int32, device="cpu" if on_host else dev) * (h * w)
            if len(cached) > 64:          # one entry per (frames in a chunk, grid): a few per video
                cached.clear()
            cached[key] = {"position_ids": pos, "cu_seqlens": cu, "max_seqlen": h * w}
        return dict(cached[key])

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
            out = out[host_to_device(torch.tensor(list(plan.compressed), dtype=torch.long), out.device)]
        return out

