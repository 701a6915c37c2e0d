"""Issue 44 item 6: output faults that were tracebacks end in one line naming the path and saying what to do, with a
non-zero status, and the records stay safe. The tests run as root on CI, where ``chmod`` does not refuse anything,
so the read-only and full-disk cases are made by injecting the error the kernel gives (``EROFS`` for a read-only
mount, ``EACCES`` for a folder without write permission, ``ENOSPC`` for a full disk) at the call that meets it.
All cases run in this process through ``cli.main`` (what ``python evaluate.py`` runs)."""
from __future__ import annotations

import builtins
import errno
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

TRACEBACK_HINT = "(set TOKENBUDGET_TRACEBACK=1 for the full traceback)"


def _config(tmp_path: Path, model_dir: Path, bench: Path, out: Path) -> Path:
    import yaml

    cfg = {"trainer": {"enable_progress_bar": False, "callbacks": [
        {"class_path": "callbacks.timing.StageTimer"},
        {"class_path": "callbacks.scoring.ScoreOnPredictEnd", "init_args": {"plots": False}},
        {"class_path": "callbacks.jsonl_writer.JsonlPredictionWriter", "init_args": {"out_dir": str(out)}}]},
        "model": {"class_path": "lightning_modules.budgeted_qa.BudgetedQA",
                  "init_args": {"model_path": str(model_dir), "budgets": [128], "max_new_tokens": 2}},
        "data": {"class_path": "datamodules.videoqa.VideoQADataModule",
                 "init_args": {"root": str(bench), "loader_kwargs": {}, "num_workers": 0}}}
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _main(capsys, run) -> tuple[int, list[str]]:
    """``cli.main(run)`` (``run``: a config file for ``evaluate.py predict --config``, or a function): (exit status,
    stderr lines), with no traceback."""
    import evaluate
    from cli import main

    try:
        main(run if callable(run) else lambda: evaluate.cli_main(["predict", f"--config={run}"]))
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in ln for ln in err), "\n".join(err)
    return code, err


def _refuse(errnum: int, path) -> OSError:
    return OSError(errnum, os.strerror(errnum), str(path)) if errnum != errno.EACCES else \
        PermissionError(errnum, os.strerror(errnum), str(path))


def _records(root: Path) -> Path:
    """A finished run's records in ``root`` (two answered questions), as the writer leaves them."""
    f = root / "b128" / "videomme" / "rank0.jsonl"
    f.parent.mkdir(parents=True)
    recs = [{"qid": q, "video": "v1", "job": "b128", "budget": 128, "variant": None, "answer": "A", "pred": "A",
             "pred_robust": "A", "response": "A", "meta": {"benchmark": "videomme", "duration": "short"}}
            for q in ("q1", "q2")]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f


def _score_at_predict_end(root: Path):
    """What the end of a predict run does with ``root``: ScoreOnPredictEnd.on_predict_end (rank 0 of 1)."""
    from types import SimpleNamespace

    from callbacks.scoring import ScoreOnPredictEnd

    trainer = SimpleNamespace(strategy=SimpleNamespace(barrier=lambda name: None), is_global_zero=True,
                              datamodule=None, callbacks=[], loggers=[])
    return lambda: ScoreOnPredictEnd(out_root=str(root), plots=False).on_predict_end(trainer, None)


