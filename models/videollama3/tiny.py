"""The tiny random VideoLLaMA3 checkpoint, built from configs, for tests and the demo.

Nothing is downloaded: the tokenizer is the offline real-vocabulary Qwen2.5 one (:mod:`models.tokenizer`). The
tiny VideoLLaMA3 and its qbase compressor are seeded random weights saved with ``save_pretrained``, so tests and
the demo load them through the same ``from_pretrained`` path as a real checkpoint.

``python -m models.videollama3.tiny [--out checkpoints/tiny-videollama3]`` writes the demo checkpoint.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
from pathlib import Path

import torch

from ..tokenizer import build_qwen_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TINY_DIR = REPO_ROOT / "checkpoints" / "tiny-videollama3"

VIDEO_PLACEHOLDER = "<|video_pad|>"  # id 151656 = VideoLlama3Config.video_token_id


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
    from .weight_files import ORIGINAL_PROJECTOR_DIR, QBASE_DIR

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


@contextlib.contextmanager
def model_dir_or_tiny(model_dir: str | None, prefix: str = "tiny_videollama3_"):
    """Yield ``model_dir`` when given; else build the tiny random model in a temporary folder, yield its path and
    remove the folder on exit (the benches' default checkpoint)."""
    if model_dir is not None:
        yield str(model_dir)
        return
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        yield str(build_tiny_videollama3(Path(tmp) / "tiny"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
