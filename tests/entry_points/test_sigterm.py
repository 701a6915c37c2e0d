"""Issue 44 item 5: SIGTERM (a scheduler, ``docker stop``) stops a predict run as Ctrl-C does: exit status 143 and
the note of what was kept. Before, Lightning's handler only logged "Received SIGTERM" and the run went on through
every video and the scoring.

The fast test sends the signal to this process from a callback (``cli.main`` in-process, as
``tests/entry_points/test_one_line_errors.py`` does Ctrl-C); the slow twin sends it to a real
``python evaluate.py predict`` process and reads its exit status."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from lightning.pytorch import Callback

from tests.conftest import REPO


class HoldAfterFirstVideo(Callback):
    """Waits (up to 120 s) after the first video's records are written (the writer is an earlier callback), so the
    signal surely comes while videos are left."""

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.05)


class SigtermAfterFirstVideo(Callback):
    """Sends SIGTERM to this process after the first video's records are written."""

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)      # the handler raises here, in the main thread, at once


def _config(tmp_path, model_dir, bench, out, stop: str):
    cfg = {"trainer": {"enable_progress_bar": False, "callbacks": [
        {"class_path": "callbacks.jsonl_writer.JsonlPredictionWriter", "init_args": {"out_dir": str(out)}},
        {"class_path": "callbacks.scoring.ScoreOnPredictEnd", "init_args": {"plots": False}},
        {"class_path": f"tests.entry_points.test_sigterm.{stop}"}]},
        "model": {"class_path": "lightning_modules.budgeted_qa.BudgetedQA",
                  "init_args": {"model_path": str(model_dir), "budgets": [128], "max_new_tokens": 2}},
        "data": {"class_path": "datamodules.videoqa.VideoQADataModule",
                 "init_args": {"root": str(bench), "loader_kwargs": {}, "num_workers": 0}}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_sigterm_stops_the_run_with_143_saying_what_was_kept(tiny_vl3_dir, demo_bench, tmp_path, capsys,
                                                              monkeypatch):
    """About 5 s on the 2-core CPU: one video answered in-process before the signal (the records to keep)."""
    import evaluate
    from callbacks.jsonl_writer import read_records
    from cli import main

    monkeypatch.setattr(sys, "argv", ["evaluate.py"])
    out = tmp_path / "out"
    path = _config(tmp_path, tiny_vl3_dir, demo_bench, out, "SigtermAfterFirstVideo")
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as info:
            main(lambda: evaluate.cli_main(["predict", f"--config={path}"]))
    finally:
        signal.signal(signal.SIGINT, sigint)       # Lightning ignores further Ctrl-C during its shutdown
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 143
    assert len(read_records(out)) == 3          # the first video (realshort, the cheaper): 3 questions x 1 budget
    assert err[-1] == f"terminated (SIGTERM): 3 records kept in {out}; run the same command to resume"
    assert not any("Traceback" in ln for ln in err) and not (out / "scores.json").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL        # the process's handler as it was


@pytest.mark.slow
def test_sigterm_stops_a_real_process_with_143(tiny_vl3_dir, demo_bench, tmp_path):
    """A real ``python evaluate.py predict`` process (the signal comes from outside, while the process waits after
    its first video). About 20 s on the 2-core CI machine, most of it the interpreter's imports: slow."""
    from callbacks.jsonl_writer import read_records

    out = tmp_path / "out"
    path = _config(tmp_path, tiny_vl3_dir, demo_bench, out, "HoldAfterFirstVideo")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("TOKENBUDGET_TRACEBACK", None)
    log = tmp_path / "predict.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "evaluate.py", "predict", f"--config={path}"], cwd=str(REPO),
                                env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        records = out / "b128" / "videomme" / "rank0.jsonl"
        while not (records.is_file() and records.read_bytes().count(b"\n") >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert rc == 143, text[-3000:]
    # the first video (realshort, the cheaper one goes first) has 3 questions x 1 budget; nothing scored
    assert len(read_records(out)) == 3
    assert text.strip().splitlines()[-1] == (f"terminated (SIGTERM): 3 records kept in {out}; run the same command "
                                             "to resume")
    assert "Traceback" not in text and not (out / "scores.json").exists()


def test_lightnings_keyboard_interrupt_line_is_left_out_after_a_sigterm_only(monkeypatch):
    """The helper's trial printed Lightning's "Detected KeyboardInterrupt, attempting graceful shutdown ..." before
    the run's own "terminated (SIGTERM)" line: after a SIGTERM that line is filtered out of Lightning's rank-zero
    logger; after a Ctrl-C it stays."""
    import logging

    import cli

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        assert cli.stop_on_sigterm() is signal.SIG_DFL
        logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
        assert cli._not_a_keyboard_interrupt in logger.filters
        record = logging.LogRecord(logger.name, logging.INFO, __file__, 1,
                                   "\nDetected KeyboardInterrupt, attempting graceful shutdown ...", None, None)
        other = logging.LogRecord(logger.name, logging.INFO, __file__, 1, "something else", None, None)
        assert logger.filter(record) and logger.filter(other)             # a Ctrl-C: kept
        monkeypatch.setattr(cli, "_TERMINATING", True)                     # a SIGTERM arrived
        assert not logger.filter(record) and logger.filter(other)
    finally:
        signal.signal(signal.SIGTERM, previous)
