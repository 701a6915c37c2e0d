"""models/videollama3/warm.py: the plumbing of the early compilation of the fused kernels (CPU only: the kernels
compile on CUDA, here they run eagerly). ``start`` does nothing off CUDA, one kernel can be called alone, the
thread compiles in the caller's grad mode and reports its time."""
import logging
import os
from pathlib import Path

import pytest
import torch

from models import kernels as fused
from models import vision_attention
from models.videollama3 import shared_prefix, warm

FUSABLE_ATTRS = {"RMSNorm": (fused, "rms_norm"), "SiLU*up": (fused, "silu_mul"), "rotary (rows)": (fused, "rope_rows"),
                 "add+LayerNorm": (fused, "add_layer_norm"), "vision rotary": (vision_attention, "fused_rotary_qk"),
                 "shared-prefix suffix+merge": (shared_prefix, "_suffix_and_merge")}


@pytest.fixture(scope="module")
def tiny_config_dir(tmp_path_factory):
    """A directory with only the tiny VideoLLaMA3 ``config.json`` (what ``start`` and the CLI read)."""
    from models.videollama3.tiny import tiny_videollama3_config

    out = tmp_path_factory.mktemp("tiny-config")
    tiny_videollama3_config().save_pretrained(out)
    return out


@pytest.fixture
def recorded(monkeypatch):
    """The six fused kernels replaced by recorders: the list of kernel names called, in order."""
    calls = []
    for name, (module, attr) in FUSABLE_ATTRS.items():
        monkeypatch.setattr(module, attr, lambda *args, _name=name: calls.append((_name, args)))
    return calls


def test_the_kernel_names_are_the_fusables_names():
    assert set(warm.KERNELS) == set(FUSABLE_ATTRS)
    for name, (module, attr) in FUSABLE_ATTRS.items():
        assert getattr(module, attr).name == name


