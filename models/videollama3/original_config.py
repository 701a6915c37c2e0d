"""Translating an original-layout VideoLLaMA3 config (and its preprocessor) into ours: layout detection, the
vision encoder's config, ``VideoLlama3Config`` + the qbase config, the video processor.

The original ``config.json`` fields read here are described in :mod:`models.videollama3.convert`'s docstring.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from .layout import COMPRESSION_END, COMPRESSION_START
from .qbase import TokenCompressorConfig

ORIGINAL_MODEL_TYPE = "videollama3_qwen2"
# fields of the original config that are not Qwen2 LM fields (all others that Qwen2Config knows go to text_config)
_LEGACY_QWEN2_FIELDS = {"rope_theta", "rope_scaling", "torch_dtype"}  # transformers-4 names
_GENERIC_FIELDS = {"transformers_version", "architectures", "id2label", "label2id", "problem_type",
                   "output_hidden_states", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder"}
_VISION_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
                  "patch_size", "hidden_act", "layer_norm_eps", "attention_dropout")
_PROCESSOR_FIELDS = ("image_mean", "image_std", "rescale_factor", "patch_size")


def is_original_layout(directory: str | Path) -> bool:
    """True for an original-layout directory: its ``config.json`` has ``model_type == "videollama3_qwen2"`` or a
    ``vision_encoder_config`` and no ``text_config`` (ours always has ``text_config``)."""
    cfg_path = Path(directory) / "config.json"
    if not cfg_path.is_file():
        return False
    cfg = json.loads(cfg_path.read_text())
    return "text_config" not in cfg and (cfg.get("model_type") == ORIGINAL_MODEL_TYPE or "vision_encoder_config" in cfg)


@dataclass
class Translated:
    """What the original ``config.json`` (+ tokenizer) becomes: our model config, the qbase config, the tokenizer."""

    config: object            # transformers VideoLlama3Config
    qbase: TokenCompressorConfig
    tokenizer: object


# heads of known vision encoders, by (hidden_size, intermediate_size): the one field weight shapes cannot give
KNOWN_VISION_HEADS = {(1152, 4304): 16}   # SigLIP-so400m / VideoLLaMA3's SigLIP-NaViT (head dim 72)
_VISION_PREFIXES = ("model.vision_encoder.vision_encoder.", "model.vision_encoder.")


def vision_config_from_weights(state: dict[str, torch.Tensor]) -> dict:
    """The vision encoder's config fields from its weights, for a checkpoint without ``vision_encoder_config``.

    ``hidden_size``, ``num_channels`` and ``patch_size`` from ``embeddings.patch_embedding.weight`` (C, ch, p, p),
    ``intermediate_size`` from ``encoder.layers.0.mlp.fc1.weight``, ``num_hidden_layers`` from the layer indices,
    ``num_attention_heads`` from :data:`KNOWN_VISION_HEADS`; the rest are transformers' ``VideoLlama3VisionConfig``
    defaults (``hidden_act`` tanh-GELU, ``layer_norm_eps`` 1e-6), which are VideoLLaMA3's.

    Raises:
        ValueError: no vision weights, or an encoder whose head count is not known (say where a config is).
    """
    for prefix in _VISION_PREFIXES:
        patch = state.get(prefix + "embeddings.patch_embedding.weight")
        if patch is not None:
            break
    else:
        raise ValueError("no vision_encoder_config, and no model.vision_encoder.embeddings.patch_embedding.weight to "
                         "derive it from")
    layers = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"encoder\.layers\.(\d+)\.", k))}
    fc1 = state.get(prefix + "encoder.layers.0.mlp.fc1.weight")
    if not layers or fc1 is None:
        raise ValueError(f"no vision_encoder_config, and no {prefix}encoder.layers.N.mlp.fc1.weight to derive it from")
    hidden, inter = int(patch.shape[0]), int(fc1.shape[0])
    heads = KNOWN_VISION_HEADS.get((hidden, inter))
    if heads is None:
        raise ValueError(f"no vision_encoder_config, and the vision encoder's head count cannot be read from its "
                         f"weights (hidden_size={hidden}, intermediate_size={inter} is no known encoder): name a "
                         "local directory holding its config.json (vision_config_dir / --vision-config)")
    return {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": max(layers) + 1,
            "num_attention_heads": heads, "num_channels": int(patch.shape[1]), "patch_size": int(patch.shape[-1])}


def resolve_vision_config(orig: dict, state: dict[str, torch.Tensor] | None,
                          vision_config_dir: str | Path | None = None) -> tuple[dict, str]:
    """The vision encoder's config fields and where they came from (see the module docstring's order).

    Raises:
        FileNotFoundError: ``vision_config_dir`` has no ``config.json``.
        ValueError: nothing gives the config (as :func:`vision_config_from_weights`).
    """
    if vision_config_dir is not None:
        path = Path(vision_config_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"vision_config_dir: no config.json in {vision_config_dir}")
        return json.loads(path.read_text()), str(path)
    vis = orig.get("vision_encoder_config")
    if isinstance(vis, dict) and vis:
        return vis, "config.json:vision_encoder_config"
    for field_name in ("vision_encoder", "mm_vision_encoder"):
        name = orig.get(field_name)
        if isinstance(name, str) and name and (Path(name) / "config.json").is_file():  # local only: no hub
            return json.loads((Path(name) / "config.json").read_text()), f"config.json:{field_name}={name}"
    return vision_config_from_weights(state or {}), "weight shapes"


def translate_config(orig: dict, tokenizer, state: dict[str, torch.Tensor] | None = None,
                     vision_config_dir: str | Path | None = None) -> Translated:
    """Original ``config.json`` dict -> ``VideoLlama3Config`` + :class:`TokenCompressorConfig`.

    Args:
        tokenizer: the checkpoint's tokenizer (for the placeholder and compression token ids).
        state: the original weights (for a vision config derived from shapes).
        vision_config_dir: a local directory with the vision encoder's ``config.json`` (overrides the others).

    Raises:
        ValueError: no vision config to be had, a projector other than ``mlp2x_gelu``, no compressor
            (``trainable_mm_compressor`` not set, or no ``token_compressor_config``), a compressor config the flat
            compressor cannot run (field named), or compression token ids that do not match the tokenizer's
            ``<|compression_start|>`` / ``<|compression_end|>`` (all problems listed).
    """
    from transformers import Qwen2Config, VideoLlama3Config
    from transformers.models.video_llama_3.configuration_video_llama_3 import VideoLlama3VisionConfig

    problems = []
    try:
        vis, _ = resolve_vision_config(orig, state, vision_config_dir)
    except ValueError as e:
        problems.append(str(e))
        vis = {}
    if orig.get("mm_projector_type", "mlp2x_gelu") != "mlp2x_gelu":
        problems.append(f"mm_projector_type={orig.get('mm_projector_type')!r}: only 'mlp2x_gelu' maps onto "
                        "VideoLlama3Projector")
    tc = orig.get("token_compressor_config")
    if tc is None:
        tc = orig.get("token_compressor")
    if not orig.get("trainable_mm_compressor") or not isinstance(tc, dict):
        problems.append("config.json has no token compressor (the fork builds one only with trainable_mm_compressor: "
                        "true and a token_compressor_config dict)")
        tc = None
    vocab = tokenizer.get_vocab()
    ids = {}
    for field_name, tok in (("compression_start_token_id", COMPRESSION_START),
                            ("compression_end_token_id", COMPRESSION_END)):
        tid = vocab.get(tok)
        if tid is None:
            problems.append(f"tokenizer has no special token {tok!r}")
        elif field_name in orig and orig[field_name] != tid:
            problems.append(f"{field_name}={orig[field_name]} but the tokenizer's {tok} is {tid}")
        ids[tok] = tid
    vision_width = vis.get("hidden_size", VideoLlama3VisionConfig().hidden_size) if vis else None
    qbase = None
    if tc is not None and vision_width is not None:
        try:
            qbase = TokenCompressorConfig.from_dict(
                tc, "config.json:token_compressor_config",
                default_hidden_size=orig.get("mm_hidden_size", vision_width),
                default_num_attention_heads=orig.get("num_attention_heads"))
        except ValueError as e:
            problems.append(str(e))
        else:
            if qbase.hidden_size != vision_width:
                problems.append(f"token_compressor_config.hidden_size={qbase.hidden_size} but the vision encoder "
                                f"width is {vision_width}")
    if problems:
        raise ValueError("cannot translate the original config: " + "; ".join(problems))

    text_keys = ({f.name for f in fields(Qwen2Config)} - _GENERIC_FIELDS) | _LEGACY_QWEN2_FIELDS
    text_kwargs = {k: v for k, v in orig.items() if k in text_keys}
    if "rope_parameters" not in text_kwargs:  # transformers-4 fields rope_theta / rope_scaling -> rope_parameters
        rope = dict(text_kwargs.pop("rope_scaling", None) or {"rope_type": "default"})
        rope["rope_type"] = rope.pop("type", rope.get("rope_type", "default"))
        rope["rope_theta"] = text_kwargs.pop("rope_theta", rope.get("rope_theta", 10000.0))
        text_kwargs["rope_parameters"] = rope
    if "torch_dtype" in text_kwargs:
        text_kwargs.setdefault("dtype", text_kwargs.pop("torch_dtype"))
    text = Qwen2Config(**text_kwargs)
    vision = VideoLlama3VisionConfig(**{k: vis[k] for k in _VISION_FIELDS if k in vis})
    fallback = orig.get("image_token_index")
    image_id = vocab.get("<|image_pad|>", fallback)
    video_id = vocab.get("<|video_pad|>", fallback)
    if image_id is None or video_id is None or image_id < 0 or video_id < 0:
        raise ValueError("cannot choose placeholder ids: the tokenizer has no <|image_pad|>/<|video_pad|> and "
                         f"image_token_index={fallback!r}")
    config = VideoLlama3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_id=image_id,
                               video_token_id=video_id, tie_word_embeddings=text.tie_word_embeddings)
    return Translated(config=config, qbase=qbase, tokenizer=tokenizer)


def translate_video_processor(original_dir: Path):
    """``VideoLlama3VideoProcessor`` (no token compression: the pipeline plans its own layout) with
    ``image_mean``/``image_std``/``rescale_factor``/``patch_size`` from the original ``preprocessor_config.json``."""
    from transformers.models.video_llama_3.video_processing_video_llama_3 import VideoLlama3VideoProcessor

    kwargs = {}
    pre = original_dir / "preprocessor_config.json"
    if pre.is_file():
        d = json.loads(pre.read_text())
        kwargs = {k: d[k] for k in _PROCESSOR_FIELDS if k in d}
    return VideoLlama3VideoProcessor(use_token_compression=False, **kwargs)
