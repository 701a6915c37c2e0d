"""Out of GPU memory (issue 8 §4), simulated on CPU: ``torch.cuda.OutOfMemoryError`` raised inside the model for
one video gives one error record per (question, budget) of that video, the memory it held is released (the
``gc.collect`` / ``torch.cuda.empty_cache`` path runs and the tensors are freed), and the next video runs."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from tests.conftest import run_predict


def test_oom_in_one_video_gives_error_records_and_the_next_video_runs(tiny_vl3_dir, demo_bench, tmp_path,
                                                                      monkeypatch):
    from models.videollama3 import BudgetedVideoLlama3

    real = BudgetedVideoLlama3.encode
    calls = []

    def encode(self, frames, *args, **kwargs):  # the vision encoder: every video goes through it
        calls.append(frames.shape)
        if len(calls) == 1:  # the first video: realshort, the cheaper (datamodules.sharding.run_order)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
        return real(self, frames, *args, **kwargs)

    monkeypatch.setattr(BudgetedVideoLlama3, "encode", encode)
    recs = run_predict(tiny_vl3_dir, demo_bench, tmp_path / "out", budgets=(128, 256),
                       model_args={"max_new_tokens": 2})
    oom = [r for r in recs if "error" in r]
    ok = [r for r in recs if "error" not in r]
    assert {r["video"] for r in oom} == {"realshort"} and len(oom) == 3 * 2  # 3 questions x 2 budgets
    assert all("CUDA out of memory" in r["error"] and "realshort.mp4" in r["error"] for r in oom)
    assert {r["job"] for r in oom} == {"b128", "b256"} and all(r["answer"] for r in oom)
    assert {r["video"] for r in ok} == {"cockatoo"} and len(ok) == 4 * 2
    assert all(r["response"] is not None for r in ok)


def test_oom_releases_memory(monkeypatch):
    """predict_step's OOM path: error records, gc + empty_cache called, the video's tensors freed."""
    import lightning_modules.budgeted_qa as bqa

    module = bqa.BudgetedQA(budgets=[128])
    module.vlm = object()  # never reached: prepare_budgets fails first
    held: list[weakref.ref] = []

    def prepare_budgets(vlm, frames, *args, **kwargs):
        activations = torch.empty(1 << 20)  # "GPU memory" the failed step holds
        held.append(weakref.ref(activations))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    emptied, collected = [], []
    monkeypatch.setattr(bqa, "prepare_budgets", prepare_budgets)
    monkeypatch.setattr(bqa.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bqa.torch.cuda, "empty_cache", lambda: emptied.append(1))
    real_collect = gc.collect
    monkeypatch.setattr(bqa.gc, "collect", lambda *a: collected.append(1) or real_collect(*a))
    item = {"video_id": "v", "video_path": "/data/v.mp4", "benchmark": "videomme", "error": None,
            "frames": torch.zeros(2, 8, 8, 3, dtype=torch.uint8), "times_s": [0.0, 1.0],
            "video_info": {}, "questions": [{"qid": "q1", "answer": "A", "meta": {}}], "jobs": {"q1": ["b128"]}}
    recs = module.predict_step(item)
    assert recs == [{"qid": "q1", "video": "v", "benchmark": "videomme", "job": "b128", "budget": 128,
                     "variant": None, "answer": "A", "meta": {},
                     "error": "/data/v.mp4: CUDA out of memory (CUDA out of memory (simulated))"}]
    assert emptied and collected
    assert held and held[0]() is None  # nothing keeps the failed step's tensors alive


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_oom_is_recoverable():
    """On a GPU: a real OOM, then the cache is emptied and a normal allocation succeeds."""
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(free * 4, dtype=torch.uint8, device="cuda")
    gc.collect()
    torch.cuda.empty_cache()
    x = torch.ones(1 << 20, device="cuda")
    assert float(x.sum()) == float(1 << 20)
