"""Convert a checkpoint saved in the original VideoLLaMA3 layout (with a token compressor) into ours.

``python -m models.videollama3.convert <original_dir> <out_dir> [--max-shard-size 5GB] [--original-projector PATH]``

**Original layout** (training code built on ``DAMO-NLP-SG/VideoLLaMA3``, model class ``Videollama3Qwen2ForCausalLM``):

* ``config.json`` -- ``Videollama3Qwen2Config``: the Qwen2 LM fields at the top level (``vocab_size``,
  ``hidden_size``, ``num_hidden_layers``, ``rope_theta``, ``tie_word_embeddings``, ...), ``vision_encoder_config``
  (the ``Videollama3VisionEncoderConfig`` dict), ``mm_projector_type`` (must be ``mlp2x_gelu``),
  ``image_token_index``, ``use_token_compression``, and the compressor fields written by the fork's training code
  (chicheng567/OnlineLong ``videollama3/train/videollama3_chat_finetune_compressor.py``): ``trainable_mm_compressor``
  (true: the fork builds ``token_compressor`` only then), ``token_compressor_config`` (or ``token_compressor``; the
  dict of :class:`models.videollama3.qbase.TokenCompressorConfig` fields, read as the fork's ``build_token_compressor`` reads
  it: legacy ``compress_w``/``compress_h``, a missing ``hidden_size`` from ``mm_hidden_size`` or the vision width,
  a missing ``num_attention_heads`` from the top level, an unknown ``compressor_type`` an error naming the supported
  one), and ``compression_start_token_id`` / ``compression_end_token_id`` (checked against the tokenizer's
  ``<|compression_start|>`` / ``<|compression_end|>``). Other top-level fields (training arguments that LLaVA-style
  code stores in the config) are ignored.
* the vision encoder's config: ``vision_encoder_config`` (a dict), or, for a checkpoint trained stage-wise
  without it, a local config directory (``vision_config_dir``, or the config's own ``vision_encoder`` /
  ``mm_vision_encoder`` when it names a local directory holding ``config.json``; a hub id is never fetched), or
  else derived from the weights' shapes (:func:`vision_config_from_weights`).
* weights: ``model.safetensors``, ``model.safetensors.index.json`` + shards, ``pytorch_model.bin`` or
  ``pytorch_model.bin.index.json`` + shards (``.bin`` read with ``torch.load(weights_only=True)``).
* tokenizer files (with the added special tokens), optionally ``preprocessor_config.json`` (the original image
  processor: ``image_mean``, ``image_std``, ``rescale_factor``, ``patch_size`` are carried over) and optionally
  ``original_projector/model.safetensors`` (our format) or ``original_projector/*.pt`` (seed 001's
  ``torch.load(orig_projector_path, weights_only=True)`` state dict), for ``raw_mode="orig"``.

**Weight names.** Module paths of the original repository: ``Videollama3Qwen2ForCausalLM.model`` is a
``Qwen2Model`` (``embed_tokens``, ``layers``, ``norm``) that also holds ``vision_encoder``
(``Videollama3VisionEncoderModel``: ``embeddings.patch_embedding``, ``encoder.layers.N.{layer_norm1, self_attn.
{q,k,v,out}_proj, layer_norm2, mlp.fc1, mlp.fc2}``, ``post_layernorm``; the training repository wraps it once more
in ``encoder.Videollama3VisionEncoder`` whose attribute is again ``vision_encoder``), ``mm_projector``
(``MlpGeluProjector``: ``readout.0``, ``readout.2``) and ``token_compressor``, the fork's
``TransformerDecoderFlatCompressor`` (:mod:`models.videollama3.qbase` has its parameters under the fork's names: ``query``,
``layers.N.{self_attn,cross_attn}.{w_q,w_k,w_v,w_o}.weight``, ``layers.N.layer_norm{1,2,3}``, ``layers.N.mlp.fc{1,2}``,
``out_gamma``/``out_beta``). :data:`KEY_MAP` is the complete table; the part after the prefix is kept as is and must be a key of the
target module with the shape its config gives. Anything else is an error that lists every offending key.

Dropped on purpose: ``*.rotary_emb.inv_freq`` and the compressor's ``pos_encoding`` / ``*rotary*.inv_freq``
(recomputed buffers, non-persistent in the fork, that some savers write anyway) and ``lm_head.weight`` when
``tie_word_embeddings`` is set and it equals ``embed_tokens`` (an error when it differs).

**Output** (what :meth:`models.videollama3.model.BudgetedVideoLlama3.from_pretrained` reads): the transformers
``VideoLlama3ForConditionalGeneration`` directory (``config.json``, weights, optionally sharded with
``model.safetensors.index.json``), the tokenizer with its special tokens, ``video_preprocessor_config.json``,
``qbase/`` and, when available, ``original_projector/``. The loader also reads an original-layout directory
directly (:func:`load_original_parts`, same mapping, nothing written).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .qbase import TokenCompressorConfig, TransformerDecoderFlatCompressor

QBASE_DIR = "qbase"                       # = models.videollama3.model.QBASE_DIR (not imported: that module imports us)
ORIGINAL_PROJECTOR_DIR = "original_projector"
COMPRESSION_START = "<|compression_start|>"
COMPRESSION_END = "<|compression_end|>"
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
BIN_WEIGHTS = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"

# (original prefix, target, our prefix); target "model" = VideoLlama3ForConditionalGeneration, "qbase" = the
# compressor's own state dict. Ordered: the first matching prefix wins (the wrapped vision prefix before the plain one).
KEY_MAP: list[tuple[str, str, str]] = [
    ("model.vision_encoder.vision_encoder.", "model", "model.vision_model."),   # training repo (encoder.py wrapper)
    ("model.vision_encoder.", "model", "model.vision_model."),                  # released checkpoints
    ("model.mm_projector.", "model", "model.projector."),
    ("model.embed_tokens.", "model", "model.language_model.embed_tokens."),
    ("model.layers.", "model", "model.language_model.layers."),
    ("model.norm.", "model", "model.language_model.norm."),
    ("lm_head.", "model", "lm_head."),
    ("model.token_compressor.", "qbase", ""),
]
DROPPED = re.compile(r"(^|\.)rotary_emb\.inv_freq$|^model\.token_compressor\.(pos_encoding|(cross_)?rotary(_pos_emb)?\.inv_freq)$")
ORIGINAL_MODEL_TYPE = "videollama3_qwen2"
# fields of the original config that are not Qwen2 LM fields (all others that Qwen2Config knows go to text_config)
_LEGACY_QWEN2_FIELDS = {"rope_theta", "rope_scaling", "torch_dtype"}  # transformers-4 names
_GENERIC_FIELDS = {"transformers_version", "architectures", "id2label", "label2id", "problem_type",
                   "output_hidden_states", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder"}
_VISION_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
                  "patch_size", "hidden_act", "layer_norm_eps", "attention_dropout")
_PROCESSOR_FIELDS = ("image_mean", "image_std", "rescale_factor", "patch_size")


# ---------------------------------------------------------------------- safetensors in / out
def read_safetensors_dir(directory: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: ``model.safetensors``, the shards named by
    ``model.safetensors.index.json``, ``pytorch_model.bin`` or the shards of ``pytorch_model.bin.index.json``
    (safetensors first; ``.bin`` files are read with ``torch.load(weights_only=True)``, so a pickle cannot run code).

    Raises:
        FileNotFoundError: none of these files exists, or an index names a missing shard (path named).
    """
    directory = Path(directory)
    for index_name, single, binary in ((SAFE_INDEX, SAFE_WEIGHTS, False), (BIN_INDEX, BIN_WEIGHTS, True)):
        index = directory / index_name
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (directory / single).is_file():
            files = [single]
        else:
            continue
        state: dict[str, torch.Tensor] = {}
        for name in files:
            path = directory / name
            if not path.is_file():
                raise FileNotFoundError(f"{index} names {name}, which is missing")
            state.update(_read_weights_file(path) if binary else _read_safetensors_file(path))
        return state
    raise FileNotFoundError(f"no {SAFE_WEIGHTS}, {SAFE_INDEX}, {BIN_WEIGHTS} or {BIN_INDEX} in {directory}")


