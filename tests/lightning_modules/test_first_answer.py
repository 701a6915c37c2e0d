"""Issue 41 (first answer, cold), the CPU-side plumbing: the weight load starts at the trainer's set-up in a
background thread and is joined at predict start, the device reaches the loaders, and ``first_step="eager"`` runs
the eager kernels (and ``static`` decode) while the early compilation still runs, the compiled ones after it."""
import threading
from types import SimpleNamespace

import pytest
import torch

from algorithms.errors import SettingError
from models.kernels import Fusable
from models.videollama3 import BudgetedVideoLlama3, warm


def _attach(module, device="cpu"):
    """A stand-in trainer: only what ``setup`` reads (the strategy's root device, the predict loop's grad mode)."""
    module._trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)), _inference_mode=True)
    return module


@pytest.fixture
def loads(monkeypatch):
    """``BudgetedVideoLlama3.from_pretrained`` recorded: (thread name, ``device`` argument) per call."""
    calls, real = [], BudgetedVideoLlama3.from_pretrained.__func__

    def record(cls, path, **kw):
        calls.append((threading.current_thread().name, kw.get("device")))
        return real(cls, path, **kw)
    monkeypatch.setattr(BudgetedVideoLlama3, "from_pretrained", classmethod(record))
    return calls


def test_setup_starts_the_load_in_the_background_and_predict_start_joins_it(tiny_vl3_dir, loads):
    from lightning_modules.budgeted_qa import BudgetedQA

    module = _attach(BudgetedQA(model_path=str(tiny_vl3_dir), raw_mode="orig"))
    module.setup("predict")
    assert module._loading is not None
    module.on_predict_start()
    assert module.vlm is not None and module._loading is None
    assert loads == [("weight-load", torch.device("cpu"))]       # one load, in the thread, to the trainer's device
    marks = module.timeline_marks
    if marks["load_start"] is not None:                           # (None where /proc/self/stat cannot be read)
        assert marks["setup"] <= marks["load_start"] <= marks["load_end"]
    module.on_predict_start()                                     # loaded once
    assert len(loads) == 1 and module.load_seconds == 0.0


