"""How the decode workers start (issue 31, first answer): fork for the CPU decoders, a fork server (one clean
process that imports the workers' modules once) where NVDEC may run in them; the same items either way."""
from __future__ import annotations

import subprocess
import sys

import torch
from torch.utils.data import DataLoader

from datamodules.videoqa import WORKER_PRELOAD, decode_worker_context
from tests.conftest import MEDIA, REPO

VL3_PROCESSOR = "transformers.models.video_llama_3.video_processing_video_llama_3"


def test_fork_unless_nvdec_may_run_in_the_workers():
    assert decode_worker_context("cpu", 8, True) is None            # CPU decoders: fork (instant)
    assert decode_worker_context("auto", 0, True) is None           # decoding in the main process
    assert decode_worker_context("nvdec", 8, False) is None         # no CUDA device: NVDEC is never tried
    for decoder in ("auto", "nvdec"):
        ctx = decode_worker_context(decoder, 8, True, (VL3_PROCESSOR, "datamodules.decode.nvdec"))
        assert ctx.get_start_method() == "forkserver"
        from multiprocessing import forkserver
        # PyNvVideoCodec's module before decord's, the processor's after; each once
        assert forkserver._forkserver._preload_modules == [*WORKER_PRELOAD, VL3_PROCESSOR]
    assert WORKER_PRELOAD[0] == "datamodules.decode.nvdec"


def test_what_the_fork_server_preloads_has_no_lightning_and_no_cuda_context():
    """The server imports the preload list in a fresh interpreter: no Lightning (seconds per start), and no CUDA
    context (its forked workers make their own for NVDEC)."""
    mods = [*WORKER_PRELOAD, VL3_PROCESSOR]
    code = (f"import sys, importlib; [importlib.import_module(m) for m in {mods!r}]; import torch; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning', "
            "'lightning_fabric')), torch.cuda.is_initialized())")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[] False"


def test_fork_server_workers_give_the_main_process_items(tiny_vl3_dir):
    """Items decoded by workers forked from the server (decoder ``auto``: on this CPU machine every file falls back
    to the CPU reader) equal the main process's, frame for frame at every held grid."""
    from datamodules.benchmarks import Question
    from datamodules.decode import EncoderSizing
    from datamodules.video_items import VideoQADataset, VideoTask
    from models.videollama3.frame_sizes import load_video_processor

    processor = load_video_processor(tiny_vl3_dir)
    sizing = EncoderSizing((128, 256), 256, "phase3", 256, processor)
    tasks = [VideoTask(name, str(MEDIA / name), "videomme",
                       [Question(f"{name}_q", name, str(MEDIA / name), "Q?", ["a", "b"], "A")],
                       {f"{name}_q": ["b128", "b256"]}) for name in ("cockatoo.mp4", "cockatoo.mp4")]
    ds = VideoQADataset(tasks, 256, sizing=sizing, decoder="auto")
    ctx = decode_worker_context("auto", 2, True, (type(processor).__module__,))
    forked = list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=ctx))
    here = [ds[i] for i in range(len(ds))]
    assert len(forked) == len(here) == 2
    for a, b in zip(forked, here):
        assert a["error"] is None and b["error"] is None and a["times_s"] == b["times_s"]
        assert b["frames"].held and a["frames"].shape == b["frames"].shape
        assert set(a["frames"].held) == set(b["frames"].held)
        for grid, (t, idx) in b["frames"].held.items():
            assert a["frames"].held[grid][1] == idx and torch.equal(a["frames"].held[grid][0], t)
        assert a["worker_start_boot_s"] != b["worker_start_boot_s"]     # decoded in another process


def test_fork_server_started_at_interpreter_start_only_for_predict_on_a_gpu_machine(monkeypatch):
    """``evaluate.py`` starts the workers' fork server before its own imports where a predict run may use it (an
    NVIDIA device node exists), with the list the data module would give it; otherwise, or switched off, not."""
    from multiprocessing import forkserver

    from datamodules import worker_server

    started = []
    monkeypatch.setattr(forkserver, "ensure_running", lambda: started.append(
        list(forkserver._forkserver._preload_modules)))
    monkeypatch.setattr(worker_server.os.path, "exists", lambda p: p == "/dev/nvidiactl")
    assert worker_server.start_early(["predict", "--config", "x.yaml"]) is True
    assert started == [[*WORKER_PRELOAD, VL3_PROCESSOR]]
    assert not worker_server.start_early(["fit"]) and not worker_server.start_early([])
    monkeypatch.setenv(worker_server.ENV_SWITCH, "0")
    assert not worker_server.start_early(["predict"])
    monkeypatch.delenv(worker_server.ENV_SWITCH)
    monkeypatch.setattr(worker_server.os.path, "exists", lambda p: False)
    assert not worker_server.start_early(["predict"]) and len(started) == 1
    code = "import sys, datamodules.worker_server; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"      # importable before anything heavy
