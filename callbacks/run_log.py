"""What a run tells its user besides its records: the tracebacks of failed videos, in a file of the output folder
instead of the console, and the note printed when the run is interrupted (Ctrl-C).

* :data:`TRACEBACKS`: the logger a module writes a failed video's traceback to (outside logging's tree: it never
  reaches the console). :class:`callbacks.jsonl_writer.JsonlPredictionWriter` attaches
  ``<out_dir>/errors_rank<r>.log`` to it for the run (created at the first traceback only), and the console gets
  one line naming the video file and that log (:func:`traceback_file`).
* :func:`note_interrupt` / :func:`take_interrupt_notes`: the writer notes "N records kept in <dir>; run the same
  command to resume" when the run is interrupted, and :func:`cli.main` prints the notes and exits 130 (the shell's
  status for SIGINT).
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

# a logger outside logging's tree (no parent, so nothing set up on the root or by a library, e.g. a console or
# pytest's capture handler, ever receives these records): a traceback of a video is for the log file only
TRACEBACKS = logging.Logger("tokenbudget.tracebacks")
TRACEBACKS.propagate = False
TRACEBACKS.addHandler(logging.NullHandler())  # no file attached: dropped (not logging's last-resort stderr handler)


def errors_log_path(out_dir: str | Path, rank: int) -> Path:
    """``<out_dir>/errors_rank<rank>.log``: the tracebacks of the videos that failed in rank ``rank``."""
    return Path(out_dir) / f"errors_rank{rank}.log"


class _TracebackFile(logging.FileHandler):
    """``FileHandler`` whose write failures (a full disk, a quota, a folder made read-only mid-run) are one console
    line, once per file, and never end the run (issue 44 item 4): logging's own ``handleError`` printed its
    ``--- Logging error ---`` block with a traceback for every record, and ``close`` re-raised the failed flush.
    The error records themselves are written by :class:`callbacks.jsonl_writer.JsonlPredictionWriter` (its
    ``OutputWriteError`` stops the run when *they* cannot be written); only the traceback is lost here."""

    failed = False

    def _report(self, e: BaseException | None) -> None:
        if self.failed:
            return
        self.failed = True
        why = os.strerror(e.errno) if isinstance(e, OSError) and e.errno else f"{type(e).__name__}: {e}"
        log.warning("%s: %s: a failed video's traceback could not be written there (its error record is kept; "
                    "later tracebacks may be lost); free space or choose another out_dir", self.baseFilename, why)

    def handleError(self, record: logging.LogRecord) -> None:
        self._report(sys.exc_info()[1])

    def close(self) -> None:
        try:
            super().close()
        except OSError as e:   # the buffered traceback's flush on close failed too
            self._report(e)
            self.stream = None


def attach_traceback_file(path: Path) -> logging.Handler:
    """Append :data:`TRACEBACKS` to ``path`` (the file is created at the first traceback); returns the handler for
    :func:`detach_traceback_file`. A write that fails is one warning line (:class:`_TracebackFile`)."""
    handler = _TracebackFile(path, mode="a", encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    TRACEBACKS.addHandler(handler)
    return handler


def detach_traceback_file(handler: logging.Handler | None) -> None:
    """Stop writing :data:`TRACEBACKS` to ``handler``'s file and close it (``None``: nothing to do)."""
    if handler is not None:
        TRACEBACKS.removeHandler(handler)
        handler.close()


def traceback_file() -> Path | None:
    """The file :data:`TRACEBACKS` is written to now (the last attached), or ``None`` when none is attached."""
    files = [h.baseFilename for h in TRACEBACKS.handlers if isinstance(h, logging.FileHandler)]
    return Path(files[-1]) if files else None


_INTERRUPT_NOTES: list[str] = []


def note_interrupt(text: str) -> None:
    """A line for the user when the run is interrupted (printed by :func:`cli.main`)."""
    _INTERRUPT_NOTES.append(text)


def take_interrupt_notes() -> list[str]:
    """The noted lines, in order; the list is emptied."""
    out = list(_INTERRUPT_NOTES)
    _INTERRUPT_NOTES.clear()
    return out


_FAILED_RUNS: list[str] = []


def note_nothing_answered(text: str) -> None:
    """A run that ended with every record of its folder an error record (``ScoreOnPredictEnd``): :func:`cli.main`
    prints ``text`` last and exits with status 1, so a script that runs it sees the failure."""
    _FAILED_RUNS.append(text)


def take_nothing_answered() -> list[str]:
    """The lines :func:`note_nothing_answered` kept, in order; the list is emptied."""
    out = list(_FAILED_RUNS)
    _FAILED_RUNS.clear()
    return out
