"""models/videollama3/warm.py: the plumbing of the early, parallel compilation of the fused kernels (CPU only: the
kernels compile on CUDA, here they run eagerly). The subprocess CLI runs and exits 0, ``start`` does nothing off
CUDA, one kernel can be called alone, and the thread's order of work (kernels of its own first, then each
subprocess's kernel as it ends; none with the switch off)."""
import logging
import sys
import threading

import pytest
import torch

from models import kernels as fused
from models import vision_attention
from models.videollama3 import warm

FUSABLE_ATTRS = {"RMSNorm": (fused, "rms_norm"), "SiLU*up": (fused, "silu_mul"), "rotary (rows)": (fused, "rope_rows"),
                 "add+LayerNorm": (fused, "add_layer_norm"), "vision rotary": (vision_attention, "fused_rotary_qk")}


@pytest.fixture(scope="module")
def tiny_config_dir(tmp_path_factory):
    """A directory with only the tiny VideoLLaMA3 ``config.json`` (what ``start`` and the CLI read)."""
    from models.videollama3.tiny import tiny_videollama3_config

    out = tmp_path_factory.mktemp("tiny-config")
    tiny_videollama3_config().save_pretrained(out)
    return out


@pytest.fixture
def recorded(monkeypatch):
    """The five fused kernels replaced by recorders: the list of kernel names called, in order."""
    calls = []
    for name, (module, attr) in FUSABLE_ATTRS.items():
        monkeypatch.setattr(module, attr, lambda *args, _name=name: calls.append((_name, args)))
    return calls


def test_the_kernel_names_are_the_fusables_names():
    assert set(warm.KERNELS) == set(FUSABLE_ATTRS) and warm.IN_THREAD <= set(warm.KERNELS)
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
    recorded.clear()
    with pytest.raises(ValueError, match="'nope'"):
        warm.compile_fused_kernels(config, "cpu", torch.float32, kernels=["RMSNorm", "nope"])
    assert recorded == []
    assert warm.compile_fused_kernels(config, "cpu", torch.float32, kernels=[]) == [] and recorded == []


def test_start_does_nothing_off_cuda(tiny_config_dir, monkeypatch):
    monkeypatch.setattr(warm.subprocess, "Popen", lambda *a, **k: pytest.fail("no subprocess off CUDA"))
    assert warm.start(tiny_config_dir, "cpu", torch.float32) is None
    assert warm.start(tiny_config_dir, torch.device("cpu"), torch.float32, parallel=False) is None


def test_the_subprocess_cli_compiles_one_kernel_on_cpu(tiny_config_dir, caplog):
    """What ``start`` launches (the command, environment, watcher) runs the CLI for one kernel against the tiny
    config on the CPU (eager kernels there) and exits 0, its one-line report logged; a subprocess past its timeout
    is killed and reported."""
    state = warm.torch_state()
    cmd = warm.command(tiny_config_dir, "cpu", torch.float32, True, None, "SiLU*up", state)
    assert cmd[:3] == [sys.executable, "-m", "models.videollama3.warm"] and "--inference-weights" in cmd
    with caplog.at_level(logging.INFO, logger="models.videollama3.warm"):
        slow, = warm.launch(tiny_config_dir, "cpu", torch.float32, True, ["RMSNorm"], state=state, timeout_s=0.0)
        child, = warm.launch(tiny_config_dir, "cpu", torch.float32, True, ["SiLU*up"], state=state)
        assert list(warm.in_order_of_ending([child, slow])) == [slow, child]
    assert slow.timed_out and not slow.ok
    assert child.returncode == 0 and child.ok and 0 < child.seconds < warm.SUBPROCESS_TIMEOUT_S, child.tail
    assert "compiled SiLU*up in" in child.tail
    assert "RMSNorm ran past 0 s and was killed" in caplog.text and "subprocess compiled SiLU*up in" in caplog.text


def test_torch_state_round_trips():
    state = warm.torch_state()
    assert state["default_dtype"] == "float32" and state["deterministic"] is False
    warm.apply_torch_state(state)
    assert warm.torch_state() == state


class _Child:
    def __init__(self, kernel):
        self.kernel, self.seconds, self.ok, self.ended = kernel, 1.5, True, threading.Event()


@pytest.mark.parametrize("switch", [None, "0"])
def test_the_thread_compiles_its_own_kernels_first_then_each_as_its_subprocess_ends(tiny_config_dir, monkeypatch,
                                                                                 switch):
    """With subprocesses: the :data:`IN_THREAD` kernels are compiled at once, the others one by one as their
    subprocesses end (in that order); with ``TOKENBUDGET_PARALLEL_COMPILE=0`` (or ``parallel=False``) no
    subprocess, all kernels in one call. (The thread's work, as ``start`` runs it on CUDA.)"""
    from transformers import VideoLlama3Config

    config = VideoLlama3Config.from_pretrained(tiny_config_dir)
    launched, calls = [], []
    ending = ["vision rotary", "RMSNorm", "rotary (rows)", "SiLU*up"]

    def launch(model_path, device, dtype, inference, kernels, **kw):
        launched.append(list(kernels))
        return [_Child(k) for k in kernels]

    def ended_in_order(children):
        by_name = {c.kernel: c for c in children}
        for name in ending:
            if name in by_name:
                yield by_name[name]

    monkeypatch.setattr(warm, "launch", launch)
    monkeypatch.setattr(warm, "in_order_of_ending", ended_in_order)
    monkeypatch.setattr(warm, "compile_fused_kernels", lambda *a, kernels=None, **k: calls.append(list(kernels)) or kernels)
    if switch is not None:
        monkeypatch.setenv(warm.ENV_PARALLEL, switch)
    parallel = warm.parallel_enabled()                                # as start reads it
    assert parallel == (switch is None) and not warm.parallel_enabled(False)
    timings = {}
    done = warm.compile_in_parallel(config, tiny_config_dir, "cpu", torch.float32, True, parallel, timings=timings)
    if parallel:
        assert launched == [[k for k in warm.KERNELS if k not in warm.IN_THREAD]]
        assert calls == [[k for k in warm.KERNELS if k in warm.IN_THREAD]] + [[k] for k in ending]
        assert timings["subprocesses"] == {k: 1.5 for k in ending}
    else:
        assert launched == [] and calls == [list(warm.KERNELS)] and timings["subprocesses"] == {}
    assert sorted(done) == sorted(warm.KERNELS) and timings["in_process"] >= 0 and "cache" in timings
