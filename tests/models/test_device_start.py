"""models.device_start: the CUDA context made beside the CLI's imports (evaluate.py), for predict runs on a machine
with an NVIDIA device node only; the device LOCAL_RANK's; a failure kept, never raised."""
from __future__ import annotations

import time

import torch

import models.device_start as ds


def _gpu_nodes(monkeypatch, present: bool) -> None:
    real = ds.os.path.exists
    monkeypatch.setattr(ds.os.path, "exists", lambda p: present if p in ds.GPU_NODES else real(p))


def test_nothing_starts_outside_a_predict_run_on_a_gpu_machine(monkeypatch):
    monkeypatch.delenv(ds.ENV_SWITCH, raising=False)
    _gpu_nodes(monkeypatch, True)
    assert ds.start_cuda_early(["fit"]) is None and ds.start_cuda_early([]) is None
    monkeypatch.setenv(ds.ENV_SWITCH, "0")
    assert ds.start_cuda_early(["predict"]) is None
    monkeypatch.delenv(ds.ENV_SWITCH)
    _gpu_nodes(monkeypatch, False)
    assert ds.start_cuda_early(["predict", "--config", "x.yaml"]) is None
    assert ds.early_cuda_marks() == {}


def test_the_context_is_made_on_local_ranks_device_and_its_times_kept(monkeypatch):
    """With a device node and CUDA (stood in for here: this machine has none): set_device, one allocation and a
    synchronize on LOCAL_RANK's device, in that order, in the thread; the marks once it ended."""
    calls = []
    monkeypatch.delenv(ds.ENV_SWITCH, raising=False)
    _gpu_nodes(monkeypatch, True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(torch, "empty", lambda *a, device=None: calls.append(("empty", a, device)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d: calls.append(("synchronize", d)))
    thread = ds.start_cuda_early(["predict"])
    thread.join()
    cuda1 = torch.device("cuda", 1)
    assert calls == [("set_device", cuda1), ("empty", (1,), cuda1), ("synchronize", cuda1)]
    marks = ds.early_cuda_marks()
    assert set(marks) == {"cuda_start", "cuda_ready"} and 0 <= marks["cuda_start"] <= marks["cuda_ready"] \
        <= time.perf_counter()


def test_a_failure_is_kept_not_raised(monkeypatch):
    monkeypatch.delenv(ds.ENV_SWITCH, raising=False)
    _gpu_nodes(monkeypatch, True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def broken(d):
        raise RuntimeError("no context for you")

    monkeypatch.setattr(torch.cuda, "set_device", broken)
    ds.start_cuda_early(["predict"]).join()
    assert ds._MARKS["cuda_failed"] == "RuntimeError: no context for you" and ds.early_cuda_marks() == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # a node but no device torch can use
    ds.start_cuda_early(["predict"]).join()
    assert ds._MARKS["cuda_failed"] == "no CUDA device" and ds.early_cuda_marks() == {}
