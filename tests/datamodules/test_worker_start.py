"""How the decode workers start (issue 31, first answer): fork on a machine without CUDA, a fork server (one clean
process that imports the workers' modules once) on a CUDA machine, whatever the decoder; the same items either way."""
from __future__ import annotations

import os
import subprocess
import sys

import torch
from torch.utils.data import DataLoader

from datamodules.videoqa import WORKER_PRELOAD, decode_worker_context
from tests.conftest import MEDIA, REPO

VL3_PROCESSOR = "transformers.models.video_llama_3.video_processing_video_llama_3"


def test_fork_unless_the_run_is_on_a_cuda_machine():
    assert decode_worker_context("auto", 0, True) is None           # decoding in the main process
    assert decode_worker_context("nvdec", 8, False) is None         # no CUDA device: NVDEC is never tried
    assert decode_worker_context("cpu", 8, False) is None           # CPU decoders on a CPU machine: fork
    # on a CUDA machine the CPU decoders too: a fork there waits for the background load / compilation
    for decoder in ("auto", "nvdec", "cpu"):
        ctx = decode_worker_context(decoder, 8, True, (VL3_PROCESSOR, "datamodules.decode.nvdec"))
        assert ctx.get_start_method() == "forkserver"
        from multiprocessing import forkserver
        # PyNvVideoCodec's module before decord's, the processor's after; each once
        assert forkserver._forkserver._preload_modules == [*WORKER_PRELOAD, VL3_PROCESSOR]
    assert WORKER_PRELOAD[0] == "datamodules.decode.nvdec"


def test_fork_server_workers_give_the_main_process_items(tiny_vl3_dir, tmp_path):
    """Items decoded by workers forked from the server (decoder ``auto``: on this CPU machine every file falls back
    to the CPU reader) equal the main process's, frame for frame at every held grid. And the workers (which hold
    what the server preloaded) have imported the preload list without Lightning (seconds per start) and without a
    CUDA context, neither their own nor one inherited from the server (their NVDEC decoders make their own)."""
    import functools
    import json

    from tests.datamodules.slow_items import report_worker_state
    from datamodules.benchmarks import Question
    from datamodules.decode import EncoderSizing
    from datamodules.video_items import VideoQADataset, VideoTask
    from models.videollama3.frame_sizes import LazyVideoProcessor, load_video_processor

    processor = load_video_processor(tiny_vl3_dir)
    tasks = [VideoTask(name, str(MEDIA / name), "videomme",
                       [Question(f"{name}_q", name, str(MEDIA / name), "Q?", ["a", "b"], "A")],
                       {f"{name}_q": ["b128", "b256"]}) for name in ("cockatoo.mp4", "cockatoo.mp4")]
    ds = VideoQADataset(tasks, 256, sizing=EncoderSizing((128, 256), 256, "phase3", 256, processor), decoder="auto")
    # the workers get what the module hands them before its load: the processor unread, read in each worker
    lazy = LazyVideoProcessor(tiny_vl3_dir)
    ds_lazy = VideoQADataset(tasks, 256, sizing=EncoderSizing((128, 256), 256, "phase3", 256, lazy), decoder="auto")
    from multiprocessing import forkserver

    forkserver._forkserver._stop()   # a server another test started has its own preload list: start ours
    ctx = decode_worker_context("auto", 2, True, (lazy.processor_module,))
    forked = list(DataLoader(ds_lazy, batch_size=None, num_workers=2, multiprocessing_context=ctx,
                             worker_init_fn=functools.partial(report_worker_state, str(tmp_path / "worker"))))
    for w in range(2):
        state = json.loads((tmp_path / f"worker.{w}.json").read_text())
        assert set(WORKER_PRELOAD) | {VL3_PROCESSOR} <= set(state["modules"])
        assert [m for m in state["modules"] if m.split(".")[0] in ("lightning", "pytorch_lightning",
                                                                  "lightning_fabric")] == []
        assert state["cuda_initialized"] is False and state["cuda_from_parent"] is False
    here = [ds[i] for i in range(len(ds))]
    assert len(forked) == len(here) == 2
    for a, b in zip(forked, here):
        assert a["error"] is None and b["error"] is None and a["times_s"] == b["times_s"]
        assert b["frames"].held and a["frames"].shape == b["frames"].shape
        assert set(a["frames"].held) == set(b["frames"].held)
        for grid, (t, idx) in b["frames"].held.items():
            assert a["frames"].held[grid][1] == idx and torch.equal(a["frames"].held[grid][0], t)
        assert a["worker_start_boot_s"] != b["worker_start_boot_s"]     # decoded in another process
    assert lazy._processor is None          # never read in this process