def test_on_a_gpu_machine_the_module_starts_the_compilation_and_load_when_built(monkeypatch):
    """Issue 41: on a machine with CUDA the compilation and the weight load start in ``__init__`` on this rank's
    GPU in inference mode (Lightning's predict defaults), 2.6 s before the trainer's set-up on the H200; a set-up
    that asks for the same keeps them, one that asks for another device starts both anew there."""
    from lightning_modules import budgeted_qa
    from lightning_modules.budgeted_qa import BudgetedQA

    starts, loads_started, weights_kind, warmups = [], [], [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(budgeted_qa.warm, "start", lambda path, device, dtype, inference, weights, first_calls=None:
                        starts.append((torch.device(device), inference)) or weights_kind.append(weights)
                        or warmups.append(first_calls) or None)
    monkeypatch.setattr(budgeted_qa.warm, "in_background", lambda fn, name: loads_started.append(name) or
                        SimpleNamespace(name=name))
    module = BudgetedQA(model_path="/nowhere")
    assert starts == [(torch.device("cuda", 1), True)] and loads_started == ["weight-load"]
    first = module._loading
    _attach(module, "cuda:1").setup("predict")                   # the same device and mode: nothing restarted
    assert len(starts) == 1 and module._loading is first
    _attach(module, "cpu").setup("predict")                      # the trainer chose the CPU: both start there
    assert starts[1:] == [(torch.device("cpu"), True)] and module._loading is not first
    assert not BudgetedQA(model_path="/nowhere", early_start=False)._loading
    # the weights come from the load thread (not in inference mode): the kernels that take weights are compiled
    # for plain tensors (they recompiled in the first step when compiled for inference tensors: H200, 2 graphs)
    assert weights_kind == [False, False]
    # the first-call warm-up goes with the compilation, as model.init_args.warm_first_calls says
    # (on by default since session 12: measured sooner with kernels: triton on the H100)
    assert warmups == [True, True]
    warmups.clear()
    BudgetedQA(model_path="/nowhere", warm_first_calls=False)
    assert warmups == [False]


@pytest.mark.slow
def test_without_early_start_the_load_runs_at_predict_start(tiny_vl3_dir, loads):
    from lightning_modules.budgeted_qa import BudgetedQA

    module = _attach(BudgetedQA(model_path=str(tiny_vl3_dir), raw_mode="orig", early_start=False))
    module.setup("predict")
    assert module._loading is None and loads == []
    module.on_predict_start()
    assert loads == [(threading.current_thread().name, torch.device("cpu"))]
    assert "load_start" not in module.timeline_marks


def test_a_failed_background_load_raises_at_predict_start(tmp_path):
    from lightning_modules.budgeted_qa import BudgetedQA

    module = _attach(BudgetedQA(model_path=str(tmp_path / "missing")))
    module.setup("predict")
    with pytest.raises(FileNotFoundError, match="missing"):
        module.on_predict_start()


def test_bad_start_settings_are_one_line_errors(tiny_vl3_dir):
    from lightning_modules.budgeted_qa import BudgetedQA

    # first_step=eager can change the first videos' tokens (bf16 rounding of the eager kernels): a folder records
    # it; the default is left out, so folders written before the setting existed still resume; early_start is not
    # recorded (the same tokens)
    assert "first_step" not in BudgetedQA(model_path=str(tiny_vl3_dir)).record_settings()
    assert BudgetedQA(model_path=str(tiny_vl3_dir), first_step="eager",
                      kernels="inductor").record_settings()["first_step"] == "eager"
    assert "early_start" not in BudgetedQA(model_path=str(tiny_vl3_dir), early_start=False).record_settings()

    with pytest.raises(SettingError, match="first_step"):
        BudgetedQA(first_step="later")
    with pytest.raises(SettingError, match="early_start"):
        BudgetedQA(early_start=None)


def test_the_device_reaches_the_loaders(tiny_vl3_dir, monkeypatch):
    """``device`` goes to transformers as ``device_map`` (only where accelerate is installed: transformers refuses
    a device_map without it) and to safetensors' ``load_file`` for the qbase compressor."""
    import importlib.util

    from transformers import VideoLlama3ForConditionalGeneration

    from models.videollama3 import encoding, qbase

    assert encoding.device_map_kwargs(None) == {}
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real_find(name, *a))
    assert encoding.device_map_kwargs("cpu") == {}                          # no accelerate: load on the CPU
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "accelerate"
                        else real_find(name, *a))
    assert encoding.device_map_kwargs(torch.device("cuda", 1)) == {"device_map": "cuda:1"}
    assert encoding.device_map_kwargs("cpu") == {}       # a CPU load reads to the CPU as it always did
    seen = {}
    real_model, real_load = VideoLlama3ForConditionalGeneration.from_pretrained.__func__, qbase.load_file

    def model_loader(cls, path, **kw):
        seen["device_map"] = kw.pop("device_map", None)
        return real_model(cls, path, **kw)

    def load_file(path, device="cpu"):
        seen["qbase"] = device
        return real_load(path, device=device)
    monkeypatch.setattr(VideoLlama3ForConditionalGeneration, "from_pretrained", classmethod(model_loader))
    monkeypatch.setattr(qbase, "load_file", load_file)
    vlm = BudgetedVideoLlama3.from_pretrained(tiny_vl3_dir, raw_mode="orig", device="cpu")
    assert seen == {"device_map": None, "qbase": "cpu"}
    assert {p.device.type for p in vlm.compressor.parameters()} == {"cpu"}


@pytest.mark.usefixtures("inductor_kernels")
def test_fusable_runs_eager_in_other_threads_while_the_compilation_runs():
    f = Fusable(lambda x: "eager", "t", devices=("cpu",))
    f._compiled, f.state = (lambda x: "compiled"), "ok"
    go, seen = threading.Event(), []
    held = threading.Thread(target=lambda: (go.wait(), seen.append(f(torch.zeros(1)))))
    held.start()
    try:
        Fusable.eager_while = held
        assert f(torch.zeros(1)) == "eager"                  # another thread, while the compilation runs
        go.set()
        held.join()
        assert seen == ["compiled"]                          # the compiling thread itself compiles
        assert f(torch.zeros(1)) == "compiled"               # after it ended
    finally:
        Fusable.eager_while = None
        go.set()


