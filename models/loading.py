"""Local checkpoint directories only: nothing here ever asks a model hub."""
from __future__ import annotations

import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path

from algorithms.errors import CheckpointError, SettingError

# transformers resolves a missing local path as a hub id; with this set it fails fast instead of trying the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def local_checkpoint(path: str | Path, what: str, hint: str = "", weights: bool = True) -> Path:
    """``path`` as a checkpoint directory holding ``config.json`` and, with ``weights``, a weights file
    (:data:`WEIGHT_SUFFIXES`; ``False`` where the model comes from elsewhere and only the folder's configs and
    processors are read, as ``bench/extract_throughput.py``'s in-memory thinker).

    Raises:
        FileNotFoundError: naming the path, what was expected there and how to create the demo one.
        CheckpointError: ``config.json`` without any weights file beside it (transformers' own message was a
            traceback ending "no file named model.safetensors").
    """
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"no {what} checkpoint at {p} (config.json missing){'; ' + hint if hint else ''}")
    if weights and not any(f.suffix in WEIGHT_SUFFIXES for f in p.iterdir()):
        raise CheckpointError(f"{p}: config.json but no weights file beside it (none of "
                              f"{', '.join('*' + s for s in WEIGHT_SUFFIXES)}); copy the whole {what} checkpoint")
    return p


def check_model_type(path: Path, what: str, model_types: tuple[str, ...]) -> None:
    """Refuse a checkpoint of another model family, by its ``config.json``'s ``model_type``, in one line (loaded,
    a Qwen2.5-Omni folder given as VideoLLaMA3's failed deep in transformers, e.g. "embed_dim must be divisible by
    num_heads"). A ``config.json`` that is not a JSON object is left to the load, which names it.

    Raises:
        CheckpointError: naming the folder, the ``model_type`` found and the ones expected.
    """
    try:
        found = json.loads((path / "config.json").read_text()).get("model_type")
    except (ValueError, AttributeError):
        return
    if found not in model_types:
        raise CheckpointError(f"{path}: config.json's model_type is {found!r}, not a {what} checkpoint (expected "
                              f"{' or '.join(repr(t) for t in model_types)})")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# transformers' Qwen2_5OmniThinkerConfig / Qwen2_5OmniConfig (a whole released Qwen2.5-Omni folder holds the thinker)
OMNI_MODEL_TYPES = ("qwen2_5_omni_thinker", "qwen2_5_omni")


def _kind(mode: int) -> str:
    return ("a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file")


def check_weight_files(path: str | Path) -> None:
    """Refuse a weights file under ``path`` (a checkpoint directory, or one file) that is not a regular file: a
    link to ``/dev/zero`` would be read for ever (or, as transformers tests ``os.path.isfile``, be reported as "no
    file named model.safetensors"), a FIFO would wait for a writer.

    Raises:
        CheckpointError: naming the file, what it is and the link's target.
    """
    p = Path(path)
    files = [f for f in p.iterdir() if f.suffix in WEIGHT_SUFFIXES] if p.is_dir() else [p]
    for f in files:
        try:
            mode = os.stat(f).st_mode
        except OSError as e:
            if os.path.islink(f):
                raise CheckpointError(f"{f}: a weights file that is a broken or looping symbolic link ({e.strerror}); "
                                      "copy the checkpoint again") from e
            continue
        if not stat.S_ISREG(mode):
            target = f" (a link to {os.readlink(f)})" if os.path.islink(f) else ""
            raise CheckpointError(f"{f}: the weights file is {_kind(mode)}{target}, not a regular file; copy the "
                                  "checkpoint again")


