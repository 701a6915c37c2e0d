"""Convert a checkpoint saved in the original VideoLLaMA3 layout (with a token compressor) into ours.

``python -m models.convert <original_dir> <out_dir> [--max-shard-size 5GB] [--original-projector PATH]``

**Original layout** (training code built on ``DAMO-NLP-SG/VideoLLaMA3``, model class ``Videollama3Qwen2ForCausalLM``):

* ``config.json`` -- ``Videollama3Qwen2Config``: the Qwen2 LM fields at the top level (``vocab_size``,
  ``hidden_size``, ``num_hidden_layers``, ``rope_theta``, ``tie_word_embeddings``, ...), ``vision_encoder_config``
  (the ``Videollama3VisionEncoderConfig`` dict), ``mm_projector_type`` (must be ``mlp2x_gelu``),
  ``image_token_index``, ``use_token_compression``, and the compressor fields written by the training code:
  ``trainable_mm_compressor`` (true), ``mm_compressor_type`` (``"qbase"``), ``token_compressor_config`` (a dict of
  :class:`models.qbase.QBaseConfig` fields except ``hidden_size``, which is the vision width), and
  ``compression_start_token_id`` / ``compression_end_token_id`` (checked against the tokenizer's
  ``<|compression_start|>`` / ``<|compression_end|>``). Other top-level fields (training arguments that LLaVA-style
  code stores in the config) are ignored.
* ``model.safetensors`` or ``model.safetensors.index.json`` + shards (safetensors only).
* tokenizer files (with the added special tokens), optionally ``preprocessor_config.json`` (the original image
  processor: ``image_mean``, ``image_std``, ``rescale_factor``, ``patch_size`` are carried over) and optionally
  ``original_projector/model.safetensors`` (our format, copied for ``raw_mode="orig"``).

**Weight names.** Module paths of the original repository: ``Videollama3Qwen2ForCausalLM.model`` is a
``Qwen2Model`` (``embed_tokens``, ``layers``, ``norm``) that also holds ``vision_encoder``
(``Videollama3VisionEncoderModel``: ``embeddings.patch_embedding``, ``encoder.layers.N.{layer_norm1, self_attn.
{q,k,v,out}_proj, layer_norm2, mlp.fc1, mlp.fc2}``, ``post_layernorm``; the training repository wraps it once more
in ``encoder.Videollama3VisionEncoder`` whose attribute is again ``vision_encoder``), ``mm_projector``
(``MlpGeluProjector``: ``readout.0``, ``readout.2``) and ``token_compressor``. The compressor is our qbase
architecture, so the training code writes it as ``model.token_compressor.<qbase key>`` (``queries``,
``layers.N.{norm_self, self_attn.{q,kv,out}, norm_q, norm_kv, cross_attn.{q,kv,out}, norm_mlp, mlp.0, mlp.2}``,
``norm``). :data:`KEY_MAP` is the complete table; the part after the prefix is kept as is and must be a key of the
target module with the shape its config gives. Anything else is an error that lists every offending key.

Dropped on purpose: ``*.rotary_emb.inv_freq`` (a recomputed buffer some old savers wrote) and ``lm_head.weight`` when
``tie_word_embeddings`` is set and it equals ``embed_tokens`` (an error when it differs).

**Output** (what :meth:`models.videollama3.BudgetedVideoLlama3.from_pretrained` reads): the transformers
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

from .qbase import QBaseCompressor, QBaseConfig

QBASE_DIR = "qbase"                       # = models.videollama3.QBASE_DIR (not imported: that module imports us)
ORIGINAL_PROJECTOR_DIR = "original_projector"
COMPRESSION_START = "<|compression_start|>"
COMPRESSION_END = "<|compression_end|>"
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"

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
DROPPED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
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
    """All tensors of ``model.safetensors`` or of the shards named by ``model.safetensors.index.json``.

    Raises:
        FileNotFoundError: neither file exists (``.bin`` checkpoints are not read).
    """
    directory = Path(directory)
    index = directory / SAFE_INDEX
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / SAFE_WEIGHTS).is_file():
        files = [SAFE_WEIGHTS]
    else:
        raise FileNotFoundError(f"no {SAFE_WEIGHTS} or {SAFE_INDEX} in {directory} (only safetensors are read)")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(directory / name), framework="pt") as f:
            for k in f.keys():
                state[k] = f.get_tensor(k)
    return state


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
    qbase: QBaseConfig
    tokenizer: object


def translate_config(orig: dict, tokenizer) -> Translated:
    """Original ``config.json`` dict -> ``VideoLlama3Config`` + :class:`QBaseConfig` (tokenizer used for the ids).

    Raises:
        ValueError: no ``vision_encoder_config``, a projector other than ``mlp2x_gelu``, a compressor type other than
            ``qbase``, ``token_compressor_config`` fields that qbase does not have, or compression token ids that do
            not match the tokenizer's ``<|compression_start|>`` / ``<|compression_end|>`` (all problems listed).
    """
    from transformers import Qwen2Config, VideoLlama3Config
    from transformers.models.video_llama_3.configuration_video_llama_3 import VideoLlama3VisionConfig

    problems = []
    vis = orig.get("vision_encoder_config")
    if not isinstance(vis, dict) or not vis:
        problems.append("config.json has no vision_encoder_config (a dict of the vision encoder's fields)")
        vis = {}
    if orig.get("mm_projector_type", "mlp2x_gelu") != "mlp2x_gelu":
        problems.append(f"mm_projector_type={orig.get('mm_projector_type')!r}: only 'mlp2x_gelu' maps onto "
                        "VideoLlama3Projector")
    if orig.get("mm_compressor_type", "qbase") != "qbase":
        problems.append(f"mm_compressor_type={orig.get('mm_compressor_type')!r}: only 'qbase' is supported")
    qfields = {f.name for f in fields(QBaseConfig)}
    tc = dict(orig.get("token_compressor_config") or {})
    unknown = sorted(set(tc) - qfields)
    if unknown:
        problems.append(f"token_compressor_config has fields qbase does not know: {unknown}")
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
    if "hidden_size" in tc and tc["hidden_size"] != vision.hidden_size:
        raise ValueError(f"token_compressor_config.hidden_size={tc['hidden_size']} but the vision encoder width is "
                         f"{vision.hidden_size}")
    tc["hidden_size"] = vision.hidden_size
    return Translated(config=config, qbase=QBaseConfig(**tc), tokenizer=tokenizer)


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
    """Key -> shape of our model's saved weights (tied ``lm_head`` excluded) and of the qbase compressor."""
    from transformers import VideoLlama3ForConditionalGeneration

    with torch.device("meta"):
        model = VideoLlama3ForConditionalGeneration(translated.config)
        qb = QBaseCompressor(translated.qbase)
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
    (a directory, sharded or not, or one ``.safetensors`` file), or from our ``original_projector`` file/dir.

    Raises:
        ValueError: no projector keys found.
    """
    path = Path(path)
    if path.is_dir():
        state = read_safetensors_dir(path)
    else:
        with safe_open(str(path), framework="pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}
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


def read_original(original_dir: str | Path, original_projector: str | Path | None = None) -> OriginalCheckpoint:
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
    translated = translate_config(orig, tokenizer)
    model_state, qbase_state = map_state_dict(read_safetensors_dir(src), translated)
    proj = None
    if original_projector is not None:
        proj = projector_state_from(original_projector)
    elif (src / ORIGINAL_PROJECTOR_DIR / SAFE_WEIGHTS).is_file():
        proj = projector_state_from(src / ORIGINAL_PROJECTOR_DIR / SAFE_WEIGHTS)
    if proj is not None:
        want = {k[len("model.projector."):]: tuple(v.shape) for k, v in model_state.items()
                if k.startswith("model.projector.")}
        got = {k: tuple(v.shape) for k, v in proj.items()}
        if got != want:
            raise ValueError(f"original projector does not match the checkpoint's projector: {got} vs {want}")
    return OriginalCheckpoint(translated, model_state, qbase_state, translate_video_processor(src), proj)


def convert(original_dir: str | Path, out_dir: str | Path, max_shard_size: int | str | None = None,
            original_projector: str | Path | None = None) -> Path:
    """Write our layout for an original-layout checkpoint (see the module docstring).

    Args:
        max_shard_size: shard the LLM weights (e.g. ``"5GB"``); ``None`` writes one ``model.safetensors``.
        original_projector: the released VideoLLaMA3 checkpoint (or file) whose ``mm_projector`` is the original
            projector for ``raw_mode="orig"``; default: the source's ``original_projector/`` if present.

    Returns:
        ``out_dir``.
    """
    ck = read_original(original_dir, original_projector)
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

    (qdir / QBaseCompressor.CONFIG_NAME).write_text(json.dumps(asdict(ck.translated.qbase), indent=2))
    save_file({k: v.contiguous() for k, v in ck.qbase_state.items()}, str(qdir / QBaseCompressor.WEIGHTS_NAME),
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
                        raw_mode: str = "phase3"):
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

    ck = read_original(original_dir)
    model, info = VideoLlama3ForConditionalGeneration.from_pretrained(
        None, config=ck.translated.config, state_dict=ck.model_state, dtype=dtype,
        attn_implementation=attn_implementation, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ValueError(f"{original_dir}: mapped weights do not match VideoLlama3ForConditionalGeneration: {bad}")
    compressor = QBaseCompressor(ck.translated.qbase)
    load_state_dict_strict(compressor, ck.qbase_state, f"{original_dir} (model.token_compressor.*)")
    orig = None
    if raw_mode == "orig":
        if ck.original_projector is None:
            raise FileNotFoundError(f"raw_mode='orig' needs the original projector at "
                                    f"{Path(original_dir) / ORIGINAL_PROJECTOR_DIR / SAFE_WEIGHTS}")
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
                         "projector for raw_mode=orig (default: the source's original_projector/, if any)")
    args = ap.parse_args(argv)
    out = convert(args.original_dir, args.out_dir, args.max_shard_size, args.original_projector)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