def test_eager_first_step_does_not_wait_and_decodes_static_meanwhile(monkeypatch):
    from lightning_modules.budgeted_qa import BudgetedQA

    module = BudgetedQA(decode="graph", first_step="eager", kernels="inductor")
    monkeypatch.setattr(module, "_answer_video", lambda item: ["answered"])
    release = threading.Event()
    thread = warm.in_background(release.wait, "fused-kernel-compile")
    module._compiling, Fusable.eager_while = thread, thread
    try:
        assert module.decode_mode() == "static"
        assert module.predict_step({"video_id": "v", "jobs": {}, "questions": [{"qid": "q1"}]}) == ["answered"]
        assert thread.is_alive() and module.eager_steps == 1 and module._compiling is thread   # not joined
        release.set()
        thread.join()
        assert module.predict_step({"video_id": "v", "jobs": {}, "questions": [{"qid": "q1"}]}) == ["answered"]
        assert module._compiling is None and Fusable.eager_while is None
        assert module.warmup_report["eager_steps"] == 1 and "compile_wait_s" in module.warmup_report
        assert module.decode_mode() == "graph"
    finally:
        Fusable.eager_while = None
        release.set()


def test_kernels_setting_is_checked_and_set_process_wide(tiny_vl3_dir):
    """``model.kernels`` names how the fused kernels run (process-wide); a bad value and ``first_step: eager`` without
    ``kernels: inductor`` (it would do nothing) are refused before anything runs."""
    from lightning_modules.budgeted_qa import BudgetedQA

    BudgetedQA(model_path=str(tiny_vl3_dir), kernels="eager")
    assert Fusable.mode == "eager"
    BudgetedQA(model_path=str(tiny_vl3_dir))
    assert Fusable.mode == "triton"
    with pytest.raises(SettingError, match="kernels must be one of"):
        BudgetedQA(model_path=str(tiny_vl3_dir), kernels="compiled")
    with pytest.raises(SettingError, match="first_step: eager acts only with kernels: inductor"):
        BudgetedQA(model_path=str(tiny_vl3_dir), first_step="eager")


def test_weight_reader_setting_reaches_the_load(tiny_vl3_dir, monkeypatch):
    """``model.init_args.weight_reader`` goes to ``BudgetedVideoLlama3.from_pretrained`` (its equality with the
    library's load: tests/models/test_weight_reader.py); a bad value is refused before anything runs."""
    import models.videollama3.encoding as enc
    from lightning_modules.budgeted_qa import BudgetedQA

    seen = []
    real = enc._load_read_state
    monkeypatch.setattr(enc, "_load_read_state", lambda *a: seen.append(a[0]) or real(*a))
    vlm = BudgetedQA(model_path=str(tiny_vl3_dir), weight_reader="pinned")._read_model(torch.device("cpu"))
    assert [str(p) for p in seen] == [str(tiny_vl3_dir)] and vlm.model.config._name_or_path == str(tiny_vl3_dir)
    seen.clear()
    qa = BudgetedQA(model_path=str(tiny_vl3_dir))
    qa._read_model(torch.device("cpu"))
    assert seen == []                                 # the default, auto: the library's loader off CUDA
    assert (qa.weight_reader_for(torch.device("cuda", 1)), qa.weight_reader_for(torch.device("cpu"))) == (
        "pinned", "library")
    lib = BudgetedQA(model_path=str(tiny_vl3_dir), weight_reader="library")
    assert lib.weight_reader_for(torch.device("cuda")) == "library"
    with pytest.raises(SettingError, match="model.init_args.weight_reader must be one of"):
        BudgetedQA(model_path=str(tiny_vl3_dir), weight_reader="mmap")


def test_predict_end_releases_the_model_and_a_later_predict_loads_it_again(tiny_vl3_dir, loads):
    """Lightning's strategy teardown moves the module to the CPU after ``on_predict_end``: with the weights still on
    it, a copy of the whole checkpoint (10 s of every 7B run's end on the H100). After the hook nothing of the VLM is
    left on the module to copy; the next predict loads it again."""
    from lightning_modules.budgeted_qa import BudgetedQA

    module = _attach(BudgetedQA(model_path=str(tiny_vl3_dir), raw_mode="orig"))
    module.setup("predict")
    module.on_predict_start()
    assert module.vlm is not None and sum(p.numel() for p in module.parameters()) > 0
    module.on_predict_end()
    assert module.vlm is None and list(module.parameters()) == [] and list(module.buffers()) == []
    module.setup("predict")                                       # a later predict on the same module
    assert module._loading is not None                            # its load started again at set-up
    module.on_predict_start()
    assert module.vlm is not None and len(loads) == 2
