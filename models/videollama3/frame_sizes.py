"""The video processor's resize outside the model: held frames (``datamodules.decode.EncoderFrames``) are made
with the very call :meth:`~models.videollama3.model.BudgetedVideoLlama3.encode` would make on them."""
from __future__ import annotations

import torch

from algorithms.budget import CELL_PIXELS, MIN_TOKENS_PER_FRAME

# the module of the class load_video_processor returns for either layout (the decode workers' fork server preloads it:
# datamodules.worker_server.VL3_PROCESSOR_MODULE, which imports nothing of this package, names it too)
PROCESSOR_MODULE = "transformers.models.video_llama_3.video_processing_video_llama_3"


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


class LazyVideoProcessor:
    """The checkpoint's video processor (:func:`load_video_processor`), read where it is first used.

    The frame sizing the data module hands its decode workers holds one (``EncoderSizing.processor``). Read in the
    main process, it cost the first decode ~1.9 s on the H100 (session 14, ``bench/start_sampler.py``):
    ``from transformers import AutoVideoProcessor`` there imported transformers' image and video stack (torchvision
    included) and waited on the import lock while the weight-load thread imported the same modules, all between the
    data module's set-up and the loader. Workers started by the fork server have those modules preloaded and read
    the processor's JSON in milliseconds. Pickled, it carries only the path; every attribute is the real
    processor's (read once per process). A path that holds no checkpoint is found by the model's own load, which
    reads the same files before the first step.

    Attributes:
        model_path: the checkpoint directory (``model.init_args.model_path``).
        processor_module: the module of the processor's class (what a fork server should preload).
    """

    processor_module = PROCESSOR_MODULE

    def __init__(self, model_path):
        self.model_path = str(model_path)
        self._processor = None

    def resolve(self):
        """The processor itself (read on the first call)."""
        if self._processor is None:
            self._processor = load_video_processor(self.model_path)
        return self._processor

    def __getattr__(self, name):   # only for names not found on this object: the processor's own
        if name.startswith("__") or name in ("model_path", "_processor"):
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    def __getstate__(self):
        return {"model_path": self.model_path, "_processor": None}

    def __repr__(self) -> str:
        return f"LazyVideoProcessor({self.model_path!r}, {'read' if self._processor is not None else 'not read'})"
