"""Local checkpoint directories only: nothing here ever asks a model hub."""
from __future__ import annotations

import os
from pathlib import Path

# transformers resolves a missing local path as a hub id; with this set it fails fast instead of trying the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def local_checkpoint(path: str | Path, what: str, hint: str = "") -> Path:
    """``path`` as a checkpoint directory holding ``config.json``.

    Raises:
        FileNotFoundError: naming the path, what was expected there and how to create the demo one.
    """
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"no {what} checkpoint at {p} (config.json missing){'; ' + hint if hint else ''}")
    return p
