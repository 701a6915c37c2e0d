"""Forked workers never free the parent's cyclic garbage (datamodules.fork_context): the objects whose teardown
deadlocks in a forked child (PyAV frames owning a libswscale thread pool) are collected in the parent first."""
import gc
import multiprocessing
import os

from datamodules import fork_context as fc


class _Cycle:
    """Cyclic garbage whose finaliser appends the pid that ran it to ``path``."""

    def __init__(self, path):
        self.path, self.me = path, self

    def __del__(self):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def _collect_in_child():
    gc.collect()


def _finalised_in(ctx, path, monkeypatch) -> set[int]:
    monkeypatch.setattr(fc, "_last_collect", float("-inf"))
    gc.collect()
    gc.disable()                       # the garbage stays uncollected until a collection we choose
    try:
        _Cycle(path)
        p = ctx.Process(target=_collect_in_child)
        p.start()
        p.join(30)
        assert p.exitcode == 0
    finally:
        gc.enable()
    gc.collect()
    return {int(x) for x in path.read_text().split()} if path.exists() else set()


def test_plain_fork_frees_the_parents_garbage_in_the_child(tmp_path, monkeypatch):
    """The hazard the context removes (so the next test can fail): a plain fork's child finalises it too."""
    pids = _finalised_in(multiprocessing.get_context("fork"), tmp_path / "plain", monkeypatch)
    assert os.getpid() in pids and len(pids) == 2


def test_collecting_fork_frees_it_in_the_parent_only(tmp_path, monkeypatch):
    assert _finalised_in(fc.fork_context(), tmp_path / "collecting", monkeypatch) == {os.getpid()}


def test_one_collection_per_interval(monkeypatch):
    monkeypatch.setattr(fc, "_last_collect", float("-inf"))
    assert fc.collect_before_fork() is True and fc.collect_before_fork() is False


def test_the_predict_loaders_fork_through_it():
    from datamodules.videoqa import video_loader

    loader = video_loader(list(range(3)), None, num_workers=2, prefetch_factor=2)
    assert isinstance(loader.multiprocessing_context, fc.CollectingForkContext)
    assert sorted(loader) == [0, 1, 2]
    assert video_loader(list(range(3)), None, num_workers=0, prefetch_factor=2).multiprocessing_context is None
    server = multiprocessing.get_context("forkserver")      # a context given (the NVDEC fork server) is kept
    assert video_loader([0], None, 1, 2, context=server).multiprocessing_context is server


class _InterruptedDel:
    """Cyclic garbage whose finaliser is interrupted (Ctrl-C arriving while the collection runs it)."""

    def __init__(self, exc):
        self.exc, self.me = exc, self

    def __del__(self):
        raise self.exc


class _Terminated(KeyboardInterrupt):
    """Stands for cli.Terminated (SIGTERM): a KeyboardInterrupt subclass."""


def test_an_interrupt_lost_in_a_finaliser_during_the_collection_is_raised(monkeypatch):
    """Python only reports an exception raised in ``__del__``; the collection before a fork raises a Ctrl-C (or a
    SIGTERM's Terminated, kept as such) that was lost so, and keeps reporting other errors as before."""
    monkeypatch.setattr(fc, "_last_collect", float("-inf"))
    gc.collect()
    gc.disable()
    try:
        _InterruptedDel(_Terminated("SIGTERM"))
        _InterruptedDel(ValueError("not an interrupt"))
        reported = []
        monkeypatch.setattr("sys.unraisablehook", lambda report: reported.append(type(report.exc_value)))
        try:
            fc.collect_before_fork()
        except KeyboardInterrupt as e:
            raised = e
        else:
            raised = None
    finally:
        gc.enable()
    assert type(raised) is _Terminated and reported == [ValueError]