def _read_safetensors_file(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """One ``.safetensors`` file, or a ``.bin`` / ``.pt`` state dict read with ``weights_only=True`` (a dict of
    tensors, possibly under ``"state_dict"``).

    Raises:
        ValueError: the file holds no dict of tensors (path named).
    """
    if path.suffix == ".safetensors":
        return _read_safetensors_file(path)
    obj = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path}: not a state dict of tensors")
    return dict(obj)


def parse_size(size: int | str | None) -> int | None:
    """``"5GB"`` / ``"200KB"`` / ``"1MiB"`` / bytes -> bytes (decimal units as in transformers; ``None`` = no sharding)."""
    if size is None or isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", size, flags=re.I)
    if not m:
        raise ValueError(f"cannot parse shard size {size!r} (e.g. 5GB, 500MB, 1048576)")
    unit = (m.group(2) or "B").upper()
    mult = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
    return int(float(m.group(1)) * mult)


def write_safetensors_dir(state: dict[str, torch.Tensor], directory: str | Path, max_shard_size: int | str | None = None
                          ) -> list[str]:
    """Write ``state`` as ``model.safetensors``, or as ``model-0000i-of-0000n.safetensors`` shards of at most
    ``max_shard_size`` bytes each (a larger tensor gets a shard of its own) plus ``model.safetensors.index.json``.

    Returns:
        the file names written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    limit = parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous()
        nbytes = t.numel() * t.element_size()
        if limit is not None and shards[-1] and sizes[-1] + nbytes > limit:
            shards.append({})
            sizes.append(0)
        shards[-1][k] = t
        sizes[-1] += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(directory / SAFE_WEIGHTS), metadata={"format": "pt"})
        return [SAFE_WEIGHTS]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards):
        save_file(shard, str(directory / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    (directory / SAFE_INDEX).write_text(json.dumps(
        {"metadata": {"total_size": sum(sizes)}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    return names + [SAFE_INDEX]


# ---------------------------------------------------------------------- layout detection and config
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


# ---------------------------------------------------------------------- weights
def _expected_shapes(translated: Translated) -> tuple[dict[str, torch.Size], dict[str, torch.Size]]:
    """Key -> shape of our model's saved weights (tied ``lm_head`` excluded) and of the token compressor."""
    from transformers import VideoLlama3ForConditionalGeneration

    with torch.device("meta"):
        model = VideoLlama3ForConditionalGeneration(translated.config)
        qb = TransformerDecoderFlatCompressor(translated.qbase)
    ours = {k: v.shape for k, v in model.state_dict().items()}
    if translated.config.tie_word_embeddings:
        ours.pop("lm_head.weight", None)
    return ours, {k: v.shape for k, v in qb.state_dict().items()}