@contextmanager
def reading_checkpoint(path: str | Path):
    """Re-raise an unreadable weight or config file under ``path`` (a truncated or corrupted safetensors file,
    invalid JSON, a weights file that is a device or FIFO: :func:`check_weight_files`) as
    :class:`~algorithms.errors.CheckpointError` naming ``path``, and a pickled weights file torch's
    ``weights_only=True`` refuses as one line that says why (torch's own message ends "re-running with
    weights_only=False will likely succeed", the unsafe way); other errors pass unchanged."""
    import pickle

    check_weight_files(path)
    try:
        yield
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError) as e:
        raise CheckpointError(f"{path}: a config file is not valid ({type(e).__name__}: {e})") from e
    except pickle.UnpicklingError as e:
        if "weights_only" not in str(e):
            raise
        pickles = sorted(f.name for f in Path(path).glob("*") if f.suffix in WEIGHT_SUFFIXES[1:]) \
            if Path(path).is_dir() else [Path(path).name]
        names = f" {', '.join(pickles)}" if pickles else ""
        raise CheckpointError(
            f"{path}: refused the pickled weights file{'s' * (len(pickles) > 1)}{names}: it holds more than tensors, "
            "and unpickling can run code, so it is read with weights_only=True only. Convert the checkpoint to "
            "safetensors where you trust it (safetensors.torch.save_file of its state dict); do not load it with "
            "weights_only=False") from e
    except Exception as e:  # noqa: BLE001 - only safetensors' own error is translated
        if type(e).__name__ != "SafetensorError":
            raise
        raise CheckpointError(f"{path}: a safetensors file cannot be read ({e}; truncated or corrupted? copy the "
                              "checkpoint again)") from e


# the seeds' attention kernel: seed 001:1074 ``from_pretrained(model_path, torch_dtype=torch.bfloat16,
# attn_implementation="flash_attention_2")`` (seed 000 loads through the same BudgetedVideoLLM); OmniZip@9060291
# eval/eval.py loads the omni model the same way
FLASH_ATTENTION_2 = "flash_attention_2"


def check_attn_implementation(where: str, name: str | None, dtype: str) -> None:
    """Refuse ``flash_attention_2`` where it cannot run, in one line, before anything is written.

    Args:
        where: the setting's name for the message (``model.init_args.attn_implementation``).
        name: the attention backend asked for (other names pass unchecked: transformers checks them at load).
        dtype: the model dtype (``float32`` / ``bfloat16`` / ``float16``).

    Raises:
        SettingError: ``flash_attention_2`` without the ``flash_attn`` package installed, or with ``float32``
            (the kernel runs in half precision only).
    """
    if name != FLASH_ATTENTION_2:
        return
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        raise SettingError(f"{where}=flash_attention_2 needs the flash_attn package, which is not installed here "
                           "(pip install flash-attn; or keep the default sdpa)")
    if dtype == "float32":
        raise SettingError(f"{where}=flash_attention_2 runs in half precision only: set model.init_args.dtype to "
                           "bfloat16 (the seeds' dtype) or float16")


OMNI_DTYPES = ("float32", "bfloat16", "float16")


def load_omni_thinker(model_dir: str | Path, dtype: str = "float32", attn_implementation: str = "sdpa",
                      thinker=None, fused_kernels: bool = True):
    """The Qwen2.5-Omni thinker and its processors from one local directory (shared by feature extraction and
    omni QA).

    Args:
        model_dir: a thinker or full Qwen2.5-Omni checkpoint directory (the talker/token2wav weights are ignored).
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        attn_implementation: passed to ``from_pretrained``.
        thinker: an already built thinker (bench: random weights in memory), used as is.
        fused_kernels: run RMSNorm, rotary and the SiLU gate as fused kernels on CUDA (:func:`models.fused_forwards.fuse`;
            the library's math, bit-identical on the CPU).

    Returns:
        ``(model_dir, thinker, feature_extractor, video_processor)``; the thinker is in eval mode with gradients off.

    Raises:
        FileNotFoundError: no ``config.json`` in ``model_dir`` (names the path).
        ValueError: unknown ``dtype``.
    """
    import torch
    from transformers import AutoFeatureExtractor, AutoVideoProcessor, Qwen2_5OmniThinkerForConditionalGeneration

    path = local_checkpoint(model_dir, "Qwen2.5-Omni thinker", "for the demo run `python -m models.omni.tiny <dir>` first",
                            weights=thinker is None)
    check_model_type(path, "Qwen2.5-Omni thinker", OMNI_MODEL_TYPES)
    if dtype not in OMNI_DTYPES:
        raise SettingError(f"dtype must be one of {list(OMNI_DTYPES)}, got {dtype!r}")
    if thinker is None:
        with reading_checkpoint(path):
            thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
                str(path), dtype=getattr(torch, dtype), attn_implementation=attn_implementation)
    thinker = thinker.eval()
    thinker.requires_grad_(False)
    from .fused_forwards import fuse
    fuse(thinker, fused_kernels)
    return (str(path), thinker, AutoFeatureExtractor.from_pretrained(str(path)),
            AutoVideoProcessor.from_pretrained(str(path)))
