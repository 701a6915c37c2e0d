"""Prediction writer: one jsonl line per (question, job), appended and flushed per video.

Files: ``<out_dir>/<job>/<benchmark>/rank<r>.jsonl`` (job = ``b<B>`` or ``<variant>_b<B>``). Records are keyed by the
benchmark's own qid, never by position or world size, so a run resumed with any number of processes skips exactly
the (job, qid) pairs already written. A last line cut by a crash is detected and truncated away on restart.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import BasePredictionWriter

log = logging.getLogger(__name__)


def repair_jsonl(path: Path) -> int:
    """Truncate a jsonl file after its last complete, parseable line.

    Returns:
        the number of bytes removed (0 when the file was intact).
    """
    data = path.read_bytes()
    keep = len(data)
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
    # a complete-looking last line that is not valid JSON (torn write) goes too
    while keep > 0:
        start = data.rfind(b"\n", 0, keep - 1) + 1
        try:
            json.loads(data[start:keep])
            break
        except ValueError:
            keep = start
    if keep != len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        log.warning("%s: removed %d bytes of a partly written last record", path, len(data) - keep)
    return len(data) - keep


def read_records(out_dir: str | Path) -> list[dict]:
    """All records under ``out_dir`` (every job, benchmark and rank file), in path then line order."""
    out = []
    for f in sorted(Path(out_dir).glob("*/*/*.jsonl")):
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except ValueError as e:
                        raise ValueError(f"{f} line {n}: not valid JSON ({e})") from e
    return out


class JsonlPredictionWriter(BasePredictionWriter):
    """Append records per video; report what is already done so the datamodule skips it before decoding.

    Args:
        out_dir: output root.
    """

    def __init__(self, out_dir: str = "outputs/demo"):
        super().__init__(write_interval="batch")
        self.out_dir = Path(out_dir)
        self._done: dict[str, set[str]] | None = None

    @property
    def out_root(self) -> Path:
        return self.out_dir

    def done_qids(self) -> dict[str, set[str]]:
        """``job -> qids`` already written (all ranks' files; truncated last lines repaired first)."""
        if self._done is None:
            done: dict[str, set[str]] = {}
            for f in sorted(self.out_dir.glob("*/*/*.jsonl")):
                repair_jsonl(f)
            for rec in read_records(self.out_dir):
                done.setdefault(rec["job"], set()).add(rec["qid"])
            self._done = done
        return self._done

    def setup(self, trainer, pl_module, stage: str) -> None:
        # every rank reads before any rank writes; then ranks only ever append to their own file
        self._done = None
        self.done_qids()
        if trainer.world_size > 1:
            trainer.strategy.barrier("jsonl_writer_setup")

    def write_on_batch_end(self, trainer, pl_module, prediction: Any, batch_indices, batch, batch_idx: int,
                           dataloader_idx: int = 0) -> None:
        if not prediction:
            return
        done = self.done_qids()
        by_file: dict[Path, list[str]] = {}
        for rec in prediction:
            job = rec["job"]
            if rec["qid"] in done.get(job, ()):
                continue  # never write a (job, qid) twice
            done.setdefault(job, set()).add(rec["qid"])
            path = self.out_dir / job / rec.get("benchmark", "benchmark") / f"rank{trainer.global_rank}.jsonl"
            by_file.setdefault(path, []).append(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
        for path, lines in by_file.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write("".join(lines))
                f.flush()
                os.fsync(f.fileno())