def test_one_kernel_is_called_alone_and_unknown_names_raise(tiny_config_dir, recorded):
    from transformers import VideoLlama3Config

    config = VideoLlama3Config.from_pretrained(tiny_config_dir)
    assert warm.compile_fused_kernels(config, "cpu", torch.bfloat16, kernels=["SiLU*up"]) == ["SiLU*up"]
    assert [n for n, _ in recorded] == ["SiLU*up"]
    gate, up = recorded[0][1]
    assert gate.shape == up.shape == (19, config.text_config.intermediate_size) and gate.dtype == torch.bfloat16
    recorded.clear()
    assert warm.compile_fused_kernels(config, "cpu", torch.bfloat16, inference=True) == list(warm.KERNELS)
    assert [n for n, _ in recorded] == list(warm.KERNELS)
    args = dict(recorded)
    assert all(t.is_inference() for t in args["vision rotary"])              # activations in inference mode
    assert [t.dtype for t in args["vision rotary"]] == [torch.bfloat16] * 2 + [torch.float32] * 2
    assert args["RMSNorm"][1].is_inference()                                 # weights: inference_weights=inference
    # the decode step's merge as shared_prefix_sdpa calls it: tiny config 4 heads / 2 KV heads / head dim 16
    text = config.text_config
    h, hkv = text.num_attention_heads, text.num_key_value_heads
    d = getattr(text, "head_dim", None) or text.hidden_size // h
    q, k, v, mask, out_p, lse_p, scale = args["shared-prefix suffix+merge"]
    assert q.shape == (3, h, 1, d) and k.shape == v.shape == (3, hkv, 19, d) and mask.shape == (3, 1, 1, 19)
    assert out_p.shape == (1, hkv, 3 * (h // hkv), d) and lse_p.shape == (1, hkv, 3 * (h // hkv))
    assert out_p.dtype == lse_p.dtype == torch.float32 and q.dtype == mask.dtype == torch.bfloat16
    assert scale == d ** -0.5
    recorded.clear()
    with pytest.raises(ValueError, match="'nope'"):
        warm.compile_fused_kernels(config, "cpu", torch.float32, kernels=["RMSNorm", "nope"])
    assert recorded == []
    assert warm.compile_fused_kernels(config, "cpu", torch.float32, kernels=[]) == [] and recorded == []


def test_start_does_nothing_off_cuda(tiny_config_dir, monkeypatch):
    monkeypatch.setattr(warm, "compile_fused_kernels", lambda *a, **k: pytest.fail("nothing compiles off CUDA"))
    assert warm.start(tiny_config_dir, "cpu", torch.float32) is None
    assert warm.start(tiny_config_dir, torch.device("cpu"), torch.float32) is None


def test_the_thread_compiles_for_the_callers_mode_and_reports_its_time(tiny_config_dir, monkeypatch, caplog):
    """On CUDA the thread calls ``compile_fused_kernels`` with the checkpoint's config, the device, the dtype and the
    grad mode given; its ``timings`` get the seconds and the cache counters (what ``BudgetedQA`` writes to the
    timing json). A failure is logged as a warning and still fills the timings (nothing is raised at ``join``)."""
    calls, first = [], []
    monkeypatch.setattr(warm, "compile_fused_kernels", lambda *a, **k: calls.append(a) or kws.append(k)
                        or list(warm.KERNELS))
    monkeypatch.setattr(warm, "warm_first_calls", lambda *a: first.append(a))
    kws = []
    thread = warm.start(tiny_config_dir, "cuda", torch.bfloat16, inference=True)   # the thread itself needs no GPU
    thread.join()
    (config, device, dtype, inference, weights), = calls
    assert (type(config).__name__, device, dtype, inference, weights) == ("VideoLlama3Config", "cuda", torch.bfloat16,
                                                                          True, None)
    calls.clear()
    warm.start(tiny_config_dir, "cuda", torch.bfloat16, inference=True, inference_weights=False).join()
    assert calls[0][3:] == (True, False)     # weights loaded in another thread: plain tensors
    assert kws[0] == {"default_dtype": torch.float32}   # the default dtype when started (before the load's)
    assert set(thread.timings) == {"seconds", "cache", "num_threads", "end_perf_counter", "first_calls_s"}
    assert thread.timings["seconds"] >= 0 and thread.timings["num_threads"] == torch.get_num_threads()
    # the first-call warm-up ran in its own thread with the same config, device and dtype, joined with this one
    assert [(type(c).__name__, d, t) for c, d, t in first] == [("VideoLlama3Config", "cuda", torch.bfloat16)] * 2
    assert isinstance(thread.timings["first_calls_s"], float)
    first.clear()
    warm.start(tiny_config_dir, "cuda", torch.bfloat16, inference=True, first_calls=False).join()
    assert first == []

    def fail(*a, **k):
        raise RuntimeError("inductor broke")

    monkeypatch.setattr(warm, "compile_fused_kernels", fail)
    monkeypatch.setattr(warm, "warm_first_calls", fail)
    with caplog.at_level(logging.INFO, logger="models.videollama3.warm"):
        thread = warm.start(tiny_config_dir, "cuda", torch.bfloat16, inference=False)
        thread.join()
    assert "inductor broke" in caplog.text and "seconds" in thread.timings
    assert thread.timings["first_calls_s"] == "failed: inductor broke"   # logged, never raised
    assert "first-call warm-up failed (inductor broke)" in caplog.text


def test_first_call_stand_ins_have_the_models_shapes(tiny_vlm):
    """The stand-ins of ``warm_first_calls`` are the model's own sizes: the patch embedding's weight, an MLP
    projection's weight, the LLM's and the vision tower's attention head counts and head dims; and they run (eager
    SDPA on the CPU)."""
    config = tiny_vlm.model.config
    shapes = warm.warm_first_calls(config, "cpu", torch.float32)
    model = tiny_vlm.model.model
    patch = next(m for m in model.vision_model.modules() if isinstance(m, torch.nn.Conv2d))
    assert shapes["conv2d"][1] == tuple(patch.weight.shape)
    up = model.language_model.layers[0].mlp.up_proj.weight
    assert shapes["linear"][1] == tuple(up.shape)
    attn = model.language_model.layers[0].self_attn
    assert shapes["sdpa_llm"][0][1:2] + shapes["sdpa_llm"][0][3:] == (config.get_text_config().num_attention_heads,
                                                                      attn.head_dim)
    v = config.vision_config
    assert shapes["sdpa_vision"][0][1] == v.num_attention_heads and shapes["sdpa_vision"][0][3] * v.num_attention_heads == v.hidden_size


def test_the_stand_ins_run_through_the_real_kernels(tiny_config_dir):
    """The stand-in shapes fit the kernels themselves (eager off CUDA): every kernel is called, none raises."""
    from transformers import VideoLlama3Config

    config = VideoLlama3Config.from_pretrained(tiny_config_dir)
    assert warm.compile_fused_kernels(config, "cpu", torch.float32) == list(warm.KERNELS)


def test_merge_stand_ins_have_the_decode_steps_layouts(tiny_vlm):
    """The early compilation's merge arguments have the shapes, strides and dtypes of what a real decode step passes
    (a compiled graph guards on strides: a contiguous stand-in query against the step's transposed view compiled a
    second graph in the first video's step on the H200)."""
    from datamodules.decode import decode_video
    from models.videollama3 import prepare_budgets
    from tests.conftest import MEDIA

    seen = []
    real = shared_prefix._suffix_and_merge

    def record(*args):
        seen.append([(tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args])
        return real(*args)

    dec = decode_video(MEDIA / "cockatoo.mp4", 1024)
    bi = next(iter(prepare_budgets(tiny_vlm, dec.frames, dec.times_s, [128])))
    qs = ["What animal is shown?\nA. A dog.\nB. A cockatoo.", "Colour?\nA. White.\nB. Green.", "Where?\nA. Here."]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shared_prefix, "_suffix_and_merge", record)
        tiny_vlm.answer_batched(bi.prompt, qs, 3, decode="static")
    assert seen, "the decode step never called the merge"
    step = seen[0]
    text = tiny_vlm.model.config.get_text_config()
    h, hkv = text.num_attention_heads, text.num_key_value_heads
    d = getattr(text, "head_dim", None) or text.hidden_size // h
    keys = step[1][0][2]                                  # the suffix region's length S of this video
    stand = shared_prefix.decode_step_stand_ins(3, h, hkv, d, keys, 23, torch.float32, "cpu")
    assert [(tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in stand] == step


def test_a_kernel_waits_for_the_default_dtype_the_load_thread_changed(tiny_config_dir):
    """``from_pretrained`` sets the process-wide default dtype to the model's while it builds the model (in the load
    thread), and TorchDynamo guards each graph on it: a kernel traced then is traced again at the step. So each
    stand-in call waits until the default dtype is the one the steps run under (here another thread holds bfloat16
    for 0.3 s); a wait that times out says so and goes on."""
    import threading
    import time

    from transformers import VideoLlama3Config

    seen = []
    real = torch.randn

    def randn(*a, **k):
        seen.append(torch.get_default_dtype())
        return real(*a, **k)

    config = VideoLlama3Config.from_pretrained(tiny_config_dir)
    held = threading.Event()

    def hold():
        torch.set_default_dtype(torch.bfloat16)
        held.set()
        time.sleep(0.3)
        torch.set_default_dtype(torch.float32)

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    t0 = time.monotonic()
    try:
        torch.randn = randn
        warm.compile_fused_kernels(config, "cpu", torch.float32, kernels=["SiLU*up"], default_dtype=torch.float32)
    finally:
        torch.randn = real
        t.join()
        torch.set_default_dtype(torch.float32)
    assert time.monotonic() - t0 >= 0.25 and seen and set(seen) == {torch.float32}
    torch.set_default_dtype(torch.bfloat16)
    try:
        assert warm.await_default_dtype(torch.float32, timeout_s=0.05) is False
        assert warm.await_default_dtype(None) is True and warm.await_default_dtype(torch.bfloat16) is True
    finally:
        torch.set_default_dtype(torch.float32)


_THREADS_SCRIPT = r"""
import sys, threading, torch
from models.videollama3 import warm
seen = {}
def fake_compile(*args, **kwargs):           # what Dynamo does while tracing: capture the thread's global state
    seen["guard"] = torch._C._dynamo.guards.GlobalStateGuard()
    seen["threads"] = torch.get_num_threads()
warm.compile_fused_kernels = fake_compile
warm.start(sys.argv[1], "cuda", torch.float32, inference=False).join()
# the DataLoader's pin-memory thread, started after the model is built, sets one thread for itself (and for every
# thread whose first use comes later)
pin = threading.Thread(target=lambda: torch.set_num_threads(1)); pin.start(); pin.join()
print(seen["threads"], torch.get_num_threads(), seen["guard"].check())
"""


def test_the_compile_thread_runs_with_the_callers_thread_count(tiny_config_dir):
    """The H200's first step recompiled all 6 graphs (``GLOBAL_STATE changed: num_threads``): the pin-memory thread's
    ``set_num_threads(1)`` came before the main thread's first use of its count. ``start`` fixes the caller's count
    and gives it to the compile thread, so a graph traced there passes the main thread's global-state guard (a fresh
    process: a thread's count is set once, at its first use; the default count must not be 1 for the pin thread's
    1 to show)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(repo)}
    out = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(tiny_config_dir)], capture_output=True,
                         text=True, env=env, cwd=repo, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    compile_threads, main_threads, guard_ok = out.stdout.split()
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: every thread's count is 1 anyway")
    assert (compile_threads, main_threads, guard_ok) == ("2", "2", "True")


def test_a_fork_from_the_main_thread_waits_for_the_background_threads():
    """A forked child gets every lock as it was at the fork: a DataLoader worker forked while the weight load held
    torch's generator lock hung in its first ``torch.manual_seed``. A fork from the main thread now waits for the
    background threads of ``warm`` (here one holding a lock for 0.5 s: the child takes that lock at once)."""
    import multiprocessing
    import threading
    import time

    from models.videollama3 import warm

    lock = threading.Lock()
    started = threading.Event()

    def hold():
        with lock:
            started.set()
            time.sleep(0.5)

    thread = warm.in_background(hold, "weight-load")
    started.wait(5)

    def child(q):
        q.put(lock.acquire(timeout=2))   # a lock copied while held would never be released in the child

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    t0 = time.perf_counter()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    waited = time.perf_counter() - t0
    assert q.get(timeout=10) is True and waited >= 0.3 and thread.done.is_set()
    p.join(10)
    assert thread not in warm._RUNNING


def test_ctrl_c_while_a_fork_waits_is_raised_after_it_and_the_load_result_is_kept(monkeypatch):
    """Ctrl-C while the decode workers' fork waits for the weight load (found by a new-user trial): the fork still
    waits until the load has ended (no lock copied while held), the interrupt is raised from the worker's
    ``start()`` once the fork is done (not swallowed by the at-fork hook), and the load's ``outcome()`` is its
    result. Before, the interrupted ``join`` marked the running thread as ended (Python 3.11), ``outcome()``
    returned at once and raised ``KeyError: 'result'``."""
    import signal
    import threading
    import time

    from datamodules import fork_context as fc
    from models.videollama3 import warm

    monkeypatch.setattr(fc, "_last_collect", time.monotonic() + 60)   # no collection: the signal lands in the wait
    thread = warm.in_background(lambda: time.sleep(0.6) or "weights", "weight-load")
    main = threading.main_thread().ident
    threading.Timer(0.15, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
    p = fc.fork_context().Process(target=_exit_at_once)
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        p.start()
    assert time.perf_counter() - t0 >= 0.4 and thread.done.is_set()   # it waited for the load, then raised
    assert thread.outcome() == "weights"


def _exit_at_once():
    os._exit(0)


def test_outcome_waits_through_an_interrupt_of_its_own_wait():
    """``outcome()`` interrupted by Ctrl-C raises the interrupt; called again it still waits for the thread and
    returns its result (an interrupted ``Thread.join`` would have marked the thread ended)."""
    import signal
    import threading
    import time

    from models.videollama3 import warm

    thread = warm.in_background(lambda: time.sleep(0.5) or 42, "weight-load")
    main = threading.main_thread().ident
    threading.Timer(0.1, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        thread.outcome()
    assert not thread.done.is_set()
    assert thread.outcome() == 42


def test_the_compressor_stand_in_is_the_checkpoints_and_runs(tiny_vl3_dir):
    """``warm_compressor`` builds the checkpoint's qbase compressor (its ``config.json``) with random weights and runs
    it on two windows of different lengths (the padded, masked key layout): B windows -> B * K rows of width C."""
    import json

    cfg = json.loads((Path(tiny_vl3_dir) / "qbase" / "config.json").read_text())
    shape = warm.warm_compressor(Path(tiny_vl3_dir) / "qbase", "cpu", torch.float32)
    assert shape == (2 * cfg["num_queries"], cfg["hidden_size"])
    with pytest.raises(FileNotFoundError):
        warm.warm_compressor(Path(tiny_vl3_dir) / "no-qbase", "cpu", torch.float32)


def test_the_first_call_thread_warms_the_compressor_of_a_checkpoint_with_one(tiny_vl3_dir, tiny_config_dir,
                                                                              monkeypatch):
    """The first-call thread also runs ``warm_compressor`` on the checkpoint's ``qbase/`` (same device and dtype),
    after ``warm_first_calls``; a checkpoint without ``qbase/`` (the config-only directory) skips it."""
    order = []
    monkeypatch.setattr(warm, "compile_fused_kernels", lambda *a, **k: list(warm.KERNELS))
    monkeypatch.setattr(warm, "warm_first_calls", lambda *a: order.append("first_calls"))
    monkeypatch.setattr(warm, "warm_compressor", lambda *a: order.append(a))
    thread = warm.start(tiny_vl3_dir, "cuda", torch.bfloat16, inference=True)
    thread.join()
    assert order == ["first_calls", (Path(tiny_vl3_dir) / "qbase", "cuda", torch.bfloat16)]
    assert isinstance(thread.timings["first_calls_s"], float)
    order.clear()
    warm.start(tiny_config_dir, "cuda", torch.bfloat16, inference=True).join()
    assert order == ["first_calls"]
