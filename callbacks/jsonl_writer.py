"""Prediction writer: one jsonl line per (question, job), appended and flushed per video.

Files: ``<out_dir>/<job>/<benchmark>/rank<r>.jsonl`` (job = ``b<B>`` or ``<variant>_b<B>``). Records are keyed by the
benchmark's own qid, never by position or world size, so a run resumed with any number of processes skips exactly
the (job, qid) pairs already written. A last line cut by a crash is detected and truncated away on restart.

Crash safety (issue 8; ``tests/callbacks/test_crash_safety.py`` kills ``python evaluate.py predict`` with SIGKILL at random
points and restarts it until done, then checks that the records equal an uninterrupted run's):

* each video's records are appended in one write, flushed and fsynced before the next video starts (a new file's
  folder is fsynced too), so a kill loses at most the video in flight;
* a (job, qid) is never written twice: restarts read every rank's files first and skip what is there;
* on restart a torn last line (no newline, or not valid JSON) is truncated away (:func:`repair_jsonl`), so that
  record is simply recomputed; an unreadable line *inside* a file (which a single appending writer cannot
  produce, e.g. a file edited by hand) is reported with its file and line number and its record recomputed;
* one run at a time per output folder and rank: a second ``predict`` on the same ``out_dir`` fails at once with a
  message naming the lock file, instead of interleaving duplicate records (the lock is ``flock``-based, so a
  killed run never leaves a stale lock behind). Only the main process holds it: a process forked from it
  (DataLoader workers) closes its copy of the lock's descriptor at once (``os.register_at_fork``), so after a
  ``kill -9`` the lock goes with the main process, not seconds later with its orphaned workers;
* a full disk (``ENOSPC`` / ``EDQUOT``) while appending a video's records: the part of that video's write that
  reached the file is cut off again, and the run stops with one line (:class:`OutputWriteError`) naming the file;
  every record written before is intact, and a rerun resumes at that video.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import tempfile
import weakref
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import BasePredictionWriter

from .record_lines import jsonl_lines
from .run_log import attach_traceback_file, detach_traceback_file, errors_log_path, note_interrupt

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
        for n, rec, err in jsonl_lines(f):
            if err is not None:
                raise ValueError(f"{f} line {n}: not valid JSON ({err})") from err
            out.append(rec)
    return out


def count_records(out_dir: str | Path) -> int:
    """The records (complete JSON lines) in ``<out_dir>/<job>/<benchmark>/*.jsonl``, every rank's file."""
    n = 0
    for f in Path(out_dir).glob("*/*/*.jsonl"):
        with open(f, "rb") as fh:
            n += sum(1 for line in fh if line.endswith(b"\n") and line.strip())
    return n


def _done_from_file(path: Path, done: dict[str, set[str]], failed: dict[str, set[str]] | None = None,
                    keys: dict[str, tuple] | None = None) -> None:
    """Add the ``(job, qid)`` of every readable line of ``path`` to ``done``; unreadable lines are logged.

    With ``failed`` given, error records go there instead of into ``done`` (their questions are retried). A line
    that is not UTF-8 (a damaged disk block) is unreadable too: scoring skips it (:func:`callbacks.scoring.
    read_records`), so its question is run again rather than taken as done with replacement characters. With
    ``keys`` given, the first answered record of each qid adds ``qid -> (answer, options, "<path> line <n>",
    video, question_sha1)``
    (what the question was when it was answered: :meth:`JsonlPredictionWriter.written_keys`)."""
    for n, rec, err in jsonl_lines(path):
        try:
            if err is not None:
                raise err
            if not isinstance(rec, dict):   # ``null``, a list, a number: no record (a hand-edited file)
                raise TypeError(f"a JSON {type(rec).__name__}, not an object")
            target = failed if failed is not None and rec.get("error") else done
            target.setdefault(str(rec["job"]), set()).add(str(rec["qid"]))
            if keys is not None and not rec.get("error") and str(rec["qid"]) not in keys:
                opts = rec.get("options")
                keys[str(rec["qid"])] = (rec.get("answer"), list(opts) if isinstance(opts, list) else None,
                                         f"{path} line {n}", rec.get("video"), rec.get("question_sha1"))
        except (ValueError, KeyError, TypeError) as e:
            log.warning("%s line %d: unreadable record (%s), skipped: its question is run again unless another "
                        "line holds it", path, n,
                        type(e).__name__)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


# the files that killed a decode worker in a run of this folder (one path per line): decoded apart in later runs
DECODE_CRASHES = "decode_crashes.txt"


class OutputLockedError(RuntimeError):
    """Another process is writing the same output folder and rank (the lock file is named)."""


class OutputWriteError(OSError):
    """The disk (or quota) is full: a video's records could not be appended (the file is named; the records written
    before it are intact)."""


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# the errors of a folder or file that cannot be written (full disk or quota, read-only mount, no permission)
UNWRITABLE = (*DISK_FULL, errno.EROFS, errno.EACCES, errno.EPERM)


def unwritable_reason(e: OSError) -> str:
    """What to do about ``e`` (an :data:`UNWRITABLE` error), for the end of a one-line message."""
    if e.errno in DISK_FULL:
        return "free space (or raise the quota)"
    if e.errno == errno.EROFS:
        return "the file system is mounted read-only: choose an out_dir on a writable one"
    return "make it writable (or choose another out_dir)"

_LOCK_HOLDERS: "weakref.WeakSet[JsonlPredictionWriter]" = weakref.WeakSet()   # writers holding an output lock


def _drop_locks_in_child() -> None:
    """After a fork, in the child: close its copies of the output locks' descriptors. An ``flock`` belongs to the
    open file description, which the parent still holds, so the parent keeps its lock; but the child no longer
    keeps it alive once the parent is gone (``kill -9`` of the main process with DataLoader workers running)."""
    for writer in list(_LOCK_HOLDERS):
        fd, writer._lock_fd = writer._lock_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:  # pragma: no cover
                pass
    _LOCK_HOLDERS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_locks_in_child)


def append_synced(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path``, flush and fsync it (a new file's folder too). On a full disk the bytes of this
    write that reached the file are truncated away again, so the file ends with its last complete record.

    Raises:
        OutputWriteError: no space left (``ENOSPC``) or quota exceeded (``EDQUOT``), naming ``path``.
    """
    new = not path.exists()
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
    size = path.stat().st_size if not new else 0
    try:
        with open(path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno not in DISK_FULL:
            if e.errno in UNWRITABLE:   # a read-only records file (or mount): nothing of this write reached it
                err = OutputWriteError(f"{path}: {os.strerror(e.errno)}: the records file cannot be appended to; the "
                                       f"records written before are intact. {unwritable_reason(e).capitalize()} "
                                       "and run again: it resumes at this video")
                err.errno = e.errno
                raise err from e
            raise
        try:   # truncating needs no space; the next run would repair a torn line anyway (repair_jsonl)
            with open(path, "r+b") as f:
                f.truncate(size)
                os.fsync(f.fileno())
        except OSError:  # pragma: no cover - the restart's repair_jsonl cuts the torn line instead
            pass
        err = OutputWriteError(f"{path}: {os.strerror(e.errno)} while appending {len(data)} bytes of records; the "
                               "records written before are intact. Free space and run again: it resumes at this video")
        err.errno = e.errno
        raise err from e
    if new:
        _fsync_dir(path.parent)


class OutputSettingsError(ValueError):
    """The output folder holds records made with other settings (model, benchmark, answer length...)."""


RUN_FILE = "run.json"
# The layout and meaning of a record. Bumped when the same settings make other records: 2 (2026-12-02) = seed 001's
# per-budget fps / fps_ok, stripped answers, the seeds' linspace thinning of the smaller budgets, FFmpeg's exact frame
# choice, max_replaced_frac 0 by default. A folder without it (written before) is format 1 and is refused.
RECORD_FORMAT = 2


MISSING_MEDIA = ": video file not found"   # the decoder's error for a missing file (datamodules.decode)


def _holds_results(out_dir: Path) -> bool:
    """Whether the folder's records hold anything but missing-video errors: a run whose every record says
    "video file not found" (a wrong root or video folder) made nothing to protect, so its settings can be
    replaced."""
    for f in out_dir.glob("*/*/*.jsonl"):
        with open(f, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    if line.strip():
                        return True   # a torn line: a record was being written
                    continue
                if not isinstance(rec, dict) or not str(rec.get("error") or "").endswith(MISSING_MEDIA):
                    return True
    return False


def _other_kind_of_run(out_dir: Path, old: dict, settings: dict) -> str | None:
    """Why a plain predict and a layout ablation cannot share ``out_dir`` (``None`` when they do not meet): the
    ablation keeps ``decode_budget`` in ``run.json`` (the frames of every job), a plain predict does not (it decodes
    for its largest budget), so the key's absence on one side is not "written before the setting existed" but
    another kind of run. An ablation folder written before ``decode_budget`` was kept has no plain ``b<B>/`` job
    folder, and resumes."""
    if "decode_budget" in old and "decode_budget" not in settings:
        return (f"{out_dir} holds a layout ablation's records (decode_budget {old['decode_budget']} in "
                f"{out_dir / RUN_FILE}); a plain predict's records would not be decoded for that budget")
    if "decode_budget" in settings and "decode_budget" not in old and any(
            re.fullmatch(r"b\d+", d.name) for d in out_dir.iterdir() if d.is_dir()):
        return (f"{out_dir} holds a plain predict's records (b<B>/ folders, decoded for their largest budget); the "
                f"layout ablation's (decode_budget {settings['decode_budget']}) would not be decoded for that budget")
    return None


def check_run_settings(out_dir: Path, settings: dict, write: bool, defaults: dict | None = None,
                       canonical=None) -> None:
    """Compare the settings that determine a record with ``<out_dir>/run.json`` (written on the first run).

    Records are resumed by qid, so a folder must never mix records made with another model, benchmark or answer
    setting: that would silently skip the new questions and score the old answers. A ``run.json`` whose run wrote
    no record (it stopped before the first video, e.g. on a wrong ``model_path``), or only "video file not found"
    error records (a wrong video folder), is replaced instead.

    A setting missing from an older ``run.json`` is not compared (folders written before the setting existed still
    resume), except the ones in ``defaults``: settings recorded only when they differ from their default (the
    objects' ``RECORD_DEFAULTS``), whose absence on either side means that default.

    ``canonical`` (``recorded settings -> settings as this run records them``, e.g. the datamodule's
    ``canonical_settings``) is applied to ``run.json`` first, so values that name the same thing compare equal
    (``loader_kwargs`` ``{}`` and ``{video_dir: videos}``: :func:`datamodules.benchmarks.canonical_loader_kwargs`).

    Raises:
        OutputSettingsError: naming every differing setting and the file.
    """
    path = out_dir / RUN_FILE
    defaults = defaults or {}
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as e:   # JSONDecodeError, not UTF-8, nested past the recursion limit
            why = "nested too deeply" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
            raise OutputSettingsError(
                f"{path} is not valid JSON ({why}); it records the settings of the records in {out_dir}. "
                f"Restore it, use another output folder, or delete it to resume with this run's settings") from e
        if not isinstance(old, dict):
            raise OutputSettingsError(
                f"{path} is not a JSON object of settings (a {type(old).__name__}); restore it, use another output "
                "folder, or delete it to resume with this run's settings")
        if canonical is not None:
            old = canonical(old)
        diffs = [f"{k}: {old.get(k)!r} there, {v!r} now" for k, v in settings.items()
                 if k not in defaults and old.get(k, v) != v]
        diffs += [f"{k}: {old.get(k, d)!r} there, {settings.get(k, d)!r} now" for k, d in defaults.items()
                  if old.get(k, d) != settings.get(k, d)]
        other_kind = _other_kind_of_run(out_dir, old, settings)
        if other_kind and _holds_results(out_dir):
            raise OutputSettingsError(f"{other_kind}. Use another output folder (--trainer.callbacks.init_args."
                                      "out_dir=DIR with the shipped configs, where the writer is the last callback)")
        if not diffs:
            return
        if _holds_results(out_dir):
            raise OutputSettingsError(
                f"{out_dir} holds records made with other settings ({'; '.join(diffs)}). Use another output folder "
                f"(--trainer.callbacks.init_args.out_dir=DIR with the shipped configs, where the writer is the last "
                f"callback), or delete {path} to resume with the new settings on purpose")
        log.info("%s: replacing the settings of a run that wrote no record (%s)", path, "; ".join(diffs))
    if write and settings:
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        try:
            tmp.write_text(json.dumps(settings, indent=2, sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as e:
            if e.errno not in UNWRITABLE:
                raise
            tmp.unlink(missing_ok=True)
            err = OutputWriteError(f"{path}: {os.strerror(e.errno)} while writing the run's settings (no record was "
                                   f"written yet); {unwritable_reason(e)} and run again")
            err.errno = e.errno
            raise err from e


def run_settings(trainer, pl_module) -> tuple[dict, dict]:
    """``(settings, defaults)`` of a predict run's ``run.json``: ``record_format`` and the ``record_settings()`` of
    the module and the datamodule, with their ``RECORD_DEFAULTS`` (settings recorded only when not at those)."""
    settings, defaults = {"record_format": RECORD_FORMAT}, {"record_format": 1}
    for obj in (pl_module, getattr(trainer, "datamodule", None)):
        if hasattr(obj, "record_settings"):
            settings.update(obj.record_settings())
            defaults.update(getattr(obj, "RECORD_DEFAULTS", {}))
    return settings, defaults


class JsonlPredictionWriter(BasePredictionWriter):
    """Append records per video; report what is already done so the datamodule skips it before decoding.

    A question whose record is an error (unreadable video, out of memory) is tried again on restart when
    ``retry_errors`` is set: a new record is appended after the error record, and scoring prefers it. The settings
    that determine records (``record_settings()`` of the module and datamodule: model, benchmark, answer length...)
    are kept in ``<out_dir>/run.json``; a run with other settings on the same folder is refused. Before anything is
    created, the module's and datamodule's ``check_before_output(trainer, settings, defaults)`` (when they have
    one) may refuse the run (the layout ablation's ``baseline_run``).

    Args:
        out_dir: output root.
        retry_errors: retry failed questions on restart.
    """

    def __init__(self, out_dir: str = "outputs/demo", retry_errors: bool = True):
        super().__init__(write_interval="batch")
        self.out_dir = Path(out_dir)
        self.retry_errors = retry_errors
        self._done: dict[str, set[str]] | None = None
        self._failed: dict[str, set[str]] = {}
        self._keys: dict[str, tuple] = {}   # qid -> (answer, options, where, video, question_sha1) of the records read
        self._lock_fd: int | None = None
        self._trace_handler: logging.Handler | None = None
        self._run_jobs: set[str] | None = None   # the module's jobs (``setup``); None: every job of the folder

    @property
    def out_root(self) -> Path:
        return self.out_dir

    def decode_crashes(self) -> set[str]:
        """The video paths in ``<out_dir>/decode_crashes.txt``: files that killed a decode worker in an earlier run of
        this folder (:meth:`record_decode_crashes`); an unreadable file counts as none."""
        try:
            text = (self.out_dir / DECODE_CRASHES).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            return set()
        return {line for line in text.splitlines() if line.strip()}

    def record_decode_crashes(self, videos: list[str]) -> None:
        """Add ``videos`` (files a decode worker died on, named by its mark) to ``<out_dir>/decode_crashes.txt``, one
        path per line, appended and synced; a rerun decodes them in a process of their own
        (:mod:`datamodules.decode.isolated`). Nothing is raised: the run is already stopping."""
        new = [v for v in videos if v not in self.decode_crashes()]
        if not new:
            return
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / DECODE_CRASHES
            # a file written by hand may lack its last newline: the first name goes on a line of its own
            lead = b""
            if path.is_file() and path.stat().st_size:
                with open(path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    lead = b"" if f.read(1) == b"\n" else b"\n"
            append_synced(path, lead + "".join(f"{v}\n" for v in new).encode("utf-8", errors="surrogateescape"))
        except OSError as e:
            log.warning("%s: could not note the file(s) that killed a decode worker (%s)", self.out_dir, e)

    def done_qids(self) -> dict[str, set[str]]:
        """``job -> qids`` already written (all ranks' files; truncated last lines repaired first)."""
        if self._done is None:
            done: dict[str, set[str]] = {}
            failed: dict[str, set[str]] = {}
            keys: dict[str, tuple] = {}
            for f in sorted(self.out_dir.glob("*/*/*.jsonl")):
                repair_jsonl(f)
                _done_from_file(f, done, failed if self.retry_errors else None, keys)
            self._keys = keys
            self._failed = {job: qids - done.get(job, set()) for job, qids in failed.items()}
            # said for this run's jobs only: a folder's other budgets are not run now, so not retried now
            n = sum(len(v) for job, v in self._failed.items() if self._run_jobs is None or job in self._run_jobs)
            if n:
                log.warning("%s: %d failed (job, question) records will be retried", self.out_dir, n)
            self._done = done
        return self._done

    def written_keys(self) -> dict[str, tuple]:
        """``qid -> (answer, options, where, video, question_sha1)`` of the answered records already written (the first
        record of each qid; ``options`` / ``video`` / ``question_sha1`` ``None`` where a record has none): what each question was when it was answered, so a resumed
        run can tell that the annotation changed since (``datamodules.videoqa.annotation_changes``)."""
        self.done_qids()
        return self._keys

    def _lock(self, rank: int) -> None:
        """Take ``<out_dir>/.rank<r>.lock`` (``flock``, released by the OS when the process dies)."""
        if self._lock_fd is not None:
            return
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f".rank{rank}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise OutputLockedError(f"{path}: another predict run is writing to {self.out_dir} (rank {rank}); "
                                        "wait for it or choose another out_dir") from e
            raise
        self._lock_fd = fd
        _LOCK_HOLDERS.add(self)   # forked children close their copy (_drop_locks_in_child)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None
        _LOCK_HOLDERS.discard(self)

    def setup(self, trainer, pl_module, stage: str) -> None:
        # the settings (and the module's / datamodule's checks of its inputs, ``check_before_output``) first: a run
        # refused there leaves nothing behind, not even the output folder
        settings, defaults = run_settings(trainer, pl_module)
        for obj in (pl_module, getattr(trainer, "datamodule", None)):
            if hasattr(obj, "check_before_output"):
                obj.check_before_output(trainer, settings, defaults)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise OutputWriteError(f"{self.out_dir}: out_dir is a file, not a folder; choose another out_dir "
                                   "(--trainer.callbacks.init_args.out_dir=DIR with the shipped configs)")
        # every rank reads before any rank writes; then ranks only ever append to their own file
        try:
            self._lock(trainer.global_rank)
        except OSError as e:   # out_dir (or a parent) read-only, on a read-only mount, or the disk full
            if e.errno not in UNWRITABLE:
                raise
            err = OutputWriteError(f"{e.filename or self.out_dir}: {os.strerror(e.errno)}: the output folder "
                                   f"{self.out_dir} cannot be created or written; {unwritable_reason(e)}")
            err.errno = e.errno
            raise err from e
        try:   # a folder that cannot take a new file fails now, not after the first video's work
            with tempfile.TemporaryFile(dir=self.out_dir):
                pass
        except OSError as e:
            self._unlock()
            raise PermissionError(f"{self.out_dir}: the output folder is not writable ({e.strerror}); choose "
                                  "another out_dir") from e
        check_run_settings(self.out_dir, settings, write=trainer.is_global_zero, defaults=defaults,
                           canonical=getattr(getattr(trainer, "datamodule", None), "canonical_settings", None))
        self._done = None
        jobs = getattr(pl_module, "jobs", None)
        self._run_jobs = set(jobs) if jobs else None
        self.done_qids()
        # a failed video's traceback goes to <out_dir>/errors_rank<r>.log (the console gets one line naming it)
        detach_traceback_file(self._trace_handler)
        self._trace_handler = attach_traceback_file(errors_log_path(self.out_dir, trainer.global_rank))
        if trainer.world_size > 1:
            trainer.strategy.barrier("jsonl_writer_setup")

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._unlock()
        detach_traceback_file(self._trace_handler)
        self._trace_handler = None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._unlock()
        detach_traceback_file(self._trace_handler)
        self._trace_handler = None
        if isinstance(exception, KeyboardInterrupt) and trainer.is_global_zero and self._done is not None:
            note_interrupt(f"{count_records(self.out_dir)} records kept in {self.out_dir}; run the same command "
                           "to resume")

    def __del__(self):
        self._unlock()

    def write_on_batch_end(self, trainer, pl_module, prediction: Any, batch_indices, batch, batch_idx: int,
                           dataloader_idx: int = 0) -> None:
        if not prediction:
            return
        done = self.done_qids()
        by_file: dict[Path, list[str]] = {}
        for rec in prediction:
            job = rec["job"]
            if rec["qid"] in done.get(job, ()):
                continue  # never write an answered (job, qid) twice
            if rec.get("error"):
                if rec["qid"] in self._failed.get(job, ()):
                    continue  # failed again: its error record is already there
                self._failed.setdefault(job, set()).add(rec["qid"])
            else:
                done.setdefault(job, set()).add(rec["qid"])
            path = self.out_dir / job / rec.get("benchmark", "benchmark") / f"rank{trainer.global_rank}.jsonl"
            by_file.setdefault(path, []).append(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
        for path, lines in by_file.items():
            append_synced(path, "".join(lines).encode("utf-8"))
