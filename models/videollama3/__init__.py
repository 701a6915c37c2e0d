"""The VideoLLaMA3 family: budgeted QA on the transformers-native class with the seeds' qbase compressor.

Public surface (everything else is an implementation detail of this package):

- :class:`BudgetedVideoLlama3` — load a checkpoint (ours or the original layout), encode frames, compress groups,
  lay out the LLM input, answer a video's questions from one cached prefix;
- :class:`EncodeCache`, :func:`prepare_budgets` — encode once per frame size, plan every budget of a video;
- :class:`VideoPrompt`, :class:`Answer`, :class:`BudgetInput` — what the layout and the answering exchange;
- :class:`TokenCompressorConfig`, :class:`TransformerDecoderFlatCompressor` — the fork's compressor (``qbase``);
- the layout ablation inputs (:mod:`.ablation`), checkpoint conversion (:mod:`.convert`, :mod:`.original_layout`)
  the tiny model (:mod:`.tiny`) and the early compilation of the fused kernels (:mod:`.warm`) are imported from
  their modules.

Files: :mod:`.model` composes :mod:`.encoding` (loading, encoding), :mod:`.layout` (the LLM input) and
:mod:`.answering` (with :mod:`.shared_prefix`); :mod:`.budgets` plans every budget of a video; :mod:`.qbase` is the
compressor; :mod:`.convert` reads the original layout through :mod:`.weight_files`, :mod:`.original_config` and
:mod:`.original_weights`.
"""
from .answering import Answer
from .budgets import BudgetInput, EncodeCache, prepare_budgets
from .layout import VideoPrompt, group_second
from .model import BudgetedVideoLlama3
from .qbase import TokenCompressorConfig, TransformerDecoderFlatCompressor

__all__ = ["Answer", "BudgetInput", "BudgetedVideoLlama3", "EncodeCache", "TokenCompressorConfig",
           "TransformerDecoderFlatCompressor", "VideoPrompt", "group_second", "prepare_budgets"]
