"""Reading and writing checkpoint weight files: safetensors (one file or sharded with an index) and ``.bin``/``.pt``.

``.bin`` / ``.pt`` files are read with ``torch.load(weights_only=True)``, so a pickle cannot run code. Used by the
conversion of original-layout checkpoints (:mod:`models.videollama3.convert`) and its inverse
(:mod:`models.videollama3.original_layout`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..loading import reading_checkpoint

QBASE_DIR = "qbase"                        # the compressor's subdirectory of a checkpoint
ORIGINAL_PROJECTOR_DIR = "original_projector"  # the original projector's (raw_mode="orig")
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
BIN_WEIGHTS = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"


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
    with reading_checkpoint(path):   # a pickle weights_only refuses: one line saying why, not torch's advice
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
