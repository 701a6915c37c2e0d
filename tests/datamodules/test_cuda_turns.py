"""datamodules.cuda_turns: decode workers make their first CUDA calls one after another in the order of their
ranks (a worker that reads on the CPU passes), never waiting more than the bound for one that does not come."""
from __future__ import annotations

import multiprocessing as mp
import time

import pytest
from torch.utils.data import DataLoader, Dataset, get_worker_info

from datamodules import cuda_turns
from datamodules.worker_watch import worker_init


@pytest.fixture(autouse=True)
def _no_turns():
    cuda_turns.install(None)
    yield
    cuda_turns.install(None)


def _worker(counter, rank, delay_s, calls, out):
    cuda_turns.install(counter)
    time.sleep(delay_s)   # started later than the others
    first = (lambda: out.put((rank, time.monotonic()))) if calls else None
    cuda_turns.take_turn(rank, first, wait_s=10.0)
    assert cuda_turns.take_turn(rank, first) is None   # once per worker


def test_first_calls_run_in_rank_order_whatever_the_start_order():
    """Four workers started in reverse rank order (rank 3 first); rank 0 reads on the CPU and passes: the first
    CUDA calls of ranks 1, 2, 3 run in that order."""
    ctx = mp.get_context("fork")
    counter, out = cuda_turns.make_counter(ctx), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(counter, r, 0.05 * (3 - r), r != 0, out)) for r in range(4)]
    for p in reversed(procs):
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    got = sorted((out.get(timeout=5) for _ in range(3)), key=lambda x: x[1])
    assert [r for r, _ in got] == [1, 2, 3]
    assert counter.value == 4


def test_a_missing_earlier_worker_costs_at_most_the_bound():
    ctx = mp.get_context("fork")
    counter = cuda_turns.make_counter(ctx)
    cuda_turns.install(counter)
    ran = []
    t0 = time.perf_counter()
    waited = cuda_turns.take_turn(2, lambda: ran.append(1), wait_s=0.2)   # ranks 0 and 1 never come
    assert ran == [1] and 0.2 <= waited < 1.0 and time.perf_counter() - t0 < 1.0
    assert counter.value == 3


def test_the_next_worker_goes_even_when_the_first_calls_fail():
    ctx = mp.get_context("fork")
    counter = cuda_turns.make_counter(ctx)
    cuda_turns.install(counter)

    def fail():
        raise RuntimeError("no device")

    with pytest.raises(RuntimeError, match="no device"):
        cuda_turns.take_turn(0, fail)
    assert counter.value == 1 and not cuda_turns.pending()


def test_nothing_without_a_counter():
    assert not cuda_turns.pending() and cuda_turns.take_turn(0, lambda: 1 / 0) is None


class _Items(Dataset):
    def __len__(self):
        return 3

    def __getitem__(self, i):
        got = []
        cuda_turns.take_turn(get_worker_info().id, lambda: got.append(time.monotonic()), wait_s=10.0)
        return {"item": i, "worker": get_worker_info().id, "first_calls_at": got[0] if got else None}


def test_the_loaders_workers_get_the_counter_from_their_init():
    """``worker_init(..., turns)`` hands each DataLoader worker the loader's counter: every worker makes its first
    calls once, in worker order, and none after its first item."""
    ctx = mp.get_context("fork")
    counter = cuda_turns.make_counter(ctx)
    loader = DataLoader(_Items(), batch_size=None, num_workers=3, multiprocessing_context=ctx,
                        worker_init_fn=worker_init(3, 0, counter))
    items = list(loader)
    assert [x["worker"] for x in items] == [0, 1, 2]
    firsts = [x["first_calls_at"] for x in items]
    assert all(f is not None for f in firsts) and firsts == sorted(firsts)
    assert counter.value == 3


def test_the_items_take_their_turn_before_the_first_decode(monkeypatch):
    """The dataset's workers (``decoder: auto``, the first video read on the CPU): worker 0 passes its turn, workers 1
    and 2 make NVDEC's first calls for their own first videos, in that order, each before its decode; the next items
    make none."""
    import datamodules.decode.nvdec as nvdec
    import datamodules.video_items as vi
    from datamodules.decode import DecodedVideo
    from datamodules.video_items import VideoQADataset, VideoTask

    ctx = mp.get_context("fork")
    calls = ctx.Queue()
    monkeypatch.setattr(nvdec, "first_cuda_calls", lambda path: calls.put(("first calls", path, time.monotonic())))
    monkeypatch.setattr(vi, "decode_video", lambda path, *a, **kw: calls.put(("decode", path, time.monotonic()))
                        or DecodedVideo(frames=None, times_s=[], info={}))
    tasks = [VideoTask(f"v{i}", f"/v{i}.mp4", "videomme", []) for i in range(5)]
    ds = VideoQADataset(tasks, 1024, decoder="auto", cpu_task=0)
    counter = cuda_turns.make_counter(ctx)
    loader = DataLoader(ds, batch_size=None, num_workers=3, multiprocessing_context=ctx,
                        worker_init_fn=worker_init(3, 0, counter))
    assert [x["video_id"] for x in loader] == [f"v{i}" for i in range(5)]
    got = [calls.get(timeout=5) for _ in range(7)]
    firsts = sorted((t, p) for kind, p, t in got if kind == "first calls")
    assert [p for _, p in firsts] == ["/v1.mp4", "/v2.mp4"]
    decodes = {p: t for kind, p, t in got if kind == "decode"}
    assert all(t < decodes[p] for t, p in firsts) and len(decodes) == 5
    assert counter.value == 3


@pytest.mark.parametrize("bad", [1, "true", None])
def test_the_setting_is_a_bool(bad):
    from algorithms.errors import SettingError
    from datamodules.videoqa import VideoQADataModule

    with pytest.raises(SettingError, match="data.cuda_turns must be true or false"):
        VideoQADataModule(cuda_turns=bad)
    assert VideoQADataModule().cuda_turns is False


def test_turns_only_where_the_fork_server_starts_workers_that_may_use_nvdec():
    from datamodules.videoqa import VideoQADataModule

    on = VideoQADataModule(cuda_turns=True, decoder="auto")
    assert on._turns(mp.get_context("forkserver")) and not on._turns(None)
    assert not VideoQADataModule(cuda_turns=True, decoder="cpu")._turns(mp.get_context("forkserver"))
    assert not VideoQADataModule(decoder="auto")._turns(mp.get_context("forkserver"))
