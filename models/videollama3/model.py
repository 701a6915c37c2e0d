"""The composed budgeted VideoLLaMA3 model: one class joining loading/encoding, the LLM input layout and answering.

Budgeted VideoLLaMA3: encode frames, compress groups with qbase, build ``inputs_embeds``, answer from one prefix.

Legend: T frames, hw merged tokens per frame, C vision hidden size, D LLM hidden size, K rows per compressed group,
G_c compressed groups, N vision rows in the LLM input.

Where each step lives (each part one job; :class:`BudgetedVideoLlama3` composes them and holds the shared state):

- :class:`~models.videollama3.encoding.VisionEncoding` -- ``from_pretrained``, ``checkpoint_dir``,
  ``set_fused_kernels``, ``set_vision_attention``, ``encode``, ``project``, ``compress``;
- :class:`~models.videollama3.layout.PromptLayout` -- the chat template, ``with_chat``, ``build_prompt``,
  ``question_ids``, ``embed`` (the LLM input of DESIGN §3.6);
- :class:`~models.videollama3.answering.SharedPrefixAnswering` -- ``prefill``, ``answer_from_scratch``,
  ``answer_all``, ``answer_batched`` (DESIGN §3.7);
- :mod:`models.videollama3.budgets` -- :class:`~models.videollama3.budgets.EncodeCache` and
  :func:`~models.videollama3.budgets.prepare_budgets`, every budget of one video.
"""
from __future__ import annotations

from torch import nn

from algorithms.budget import K_ROWS
from algorithms.errors import CheckpointError
from .answering import SharedPrefixAnswering
from .encoding import VisionEncoding
from .layout import COMPRESSION_END, COMPRESSION_START, PromptLayout
from .qbase import TransformerDecoderFlatCompressor


class BudgetedVideoLlama3(VisionEncoding, PromptLayout, SharedPrefixAnswering, nn.Module):
    """VideoLLaMA3 + qbase compressor with budgeted layouts and shared-prefix answering.

    Args:
        model: a ``VideoLlama3ForConditionalGeneration`` (eval mode).
        tokenizer: its tokenizer, with ``<|compression_start|>`` / ``<|compression_end|>``.
        video_processor: a ``VideoLlama3VideoProcessor``.
        compressor: the qbase compressor; ``num_queries`` must be the planner's K.
        original_projector: the original projector for ``raw_mode="orig"``, or ``None``.

    Raises:
        CheckpointError: the compressor's ``num_queries`` is not K.
        ValueError: the tokenizer lacks a compression token, or its chat template does not place user content
            verbatim.
    """

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
        self.add_system_prompt = True   # seed 001 prompt_embeds: apply_chat_template(..., add_system_prompt=True)
        self._template = self._split_chat_template()
        self._fused = False      # fused kernels bound, LLM and vision encoder (set_fused_kernels)

