"""``bench/aot_probe.py`` compiles the fused kernels ahead of time on its own stand-in tensors: they must be the very
arguments :func:`models.videollama3.warm.compile_fused_kernels` passes (same shapes, dtypes, strides, tensor kinds),
else the probe times other graphs than the early compilation's."""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import aot_probe  # noqa: E402

SIZES = {"d_model": 64, "inter": 128, "heads": 4, "kv_heads": 2, "head_dim": 16, "rms_eps": 1e-6, "c": 32,
         "v_heads": 2, "ln_eps": 1e-5}


def _describe(args):
    return [(tuple(a.shape), a.dtype, a.stride(), a.is_inference(), isinstance(a, torch.nn.Parameter))
            if isinstance(a, torch.Tensor) else a for a in args]


@pytest.mark.parametrize("inference,inference_weights", [(True, False), (True, True), (False, False)])
def test_stand_ins_are_warm_calls(monkeypatch, inference, inference_weights):
    from models import kernels, vision_attention
    from models.videollama3 import shared_prefix, warm

    seen = {}
    targets = {"RMSNorm": (kernels, "rms_norm"), "SiLU*up": (kernels, "silu_mul"),
               "rotary (rows)": (kernels, "rope_rows"), "add+LayerNorm": (kernels, "add_layer_norm"),
               "vision rotary": (vision_attention, "fused_rotary_qk"),
               "shared-prefix suffix+merge": (shared_prefix, "_suffix_and_merge")}
    for name, (module, attr) in targets.items():
        monkeypatch.setattr(module, attr, lambda *a, _n=name: seen.setdefault(_n, _describe(a)))
    assert warm.compile_fused_kernels(aot_probe.namespace_config(SIZES), "cpu", torch.bfloat16, inference,
                                      inference_weights) == list(aot_probe.KERNELS)
    weights = aot_probe.make_weights(SIZES, torch.device("cpu"), torch.bfloat16, inference_weights)
    with aot_probe._mode(inference):
        for name in aot_probe.KERNELS:
            mine = _describe(aot_probe.stand_ins(name, SIZES, aot_probe.WARM_ROWS, "cpu", torch.bfloat16, weights))
            assert mine == seen[name], name
    assert set(aot_probe.fusables()) == set(targets)


def test_guard_summary_reads_global_state_and_value_guards():
    text = ("TREE_GUARD_MANAGER:\n+- RootGuardManager\n"
            '| +- GLOBAL_STATE: ___check_global_state() against {"default_dtype":6,"grad_mode":false,"num_threads":2}\n'
            "| | +- EQUALS_MATCH: L['eps'] == 1e-06          # xf = ...\n"
            "+- LAMBDA_GUARD: 2 <= L['x'].size()[0]  # xf = x.float()\n")
    s = aot_probe.guard_summary(text)
    assert s["global_state"] == {"default_dtype": 6, "grad_mode": False, "num_threads": 2}
    assert s["kinds"] == {"TREE_GUARD_MANAGER": 1, "GLOBAL_STATE": 1, "EQUALS_MATCH": 1, "LAMBDA_GUARD": 1}
    assert [g.strip() for g in s["value_guards"]] == ["EQUALS_MATCH: L['eps'] == 1e-06",
                                                      "LAMBDA_GUARD: 2 <= L['x'].size()[0]"]
