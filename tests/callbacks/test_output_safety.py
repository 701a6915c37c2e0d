"""Issue 35 §5: a full disk while appending records stops the run with one line, the records written before intact
and nothing torn; the output lock goes with a killed main process even while processes forked from it (DataLoader
workers) still run."""
from __future__ import annotations

import errno
import os
import re
import signal
import time

import pytest

from tests.conftest import run_predict


class _DiskFull:
    """A file whose write puts half the bytes on disk, then fails as a full disk does."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_full_disk_gives_one_line_and_keeps_the_records_safe(tiny_vl3_dir, demo_bench, tmp_path, monkeypatch,
                                                               capsys):
    import builtins

    import callbacks.jsonl_writer as jw
    from callbacks.jsonl_writer import read_records
    from cli import main

    appends = []

    def fake_open(path, mode="r", *args, **kwargs):
        f = builtins.open(path, mode, *args, **kwargs)
        if mode == "ab":
            appends.append(path)
            if len(appends) == 2:        # the second video's records
                return _DiskFull(f)
        return f

    monkeypatch.setattr(jw, "open", fake_open, raising=False)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(lambda: run_predict(tiny_vl3_dir, demo_bench, out, budgets=(128,), model_args={"max_new_tokens": 2}))
    assert e.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1                                     # one line, no traceback
    f = out / "b128" / "videomme" / "rank0.jsonl"
    assert re.fullmatch(rf"error: OutputWriteError: {re.escape(str(f))}: No space left on device while appending "
                        r"\d+ bytes of records; the records written before are intact\. Free space and run again: "
                        r"it resumes at this video", err[0]), err
    assert len(appends) == 2 and appends[1] == f
    data = f.read_bytes()
    assert data.endswith(b"\n")                              # the torn half of the second write is gone
    # the first video's records, whole (the run order puts either video first: datamodules.sharding.run_order)
    assert sorted(r["qid"] for r in read_records(out)) in (["001-1", "001-2", "001-3", "001-4"],
                                                          ["002-1", "002-2", "002-3"])
    monkeypatch.undo()
    recs = run_predict(tiny_vl3_dir, demo_bench, out, budgets=(128,), model_args={"max_new_tokens": 2})
    assert f.read_bytes().startswith(data)                   # resumed: appended after the intact records
    assert sorted(r["qid"] for r in recs) == ["001-1", "001-2", "001-3", "001-4", "002-1", "002-2", "002-3"]


def test_other_os_errors_while_writing_keep_their_type(tmp_path, monkeypatch):
    import builtins

    import callbacks.jsonl_writer as jw

    class _IOError(_DiskFull):
        def write(self, data):
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(jw, "open", lambda p, m="r", *a, **k: _IOError(builtins.open(p, m, *a, **k)), raising=False)
    with pytest.raises(OSError) as e:
        jw.append_synced(tmp_path / "x.jsonl", b"{}\n")
    assert e.value.errno == errno.EIO and not isinstance(e.value, jw.OutputWriteError)


def _child(body) -> int:
    """Fork; the child runs ``body()`` and exits without running the parent's cleanup (``os._exit``)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = body() or 0
        finally:
            os._exit(code)
    return pid


def test_the_lock_goes_with_a_killed_main_process_while_its_forked_workers_live(tmp_path):
    from callbacks.jsonl_writer import JsonlPredictionWriter, OutputLockedError

    out = tmp_path / "out"
    read, write = os.pipe()

    def main_process():   # takes the lock, starts a "DataLoader worker" by fork, then waits to be killed
        os.close(read)
        writer = JsonlPredictionWriter(out_dir=str(out))
        writer._lock(0)
        worker = _child(lambda: time.sleep(30))
        os.write(write, f"{worker}\n".encode())
        time.sleep(30)
        return writer is None

    main = _child(main_process)
    os.close(write)
    worker = None
    try:
        worker = int(os.read(read, 64).decode())
        w = JsonlPredictionWriter(out_dir=str(out))
        with pytest.raises(OutputLockedError):      # held while the main process lives
            w._lock(0)
        os.kill(main, signal.SIGKILL)
        os.waitpid(main, 0)
        main = None
        os.kill(worker, 0)                          # the orphaned worker still runs...
        w._lock(0)                                  # ...and the restart gets the lock at once
        w._unlock()
    finally:
        os.close(read)
        for pid in (main, worker):
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if main is not None:
            os.waitpid(main, 0)


def test_a_forked_child_of_a_live_writer_does_not_release_its_lock(tmp_path):
    """The child closes its copy of the descriptor; the parent's flock stays (it belongs to the open file)."""
    import fcntl

    from callbacks.jsonl_writer import JsonlPredictionWriter

    out = tmp_path / "out"
    w = JsonlPredictionWriter(out_dir=str(out))
    w._lock(0)
    try:
        pid = _child(lambda: 0 if w._lock_fd is None else 3)   # the child's writer holds no descriptor
        assert os.waitpid(pid, 0)[1] == 0
        assert w._lock_fd is not None
        fd = os.open(out / ".rank0.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):    # still locked by this process's descriptor
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        w._unlock()
