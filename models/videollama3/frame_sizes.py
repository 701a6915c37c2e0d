"""The video processor's resize outside the model: held frames (``datamodules.decode.EncoderFrames``) are made
with the very call :meth:`~models.videollama3.model.BudgetedVideoLlama3.encode` would make on them."""
from __future__ import annotations

import torch

from algorithms.budget import CELL_PIXELS, MIN_TOKENS_PER_FRAME


def processor_resize(processor, frames: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """``(n, H, W, 3)`` uint8 -> ``(n, 28 gh, 28 gw, 3)`` uint8 with ``(gh, gw) = frame_grid(H, W, max_tokens)``:
    ``VideoLlama3VideoProcessor.resize`` with the size ``BudgetedVideoLlama3.encode`` passes (``smart_resize`` with
    ``max_pixels = max_tokens * 28²`` per frame) and the processor's own ``resample``."""
    from transformers.image_processing_utils_fast import SizeDict

    n = frames.shape[0]
    out = processor.resize(videos=frames.permute(0, 3, 1, 2)[None],
                           size=SizeDict(shortest_edge=min(MIN_TOKENS_PER_FRAME, max_tokens) * CELL_PIXELS ** 2,
                                         longest_edge=max_tokens * CELL_PIXELS ** 2 * n),
                           resample=processor.resample, factor=processor.patch_size * processor.merge_size)
    return out[0].permute(0, 2, 3, 1).contiguous()


def load_video_processor(model_path):
    """The checkpoint's video processor as :meth:`BudgetedVideoLlama3.from_pretrained` loads it, without the weights:
    the original layout's translated one, else ``AutoVideoProcessor.from_pretrained``."""
    from transformers import AutoVideoProcessor

    from .convert import is_original_layout, translate_video_processor
    from .model import BudgetedVideoLlama3

    path = BudgetedVideoLlama3.checkpoint_dir(model_path)
    return translate_video_processor(path) if is_original_layout(path) else AutoVideoProcessor.from_pretrained(path)