def map_state_dict(state: dict[str, torch.Tensor], translated: Translated
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Original keys -> (our model's state dict, qbase state dict) through :data:`KEY_MAP`.

    Raises:
        ValueError: listing every key that matches no prefix or lands on no key of its target, every missing key,
            every shape that does not match the translated configs (the compressor's included), and a tied
            ``lm_head`` that differs from ``embed_tokens``.
    """
    want = dict(zip(("model", "qbase"), _expected_shapes(translated)))
    out: dict[str, dict[str, torch.Tensor]] = {"model": {}, "qbase": {}}
    source: dict[tuple[str, str], str] = {}
    unplaced, shapes, duplicate = [], [], []
    mismatched: set[tuple[str, str]] = set()
    tied = translated.config.tie_word_embeddings
    for key, tensor in state.items():
        if DROPPED.search(key):
            continue
        for prefix, target, ours in KEY_MAP:
            if key.startswith(prefix):
                new = ours + key[len(prefix):]
                break
        else:
            unplaced.append(key)
            continue
        if tied and target == "model" and new == "lm_head.weight":
            emb = state.get("model.embed_tokens.weight")
            if emb is None or emb.shape != tensor.shape or not torch.equal(emb, tensor):
                unplaced.append(f"{key} (tie_word_embeddings is true but it differs from model.embed_tokens.weight)")
            continue
        if new not in want[target]:
            unplaced.append(f"{key} (-> {target}:{new}, no such key)")
            continue
        if (target, new) in source:
            duplicate.append(f"{key} and {source[(target, new)]} both -> {target}:{new}")
            continue
        if tuple(tensor.shape) != tuple(want[target][new]):
            shapes.append(f"{key}: checkpoint {tuple(tensor.shape)} vs {target} config {tuple(want[target][new])}")
            mismatched.add((target, new))
            continue
        source[(target, new)] = key
        out[target][new] = tensor
    missing = [f"{t}:{k}" for t in ("model", "qbase") for k in sorted(want[t])
               if k not in out[t] and (t, k) not in mismatched]  # a mis-shaped key is listed once, under shapes
    if unplaced or shapes or missing or duplicate:
        raise ValueError(
            "original checkpoint does not map onto our model + qbase compressor:"
            f"\n  unplaced keys ({len(unplaced)}): {sorted(unplaced)}"
            f"\n  shape mismatches ({len(shapes)}): {sorted(shapes)}"
            f"\n  missing ({len(missing)}): {missing}"
            f"\n  duplicates ({len(duplicate)}): {duplicate}")
    return out["model"], out["qbase"]


def projector_state_from(path: str | Path) -> dict[str, torch.Tensor]:
    """The ``VideoLlama3Projector`` state (``readout.*``) from an original-layout checkpoint's ``model.mm_projector.*``
    (a directory, sharded or not, or one ``.safetensors`` file), from our ``original_projector`` file/dir, or from a
    ``.pt`` / ``.bin`` state dict as seed 001 loads it into ``build_vision_projector(...)``, keys ``readout.*``:
    ``torch.load(orig_projector_path, weights_only=True, map_location="cpu")``.

    Raises:
        ValueError: no projector keys found.
    """
    path = Path(path)
    if path.is_dir():
        pts = sorted(path.glob("*.pt"))
        state = read_safetensors_dir(path) if not pts or (path / SAFE_WEIGHTS).is_file() else _read_weights_file(pts[0])
    else:
        state = _read_weights_file(path)
    for prefix in ("model.mm_projector.", ""):
        got = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix) and
               k[len(prefix):].startswith("readout.")}
        if got:
            return got
    raise ValueError(f"{path}: no model.mm_projector.readout.* (or readout.*) weights")


# ---------------------------------------------------------------------- read / convert / load
@dataclass
class OriginalCheckpoint:
    """An original-layout checkpoint translated in memory."""

    translated: Translated
    model_state: dict[str, torch.Tensor]
    qbase_state: dict[str, torch.Tensor]
    video_processor: object
    original_projector: dict[str, torch.Tensor] | None


def find_original_projector(directory: Path) -> Path | None:
    """``original_projector/model.safetensors`` or the one ``original_projector/*.pt`` of ``directory``, if any."""
    d = directory / ORIGINAL_PROJECTOR_DIR
    if (d / SAFE_WEIGHTS).is_file():
        return d / SAFE_WEIGHTS
    pts = sorted(d.glob("*.pt")) if d.is_dir() else []
    return pts[0] if len(pts) == 1 else None


def read_original(original_dir: str | Path, original_projector: str | Path | None = None,
                  vision_config_dir: str | Path | None = None) -> OriginalCheckpoint:
    """Read and map an original-layout directory (nothing written). See the module docstring for the layout.

    Raises:
        FileNotFoundError: config or weights missing.
        ValueError: config not translatable, or keys/shapes that do not map (all listed).
    """
    from transformers import AutoTokenizer

    src = Path(original_dir)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no config.json in {src}")
    orig = json.loads(cfg_path.read_text())
    if not is_original_layout(src):
        raise ValueError(f"{src} is not in the original VideoLLaMA3 layout (config.json has text_config or no "
                         "vision_encoder_config)")
    with warnings.catch_warnings():  # AutoTokenizer parses the original config.json, whose rope_scaling is legacy
        warnings.filterwarnings("ignore", message=".*rope_scaling.*", category=FutureWarning)
        tokenizer = AutoTokenizer.from_pretrained(src)
    state = read_safetensors_dir(src)
    translated = translate_config(orig, tokenizer, state, vision_config_dir)
    model_state, qbase_state = map_state_dict(state, translated)
    proj = None
    found = original_projector if original_projector is not None else find_original_projector(src)
    if found is not None:
        proj = projector_state_from(found)
    if proj is not None:
        want = {k[len("model.projector."):]: tuple(v.shape) for k, v in model_state.items()
                if k.startswith("model.projector.")}
        got = {k: tuple(v.shape) for k, v in proj.items()}
        if got != want:
            raise ValueError(f"original projector does not match the checkpoint's projector: {got} vs {want}")
    return OriginalCheckpoint(translated, model_state, qbase_state, translate_video_processor(src), proj)


def convert(original_dir: str | Path, out_dir: str | Path, max_shard_size: int | str | None = None,
            original_projector: str | Path | None = None, vision_config_dir: str | Path | None = None) -> Path:
    """Write our layout for an original-layout checkpoint (see the module docstring).

    Args:
        max_shard_size: shard the LLM weights (e.g. ``"5GB"``); ``None`` writes one ``model.safetensors``.
        original_projector: the released VideoLLaMA3 checkpoint (or file) whose ``mm_projector`` is the original
            projector for ``raw_mode="orig"`` (or seed 001's ``.pt`` state dict); default: the source's
            ``original_projector/`` if present.
        vision_config_dir: a local directory with the vision encoder's ``config.json`` (for a checkpoint without
            ``vision_encoder_config`` whose encoder is not derivable from its weights).

    Returns:
        ``out_dir``.
    """
    ck = read_original(original_dir, original_projector, vision_config_dir)
    out = Path(out_dir)
    if out.resolve() == Path(original_dir).resolve():
        raise ValueError("out_dir must differ from original_dir")
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("model*.safetensors")) + [out / SAFE_INDEX]:
        stale.unlink(missing_ok=True)
    cfg = ck.translated.config
    first = next(iter(ck.model_state.values()))
    cfg.dtype = first.dtype
    cfg.architectures = ["VideoLlama3ForConditionalGeneration"]
    cfg.save_pretrained(out)
    write_safetensors_dir(ck.model_state, out, max_shard_size)
    ck.translated.tokenizer.save_pretrained(out)
    ck.video_processor.save_pretrained(out)
    qdir = out / QBASE_DIR
    qdir.mkdir(exist_ok=True)
    from dataclasses import asdict

    (qdir / TransformerDecoderFlatCompressor.CONFIG_NAME).write_text(json.dumps(asdict(ck.translated.qbase), indent=2))
    save_file({k: v.contiguous() for k, v in ck.qbase_state.items()},
              str(qdir / TransformerDecoderFlatCompressor.WEIGHTS_NAME),
              metadata={"format": "pt"})
    if ck.original_projector is not None:
        pdir = out / ORIGINAL_PROJECTOR_DIR
        pdir.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in ck.original_projector.items()}, str(pdir / SAFE_WEIGHTS),
                  metadata={"format": "pt"})
    else:
        shutil.rmtree(out / ORIGINAL_PROJECTOR_DIR, ignore_errors=True)
    return out


def load_original_parts(original_dir: str | Path, dtype: torch.dtype, attn_implementation: str | None,
                        raw_mode: str = "phase3", original_projector: str | Path | None = None,
                        vision_config_dir: str | Path | None = None):
    """What ``BudgetedVideoLlama3.from_pretrained`` needs, straight from an original-layout directory (in memory,
    through the same mapping as :func:`convert`).

    Returns:
        ``(model, tokenizer, video_processor, compressor, original_projector_or_None)``, in eval mode and ``dtype``.

    Raises:
        FileNotFoundError: ``raw_mode="orig"`` without an ``original_projector/`` in the directory.
        ValueError: as :func:`read_original`, or transformers reports missing/unexpected/mismatched keys.
    """
    from transformers import VideoLlama3ForConditionalGeneration

    from .qbase import load_state_dict_strict

    ck = read_original(original_dir, original_projector, vision_config_dir)
    model, info = VideoLlama3ForConditionalGeneration.from_pretrained(
        None, config=ck.translated.config, state_dict=ck.model_state, dtype=dtype,
        attn_implementation=attn_implementation, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ValueError(f"{original_dir}: mapped weights do not match VideoLlama3ForConditionalGeneration: {bad}")
    compressor = TransformerDecoderFlatCompressor(ck.translated.qbase)
    load_state_dict_strict(compressor, ck.qbase_state, f"{original_dir} (model.token_compressor.*)")
    orig = None
    if raw_mode == "orig":
        if ck.original_projector is None:
            raise FileNotFoundError(f"raw_mode='orig' needs the original projector: "
                                    f"{Path(original_dir) / ORIGINAL_PROJECTOR_DIR}/{SAFE_WEIGHTS} or one *.pt there, "
                                    "or original_projector=PATH")
        orig = type(model.model.projector)(model.config)
        load_state_dict_strict(orig, ck.original_projector, "original projector")
        orig = orig.to(dtype).eval()
    return model.eval(), ck.translated.tokenizer, ck.video_processor, compressor.to(dtype).eval(), orig


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("original_dir", help="checkpoint in the original VideoLLaMA3 layout (with a token compressor)")
    ap.add_argument("out_dir", help="where to write our layout")
    ap.add_argument("--max-shard-size", default=None, help="shard the weights, e.g. 5GB (default: one file)")
    ap.add_argument("--original-projector", default=None,
                    help="released VideoLLaMA3 checkpoint (dir or .safetensors) whose mm_projector is the original "
                         "projector for raw_mode=orig, or seed 001's .pt state dict (default: the source's "
                         "original_projector/, if any)")
    ap.add_argument("--vision-config", default=None,
                    help="local directory with the vision encoder's config.json, for a checkpoint without "
                         "vision_encoder_config whose encoder cannot be derived from its weights")
    args = ap.parse_args(argv)
    out = convert(args.original_dir, args.out_dir, args.max_shard_size, args.original_projector, args.vision_config)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
