"""Write one of our checkpoints in the original VideoLLaMA3 layout (the inverse of :mod:`models.videollama3.convert`).

Used to make the tiny original-layout checkpoint of the tests; the layout is the one described in
:mod:`models.videollama3.convert` (``Videollama3Qwen2Config``-style ``config.json`` with the Qwen2 fields at the top level, weight
names of the original repository's modules, the compressor under ``model.token_compressor.``, an ``<image>`` token
added to the tokenizer as the original repository does, ``preprocessor_config.json`` of the original image processor).

``python -m models.videollama3.original_layout <our_dir> <out_dir> [--max-shard-size 200MB] [--wrapped-vision]``
"""
from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict
from pathlib import Path

from .weight_files import ORIGINAL_PROJECTOR_DIR, QBASE_DIR
from .layout import COMPRESSION_END, COMPRESSION_START
from .original_config import ORIGINAL_MODEL_TYPE
from .original_weights import KEY_MAP
from .weight_files import read_safetensors_dir, write_safetensors_dir
from .qbase import TransformerDecoderFlatCompressor

# the Qwen2 fields a transformers-4.4x Videollama3Qwen2Config.json carries at its top level
_ORIGINAL_LM_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "hidden_act", "max_position_embeddings", "initializer_range",
                       "rms_norm_eps", "use_cache", "tie_word_embeddings", "use_sliding_window", "sliding_window",
                       "max_window_layers", "attention_dropout", "bos_token_id", "eos_token_id")
IMAGE_TOKEN = "<image>"  # the original repository's DEFAULT_IMAGE_TOKEN, added to its tokenizer


def to_original_key(key: str, target: str = "model", wrapped_vision: bool = False) -> str:
    """Our key (of ``target`` ``"model"`` or ``"qbase"``) -> the original name, inverting :data:`KEY_MAP`.

    Raises:
        KeyError: no row of the table produces ``key``.
    """
    for orig_prefix, tgt, ours in KEY_MAP:
        if tgt != target or not key.startswith(ours):
            continue
        if ours == "model.vision_model." and wrapped_vision != orig_prefix.endswith("vision_encoder.vision_encoder."):
            continue
        return orig_prefix + key[len(ours):]
    raise KeyError(f"{target}:{key} has no original name in KEY_MAP")


def write_original_layout(our_dir: str | Path, out_dir: str | Path, max_shard_size: int | str | None = None,
                          wrapped_vision: bool = False) -> Path:
    """Write ``our_dir`` (our layout: transformers VideoLLaMA3 dir + ``qbase/`` [+ ``original_projector/``]) in the
    original layout.

    Args:
        max_shard_size: shard the weights (``model.safetensors.index.json``); ``None`` = one file.
        wrapped_vision: name the vision encoder ``model.vision_encoder.vision_encoder.*`` (the training repository's
            ``Videollama3VisionEncoder`` wrapper) instead of the released ``model.vision_encoder.*``.

    Returns:
        ``out_dir``.
    """
    from transformers import AutoTokenizer, VideoLlama3Config
    from tokenizers import AddedToken

    src, out = Path(our_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = VideoLlama3Config.from_pretrained(src)
    tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken(IMAGE_TOKEN, special=True,
                                                                           normalized=False)]},
                                 replace_extra_special_tokens=False)
    tokenizer.save_pretrained(out)
    vocab = tokenizer.get_vocab()

    state = {to_original_key(k, "model", wrapped_vision): v for k, v in read_safetensors_dir(src).items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    qb = TransformerDecoderFlatCompressor.from_pretrained(src / QBASE_DIR)
    state.update({to_original_key(k, "qbase"): v for k, v in qb.state_dict().items()})
    write_safetensors_dir(state, out, max_shard_size)

    text = cfg.text_config.to_dict()
    rope = text.get("rope_parameters") or {}
    text = {k: text[k] for k in _ORIGINAL_LM_FIELDS if k in text}
    vision = cfg.vision_config
    qcfg = asdict(qb.config)   # the fork's _build_token_compressor_config writes hidden_size = mm_hidden_size
    orig = {
        **text,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": None,
        "architectures": ["Videollama3Qwen2ForCausalLM"],
        "transformers_version": "4.46.3",
        "model_type": ORIGINAL_MODEL_TYPE,
        "torch_dtype": str(next(iter(state.values())).dtype).replace("torch.", ""),
        "vision_encoder": None,
        "vision_encoder_config": {"model_type": "videollama3_vision_encoder",
                                  **{k: getattr(vision, k) for k in (
                                      "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                      "num_channels", "patch_size", "hidden_act", "layer_norm_eps",
                                      "attention_dropout")}},
        "mm_projector_type": "mlp2x_gelu",
        "use_token_compression": True,
        "image_token_index": vocab[IMAGE_TOKEN],
        "trainable_mm_compressor": True,
        "mm_hidden_size": vision.hidden_size,
        "token_compressor_config": qcfg,
        "compression_start_token_id": vocab[COMPRESSION_START],
        "compression_end_token_id": vocab[COMPRESSION_END],
        "tokenizer_model_max_length": 16384,   # a training argument the original code stores (ignored on conversion)
    }
    (out / "config.json").write_text(json.dumps(orig, indent=2))

    vp_path = src / "video_preprocessor_config.json"
    vp = json.loads(vp_path.read_text()) if vp_path.is_file() else {}
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Videollama3ImageProcessor",
        **{k: vp[k] for k in ("image_mean", "image_std", "rescale_factor", "patch_size", "do_rescale",
                              "do_normalize", "do_resize") if k in vp},
        "merge_size": 1, "min_tokens": 16, "max_tokens": 16384}, indent=2))
    if (src / ORIGINAL_PROJECTOR_DIR).is_dir():
        shutil.copytree(src / ORIGINAL_PROJECTOR_DIR, out / ORIGINAL_PROJECTOR_DIR, dirs_exist_ok=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("our_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--max-shard-size", default=None)
    ap.add_argument("--wrapped-vision", action="store_true")
    args = ap.parse_args(argv)
    print(f"wrote {write_original_layout(args.our_dir, args.out_dir, args.max_shard_size, args.wrapped_vision)}")


if __name__ == "__main__":
    main()
