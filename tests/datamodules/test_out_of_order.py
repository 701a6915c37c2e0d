"""Out-of-order delivery of decoded videos (``data.in_order: false``, the default): a short video is not held behind
a long one, every video of a rank comes exactly once, the ranks' shares are disjoint and cover the run, and a
resumed run with workers writes no duplicate."""
import json
import time

import pytest

from datamodules.sharding import CostBalancedSampler
from datamodules.videoqa import VideoQADataModule, video_loader
from tests.datamodules.slow_items import SlowItems


def _clean_workers():
    """Workers forked from a fresh fork server, not from pytest's process: a plain fork of a process where an
    earlier test left threads can deadlock on a lock one of them held (seen once in CI: two idle workers)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.datamodules.slow_items"])   # (only if the server is not running yet)
    return ctx


def test_out_of_order_delivers_a_short_video_before_a_long_one_once_each():
    # 4 videos on one rank; run order with 2 workers: worker 0 gets the slow one first
    costs = [1.0, 2.0, 3.0, 4.0]
    sampler = CostBalancedSampler(costs, 1, 0, workers=2)
    order = list(sampler)
    delay = {i: 0.0 for i in order}
    delay[order[0]] = 1.5               # the first video in the sampler's order is the slow one
    ds = SlowItems([delay[i] for i in range(len(costs))])
    got = list(video_loader(ds, sampler, num_workers=2, prefetch_factor=1, context=_clean_workers(), in_order=False))
    assert sorted(got) == sorted(order) and len(got) == len(order)          # each once
    assert got[0] != order[0] and got.index(order[0]) > 0                  # not held behind the slow one
    in_order = list(video_loader(ds, sampler, num_workers=2, prefetch_factor=1, context=_clean_workers(), in_order=True))
    assert in_order == order


def test_out_of_order_ddp_shares_are_disjoint_and_cover_the_run():
    costs = [5.0, 1.0, 3.0, 2.0, 8.0, 1.5, 4.0]
    seen = []
    for rank in range(2):
        sampler = CostBalancedSampler(costs, 2, rank, workers=2)
        ds = SlowItems([0.05 if i % 3 == 0 else 0.0 for i in range(len(costs))])
        seen += list(video_loader(ds, sampler, num_workers=2, prefetch_factor=2, context=_clean_workers(), in_order=False))
    assert sorted(seen) == list(range(len(costs)))


def test_in_order_setting_is_checked():
    assert VideoQADataModule(num_workers=0).in_order is False
    with pytest.raises(Exception, match="data.in_order must be true or false"):
        VideoQADataModule(num_workers=0, in_order="yes")


@pytest.mark.slow   # ~50 s on 2 cores; the default run's twins: the loader tests above and the resume e2e test
def test_resumed_run_with_workers_out_of_order_writes_no_duplicate(tiny_vl3_dir, tmp_path, capsys):
    """Two decode workers delivering out of order, then a resume after two lines were deleted: every (job, qid)
    once, the deleted ones written again, the rest untouched."""
    from conftest import run_predict
    from tests.models.videollama3.test_throughput import make_bench

    root = tmp_path / "bench"
    make_bench(root, 3)
    out = tmp_path / "out"
    extra = ["--data.init_args.num_workers=2"]
    recs = run_predict(tiny_vl3_dir, root, out, budgets=(128,), extra=extra)
    assert len({(r["job"], r["qid"]) for r in recs}) == len(recs) > 2
    f = next(out.glob("b128/*/rank0.jsonl"))
    lines = f.read_text().splitlines(keepends=True)
    deleted = {json.loads(lines[i])["qid"] for i in (0, 2)}
    f.write_text("".join(l for i, l in enumerate(lines) if i not in (0, 2)))
    recs2 = run_predict(tiny_vl3_dir, root, out, budgets=(128,), extra=extra)
    assert len(recs2) == len(recs) and len({(r["job"], r["qid"]) for r in recs2}) == len(recs2)
    assert {r["qid"] for r in recs2} == {r["qid"] for r in recs} and deleted <= {r["qid"] for r in recs2}


def test_worker_niceness_lowers_each_decode_workers_priority_and_only_theirs():
    import os

    from tests.datamodules.slow_items import Niceness

    base = os.nice(0)
    step = min(3, 19 - base)
    got = list(video_loader(Niceness(), range(2), num_workers=2, prefetch_factor=1, context=_clean_workers(),
                            worker_niceness=step))
    assert got == [base + step] * 2 and os.nice(0) == base            # the workers' priority, not this process's
    assert list(video_loader(Niceness(), range(2), num_workers=2, prefetch_factor=1,
                             context=_clean_workers())) == [base, base]   # 0 (the default): unchanged
    assert VideoQADataModule(num_workers=0).worker_niceness == 0
    for bad in (-1, 20, 2.5, True):
        with pytest.raises(Exception, match="data.worker_niceness"):
            VideoQADataModule(num_workers=0, worker_niceness=bad)


def test_pin_memory_setting_follows_the_device_and_can_be_turned_off():
    from types import SimpleNamespace

    import torch

    def on(device, **kw):
        dm = VideoQADataModule(num_workers=0, **kw)
        dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
        return dm.pins_frames()

    assert (on("cuda"), on("cuda", pin_memory=True), on("cuda", pin_memory=False)) == (True, True, False)
    assert (on("cpu"), on("cpu", pin_memory=True)) == (False, False)
    with pytest.raises(Exception, match="data.pin_memory must be true, false or null"):
        VideoQADataModule(num_workers=0, pin_memory="yes")