def test_output_faults_are_one_line_naming_the_path(tiny_vl3_dir, demo_bench, tmp_path, monkeypatch, capsys):
    """Before: tracebacks (``OSError: [Errno 28]`` from report.html / run.json, ``[Errno 30]`` from the lock file
    and from scores.json, ``FileExistsError`` for a file as out_dir, ``JSONDecodeError`` for a damaged run.json).
    About 8 s on the 2-core CPU: six ``evaluate.py predict`` runs in-process, each refused before its first video
    (the tiny model is built for each); in one test so that the cases share the CLI's imports."""
    import callbacks.jsonl_writer as jw
    import callbacks.report as report

    monkeypatch.setattr(sys, "argv", ["evaluate.py"])
    monkeypatch.delenv("TOKENBUDGET_TRACEBACK", raising=False)
    real_open, real_mkdir, real_write_text, real_mkstemp = os.open, Path.mkdir, Path.write_text, tempfile.mkstemp

    # 1. a full disk while report.html is written at the end of the run: the table, then one line; records whole
    out = tmp_path / "full_report"
    records = _records(out)
    kept = records.read_bytes()

    def no_space(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))   # as a write() meets it: no file name

    with monkeypatch.context() as m:
        m.setattr(report, "atomic_write_bytes", no_space)
        code, err = _main(capsys, _score_at_predict_end(out))
    assert code == 2
    assert err[-2:] == [f"error: OutputWriteError: {out / 'report.html'}: No space left on device while writing the "
                        f"scores and report; the records in {out} are intact. Free space (or raise the quota), then "
                        f"write them with `python -m callbacks.scoring {out}`", TRACEBACK_HINT]
    assert records.read_bytes() == kept and not (out / "report.html").exists()

    # 2. the report folder (out_dir: scores.json and report.html go there) on a read-only mount after the records
    out = tmp_path / "ro_report"
    records = _records(out)
    kept = records.read_bytes()

    def mkstemp(*a, dir=None, prefix=None, **k):
        if str(prefix).startswith((".scores.json", ".report.html")):
            raise _refuse(errno.EROFS, dir)
        return real_mkstemp(*a, dir=dir, prefix=prefix, **k)

    with monkeypatch.context() as m:
        m.setattr(tempfile, "mkstemp", mkstemp)
        code, err = _main(capsys, _score_at_predict_end(out))
    assert code == 2
    assert err[-2] == (f"error: OutputWriteError: {out}: Read-only file system while writing the scores and report; "
                       f"the records in {out} are intact. The file system is mounted read-only: choose an out_dir on "
                       f"a writable one, then write them with `python -m callbacks.scoring {out}`")
    assert records.read_bytes() == kept and not (out / "scores.json").exists()

    # 3. a records file that is read-only (a resumed folder): nothing of the new video reaches it
    out = tmp_path / "ro_records"
    records = _records(out)
    kept = records.read_bytes()

    def jw_open(path, mode="r", *a, **k):
        if mode == "ab":
            raise _refuse(errno.EACCES, path)
        return builtins.open(path, mode, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(jw, "open", jw_open, raising=False)
        code, err = _main(capsys, lambda: jw.append_synced(records, b'{"qid": "q3"}\n'))
    assert code == 2
    assert err[-2] == (f"error: OutputWriteError: {records}: Permission denied: the records file cannot be appended "
                       "to; the records written before are intact. Make it writable (or choose another out_dir) and "
                       "run again: it resumes at this video")
    assert records.read_bytes() == kept

    # the rest through `evaluate.py predict`: each is refused before the first video
    # 4. a full disk while run.json is written (before any record)
    out = tmp_path / "full_run_json"

    def write_text(self, *a, **k):
        if self.name == "run.json.tmp":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write_text(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", write_text)
        code, err = _main(capsys, _config(tmp_path, tiny_vl3_dir, demo_bench, out))
    assert code == 2
    assert err[-2] == (f"error: OutputWriteError: {out / 'run.json'}: No space left on device while writing the run's "
                       "settings (no record was written yet); free space (or raise the quota) and run again")
    assert not (out / "run.json").exists() and not (out / "run.json.tmp").exists()

    # 5. out_dir on a read-only mount (the folder exists: its lock file cannot be created)
    out = tmp_path / "ro_mount"
    out.mkdir()

    def os_open(path, flags, *a, **k):
        if Path(path).parent == out and flags & os.O_CREAT:
            raise _refuse(errno.EROFS, path)
        return real_open(path, flags, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(os, "open", os_open)
        code, err = _main(capsys, _config(tmp_path, tiny_vl3_dir, demo_bench, out))
    assert code == 2
    assert err[-2] == (f"error: OutputWriteError: {out / '.rank0.lock'}: Read-only file system: the output folder "
                       f"{out} cannot be created or written; the file system is mounted read-only: choose an out_dir "
                       "on a writable one")

    # 6. out_dir missing under a parent without write permission
    out = tmp_path / "ro_parent" / "out"

    def mkdir(self, *a, **k):
        if self in (out, out.parent):
            raise _refuse(errno.EACCES, self)
        return real_mkdir(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", mkdir)
        code, err = _main(capsys, _config(tmp_path, tiny_vl3_dir, demo_bench, out))
    assert code == 2
    assert err[-2] == (f"error: OutputWriteError: {out}: Permission denied: the output folder {out} cannot be created "
                       "or written; make it writable (or choose another out_dir)")

    # 7. out_dir is a file
    out = tmp_path / "a_file"
    out.write_text("not a folder")
    code, err = _main(capsys, _config(tmp_path, tiny_vl3_dir, demo_bench, out))
    assert code == 2
    assert err[-2] == (f"error: OutputWriteError: {out}: out_dir is a file, not a folder; choose another out_dir "
                       "(--trainer.callbacks.init_args.out_dir=DIR with the shipped configs)")
    assert out.read_text() == "not a folder"

    # 8. a run.json that is not JSON (and one that is JSON but not an object): refused, nothing written
    out = tmp_path / "bad_run_json"
    out.mkdir()
    for text, why in (('{"model_path": ', r"JSONDecodeError: Expecting value: line 1 column 16 \(char 15\)"),
                      ("[1, 2]", None)):
        (out / "run.json").write_text(text)
        code, err = _main(capsys, _config(tmp_path, tiny_vl3_dir, demo_bench, out))
        assert code == 2
        if why:
            assert re.fullmatch(rf"error: OutputSettingsError: {re.escape(str(out / 'run.json'))} is not valid JSON "
                                rf"\({why}\); it records the settings of the records in {re.escape(str(out))}\. "
                                r"Restore it, use another output folder, or delete it to resume with this run's "
                                r"settings", err[-2]), err[-2]
        else:
            assert err[-2] == (f"error: OutputSettingsError: {out / 'run.json'} is not a JSON object of settings (a "
                               "list); restore it, use another output folder, or delete it to resume with this run's "
                               "settings")
        assert (out / "run.json").read_text() == text and not list(out.glob("*/*/*.jsonl"))
