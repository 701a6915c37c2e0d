"""Mapping an original-layout checkpoint's weights onto ours: the key table, the shape checks, the original projector.

:data:`KEY_MAP` is the complete table of original weight-name prefixes (see :mod:`models.videollama3.convert`'s
docstring for the module paths they come from); anything it does not place is an error listing every offending key.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from .weight_files import ORIGINAL_PROJECTOR_DIR
from .original_config import Translated
from .qbase import TransformerDecoderFlatCompressor
from .weight_files import SAFE_WEIGHTS, _read_weights_file, read_safetensors_dir

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


def find_original_projector(directory: Path) -> Path | None:
    """``original_projector/model.safetensors`` or the one ``original_projector/*.pt`` of ``directory``, if any."""
    d = directory / ORIGINAL_PROJECTOR_DIR
    if (d / SAFE_WEIGHTS).is_file():
        return d / SAFE_WEIGHTS
    pts = sorted(d.glob("*.pt")) if d.is_dir() else []
    return pts[0] if len(pts) == 1 else None
