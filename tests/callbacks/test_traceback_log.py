"""Issue 44 item 4: a disk that fills while ``errors_rank<r>.log`` (a failed video's traceback) is written is one
warning line naming the file, once, and never ends the run (before: logging's ``--- Logging error ---`` block with a
traceback on stderr for every record, and the flush on close raised ``OSError``). ``/dev/full`` answers every write
with ``ENOSPC``, as a full disk does."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from callbacks.run_log import TRACEBACKS, attach_traceback_file, detach_traceback_file


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_while_a_traceback_is_logged_is_one_line(capfd, caplog):
    handler = attach_traceback_file(Path("/dev/full"))
    try:
        for video in ("a.mp4", "b.mp4"):
            try:
                raise ValueError(f"{video}: bad frame")
            except ValueError:
                TRACEBACKS.warning("video failed, recorded as an error: %s", video, exc_info=True)
    finally:
        detach_traceback_file(handler)            # the failed flush on close does not raise
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert lines == ["/dev/full: No space left on device: a failed video's traceback could not be written there "
                     "(its error record is kept; later tracebacks may be lost); free space or choose another "
                     "out_dir"]


def test_the_traceback_still_reaches_a_writable_file(tmp_path):
    path = tmp_path / "errors_rank0.log"
    handler = attach_traceback_file(path)
    try:
        try:
            raise ValueError("bad frame")
        except ValueError:
            TRACEBACKS.warning("video failed", exc_info=True)
    finally:
        detach_traceback_file(handler)
    text = path.read_text()
    assert "video failed" in text and "ValueError: bad frame" in text and not handler.failed
