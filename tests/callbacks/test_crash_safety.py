"""Crash safety (issue 8 §3).

* ``python evaluate.py predict`` is killed with SIGKILL at random points and restarted until it finishes by
  itself; then no record is lost or duplicated and the records equal those of an uninterrupted run.
* A torn last jsonl line is detected and repaired on restart, at every possible cut.
* A second run on the same output folder is refused while the first holds it; a killed run leaves no stale lock.
* ``scores.json`` and feature files are replaced atomically: a failure while writing leaves the old file intact
  and no temporary file behind.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, predict_in_process
from tests.media_factory import MediaFactory


@pytest.fixture(scope="session")
def crash_media(tmp_path_factory) -> MediaFactory:
    return MediaFactory(tmp_path_factory.mktemp("crash_media"))


def _bench(root: Path, clips: list[Path], questions_per_video: int = 2) -> int:
    """A LongVideoBench-format root over ``clips``; returns the number of questions."""
    (root / "videos").mkdir(parents=True)
    rows = []
    for i, clip in enumerate(clips):
        (root / "videos" / clip.name).write_bytes(clip.read_bytes())
        for k in range(questions_per_video):
            rows.append({"id": f"v{i}_q{k}", "video_id": f"v{i}", "video_path": clip.name,
                         "question": f"Question {k} about video {i}: what is on screen?",
                         "candidates": ["colour bars", "a person", "a fractal", "text"], "correct_choice": k % 4})
    (root / "lvb_val.json").write_text(json.dumps(rows))
    return len(rows)


def _config(path: Path, model_dir: Path, root: Path, out: Path, budgets=(128, 256)) -> Path:
    cfg = {
        "trainer": {"enable_progress_bar": False, "callbacks": [
            {"class_path": "callbacks.jsonl_writer.JsonlPredictionWriter", "init_args": {"out_dir": str(out)}},
            {"class_path": "callbacks.scoring.ScoreOnPredictEnd", "init_args": {"plots": False}}]},
        "model": {"class_path": "lightning_modules.budgeted_qa.BudgetedQA",
                  "init_args": {"model_path": str(model_dir), "budgets": list(budgets), "max_new_tokens": 3}},
        "data": {"class_path": "datamodules.videoqa.VideoQADataModule",
                 "init_args": {"benchmark": "lvb", "root": str(root), "loader_kwargs": {}, "num_workers": 0}},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _start(cfg: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "evaluate.py", "predict", f"--config={cfg}"], cwd=str(REPO), env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def _lines(out: Path) -> int:
    n = 0
    for f in out.glob("*/*/*.jsonl"):
        with open(f, "rb") as fh:
            n += fh.read().count(b"\n")
    return n


def _records(out: Path) -> list[dict]:
    recs = []
    for f in sorted(out.glob("*/*/*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            recs.append(json.loads(line))  # every line is whole: a torn one would fail here
    return recs


def _kill_and_restart_until_done(cfg: Path, out: Path, log: Path, n_records: int, kills: int, rng: random.Random,
                                 timeout_s: float) -> list[str]:
    """Run predict, SIGKILL it ``kills`` times at random moments, restart each time; then let it finish."""
    history = []
    deadline = time.monotonic() + timeout_s
    for k in range(kills + 1):
        proc = _start(cfg, log)
        before = _lines(out)
        if k < kills:
            # a random moment: after a random number of new record lines appear (mid-run), plus a random delay,
            # or (one time in three) a random time after start (often during start-up or loading)
            if rng.random() < 1 / 3:
                target, delay = None, rng.uniform(0.5, 6.0)
            else:
                target, delay = rng.randint(before + 1, max(before + 1, n_records - 1)), rng.uniform(0.0, 0.4)
            t0 = time.monotonic()
            while proc.poll() is None and time.monotonic() < deadline:
                if target is None and time.monotonic() - t0 >= delay:
                    break
                if target is not None and _lines(out) >= target:
                    time.sleep(delay)
                    break
                time.sleep(0.01)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                history.append(f"killed at {_lines(out)} lines" + (f" (target {target})" if target else
                                                                   f" ({delay:.1f} s after start)"))
                continue
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        history.append(f"exited {rc} at {_lines(out)} lines")
        if rc == 0 and _lines(out) >= n_records:
            break
    else:
        proc = _start(cfg, log)
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        history.append(f"final run exited {rc}")
    return history


def _check_against_reference(tiny_vl3_dir, crash_media, tmp_path, n_videos: int, kills: int, seed: int,
                             timeout_s: float) -> None:
    clips = crash_media.clips(n_videos)
    root = tmp_path / "bench"
    n_q = _bench(root, clips)
    n_records = n_q * 2  # two budgets
    ref_out, out = tmp_path / "ref", tmp_path / "out"
    ref_cfg = _config(tmp_path / "ref.yaml", tiny_vl3_dir, root, ref_out)
    cfg = _config(tmp_path / "run.yaml", tiny_vl3_dir, root, out)
    log = tmp_path / "predict.log"
    rng = random.Random(seed)
    # the killed runs (subprocesses, started and killed from a thread) and the reference run, uninterrupted, in this
    # process's main thread (one interpreter start less; on one thread, as the subprocesses run) share the cores
    with ThreadPoolExecutor(1) as pool:
        killed = pool.submit(_kill_and_restart_until_done, cfg, out, log, n_records, kills, rng, timeout_s)
        predict_in_process(ref_cfg)
        history = killed.result(timeout=timeout_s)
    print(f"seed {seed}: {history}")
    msg = f"seed {seed}: {history}\n{log.read_text()[-2000:]}"
    recs, ref_recs = _records(out), _records(ref_out)
    assert len(ref_recs) == n_records
    keys = [(r["job"], r["qid"]) for r in recs]
    assert len(keys) == len(set(keys)), f"duplicated records; {msg}"
    assert set(keys) == {(r["job"], r["qid"]) for r in ref_recs}, f"lost records; {msg}"
    by_key = {(r["job"], r["qid"]): r for r in ref_recs}
    for r in recs:
        assert r == by_key[(r["job"], r["qid"])], f"record differs from the uninterrupted run; {msg}"
    scores = json.loads((out / "scores.json").read_text())
    assert all(g["n_duplicates"] == 0 and g["n_records"] == n_q for g in scores["groups"])
    assert not list(out.rglob("*.tmp"))


def test_sigkill_at_random_points_loses_and_repeats_nothing(tiny_vl3_dir, crash_media, tmp_path):
    seed = int(os.environ.get("CRASH_SEED", random.randrange(10**6)))
    # one kill in the default run (each kill is a restart of evaluate.py); eight in test_sigkill_many_times (slow)
    _check_against_reference(tiny_vl3_dir, crash_media, tmp_path, n_videos=3, kills=1, seed=seed, timeout_s=240)


@pytest.mark.slow
def test_sigkill_many_times(tiny_vl3_dir, crash_media, tmp_path):
    seed = int(os.environ.get("CRASH_SEED", random.randrange(10**6)))
    _check_against_reference(tiny_vl3_dir, crash_media, tmp_path, n_videos=10, kills=8, seed=seed, timeout_s=900)


# ------------------------------------------------------------------------------------------ torn lines
def test_torn_last_line_repaired_at_every_cut(tmp_path):
    from callbacks.jsonl_writer import JsonlPredictionWriter

    recs = [{"qid": f"q{i}", "job": "b128", "benchmark": "lvb", "response": "é" * i} for i in range(3)]
    whole = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode("utf-8")
    last_start = whole.rstrip(b"\n").rfind(b"\n") + 1
    f = tmp_path / "out" / "b128" / "lvb" / "rank0.jsonl"
    f.parent.mkdir(parents=True)
    for cut in range(last_start, len(whole) + 1):
        f.write_bytes(whole[:cut])
        done = JsonlPredictionWriter(str(tmp_path / "out")).done_qids()
        if cut == len(whole):
            assert done == {"b128": {"q0", "q1", "q2"}} and f.read_bytes() == whole
        else:  # the third record is torn (even when only its newline is missing): removed, to be recomputed
            assert done == {"b128": {"q0", "q1"}}, cut
            assert f.read_bytes() == whole[:last_start], cut


def test_unreadable_line_inside_a_file_is_reported_and_rerun(tmp_path, caplog):
    from callbacks.jsonl_writer import JsonlPredictionWriter

    f = tmp_path / "out" / "b128" / "lvb" / "rank0.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text('{"qid": "a", "job": "b128"}\n{"qid": "b", "jo\n{"qid": "c", "job": "b128"}\n')
    done = JsonlPredictionWriter(str(tmp_path / "out")).done_qids()
    assert done == {"b128": {"a", "c"}}
    assert f"{f} line 2: unreadable record" in caplog.text


def test_a_line_that_is_json_but_no_object_is_reported_and_rerun(tmp_path, caplog):
    """Before: ``AttributeError: 'NoneType' object has no attribute 'get'`` from the writer's set-up (a traceback
    naming no file) for a ``null`` or ``[1]`` line, e.g. in a file merged or edited by hand."""
    from callbacks.jsonl_writer import JsonlPredictionWriter

    f = tmp_path / "out" / "b128" / "lvb" / "rank0.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text('{"qid": "a", "job": "b128"}\nnull\n[1]\n"b"\n{"qid": "c", "job": "b128"}\n')
    done = JsonlPredictionWriter(str(tmp_path / "out")).done_qids()
    assert done == {"b128": {"a", "c"}}
    for n in (2, 3, 4):
        assert f"{f} line {n}: unreadable record" in caplog.text


def test_a_line_that_is_not_utf8_is_rerun_and_skipped_by_scoring_not_a_traceback(tmp_path, caplog):
    """A damaged disk block inside a records file (bytes that are not UTF-8 inside a string). Before: the writer read
    it with replacement characters as done (never rerun), and the scoring at the end of the run stopped with
    ``UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff`` naming no file (scores.json left stale)."""
    from callbacks.jsonl_writer import JsonlPredictionWriter
    from callbacks.scoring import read_records

    f = tmp_path / "out" / "b128" / "lvb" / "rank0.jsonl"
    f.parent.mkdir(parents=True)
    f.write_bytes(b'{"qid": "a", "job": "b128", "answer": "A", "pred": "A"}\n'
                  b'{"qid": "b", "job": "b128", "answer": "A", "pred": "A", "response": "\xff\xfe"}\n'
                  b'{"qid": "c", "job": "b128", "answer": "A", "pred": "B"}\n')
    assert JsonlPredictionWriter(str(tmp_path / "out")).done_qids() == {"b128": {"a", "c"}}
    assert f"{f} line 2: unreadable record" in caplog.text
    records, stats = read_records(tmp_path / "out")
    assert [r["qid"] for r in records] == ["a", "c"] and stats["n_bad_lines"] == 1
    assert f"scoring: skipping unreadable line 2 of {f}" in caplog.text


# ------------------------------------------------------------------------------------------ one writer at a time
def test_second_run_on_the_same_output_is_refused_and_a_killed_run_leaves_no_lock(tmp_path):
    from callbacks.jsonl_writer import JsonlPredictionWriter, OutputLockedError

    out = tmp_path / "out"
    out.mkdir()
    # another process holding rank 0's lock the way the writer takes it (flock on <out>/.rank0.lock)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, time;"
        f"fd = os.open({str(out / '.rank0.lock')!r}, os.O_RDWR | os.O_CREAT);"
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('locked', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        w = JsonlPredictionWriter(str(out))
        with pytest.raises(OutputLockedError, match=r"\.rank0\.lock: another predict run is writing"):
            w._lock(0)
        w._lock(1)  # another rank's file is free
        w._unlock()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    w = JsonlPredictionWriter(str(out))
    w._lock(0)  # the killed holder's lock went with it
    w._unlock()


# ------------------------------------------------------------------------------------------ atomic files
def test_scores_json_replaced_atomically(tmp_path, monkeypatch):
    from callbacks import scoring

    out = tmp_path / "out"
    (out / "b128" / "lvb").mkdir(parents=True)
    (out / "b128" / "lvb" / "rank0.jsonl").write_text(json.dumps(
        {"qid": "a", "job": "b128", "answer": "A", "pred": "A", "meta": {"benchmark": "lvb"}}) + "\n")
    scoring.write_scores(out, plots=False)
    before = (out / "scores.json").read_bytes()

    def crash(*a, **k):
        raise OSError("disk full (simulated)")

    from datamodules import features

    monkeypatch.setattr(features.os, "replace", crash)   # scores.json is written by features.atomic_write_bytes
    with open(out / "b128" / "lvb" / "rank0.jsonl", "a") as fh:
        fh.write(json.dumps({"qid": "b", "job": "b128", "answer": "B", "pred": "A", "meta": {"benchmark": "lvb"}})
                 + "\n")
    with pytest.raises(OSError, match="disk full"):
        scoring.write_scores(out, plots=False)
    assert (out / "scores.json").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["b128", "report.html", "scores.json"]  # no temporary file left


def test_feature_file_written_atomically(tmp_path, monkeypatch):
    import torch

    from datamodules import features

    n = 4
    tensors = {k: torch.zeros(n) for k in features.REQUIRED_TENSORS}
    tensors["states"] = torch.zeros(n, 3)
    meta = {k: 1 for k in features.REQUIRED_META}
    path = features.feature_path(tmp_path, "s1", "micro-chunk-200ms")
    features.save_features(path, tensors, meta)
    before = path.read_bytes()

    def crash(out, tmp, metadata=None):
        Path(tmp).write_bytes(b"partial")
        raise OSError("killed mid-write (simulated)")

    monkeypatch.setattr(features, "save_file", crash)
    with pytest.raises(OSError, match="mid-write"):
        features.save_features(path, {**tensors, "states": torch.ones(n, 3)}, meta)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_run_settings_recorded_only_off_default_are_compared_both_ways(tmp_path):
    """A setting kept in run.json only when it is not its default (``RECORD_DEFAULTS``: ``cudnn_attention``,
    ``original_projector``, ``max_replaced_frac``) is compared with its default standing in for an absent key, in
    both directions; another key missing from an older run.json is still not compared (older folders resume)."""
    from callbacks.jsonl_writer import OutputSettingsError, check_run_settings

    defaults = {"cudnn_attention": False, "max_replaced_frac": 0.2}
    out = tmp_path / "folder"
    check_run_settings(out, {"dtype": "bfloat16"}, write=True, defaults=defaults)       # made with both defaults
    (out / "b128" / "videomme").mkdir(parents=True)
    (out / "b128" / "videomme" / "rank0.jsonl").write_text('{"qid": "1"}\n')
    with pytest.raises(OutputSettingsError, match="cudnn_attention: False there, True now"):
        check_run_settings(out, {"dtype": "bfloat16", "cudnn_attention": True}, write=True, defaults=defaults)
    check_run_settings(out, {"dtype": "bfloat16", "new_setting": 1}, write=False, defaults=defaults)  # resumes
    check_run_settings(out, {"dtype": "bfloat16"}, write=False, defaults=defaults)
    on = tmp_path / "on"
    check_run_settings(on, {"dtype": "bfloat16", "max_replaced_frac": 0.5}, write=True, defaults=defaults)
    (on / "b128" / "videomme").mkdir(parents=True)
    (on / "b128" / "videomme" / "rank0.jsonl").write_text('{"qid": "1"}\n')
    with pytest.raises(OutputSettingsError, match="max_replaced_frac: 0.5 there, 0.2 now"):
        check_run_settings(on, {"dtype": "bfloat16"}, write=True, defaults=defaults)


def test_modules_record_defaults_match_their_record_settings(tiny_vl3_dir):
    """Each optional key's default is what ``record_settings`` leaves out: off, the key is absent; on, present."""
    from datamodules.videoqa import VideoQADataModule
    from lightning_modules.budgeted_qa import BudgetedQA

    assert BudgetedQA.RECORD_DEFAULTS == {"original_projector": None, "cudnn_attention": False,
                                          "add_system_prompt": True, "first_step": "wait", "kernels": "triton"}
    off = BudgetedQA(model_path=str(tiny_vl3_dir)).record_settings()
    assert not set(off) & set(BudgetedQA.RECORD_DEFAULTS)
    on = BudgetedQA(model_path=str(tiny_vl3_dir), cudnn_attention=True, original_projector="/x/p.pt",
                    kernels="inductor").record_settings()
    assert on["cudnn_attention"] is True and on["original_projector"] == "/x/p.pt" and on["kernels"] == "inductor"
    assert BudgetedQA(model_path=str(tiny_vl3_dir), add_system_prompt=False).record_settings()["add_system_prompt"] \
        is False
    assert BudgetedQA(model_path=str(tiny_vl3_dir), first_step="eager",
                      kernels="inductor").record_settings()["first_step"] == "eager"
    assert "max_replaced_frac" not in VideoQADataModule().record_settings()
    assert VideoQADataModule(max_replaced_frac=0.5).record_settings()["max_replaced_frac"] == 0.5
    assert VideoQADataModule.RECORD_DEFAULTS == {"max_replaced_frac": VideoQADataModule().max_replaced_frac,
                                                 "strict_frames": False}
    # issue 42 item 1: seed 001 answers videos with concealed frames; the strict rule is recorded when on
    assert "strict_frames" not in VideoQADataModule().record_settings()
    assert VideoQADataModule(strict_frames=True).record_settings()["strict_frames"] is True