def test_lazy_video_processor_is_the_checkpoints(tiny_vl3_dir):
    """``LazyVideoProcessor``: nothing read until an attribute is used, then the very processor
    ``load_video_processor`` reads (the same resize, pixel for pixel); copied as pickle copies it (its
    ``__getstate__``: what the DataLoader sends a worker), only the path travels; its module is the one the fork
    server preloads."""
    import copy

    from datamodules import worker_server
    from models.videollama3.frame_sizes import LazyVideoProcessor, load_video_processor, processor_resize

    real = load_video_processor(tiny_vl3_dir)
    lazy = LazyVideoProcessor(tiny_vl3_dir)
    assert lazy._processor is None and "not read" in repr(lazy)
    sent = copy.deepcopy(lazy)
    assert sent._processor is None and sent.model_path == str(tiny_vl3_dir)
    frames = torch.randint(0, 256, (3, 90, 160, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for max_tokens in (16, 64, 256):
        assert torch.equal(processor_resize(sent, frames, max_tokens), processor_resize(real, frames, max_tokens))
    assert type(sent._processor) is type(real) and sent.to_dict() == real.to_dict()
    assert copy.deepcopy(sent)._processor is None      # read once here, still only the path
    assert lazy.processor_module == type(real).__module__ == worker_server.VL3_PROCESSOR_MODULE == VL3_PROCESSOR
    missing = LazyVideoProcessor(tiny_vl3_dir.parent / "nowhere")
    try:
        missing.resize
    except FileNotFoundError as e:
        assert "nowhere" in str(e) and "config.json" in str(e)
    else:
        raise AssertionError("a path without a checkpoint must raise when the processor is first used")


def test_fork_server_started_at_interpreter_start_only_for_predict_on_a_gpu_machine(monkeypatch):
    """``evaluate.py`` starts the workers' fork server before its own imports where a predict run may use it (an
    NVIDIA device node exists), with the list the data module would give it; otherwise, or switched off, not."""
    from multiprocessing import forkserver

    from datamodules import worker_server

    started = []
    monkeypatch.setattr(worker_server, "_STARTED_EARLY", False)   # restored after the test (start_early sets it)
    monkeypatch.setattr(forkserver, "ensure_running", lambda: started.append(
        list(forkserver._forkserver._preload_modules)))
    monkeypatch.setattr(os.path, "exists", lambda p: p == "/dev/nvidiactl")
    assert not worker_server.started_early()
    assert worker_server.start_early(["predict", "--config", "x.yaml"]) is True and worker_server.started_early()
    assert started == [[*WORKER_PRELOAD, VL3_PROCESSOR]]
    assert not worker_server.start_early(["fit"]) and not worker_server.start_early([])
    monkeypatch.setenv(worker_server.ENV_SWITCH, "0")
    assert not worker_server.start_early(["predict"])
    monkeypatch.delenv(worker_server.ENV_SWITCH)
    monkeypatch.setattr(os.path, "exists", lambda p: False)
    assert not worker_server.start_early(["predict"]) and len(started) == 1
    code = "import sys, datamodules.worker_server; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"      # importable before anything heavy


def test_setup_reads_the_frame_sizing_only_where_it_sets_the_servers_preload(monkeypatch):
    """The module's frame sizing (its video processor, ~1.5 s) is read at the data module's set-up only when the
    fork server is still to be started with it; on the CPU path (fork), or with a server already started by
    ``start_early``, it is read when the loader is built, after the module's set-up has started the weight load."""
    from multiprocessing import forkserver
    from types import SimpleNamespace

    from datamodules import worker_server
    from datamodules.videoqa import VideoQADataModule

    reads, started = [], []
    module = SimpleNamespace(frame_sizing=lambda: reads.append(1))
    monkeypatch.setattr(forkserver, "ensure_running", lambda: started.append(1))
    monkeypatch.setattr(worker_server, "_STARTED_EARLY", False)

    def setup(decoder: str, cuda: bool) -> tuple[int, int]:
        reads.clear(), started.clear()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        dm = VideoQADataModule("videomme", str(REPO / "assets"), {"video_dir": "media"}, num_workers=2,
                               decoder=decoder)
        dm.trainer = SimpleNamespace(lightning_module=module)
        dm.setup("predict")
        return len(reads), len(started)

    assert setup("cpu", False) == (0, 0) and setup("auto", False) == (0, 0)    # fork: nothing to start
    assert setup("auto", True) == (1, 1)          # the server starts here, with the processor's module preloaded
    assert setup("cpu", True) == (1, 1)           # the CPU decoders on CUDA too
    monkeypatch.setattr(worker_server, "_STARTED_EARLY", True)
    assert setup("auto", True) == (0, 1)          # already running (ensure_running: nothing to do)


def test_module_frame_sizing_before_the_load_reads_no_processor(tiny_vl3_dir):
    """Before its model is loaded, the module's frame sizing holds the processor unread (the workers read it);
    after, the loaded model's own."""
    from types import SimpleNamespace

    from lightning_modules.budgeted_qa import BudgetedQA
    from models.videollama3.frame_sizes import LazyVideoProcessor

    hp = SimpleNamespace(model_path=str(tiny_vl3_dir), max_tokens_per_frame=256, raw_mode="phase3", raw_max_tokens=256)
    sizing = BudgetedQA.frame_sizing(SimpleNamespace(vlm=None, hparams=hp, budgets=[128, 256]))
    assert isinstance(sizing.processor, LazyVideoProcessor) and sizing.processor._processor is None
    assert sizing.budgets == (128, 256) and sizing.max_tokens_per_frame == 256
    loaded = SimpleNamespace(video_processor=object())
    assert BudgetedQA.frame_sizing(SimpleNamespace(vlm=loaded, hparams=hp, budgets=[128])).processor \
        is loaded.video_processor
