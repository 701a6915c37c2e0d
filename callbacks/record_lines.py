"""The lines of a records file (``<out_dir>/<job>/<benchmark>/rank<r>.jsonl``) as every reader reads them: blank
lines skipped, each other line decoded as UTF-8 strictly (a line that is not, a damaged disk block, is as unreadable
as one that is no JSON) and parsed. What an unreadable line means is the reader's: the writer reruns its question,
scoring skips it, a baseline run refuses the folder."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


def jsonl_lines(path: str | Path) -> Iterator[tuple[int, Any, ValueError | None]]:
    """``(line number from 1, parsed value, None)`` for each readable non-blank line of ``path``, ``(line number,
    None, the error)`` for each unreadable one (``json.JSONDecodeError`` or ``UnicodeDecodeError``, both
    ``ValueError``). The value may be any JSON (``null``, a list): callers check for a record object.

    Raises:
        OSError: ``path`` cannot be opened or read.
    """
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line.decode("utf-8")), None
            except ValueError as e:
                yield n, None, e