def test_a_family_without_the_benchmarks_prompt_stops_before_run_json(tiny_vl3_dir):
    """``prompt_template=lmms_eval`` on MLVU (no reproducible lmms-eval MLVU prompt) is refused by
    ``record_settings``, which the JSONL writer calls before it writes the folder's ``run.json``."""
    from types import SimpleNamespace

    from algorithms.errors import SettingError
    from lightning_modules.budgeted_qa import BudgetedQA

    m = BudgetedQA(model_path=str(tiny_vl3_dir), prompt_template="lmms_eval")
    m._trainer = SimpleNamespace(datamodule=SimpleNamespace(benchmark="mlvu"))
    with pytest.raises(SettingError, match="'lmms_eval' has no prompt for 'mlvu'"):
        m.record_settings()
    m._trainer = SimpleNamespace(datamodule=SimpleNamespace(benchmark="worldsense"))
    assert m.record_settings()["prompt_template"] == "lmms_eval"


def test_a_folder_of_an_older_record_format_is_refused(tmp_path):
    """``record_format`` is compared with 1 standing in for an older run.json without it: records of the earlier
    format (other fps fields, unstripped answers, other thinning) are never mixed with new ones."""
    from callbacks.jsonl_writer import RECORD_FORMAT, OutputSettingsError, check_run_settings

    out = tmp_path / "old"
    out.mkdir()
    (out / "run.json").write_text('{"dtype": "float32"}')
    (out / "b128" / "videomme").mkdir(parents=True)
    (out / "b128" / "videomme" / "rank0.jsonl").write_text('{"qid": "1"}\n')
    with pytest.raises(OutputSettingsError, match=f"record_format: 1 there, {RECORD_FORMAT} now"):
        check_run_settings(out, {"dtype": "float32", "record_format": RECORD_FORMAT}, write=True,
                           defaults={"record_format": 1})


def test_a_temp_file_left_by_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    """The random-kill test once found ``.scores.json.<random>.tmp`` after the final run: a SIGKILL between the temp
    file and its rename. Temp files now carry their writer's pid; the next write of the same file removes those of
    dead processes and never a live one's."""
    import os
    import subprocess
    import sys

    from datamodules.features import atomic_write_bytes

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".scores.json.{int(dead.stdout)}.abc123.tmp"
    live = tmp_path / f".scores.json.{os.getppid()}.def456.tmp"     # a live process's (this one's parent)
    other = tmp_path / ".report.html.1.x.tmp"                        # another file's: not this write's business
    for f in (stale, live, other):
        f.write_bytes(b"partial")
    atomic_write_bytes(tmp_path / "scores.json", b"{}")
    assert (tmp_path / "scores.json").read_bytes() == b"{}"
    assert not stale.exists() and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, "scores.json"])
