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
  else derived from the weights' shapes (:func:`models.videollama3.original_config.vision_config_from_weights`).
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
``out_gamma``/``out_beta``). :data:`models.videollama3.original_weights.KEY_MAP` is the complete table; the part after the prefix is kept as is and must be a key of the
target module with the shape its config gives. Anything else is an error that lists every offending key.

Dropped on purpose: ``*.rotary_emb.inv_freq`` and the compressor's ``pos_encoding`` / ``*rotary*.inv_freq``
(recomputed buffers, non-persistent in the fork, that some savers write anyway) and ``lm_head.weight`` when
``tie_word_embeddings`` is set and it equals ``embed_tokens`` (an error when it differs).

**Output** (what :meth:`models.videollama3.model.BudgetedVideoLlama3.from_pretrained` reads): the transformers
``VideoLlama3ForConditionalGeneration`` directory (``config.json``, weights, optionally sharded with
``model.safetensors.index.json``), the tokenizer with its special tokens, ``video_preprocessor_config.json``,
``qbase/`` and, when available, ``original_projector/``. The loader also reads an original-layout directory
directly (:func:`load_original_parts`, same mapping, nothing written).

**Where the pieces live**: this module is the entry point (read, convert, load, the CLI);
:mod:`models.videollama3.weight_files` reads and writes the weight files, :mod:`models.videollama3.original_config`
translates the config and the preprocessor, :mod:`models.videollama3.original_weights` maps the weight names, and
:mod:`models.videollama3.original_layout` writes the original layout from ours (the inverse).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from .chat_template import processor_chat_template
from .weight_files import ORIGINAL_PROJECTOR_DIR, QBASE_DIR
from .original_config import Translated, is_original_layout, translate_config, translate_video_processor
from .original_weights import find_original_projector, map_state_dict, projector_state_from
from .qbase import TransformerDecoderFlatCompressor
from .weight_files import SAFE_INDEX, SAFE_WEIGHTS, read_safetensors_dir, write_safetensors_dir


# ---------------------------------------------------------------------- read / convert / load
@dataclass
class OriginalCheckpoint:
    """An original-layout checkpoint translated in memory."""

    translated: Translated
    model_state: dict[str, torch.Tensor]
    qbase_state: dict[str, torch.Tensor]
    video_processor: object
    original_projector: dict[str, torch.Tensor] | None



class _DropModelTypeWarning(logging.Filter):
    """Drops transformers' "You are using a model of type `videollama3_qwen2` to instantiate a model of type ``"."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "to instantiate a model of type" not in str(record.getMessage())


@contextlib.contextmanager
def _without_model_type_warning():
    """Inside the block, transformers' config loader does not warn about the original ``model_type``: AutoTokenizer
    reads the original ``config.json`` (``videollama3_qwen2``, a type transformers does not register) through the base
    config class only to look for a tokenizer class, and ``tokenizer_config.json`` names it; the warning said nothing
    about the load, yet was printed on every original-layout load)."""
    logger = logging.getLogger("transformers.configuration_utils")
    drop = _DropModelTypeWarning()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def read_original(original_dir: str | Path, original_projector: str | Path | None = None,
                  vision_config_dir: str | Path | None = None) -> OriginalCheckpoint:
    """Read and map an original-layout directory (nothing written). See the module docstring for the layout.

    Raises:
        FileNotFoundError: config or weights missing.
        ValueError: config not translatable, or keys/shapes that do not map (all listed).
    """
    from transformers import AutoTokenizer

    src = Path(original_dir)
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: no such folder (the original-layout checkpoint to convert)")
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no config.json in {src}")
    orig = json.loads(cfg_path.read_text())
    if not is_original_layout(src):
        raise ValueError(f"{src} is not in the original VideoLLaMA3 layout (config.json has text_config or no "
                         "vision_encoder_config)")
    with warnings.catch_warnings(), _without_model_type_warning():
        # AutoTokenizer parses the original config.json, whose rope_scaling is legacy
        warnings.filterwarnings("ignore", message=".*rope_scaling.*", category=FutureWarning)
        tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.chat_template = processor_chat_template(src)  # seed 001: Videollama3Processor's template (saved on)
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
    try:
        out = convert(args.original_dir, args.out_dir, args.max_shard_size, args.original_projector,
                      args.vision_config)
    except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError) as e:
        # a wrong folder or a checkpoint that does not map: one line naming it (its own messages name the file),
        # exit status 2 as the entry points' user errors; TOKENBUDGET_TRACEBACK=1 shows the traceback
        if os.environ.get("TOKENBUDGET_TRACEBACK"):
            raise
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
