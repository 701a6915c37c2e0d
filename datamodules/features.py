"""Cached causal-feature files (one per session and streaming mode): the contract between extraction
(``python evaluate.py predict --config configs/extract/<mode>.yaml``) and turn-head training (``train.py``).

File: ``<dir>/<session>.<mode>.safetensors`` (safetensors; never pickles).

Tensors (T_rows = number of 5 Hz rows; row ``i`` is at ``t_i = 0.2 (i + 1)`` s):
    states                 float32 (T_rows, D)  hidden state read out at layer ``meta["layer"]``
    row_times              float32 (T_rows,)    t_i in seconds
    initialization_mask    uint8   (T_rows,)    1 where no state exists yet (row holds zeros)
    state_source_times     float32 (T_rows,)    end time (s) of the newest media the row's state saw (-1 if none)
    state_update_mask      uint8   (T_rows,)    1 where the state was recomputed at this row
    payload_commit_mask    uint8   (T_rows,)    1 where media was committed to the KV cache at this row
    native_boundary_mask   uint8   (T_rows,)    1 where a 2 s native block ends at this row

Metadata (safetensors header): ``format = "omni-features/1"`` and ``meta`` = JSON object with at least
``mode, memory_s, fps, output_hz, layer, model, session, config_hash, production_processor_calls,
production_prepared_media_seconds, wall_time_s, peak_memory_bytes, verification``. Optional keys with a default
(``META_DEFAULTS``, used by ``check_meta`` when a file lacks them): ``memory_policy`` (``window`` | ``sliding``,
``algorithms.streaming.MEMORY_POLICIES``; files written before the field existed were extracted with ``window``).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from algorithms.streaming import DEFAULT_MEMORY_POLICY
from datamodules.worker_watch import process_alive

FORMAT = "omni-features/1"
REQUIRED_TENSORS = ("states", "row_times", "initialization_mask", "state_source_times", "state_update_mask",
                    "payload_commit_mask", "native_boundary_mask")
REQUIRED_META = ("mode", "memory_s", "fps", "output_hz", "layer", "model", "session", "config_hash")
META_DEFAULTS = {"memory_policy": DEFAULT_MEMORY_POLICY,   # value of an absent key (older files)
                 "audio_left_context": False}              # files before the log-mel left context: reflect padding


class FeatureFileError(ValueError):
    """A feature file is unreadable, incomplete, or does not match what the run expects (file named)."""


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mode of result files written through a temp file (mkstemp and safetensors make 0600): readable like any other output;
# the umask is read once at import (os.umask is process-wide and not thread-safe)
SHARED_FILE_MODE = 0o666 & ~_read_umask()


def nonfinite_rows(states) -> int:
    """Rows of ``states`` (T, D) holding a NaN or an infinite value."""
    return int((~torch.isfinite(states)).any(1).sum())


def temp_beside(path: Path) -> tuple[int, str]:
    """``tempfile.mkstemp`` in ``path``'s folder, named ``.<name>.<pid>.<random>.tmp``, after removing the temp files
    of ``path`` that a process no longer alive left there (one killed between the temp file and its rename: a
    SIGKILL mid-write left ``.scores.json.*.tmp`` behind for good). A live writer's temp file is never touched."""
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        names = []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            try:
                os.unlink(path.parent / name)
            except OSError:
                pass
    return tempfile.mkstemp(dir=path.parent, prefix=f"{prefix}{os.getpid()}.", suffix=".tmp")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temp file in the same folder (mode :data:`SHARED_FILE_MODE`),
    fsynced, then renamed over ``path``; on any failure the temp file is removed and ``path`` is untouched (a temp
    file a killed process left is removed by the next write of ``path``: :func:`temp_beside`)."""
    fd, tmp = temp_beside(path)
    try:
        os.chmod(tmp, SHARED_FILE_MODE)  # mkstemp makes 0600; results are shared like the jsonl files
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # the bytes are on disk before the rename makes them visible
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def error_path(feature_file: str | Path) -> Path:
    """``<session>.<mode>[.<policy>].error.json`` beside the feature file ``<...>.safetensors``: written by
    ``callbacks.feature_writer.FeatureWriter`` when that session's extraction failed (its message inside)."""
    return Path(feature_file).with_suffix(".error.json")


def feature_path(out_dir: str | Path, session: str, mode: str, memory_policy: str = "window") -> Path:
    """``<out_dir>/<session>.<mode>.safetensors`` (memory policy ``window``) or
    ``<out_dir>/<session>.<mode>.<memory_policy>.safetensors`` (any other policy), so that extractions with
    different memory policies into one folder never overwrite each other."""
    tag = mode if memory_policy == "window" else f"{mode}.{memory_policy}"
    return Path(out_dir) / f"{session}.{tag}.safetensors"


def parse_feature_name(name: str) -> tuple[str, str, str]:
    """``(session, mode, memory_policy)`` of a :func:`feature_path` file name."""
    stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else name
    session, _, rest = stem.partition(".")
    mode, _, policy = rest.partition(".")
    return session, mode, policy or "window"


def save_features(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Write a feature file atomically (temp file in the same folder, fsync, rename).

    Raises:
        FeatureFileError: a required tensor or meta key is missing, or tensor lengths disagree.
    """
    path = Path(path)
    missing = [k for k in REQUIRED_TENSORS if k not in tensors] + [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise FeatureFileError(f"{path}: cannot save, missing {missing}")
    n = tensors["states"].shape[0]
    bad = [k for k in REQUIRED_TENSORS if tensors[k].shape[0] != n]
    if bad:
        raise FeatureFileError(f"{path}: tensors {bad} do not have T_rows={n} rows")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_beside(path)
    os.close(fd)
    try:
        out = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        save_file(out, tmp, metadata={"format": FORMAT, "meta": json.dumps(meta, sort_keys=True)})
        os.chmod(tmp, SHARED_FILE_MODE)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_features(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a feature file: ``(tensors, meta)``.

    Raises:
        FeatureFileError: unreadable file, wrong format tag, or missing tensors/meta keys (file named).
    """
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises several types for bad bytes
        raise FeatureFileError(f"{path}: not a readable safetensors feature file ({e})") from e
    if header.get("format") != FORMAT:
        raise FeatureFileError(f"{path}: format {header.get('format')!r}, expected {FORMAT!r}")
    meta = json.loads(header.get("meta", "{}"))
    missing = [k for k in REQUIRED_TENSORS if k not in tensors] + [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise FeatureFileError(f"{path}: missing {missing}")
    return tensors, meta


def check_meta(path: str | Path, meta: dict[str, Any], expected: dict[str, Any]) -> None:
    """Fail closed when a file's settings differ from the run's (a key absent from the file counts as its
    ``META_DEFAULTS`` value, e.g. ``memory_policy = "window"``).

    Raises:
        FeatureFileError: naming the file and every mismatching key (expected vs found).
    """
    def found(k):
        return meta.get(k, META_DEFAULTS.get(k))

    diffs = [f"{k}: expected {v!r}, file has {found(k)!r}" for k, v in expected.items() if found(k) != v]
    if diffs:
        raise FeatureFileError(f"{path}: feature file does not match this run ({'; '.join(diffs)})")
